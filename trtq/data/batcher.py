"""Batches of model inputs from the configured sources, decoded ahead by a pool of threads.

Contract (docs/internals.md, section Data): ``iter(batcher)`` yields :class:`Batch` objects with the
same bytes in the same order on every pass and every run, whatever the number of workers. Memory
is bounded by ``prefetch`` batches, not by the size of the data set.
"""

import hashlib
import json
import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from trtq import interrupt
from trtq.config import DataOptions
from trtq.data.sources import SampleError, make_source
from trtq.errors import ConfigError, DataError
from trtq.memory import physical_memory
from trtq.model import TensorSpec, resolve_shapes

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 8
FINGERPRINT_VERSION = 1


@dataclass
class Batch:
    """One batch. Rows ``valid:`` of every array are padding (copies of the last real sample)."""

    index: int
    arrays: dict[str, np.ndarray]
    valid: int


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class Batcher:
    """Re-iterable source of :class:`Batch` for a model's inputs.

    Attributes: ``batch_size``, ``num_samples`` and ``num_batches`` (before any skipping),
    ``shapes`` (full batch shape per input), ``skipped`` (``(path, reason)`` pairs recorded by the
    latest pass when ``skip_bad`` is set).
    """

    def __init__(self, options: DataOptions, specs: Sequence[TensorSpec]):
        self.options = options
        self.specs = list(specs)
        self._check_options()
        self._check_names()
        self.batch_size = self._batch_size()
        self.shapes: dict[str, tuple[int, ...]] = resolve_shapes(self.specs, self._given_shapes(), self.batch_size)
        for s in self.specs:
            if len(self.shapes[s.name]) == 0:
                raise DataError(f"model input {s.describe()} is a scalar", "trtq feeds batched inputs only")
        self._check_batch_memory()
        self.sources = {
            s.name: make_source(s.name, options.inputs[s.name], self.shapes[s.name][1:], s.dtype, options.skip_bad)
            for s in self.specs
        }
        counts = {name: len(src) for name, src in self.sources.items()}
        if len(set(counts.values())) > 1:
            raise DataError(
                "the inputs' sources hold different numbers of samples: "
                + ", ".join(f"{n}={c}" for n, c in counts.items()),
                "give every input the same number of samples (sample i of each input forms one example)",
            )
        total = next(iter(counts.values()))
        self.total_samples = total
        order = np.random.default_rng(options.seed).permutation(total) if options.shuffle else np.arange(total)
        if options.limit is not None:
            order = order[: options.limit]
        self._order = order.astype(np.int64)
        self._full_order = self._order  # what fingerprint() names, also for a shard (take_shard)
        self.shard = None
        self.num_samples = int(len(self._order))
        bs = self.batch_size
        if options.last_batch == "keep" and not self._dynamic_batch():
            fixed = [s.describe() for s in self.specs if s.shape and isinstance(s.shape[0], int)]
            raise DataError(
                "data.last_batch keep makes a smaller last batch, but the model fixes the batch dim: "
                + ", ".join(fixed),
                "use last_batch: pad (repeat the last sample) or drop",
            )
        if options.last_batch == "drop":
            self.num_batches = self.num_samples // bs
            if self.num_batches == 0:
                raise DataError(
                    f"only {self.num_samples} samples, fewer than one batch of {bs}, and data.last_batch is drop",
                    "lower data.batch_size, add data, or use last_batch: pad",
                )
        else:
            self.num_batches = -(-self.num_samples // bs)
        self.workers = default_workers() if options.workers is None else int(options.workers)
        self.prefetch = max(1, int(options.prefetch))
        self.skipped: list[tuple[str, str]] = []

    def take_shard(self, index: int, count: int) -> None:
        """Keep only the samples at positions ``p`` with ``p % count == index`` of the full order.

        Positions are taken in the sorted (or seeded-shuffled) sample order, so the split does not
        depend on file order on disk; :meth:`fingerprint` keeps naming the whole data set, which is
        what lets shards be checked against each other when they are merged (trtq.calib.shard).
        """
        if self.shard is not None:
            raise ValueError("take_shard may be called once")
        if self.options.last_batch == "drop":
            raise ConfigError(
                "--shard with data.last_batch drop: which samples a single run drops depends on all shards",
                "use last_batch: pad (the default; padding rows never enter the statistics)",
            )
        self._order = self._full_order[index::count]
        self.shard = (int(index), int(count))
        self.num_samples = int(len(self._order))
        self.num_batches = -(-self.num_samples // self.batch_size)

    def _given_shapes(self) -> dict[str, tuple[int, ...]]:
        """data.shapes, plus the dynamic dims of .npy-fed inputs taken from their first file (the
        arrays are fed as they are, so their shape is the only one that can work)."""
        from trtq.data.sources import npy_sample_shape

        shapes = dict(self.options.shapes)
        for s in self.specs:
            if s.name in shapes or all(isinstance(d, int) for d in s.shape[1:]):
                continue
            src = self.options.inputs.get(s.name)
            sample = npy_sample_shape(src) if src is not None else None
            if sample is None or len(sample) + 1 != len(s.shape):
                continue
            dims = [d if isinstance(d, int) else sample[i - 1] for i, d in enumerate(s.shape)]
            dims[0] = s.shape[0] if isinstance(s.shape[0], int) else self.batch_size
            shapes[s.name] = tuple(dims)
        return shapes

    # ------------------------------------------------------------------------------ setup checks

    def _check_options(self) -> None:
        o = self.options
        if o.batch_size is not None and o.batch_size < 1:
            raise ConfigError(
                f"data.batch_size must be at least 1, got {o.batch_size}",
                "e.g. --batch-size 8, or leave it unset for the model's batch dim",
            )
        if o.limit is not None and o.limit < 1:
            raise ConfigError(f"data.limit must be at least 1, got {o.limit}", "leave it unset to use all samples")
        if o.workers is not None and o.workers < 0:
            raise ConfigError(
                f"data.workers must be 0 (decode in the caller's thread) or more, got {o.workers}",
                "e.g. --workers 4, or leave it unset",
            )
        if o.prefetch < 1:
            raise ConfigError(f"data.prefetch must be at least 1, got {o.prefetch}", "e.g. data.prefetch: 2")
        if o.last_batch not in ("pad", "drop", "keep"):
            raise ConfigError(
                f"data.last_batch must be pad, drop or keep, got {o.last_batch!r}", "e.g. data.last_batch: pad"
            )

    def _check_batch_memory(self) -> None:
        """ConfigError when one batch of inputs alone would take more than half the memory."""
        total = 0
        for s in self.specs:
            try:
                itemsize = np.dtype(s.dtype).itemsize
            except TypeError:
                itemsize = 4
            total += int(np.prod([int(d) for d in self.shapes[s.name]], dtype=object)) * itemsize
        limit = (physical_memory() or 1 << 40) // 2  # 1 TiB when unknown
        if total > limit:
            raise ConfigError(
                f"data.batch_size {self.batch_size} needs {total / 2**30:.1f} GiB for one batch of inputs "
                f"(more than half of this machine's {limit * 2 / 2**30:.1f} GiB)",
                "lower --batch-size (8 to 64 is typical)",
            )

    def _check_names(self) -> None:
        model = [s.name for s in self.specs]
        config = list(self.options.inputs)
        if not config:
            raise DataError(
                "no data configured", "set data.inputs.<input>: {images: DIR} in the config, or pass --data"
            )
        unknown = [n for n in config if n not in model]
        missing = [n for n in model if n not in config]
        if unknown or missing:
            parts = []
            if unknown:
                parts.append("config names " + ", ".join(unknown) + " which the model lacks")
            if missing:
                parts.append("model input(s) " + ", ".join(missing) + " have no data")
            raise DataError(
                "data.inputs does not match the model inputs: " + "; ".join(parts),
                f"model inputs: {', '.join(model)}; data.inputs: {', '.join(config)}",
            )

    def _batch_size(self) -> int:
        o = self.options
        fixed: dict[str, tuple[int, str]] = {}
        for s in self.specs:
            if s.name in o.shapes and len(o.shapes[s.name]) > 0:
                fixed[s.name] = (int(o.shapes[s.name][0]), f"data.shapes.{s.name}[0]")
            if s.shape and isinstance(s.shape[0], int):
                fixed[s.name] = (s.shape[0], f"the model's fixed batch dim of {s.name}")
        if o.batch_size is not None:
            for value, what in fixed.values():
                if value != o.batch_size:
                    raise DataError(
                        f"data.batch_size is {o.batch_size} but {what} is {value}",
                        f"set data.batch_size: {value} (or leave it unset)",
                    )
            return int(o.batch_size)
        values = sorted({v for v, _ in fixed.values()})
        if len(values) > 1:
            raise DataError(
                "the inputs disagree on the batch size: " + ", ".join(f"{w} is {v}" for v, w in fixed.values()),
                "make data.shapes agree with the model",
            )
        if values:
            return values[0]
        return DEFAULT_BATCH_SIZE

    def _dynamic_batch(self) -> bool:
        return all(s.shape and not isinstance(s.shape[0], int) for s in self.specs)

    # ------------------------------------------------------------------------------ iteration

    def _load(self, index: int) -> dict[str, np.ndarray]:
        return {name: src.load(index) for name, src in self.sources.items()}

    def _samples(self) -> Iterator[tuple[int, Any]]:
        """(source index, arrays or SampleError) in order, decoded ahead by the worker pool."""
        order = self._order
        if self.workers == 0:
            for i in order.tolist():
                yield i, _call(self._load, i)
            return
        window = self.prefetch * self.batch_size
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="trtq-data")
        pending: deque[tuple[int, Future]] = deque()
        todo = iter(order.tolist())
        interrupted = False
        try:
            for i in todo:
                pending.append((i, pool.submit(_call, self._load, i)))
                if len(pending) >= window:
                    break
            while pending:
                i, fut = pending.popleft()
                result = fut.result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(_call, self._load, nxt)))
                yield i, result
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            for _, fut in pending:
                fut.cancel()
            # after Ctrl-C / SIGTERM, no join: the interrupt may have hit pool.submit between taking
            # and releasing the lock of the pool's idle semaphore (Python-level lock code), and a
            # worker then waits on it forever; the process ends without its workers (os._exit)
            pool.shutdown(wait=not interrupted, cancel_futures=interrupted)

    def __iter__(self) -> Iterator[Batch]:
        # sub-folders that could not be listed (skip_bad) count as skipped on every pass
        skipped: list[tuple[str, str]] = [u for src in self.sources.values() for u in getattr(src, "unreadable", [])]
        self.skipped = skipped
        bs = self.batch_size
        rows: list[dict[str, np.ndarray]] = []
        index = 0
        for _, result in self._samples():
            interrupt.check()  # an interrupt swallowed by a finalizer is raised again here
            if isinstance(result, SampleError):
                if self.options.skip_bad and result.skippable:
                    log.warning("skipping %s: %s", result.path, result.reason)
                    skipped.append((result.path, result.reason))
                    continue
                raise result
            rows.append(result)
            if len(rows) == bs:
                yield self._stack(index, rows, bs)
                index += 1
                rows = []
        if rows:
            policy = self.options.last_batch
            if policy == "pad":
                yield self._stack(index, rows, bs)
            elif policy == "keep":
                yield self._stack(index, rows, len(rows))

    def _stack(self, index: int, rows: list[dict[str, np.ndarray]], size: int) -> Batch:
        arrays = {}
        for name in self.sources:
            first = rows[0][name]
            out = np.empty((size,) + first.shape, first.dtype)
            for r, row in enumerate(rows):
                out[r] = row[name]
            if len(rows) < size:
                out[len(rows) :] = rows[-1][name]
            arrays[name] = out
        return Batch(index, arrays, len(rows))

    def __len__(self) -> int:
        return self.num_batches

    # ------------------------------------------------------------------------------ reporting

    def fingerprint(self) -> str:
        """sha256 of the ordered sample list and everything that shapes a sample (no decoding)."""
        h = hashlib.sha256()
        head = {
            "version": FINGERPRINT_VERSION,
            "inputs": {
                name: {
                    "kind": src.kind,
                    "items": src.identity(),
                    "sample_shape": list(src.sample_shape),
                    "dtype": str(src.dtype),
                    "preprocess": asdict(src.preprocess.options) if hasattr(src, "preprocess") else None,
                }
                for name, src in sorted(self.sources.items())
            },
        }
        h.update(json.dumps(head, sort_keys=True).encode("utf-8"))
        h.update(self._full_order.astype("<i8").tobytes())
        return h.hexdigest()

    def describe(self) -> dict[str, Any]:
        o = self.options
        return {
            "inputs": {
                name: {
                    "shape": list(self.shapes[name]),
                    "dtype": str(src.dtype),
                    "source": src.describe(),
                }
                for name, src in self.sources.items()
            },
            "samples": self.num_samples,
            "available": self.total_samples,
            "batches": self.num_batches,
            "batch_size": self.batch_size,
            "last_batch": o.last_batch,
            "limit": o.limit,
            "shuffle": o.shuffle,
            "seed": o.seed,
            "skip_bad": o.skip_bad,
            "workers": self.workers,
            "prefetch": self.prefetch,
            "fingerprint": self.fingerprint(),
        }


def _call(fn: Callable[[int], Any], i: int) -> Any:
    """Run ``fn(i)``; a SampleError is returned (so skip_bad can decide), anything else raises."""
    try:
        return fn(i)
    except SampleError as e:
        return e
