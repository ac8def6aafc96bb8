"""Decode once, read twice: the second calibration pass replays the first pass's batches from disk.

The two passes need the same batches, byte for byte (the batcher guarantees it). Decoding and
resizing photos again costs CPU that the second pass needs for its histograms, and the decode
threads running beside ONNX Runtime slow its parallel loops down; reading back the raw batches
from an unlinked temporary file costs almost nothing. Batches of ``.npy`` inputs are memory
mapped already, so they are not copied. When the batches would not fit the disk budget, or a write
fails (disk full), the second pass simply iterates the batcher again.
"""

import logging
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np

from trtq.data.batcher import Batch

log = logging.getLogger(__name__)

DISK_BUDGET = 4 << 30  # bytes of temporary disk the replay may use (and at most half the free space)


class ReplayedBatches:
    """``first()`` iterates ``batcher`` and keeps the batches; ``second()`` yields them again."""

    def __init__(self, batcher, enabled: bool = True, budget: int = DISK_BUDGET):
        self.batcher = batcher
        self.enabled = enabled and _decodes_images(batcher)
        self.budget = budget
        self._file = None
        self._index: list[tuple[int, int, list[tuple[str, tuple, str]]]] = []
        self._complete = False
        self._written = 0  # bytes kept so far: a source whose length is not known ahead stops at the budget

    def first(self) -> Iterator[Batch]:
        for batch in self.batcher:
            if self.enabled:
                self._keep(batch)
            yield batch
        self._complete = self._file is not None

    def second(self) -> Iterator[Batch]:
        if not self._complete:
            yield from self.batcher
            return
        f = self._file
        f.seek(0)
        for index, valid, layout in self._index:
            arrays = {}
            for name, shape, dtype in layout:
                a = np.empty(shape, dtype=np.dtype(dtype))
                if f.readinto(memoryview(a).cast("B")) != a.nbytes:
                    raise OSError("calibration replay file is shorter than written")
                arrays[name] = a
            yield Batch(index=index, arrays=arrays, valid=valid)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._complete = False

    def __enter__(self) -> "ReplayedBatches":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _keep(self, batch: Batch) -> None:
        try:
            if self._file is None:
                if not self._fits(batch):
                    self.enabled = False
                    return
                self._file = tempfile.TemporaryFile(prefix="trtq-batches-")  # noqa: SIM115 (open until close())
            self._written += sum(int(a.nbytes) for a in batch.arrays.values())
            if self._written > self.budget:
                log.info(
                    "decoded batches passed %.0f MiB of temporary disk; the second pass reads again",
                    self.budget / 2**20,
                )
                self.enabled = False
                self.close()
                return
            layout = []
            for name, a in batch.arrays.items():
                a = np.ascontiguousarray(a)
                self._file.write(memoryview(a).cast("B"))
                layout.append((name, a.shape, a.dtype.str))
            self._index.append((batch.index, batch.valid, layout))
        except OSError as e:  # disk full, no temp dir: decode again in the second pass
            log.info("not keeping decoded batches for the second pass (%s); decoding again", e)
            self.enabled = False
            self.close()

    def _fits(self, batch: Batch) -> bool:
        need = sum(int(a.nbytes) for a in batch.arrays.values()) * max(1, self.batcher.num_batches)
        try:
            free = shutil.disk_usage(tempfile.gettempdir()).free
        except OSError:
            return False
        if need > min(self.budget, free // 2):
            log.info(
                "decoded batches would take %.0f MiB of temporary disk; the second pass decodes again", need / 2**20
            )
            return False
        return True


def _decodes_images(batcher) -> bool:
    """True when some input is decoded from image files (``.npy`` shards are memory mapped)."""
    inputs = getattr(getattr(batcher, "options", None), "inputs", None)
    if not inputs:
        return True
    return any(getattr(src, "images", None) or getattr(src, "files", None) for src in inputs.values())


__all__ = ["DISK_BUDGET", "ReplayedBatches"]
