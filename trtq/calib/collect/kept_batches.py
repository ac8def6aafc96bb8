"""Decoded batches of one shard kept on disk between its two passes (``calibrate --keep-batches``).

A single run decodes the photos once and replays them for pass 2 (trtq.calib.collect.replay); a shard's
two passes are separate processes, so pass 1 can write its decoded batches to a file that pass 2
of the same shard reads instead of decoding again. The file is raw array bytes followed by a JSON
footer (data fingerprint, shard, per-batch layout, skipped samples) and its length, written
atomically (a pass that fails leaves no file). Pass 2 uses it only when the footer names the same
data set and shard; a file of another shard or data set is refused, a missing one means decoding.
"""

import json
import logging
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Optional

import numpy as np

from trtq.data.batcher import Batch
from trtq.errors import CacheError
from trtq.fileio import atomic_path

log = logging.getLogger(__name__)

MAGIC = b"TRTQBATCH1"
FORMAT = "trtq-batches/1"


def identity(batcher) -> dict:
    return {"fingerprint": batcher.fingerprint(), "shard": list(batcher.shard) if batcher.shard else None}


def write_through(batches: Iterable[Batch], path: Path, batcher) -> Iterator[Batch]:
    """Yield ``batches`` unchanged while writing them to ``path``; the file appears only when the
    iteration completes."""
    layout: list[list] = []
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(MAGIC)
        for batch in batches:
            arrays = []
            for name, a in batch.arrays.items():
                a = np.ascontiguousarray(a)
                f.write(memoryview(a).cast("B"))
                arrays.append([name, list(a.shape), a.dtype.str])
            layout.append([batch.index, batch.valid, arrays])
            yield batch
        footer = dict(
            identity(batcher), format=FORMAT, batches=layout, skipped=[list(s) for s in getattr(batcher, "skipped", [])]
        )
        blob = json.dumps(footer).encode("utf-8")
        f.write(blob)
        f.write(struct.pack("<Q", len(blob)))


def _footer(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise ValueError("magic")
            f.seek(-8, 2)
            n = struct.unpack("<Q", f.read(8))[0]
            f.seek(-8 - n, 2)
            return json.loads(f.read(n).decode("utf-8"))
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as e:
        raise CacheError(
            f"{path} is not a trtq batch file ({type(e).__name__})", "delete it; pass 2 then decodes the data again"
        ) from None


def open_batches(path: Path, batcher) -> Optional[Iterator[Batch]]:
    """Batches of this shard from ``path`` (and ``batcher.skipped`` restored), or None when there is
    no file; CacheError when the file belongs to another data set or shard."""
    path = Path(path)
    if not path.is_file():
        log.info("no kept batches at %s; decoding the data again", path)
        return None
    footer = _footer(path)
    want = identity(batcher)
    if footer.get("format") != FORMAT or footer.get("fingerprint") != want["fingerprint"]:
        raise CacheError(
            f"--keep-batches {path} holds batches of another data set or preprocessing",
            "delete it, or pass the file pass 1 of this shard wrote",
        )
    if footer.get("shard") != want["shard"]:
        raise CacheError(
            f"--keep-batches {path} holds shard {footer.get('shard')}, this is shard {want['shard']}",
            "pass each shard its own file (e.g. batches-I.bin)",
        )
    batcher.skipped = [tuple(s) for s in footer.get("skipped", [])]
    return _read(path, footer["batches"])


def _read(path: Path, layout: list) -> Iterator[Batch]:
    with open(path, "rb") as f:
        f.seek(len(MAGIC))
        for index, valid, arrays in layout:
            out = {}
            for name, shape, dtype in arrays:
                a = np.empty(tuple(shape), dtype=np.dtype(dtype))
                if f.readinto(memoryview(a).cast("B")) != a.nbytes:
                    raise CacheError(f"{path} is truncated", "delete it; pass 2 then decodes the data again")
                out[name] = a
            yield Batch(index=index, arrays=out, valid=valid)
