"""Streaming, bounded-memory, exactly mergeable activation statistics: one accumulator per pass.

* :class:`AbsMaxAccumulator` keeps the running ``max|x|`` of every tensor (and its signed extremes).
* :class:`HistogramAccumulator` histograms ``|x|`` over *fixed* edges
  ``linspace(0, max|x|, num_bins + 1)`` taken from the first pass. Because the edges never move,
  histograms of any split of the data (batches, shards, orders) add up to exactly the same counts.

Only the arrays handed to ``update`` are touched; nothing of a batch is kept. Memory is
``tensors x num_bins x 8`` bytes. The per-array work runs on trtq.calib.collect.kernels.
"""

import math
from collections.abc import Mapping
from typing import Optional

import numpy as np

from trtq.calib.collect import kernels
from trtq.errors import ConfigError, DataError

DEFAULT_NUM_BINS = 2048


def nonfinite_error(name: str) -> DataError:
    return DataError(
        f"non-finite values (NaN/Inf) in activation '{name}'",
        "check the inputs and that the model runs correctly in FP32 (e.g. run trtq compare on a few samples)",
    )


# --------------------------------------------------------------------------------------------
# pass 1: max |x|
# --------------------------------------------------------------------------------------------


def batch_extremes(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Signed ``(min, max)`` of every non-empty array, reduced in parallel (large arrays split,
    small ones bundled into shared tasks). DataError for a non-numeric dtype or a NaN / Inf."""
    tasks = []
    for name, array in arrays.items():
        a = np.asarray(array)
        if a.size == 0:
            continue
        if a.dtype.kind not in "fiub":
            raise DataError(f"activation '{name}' has non-numeric dtype {a.dtype}", "calibrate float tensors only")
        tasks += [(name, p) for p in kernels.parts(a.reshape(-1))]
    results = kernels.map_bundled(lambda t: kernels.abs_max_min(t[1]), tasks, [p.size for _, p in tasks])
    out: dict[str, tuple[float, float]] = {}
    for (name, _), (hi, lo) in zip(tasks, results):
        if not (math.isfinite(hi) and math.isfinite(lo)):  # NaN propagates through max and min
            raise nonfinite_error(name)
        old = out.get(name)
        out[name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return out


class AbsMaxAccumulator:
    """Running ``max|x|`` per tensor (float64). Tensors keep the order in which they were first seen."""

    def __init__(self) -> None:
        self._max: dict[str, float] = {}
        self._ext: dict[str, tuple[float, float]] = {}  # signed (min, max), for trtq.calib.collect.derive

    def update(self, name: str, array) -> None:
        self.update_batch({name: array})

    def update_batch(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Fold one batch of activations in; the tensors are reduced in parallel."""
        for name, array in arrays.items():
            if np.asarray(array).size == 0:
                self.add_extremes(name, None)
        for name, extremes in batch_extremes(arrays).items():
            self.add_extremes(name, extremes)

    def _fold(self, name: str, m: float, ext: Optional[tuple[float, float]]) -> None:
        prev = self._max.get(name)
        if prev is None or m > prev:
            self._max[name] = m
        if ext is not None:
            old = self._ext.get(name)
            self._ext[name] = ext if old is None else (min(old[0], ext[0]), max(old[1], ext[1]))

    @property
    def maxima(self) -> dict[str, float]:
        return dict(self._max)

    @property
    def extremes(self) -> dict[str, tuple[float, float]]:
        """Signed ``(min, max)`` per tensor that had any element."""
        return dict(self._ext)

    def add_extremes(self, name: str, extremes: Optional[tuple[float, float]]) -> None:
        """Fold one tensor's signed ``(min, max)`` in (from :meth:`update_batch`, or trtq.calib.collect.ingraph's
        operator); None: the tensor had no element."""
        if extremes is None:
            self._max.setdefault(name, 0.0)
        else:
            self._fold(name, max(extremes[1], -extremes[0]), extremes)

    def add_derived(self, amax: Mapping[str, float]) -> None:
        """Maxima known without measuring (see trtq.calib.collect.derive); kept in the given order."""
        for name, m in amax.items():
            self._max[name] = float(m)

    def merge(self, other: "AbsMaxAccumulator") -> None:
        for name, m in other._max.items():
            self._fold(name, m, other._ext.get(name))


# --------------------------------------------------------------------------------------------
# pass 2: histogram of |x| over fixed edges
# --------------------------------------------------------------------------------------------


class HistogramAccumulator:
    """Histogram of ``|x|`` per tensor over ``linspace(0, maxima[name], num_bins + 1)`` (int64 counts).

    Bin of a value: ``floor(|x| * (num_bins / max))`` computed in float32, clipped to
    ``num_bins - 1``; so a value equal to the max lands in the last bin, and a value above the
    first-pass max (the data changed between passes) is counted in the last bin and the tensor is
    listed in :attr:`exceeded`. A tensor with max 0 counts everything in bin 0.

    Exact zeros are also counted on their own (:attr:`zeros`; they are in bin 0 too): the
    entropy method leaves them out, as TensorRT's EntropyCalibration2 does (measured: with them,
    the ~30-90% zeros of a ReLU6 output pin its range to 0.75 instead of TensorRT's 6.0).
    """

    def __init__(self, maxima: Mapping[str, float], num_bins: int = DEFAULT_NUM_BINS):
        if int(num_bins) < 1:
            raise ConfigError(
                f"num_bins must be a positive integer, got {num_bins}",
                f"e.g. --num-bins {DEFAULT_NUM_BINS} (TensorRT's)",
            )
        self.num_bins = int(num_bins)
        self.maxima: dict[str, float] = {}
        self._counts: dict[str, np.ndarray] = {}
        self._scale: dict[str, Optional[np.float32]] = {}
        self._zeros: dict[str, int] = {}
        self.exceeded = set()
        for name, m in maxima.items():
            m = float(m)
            if not math.isfinite(m) or m < 0:
                raise DataError(f"max of activation '{name}' is {m}", "re-run the max pass on finite data")
            self.maxima[name] = m
            self._counts[name] = np.zeros(self.num_bins, dtype=np.int64)
            self._zeros[name] = 0
            # bins per unit; None when num_bins / m overflows float32 (m < ~6e-36): float64 path
            scale = self.num_bins / m if m > 0 else 0.0
            self._scale[name] = np.float32(scale) if scale < 1e38 else None

    def update(self, name: str, array) -> None:
        self.update_batch({name: array})

    def update_batch(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Fold one batch of activations in; large tensors are split and counted in parallel."""
        tasks = []
        for name, array in arrays.items():
            if name not in self._counts:
                raise ValueError(f"tensor '{name}' has no max from the first pass")
            a = np.asarray(array)
            if a.size == 0:
                continue
            if self.maxima[name] == 0.0 or self._scale[name] is None:
                self._update_special(name, a)
                continue
            tasks += [(name, p) for p in kernels.parts(a.reshape(-1))]
        nb = self.num_bins

        def count(task):
            name, part = task
            c = np.zeros(nb, dtype=np.int64)
            zeros, flags = kernels.histogram_into(part, self._scale[name], c)
            return c, zeros, flags

        results = kernels.map_bundled(count, tasks, [p.size for _, p in tasks])
        for (name, _), (_, _, flags) in zip(tasks, results):
            if flags & kernels.NONFINITE:
                raise nonfinite_error(name)
        for (name, _), (c, zeros, flags) in zip(tasks, results):
            self.add_counts(name, c, zeros, bool(flags & kernels.EXCEEDED))

    def add_counts(self, name: str, counts: np.ndarray, zeros: int, exceeded: bool) -> None:
        """Add counts over this tensor's edges (from :meth:`update_batch`, or trtq.calib.collect.ingraph's operator)."""
        self._counts[name] += counts
        self._zeros[name] += int(zeros)
        if exceeded:
            self.exceeded.add(name)

    def _update_special(self, name: str, a: np.ndarray) -> None:
        """Max 0 (everything in bin 0), or a max so small that num_bins / max overflows float32."""
        counts = self._counts[name]
        if self.maxima[name] == 0.0:
            if not np.isfinite(a).all():
                raise nonfinite_error(name)
            nonzero = int(np.count_nonzero(a))
            if nonzero:
                self.exceeded.add(name)
            counts[0] += a.size
            self._zeros[name] += a.size - nonzero
            return
        x = np.abs(a.reshape(-1), dtype=np.float64)  # divide first so nothing overflows
        np.divide(x, self.maxima[name], out=x)
        np.multiply(x, float(self.num_bins), out=x)
        top = float(x.max())  # NaN propagates; Inf stays Inf
        if not math.isfinite(top):
            raise nonfinite_error(name)
        if top >= self.num_bins:
            if top >= self.num_bins * (1.0 + 1e-6):
                self.exceeded.add(name)
            np.minimum(x, self.num_bins - 1, out=x)
        counts += np.bincount(x.astype(np.intp), minlength=self.num_bins)
        self._zeros[name] += x.size - int(np.count_nonzero(x))

    @property
    def counts(self) -> dict[str, np.ndarray]:
        return {name: c.copy() for name, c in self._counts.items()}

    @property
    def zeros(self) -> dict[str, int]:
        """Exact zeros seen per tensor (a subset of bin 0)."""
        return dict(self._zeros)

    def merge(self, other: "HistogramAccumulator") -> None:
        """Add ``other``'s counts; both must use the same edges for every shared tensor."""
        if other.num_bins != self.num_bins:
            raise ValueError(f"cannot merge histograms with {other.num_bins} and {self.num_bins} bins")
        for name, m in other.maxima.items():
            if name in self.maxima and self.maxima[name] != m:
                raise ValueError(
                    f"cannot merge histograms of '{name}': different edges (max {m!r} vs {self.maxima[name]!r})"
                )
        for name, m in other.maxima.items():
            if name in self._counts:
                self._counts[name] += other._counts[name]
                self._zeros[name] += other._zeros[name]
            else:
                self.maxima[name] = m
                self._counts[name] = other._counts[name].copy()
                self._zeros[name] = other._zeros[name]
                self._scale[name] = other._scale[name]
        self.exceeded |= other.exceeded
