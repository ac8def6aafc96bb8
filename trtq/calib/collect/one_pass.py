"""One-pass histograms over power-of-two ranges, for the ``mse`` and ``percentile`` methods.

Each tensor's histogram covers ``[0, 2**e)`` in ``num_bins`` equal bins (``num_bins`` a power of
two), ``e`` the smallest exponent with ``max|x| < 2**e`` so far. A value's bin is
``floor(|x| * num_bins * 2**-e)``: the scale is a power of two, so the product is exact in float32
and the bin at a larger exponent ``e + d`` is exactly ``floor(bin / 2**d)``. When a batch raises
the max past ``2**e``, the counts are merged in runs of ``2**d`` bins. The counts after any split of
the data (batches, orders, shards merged with :func:`merge_into`) are therefore exactly those of
one histogram over the final range: one model pass instead of a max pass plus a histogram pass,
with the same order- and batch-independence. (Ranges that grow to arbitrary values, as in
pytorch-quantization or ONNX Runtime, would make the result depend on batch order.)

Resolution: the final range is below ``2 * max``, so bins are at most twice as wide as over
``[0, max]`` (2048 bins: max/2048 to max/1024). ``entropy`` keeps the two-pass histograms over
``[0, max]``: that is TensorRT's EntropyCalibration2.

Histogramming every element is most of calibration's cost on convolutional models; with
``hist_elements`` set, a tensor whose leading dim is the batch takes every ``k``-th element of
each sample (``k`` the smallest prime with ``elements / k <= hist_elements`` that divides no dim
of the sample, so that it does not line up with rows or columns). The subset depends only on the
sample, never on how samples are batched. The max is always over every element.
"""

import functools
import math
from collections.abc import Mapping
from typing import Optional

import numpy as np

from trtq.calib.collect import kernels
from trtq.calib.collect.accumulators import batch_extremes, nonfinite_error
from trtq.errors import ConfigError

# float32 scales num_bins * 2**-e are normal numbers for these exponents; outside, float64 counting
_MIN_EXP, _MAX_EXP = -100, 128


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def exponent_of(m: float) -> Optional[int]:
    """Smallest ``e`` with ``m < 2**e`` (None for 0)."""
    if m <= 0:
        return None
    return math.frexp(m)[1]  # m = f * 2**e with 0.5 <= f < 1


def regrow(counts: np.ndarray, d: int) -> np.ndarray:
    """The counts of the same values over a range ``2**d`` times wider (same bin count)."""
    nb = counts.size
    if d <= 0:
        return counts
    out = np.zeros(nb, dtype=np.int64)
    if (1 << min(d, 62)) >= nb:
        out[0] = counts.sum()
    else:
        out[: nb >> d] = counts.reshape(nb >> d, 1 << d).sum(axis=1)
    return out


@functools.lru_cache(maxsize=4096)  # asked once per tensor and batch; the answer depends on the shape only
def stride_for(elements: int, cap: int, dims: tuple = ()) -> int:
    """1 when ``elements <= cap`` (or cap is 0: everything), else the smallest prime ``k`` with
    ``ceil(elements / k) <= cap`` that divides none of the sample's ``dims``: a stride that divides
    a row length would visit the same columns of every row (on padded maps: only the zero padding
    column, docs/decisions.md D13)."""
    if cap <= 0 or elements <= cap:
        return 1
    k = max(2, -(-elements // cap))
    while True:
        if all(k % p for p in range(2, int(math.isqrt(k)) + 1)) and all(int(d) % k for d in dims if int(d) > 0):
            return k
        k += 1


class Pow2Histograms:
    """Running ``max|x|``, exponent, counts and exact zeros per tensor.

    With ``hist_elements`` > 0, subsampled: the tensors of ``batch_leading`` (leading dim = the
    batch), or every tensor when ``one_sample_calls`` (each model call holds one sample)."""

    def __init__(
        self,
        tensors,
        num_bins: int,
        hist_elements: int = 0,
        batch_leading: Optional[set] = None,
        one_sample_calls: bool = False,
    ):
        if not is_pow2(int(num_bins)):
            raise ConfigError(f"one-pass histograms need a power-of-two bin count, got {num_bins}")
        self.num_bins = int(num_bins)
        self.hist_elements = int(hist_elements)
        self.batch_leading = set(batch_leading or ())
        self.one_sample_calls = bool(one_sample_calls)
        self.maxima: dict[str, float] = {n: 0.0 for n in tensors}
        self.exponents: dict[str, Optional[int]] = {n: None for n in tensors}
        self.counts: dict[str, np.ndarray] = {n: np.zeros(self.num_bins, dtype=np.int64) for n in tensors}
        self.zeros: dict[str, int] = {n: 0 for n in tensors}
        self.strides: dict[str, int] = {}  # the stride each subsampled tensor took (for the log)

    @property
    def tops(self) -> dict[str, float]:
        """Upper edge of each histogram (0.0 for a tensor that was all zeros)."""
        return {n: (math.ldexp(1.0, e) if e is not None else 0.0) for n, e in self.exponents.items()}

    def _raise_to(self, name: str, e: int) -> None:
        old = self.exponents[name]
        if old is None:
            self.exponents[name] = e  # only zeros so far: they stay in bin 0
        elif e > old:
            self.counts[name] = regrow(self.counts[name], e - old)
            self.exponents[name] = e

    def add(self, name: str, counts: np.ndarray, exponent: Optional[int], zeros: int) -> None:
        """Add counts taken over ``[0, 2**exponent)`` (None: zeros only, all in bin 0) to ``name``'s:
        both are brought to the wider of the two ranges (exact: :func:`regrow`)."""
        c = np.asarray(counts, dtype=np.int64)
        if exponent is not None:
            self._raise_to(name, exponent)
            c = regrow(c, self.exponents[name] - exponent)
        self.counts[name] = self.counts[name] + c
        self.zeros[name] += int(zeros)

    def _stride(self, name: str, a: np.ndarray) -> tuple[np.ndarray, int]:
        """(rows [R, n], stride): each row one sample, every stride-th element of it counted."""
        if self.hist_elements > 0 and a.ndim >= 1 and (self.one_sample_calls or name in self.batch_leading):
            rows = 1 if self.one_sample_calls else a.shape[0]
            k = stride_for(a.size // rows, self.hist_elements, tuple(a.shape if self.one_sample_calls else a.shape[1:]))
            if k > 1:
                self.strides[name] = k
                return np.ascontiguousarray(a).reshape(rows, -1), k
        return np.ascontiguousarray(a).reshape(1, -1), 1

    def update_batch(self, arrays: Mapping[str, np.ndarray]) -> None:
        unknown = next((name for name in arrays if name not in self.counts), None)
        if unknown is not None:
            raise ValueError(f"tensor '{unknown}' is not collected")
        fused = kernels.pow2_kernel() is not None
        # a range already below 2**_MIN_EXP has no float32 scale: those tensors keep the float64 path
        one_read = {
            n: a
            for n, a in arrays.items()
            if fused
            and np.asarray(a).dtype == np.float32
            and (self.exponents[n] is None or self.exponents[n] >= _MIN_EXP)
        }
        rest = {n: a for n, a in arrays.items() if n not in one_read}
        if one_read:
            rest.update(self._update_one_read(one_read))
        if rest:
            self._update_two_reads(rest)

    def _update_one_read(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """float32 tensors, max and counts in one read (the compiled kernel); returns the tensors whose range
        stays below 2**_MIN_EXP, for the float64 path."""
        tasks = []
        for name, a in arrays.items():
            a = np.asarray(a)
            if a.size == 0:
                continue
            rows, k = self._stride(name, a)
            e0 = self.exponents[name]
            if k == 1:
                tasks += [(name, p.reshape(1, -1), 1, e0) for p in kernels.parts(rows.reshape(-1))]
            else:  # every element of a row is read (the max), every k-th counted
                per_task = max(1, kernels.PART // rows.shape[1])
                tasks += [(name, rows[i : i + per_task], k, e0) for i in range(0, rows.shape[0], per_task)]
        nb = self.num_bins
        results = kernels.map_bundled(
            lambda t: kernels.pow2_histogram(t[1], t[2], t[3], nb, _MIN_EXP), tasks, [t[1].size for t in tasks]
        )
        by_name: dict[str, list] = {}
        for task, result in zip(tasks, results):
            by_name.setdefault(task[0], []).append(result)
        tiny = {}
        for name, parts in by_name.items():
            if any(status == kernels.POW2_NONFINITE for *_, status in parts):
                raise nonfinite_error(name)
            if any(status == kernels.POW2_TINY for *_, status in parts):
                tiny[name] = arrays[name]
                continue
            self.maxima[name] = max(self.maxima[name], *(m for _, _, m, _, _ in parts))
            for counts, e, _, zeros, _ in parts:  # each part reached its own range
                self.add(name, counts, e, zeros)
        return tiny

    def _update_two_reads(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The max first (numpy), then the counts: other dtypes, the numpy fallback, tiny ranges."""
        extremes = batch_extremes(arrays)
        work = [(name, np.asarray(arrays[name])) for name in extremes]
        for name, (lo, hi) in extremes.items():
            m = max(hi, -lo)
            if m > self.maxima[name]:
                self.maxima[name] = m
            e = exponent_of(m)
            if e is not None:
                self._raise_to(name, e)
        hist_tasks, special = [], []
        for name, a in work:
            e = self.exponents[name]
            rows, k = self._stride(name, a)
            if e is None:  # all zeros so far
                n = rows.shape[0] * -(-rows.shape[1] // k)
                self.counts[name][0] += n
                self.zeros[name] += n
            elif _MIN_EXP <= e <= _MAX_EXP:
                scale = np.float32(math.ldexp(float(self.num_bins), -e))
                if k == 1:
                    hist_tasks += [(name, scale, p, 1) for p in kernels.parts(rows.reshape(-1))]
                else:  # one task counts about PART elements: the rows of a strided tensor share tasks
                    per_task = max(1, kernels.PART // -(-rows.shape[1] // k))
                    hist_tasks += [(name, scale, rows[i : i + per_task], k) for i in range(0, rows.shape[0], per_task)]
            else:
                special.append((name, rows[:, ::k].reshape(-1)))
        nb = self.num_bins

        def count(task):
            _, scale, block, k = task
            c = np.zeros(nb, dtype=np.int64)
            z, flags = kernels.histogram_into(block, scale, c, k)
            return c, z, flags

        counted = [t[2].shape[0] * -(-t[2].shape[-1] // t[3]) if t[2].ndim == 2 else t[2].size for t in hist_tasks]
        for (name, *_), (c, z, flags) in zip(hist_tasks, kernels.map_bundled(count, hist_tasks, counted)):
            if flags & kernels.NONFINITE:
                raise nonfinite_error(name)
            self.counts[name] += c
            self.zeros[name] += z
        for name, sel in special:
            self._count_float64(name, sel)

    def _count_float64(self, name: str, sel: np.ndarray) -> None:
        """Exponents where ``num_bins * 2**-e`` is not a normal float32: the same bins in float64."""
        x = np.abs(sel, dtype=np.float64)
        y = np.ldexp(x, -self.exponents[name]) * self.num_bins
        k = np.minimum(y, self.num_bins - 1).astype(np.intp)
        self.counts[name] += np.bincount(k, minlength=self.num_bins)
        self.zeros[name] += int(x.size - np.count_nonzero(x))


def merge_into(
    target: Pow2Histograms,
    maxima: Mapping[str, float],
    tops: Mapping[str, float],
    counts: Mapping[str, np.ndarray],
    zeros: Mapping[str, int],
) -> None:
    """Add saved pow2 statistics (another shard's) to ``target``: ranges raised to the larger one."""
    for name in target.counts:
        top = float(tops[name])
        target.add(
            name,
            counts[name],
            exponent_of(top) - 1 if top > 0 else None,  # top = 2**e exactly
            zeros.get(name, 0),
        )
        target.maxima[name] = max(target.maxima[name], float(maxima[name]))
