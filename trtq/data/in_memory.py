"""Batches from data already in memory: an iterable of numpy arrays, of dicts of arrays by input
name, or of torch tensors (a ``torch.utils.data.DataLoader`` as it is; torch is never imported).

:class:`InMemoryBatches` has the surface of :class:`trtq.data.batcher.Batcher` that calibration and
compare read (``batch_size``, ``shapes``, ``num_samples``, ``num_batches``, ``skipped``, iteration,
``fingerprint``, ``describe``) and makes the batches the Batcher makes: the caller's batches are
cut into batches of ``batch_size`` samples (the model's fixed batch dim, else 8), the last one
padded with copies of its last sample and ``valid`` set to its real rows. Calibrating from memory
thus runs ONNX Runtime on the very batches ``trtq calibrate`` runs on the same samples in the same
order, and writes the same cache.

One item of the iterable, for a model with inputs ``x`` (and ``y``):

* an array ``[n, ...]`` (numpy, a torch tensor, anything numpy reads): ``n`` samples of the
  model's only input;
* a dict ``{"x": ..., "y": ...}``: ``n`` samples of each input, keyed by the model's input names;
* a tuple or list: the inputs in the model's order, extra elements ignored (a DataLoader's
  ``(images, labels)`` feeds a one-input model its images).

``data`` that is itself one array (numpy, a torch tensor) or one dict of arrays is all the samples
in one item (iterating it would give single samples, or the input names).

Values are cast to the input's dtype by numpy's ``same_kind`` rule as ``.npy`` files are
(float64 to float32; integers to float with a warning that nothing is scaled), and NaN / Inf is
refused. The first pass reads the iterable once; later passes (only where calibration's replay of
pass 1 could not keep the batches) read it again, which a generator cannot: it says so.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from trtq import interrupt
from trtq.data.batcher import DEFAULT_BATCH_SIZE, Batch
from trtq.errors import DataError
from trtq.model import TensorSpec

log = logging.getLogger(__name__)

SOURCE = "in-memory"  # what the provenance's data entry names as the source
FORMS = "numpy arrays, torch tensors, dicts of them by input name, or tuples (a DataLoader's (images, labels))"


class InMemoryBatches:
    """:class:`~trtq.data.batcher.Batcher`'s surface over an iterable of in-memory batches (module doc)."""

    def __init__(
        self, data: Iterable[Any], specs: Sequence[TensorSpec], batch_size: int | None = None, limit: int | None = None
    ):
        if isinstance(data, (Mapping, np.ndarray)) or _is_tensor(data):
            data = [data]  # all the samples at once
        if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise DataError(f"data is of type {type(data).__name__}, not an iterable of batches", f"pass {FORMS}")
        self.specs = list(specs)
        self._data = data
        self.batch_size = _batch_size(self.specs, batch_size)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise DataError(f"limit must be an integer of at least 1, got {limit!r}", "or leave it out")
        self.limit = limit  # at most this many samples, the first ones (quantize's data steps)
        self._warned: set[str] = set()  # inputs whose integer data was cast (warned once)
        self._fresh: Iterator[dict[str, np.ndarray]] | None = self._items()
        first = next(self._fresh, None)  # read ahead for the shapes; the first pass goes on from it
        if first is None:
            raise DataError("the data holds no batch", f"pass at least one batch: {FORMS}")
        self._first = first
        self.shapes = {s.name: (self.batch_size, *first[s.name].shape[1:]) for s in self.specs}
        for s in self.specs:
            _check_shape(s, self.shapes[s.name])
        rows = len(next(iter(first.values())))
        # an estimate until the first pass has counted them (a DataLoader's len is its batches)
        self.num_samples = rows * len(data) if hasattr(data, "__len__") else 0
        if limit is not None:
            self.num_samples = min(self.num_samples, limit) if self.num_samples else limit
            if iter(data) is data:  # a generator: its first `limit` samples, kept to be read again
                self._data = self._keep(limit, rows)
        self.num_batches = math.ceil(self.num_samples / self.batch_size)
        self.total_samples = self.num_samples
        self.skipped: list[tuple[str, str]] = []
        self.shard = None
        self._digest = hashlib.sha256(SOURCE.encode())
        self._counted = False

    # ------------------------------------------------------------------------------ items

    def _keep(self, limit: int, rows: int) -> list[dict[str, np.ndarray]]:
        """The checked items of a generator up to ``limit`` samples (the first read ahead), as a list
        that every pass reads; the first pass goes on from its second item."""
        kept = [self._first]
        while rows < limit:
            item = next(self._fresh, None)
            if item is None:
                break
            kept.append(item)
            rows += len(next(iter(item.values())))
        self._fresh = iter(kept[1:])
        return kept

    def _items(self) -> Iterator[dict[str, np.ndarray]]:
        """Each item of the data as {input: [n, ...] array of the input's dtype}, checked."""
        for k, item in enumerate(self._data):
            arrays = self._arrays(k, item)
            rows = {len(a) for a in arrays.values()}
            if len(rows) != 1:
                raise DataError(
                    f"batch {k}: the inputs hold different numbers of samples ({', '.join(map(str, sorted(rows)))})",
                    "give every input the same number of samples in one batch",
                )
            yield {s.name: self._cast(arrays[s.name], s, k) for s in self.specs}

    def _arrays(self, k: int, item: Any) -> dict[str, Any]:
        names = [s.name for s in self.specs]
        if isinstance(item, Mapping):
            unknown = [str(n) for n in item if n not in names]
            missing = [n for n in names if n not in item]
            if unknown or missing:
                found = ", ".join(map(str, item)) or "nothing"
                raise DataError(
                    f"batch {k} names {found}; the model's inputs are {', '.join(names)}",
                    "key each dict by the model's input names, nothing else",
                )
            return {n: as_array(item[n], f"batch {k}, input {n}") for n in names}
        if isinstance(item, (tuple, list)):
            if len(item) < len(names):
                raise DataError(
                    f"batch {k} holds {len(item)} arrays for the model's {len(names)} inputs ({', '.join(names)})",
                    "give one array per input, in the model's order, or a dict by input name",
                )
            return {n: as_array(v, f"batch {k}, input {n}") for n, v in zip(names, item)}
        if len(names) > 1:
            raise DataError(
                f"batch {k} is one array but the model has {len(names)} inputs ({', '.join(names)})",
                "give dicts by input name, or tuples in the model's input order",
            )
        return {names[0]: as_array(item, f"batch {k}")}

    def _cast(self, array: np.ndarray, spec: TensorSpec, k: int) -> np.ndarray:
        """``array`` in the input's dtype by the rule of .npy sources (trtq.data.sources.NpySource)."""
        try:
            dtype = np.dtype(spec.dtype)
        except TypeError:
            raise DataError(
                f"model input {spec.name} has dtype {spec.dtype}, which trtq cannot feed",
                "export the model with a float32 input",
            ) from None
        if array.dtype.kind not in "biufc" or array.dtype.names is not None:
            raise DataError(
                f"batch {k}, input {spec.name} has dtype {array.dtype}, which is not numeric", f"pass {FORMS}"
            )
        if not np.can_cast(array.dtype, dtype, "same_kind"):
            raise DataError(
                f"batch {k}, input {spec.name} has dtype {array.dtype}, which cannot be cast to {dtype} "
                "(the input's dtype)",
                f"convert it to {dtype}",
            )
        if array.dtype.kind in "biu" and dtype.kind == "f" and spec.name not in self._warned:
            self._warned.add(spec.name)
            log.warning(
                "input %s: %s data cast to %s as it is (no scaling; divide by 255 first if the model expects 0..1)",
                spec.name,
                array.dtype,
                dtype,
            )
        out = array if array.dtype == dtype else array.astype(dtype)
        if out.dtype.kind in "fc" and not np.isfinite(out).all():
            raise DataError(f"batch {k}, input {spec.name} has NaN or Inf values", "fix or drop those samples")
        return out

    # ------------------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Batch]:
        if self._fresh is not None:  # the first pass goes on from the item read ahead
            items, self._fresh = _chain(self._first, self._fresh), None
        elif iter(self._data) is self._data:
            raise DataError(
                "the data is a generator (an iterator), read once already, and this step reads it again",
                "pass a list, a tuple or a DataLoader, which can be read more than once",
            )
        else:
            items = self._items()
        pending: dict[str, list[np.ndarray]] = {s.name: [] for s in self.specs}
        held = index = samples = 0
        for k, arrays in enumerate(_limited(items, self.limit)):
            interrupt.check()
            for name, a in arrays.items():
                if a.shape[1:] != self.shapes[name][1:]:
                    raise DataError(
                        f"batch {k}, input {name}: samples of shape {list(a.shape[1:])} after "
                        f"{list(self.shapes[name][1:])}",
                        "give every batch the same sample shape",
                    )
                pending[name].append(a)
            held += len(next(iter(arrays.values())))
            while held >= self.batch_size:
                held -= self.batch_size
                samples += self.batch_size
                yield self._emit(index, _take(pending, self.batch_size), self.batch_size)
                index += 1
        if held:
            samples += held
            yield self._emit(index, _padded(_take(pending, held), self.batch_size), held)
            index += 1
        if samples == 0:
            raise DataError("the data holds no samples (every batch is empty)", f"pass {FORMS}")
        if not self._counted:
            self._counted = True
            self.num_samples = self.total_samples = samples
            self.num_batches = index

    def _emit(self, index: int, arrays: dict[str, np.ndarray], valid: int) -> Batch:
        if not self._counted:  # the fingerprint: the samples' bytes, in order
            for name in sorted(arrays):
                a = np.ascontiguousarray(arrays[name][:valid])
                self._digest.update(f"{name}:{a.dtype.str}:{list(a.shape)}".encode())
                self._digest.update(memoryview(a).cast("B"))
        return Batch(index, arrays, valid)

    def __len__(self) -> int:
        return self.num_batches

    # ------------------------------------------------------------------------------ reporting

    def fingerprint(self) -> str:
        """sha256 over the samples' names, dtypes, shapes and bytes in order (once read through)."""
        return self._digest.hexdigest() if self._counted else ""

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": {n: {"shape": list(shape), "source": SOURCE} for n, shape in self.shapes.items()},
            "samples": self.num_samples,
            "batches": self.num_batches,
            "batch_size": self.batch_size,
            "last_batch": "pad",
            "fingerprint": self.fingerprint(),
        }


def _is_tensor(value: Any) -> bool:
    """A torch tensor (or one of its kind), recognised without importing torch."""
    return hasattr(value, "detach") and hasattr(value, "numpy") and hasattr(value, "shape")


def as_array(value: Any, what: str) -> np.ndarray:
    """A numpy array from a numpy array, a torch tensor (detached, on the CPU; torch is not imported)
    or anything numpy reads; DataError naming ``what`` otherwise."""
    if not isinstance(value, np.ndarray) and _is_tensor(value) and hasattr(value, "cpu"):
        value = value.detach().cpu()
    if not isinstance(value, np.ndarray) and hasattr(value, "numpy"):
        try:
            value = value.numpy()
        except (TypeError, RuntimeError) as e:  # e.g. a bfloat16 tensor
            raise DataError(f"{what} cannot be read as a numpy array ({e})", "convert it to float32") from None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise DataError(f"{what} is not an array ({type(value).__name__}: {e})", f"pass {FORMS}") from None
    if array.ndim == 0:
        raise DataError(f"{what} is a scalar ({type(value).__name__})", "give arrays whose axis 0 is the sample")
    return array


def _batch_size(specs: Sequence[TensorSpec], given: int | None) -> int:
    """The Batcher's rule: the model's fixed batch dim, which ``given`` must equal; else ``given``,
    else 8."""
    fixed = sorted({s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int)})
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise DataError(f"batch_size must be an integer of at least 1, got {given!r}", "e.g. batch_size=8")
        if fixed and fixed != [given]:
            raise DataError(
                f"batch_size is {given} but the model fixes the batch dim to {fixed[0]}",
                f"pass batch_size={fixed[0]} (or leave it out)",
            )
        return given
    if len(fixed) > 1:
        raise DataError(f"the model's inputs fix different batch dims ({fixed})", "export one batch dim")
    return fixed[0] if fixed else DEFAULT_BATCH_SIZE


def _check_shape(spec: TensorSpec, shape: tuple[int, ...]) -> None:
    if len(spec.shape) != len(shape):
        hint = (
            "add the batch axis (array[None]) or batch the samples"
            if len(shape) + 1 == len(spec.shape)
            else "give arrays whose axis 0 is the sample and the rest the model's input"
        )
        raise DataError(f"input {spec.name}: batches of rank {len(shape)}, the model takes {spec.describe()}", hint)
    for i, (want, got) in enumerate(zip(spec.shape[1:], shape[1:]), 1):
        if isinstance(want, int) and want != got:
            raise DataError(
                f"input {spec.name}: samples of shape {list(shape[1:])}, the model takes {spec.describe()} "
                f"(dim {i} is {got}, not {want})",
                "resize or re-layout the data to the model's input",
            )


def _take(pending: dict[str, list[np.ndarray]], count: int) -> dict[str, np.ndarray]:
    """The first ``count`` samples of ``pending`` (consumed), one array per input."""
    out = {}
    for name, parts in pending.items():
        joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
        out[name], rest = np.ascontiguousarray(joined[:count]), joined[count:]
        parts[:] = [rest] if len(rest) else []
    return out


def _padded(arrays: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Each array grown to ``size`` rows with copies of its last row (the Batcher's padding)."""
    return {n: np.concatenate([a, np.repeat(a[-1:], size - len(a), axis=0)]) for n, a in arrays.items()}


def _limited(items: Iterator[dict[str, np.ndarray]], limit: int | None) -> Iterator[dict[str, np.ndarray]]:
    """``items`` up to ``limit`` samples in all (the item that reaches it cut), then no more read."""
    left = limit
    for arrays in items:
        rows = len(next(iter(arrays.values())))
        if left is not None and rows >= left:
            yield {n: a[:left] for n, a in arrays.items()}
            return
        if left is not None:
            left -= rows
        yield arrays


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
