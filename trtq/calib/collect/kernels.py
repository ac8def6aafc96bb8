"""Per-array work of the two calibration passes, spread over the CPU cores.

* :func:`abs_max_min` - ``(max, min)`` of an array (numpy; its reductions release the GIL).
* :func:`histogram_into` - add the counts of ``floor(|x| * scale)`` (clipped to the last bin) of
  one array to ``counts``, and report exact zeros, non-finite values and values past the last edge.

``histogram_into`` (and the one-pass :func:`pow2_histogram`, the range search's :func:`level_sums`)
have two implementations that give bit-identical results:

* the compiled kernels of trtq.calib.collect.compiled (built at install where a C compiler is
  found; ``TRTQ_NO_NATIVE=1`` skips them): per block of 4096 elements a vectorised max, then the
  counts (no clamp where the max is below the last bin);
* numpy on small reused scratch buffers: the reference the compiled kernels are tested against
  (tests/calib/test_kernels.py, test_one_pass.py, test_search.py), and the fallback where they were
  not built (slower per element: benchmarks/README.md has the figures).

Work is split into parts of at most :data:`PART` elements and run on a thread pool as wide as the
usable cores; each part has its own counts, summed at the end, so the result is independent of the
split and the thread count.
"""

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, TypeVar

import numpy as np

PART = 1 << 21  # elements per parallel task (8 MiB of float32)
_CHUNK = 1 << 16  # elements per step of the numpy fallback (scratch stays in L2 cache)

NONFINITE = 1  # flag: NaN or Inf seen
EXCEEDED = 2  # flag: a value past num_bins * (1 + 1e-6), i.e. above the first-pass max
_EXCEED_TOLERANCE = 1.0 + 1e-6

T = TypeVar("T")
R = TypeVar("R")

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]`` on the shared thread pool (inline on one core), in order."""
    items = list(items)
    cores = usable_cores()
    if cores == 1 or len(items) < 2:
        return [fn(x) for x in items]
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=cores, thread_name_prefix="trtq-stats")
    return list(_pool.map(fn, items))


def map_bundled(fn: Callable[[T], R], items: list, sizes: list, least: int = PART // 8) -> list[R]:
    """``[fn(x) for x in items]`` on the pool, consecutive items bundled into tasks of at least
    ``least`` elements (by ``sizes``): thousands of small tensors cost one task each otherwise."""
    bundles, current, total = [], [], 0
    for item, size in zip(items, sizes):
        current.append(item)
        total += int(size)
        if total >= least:
            bundles.append(current)
            current, total = [], 0
    if current:
        bundles.append(current)
    results = parallel_map(lambda bundle: [fn(x) for x in bundle], bundles)
    return [r for chunk in results for r in chunk]


def parts(flat: np.ndarray, size: int = PART) -> list[np.ndarray]:
    """Contiguous views of ``flat`` of at most ``size`` elements."""
    return [flat[i : i + size] for i in range(0, flat.size, size)] or [flat]


# --------------------------------------------------------------------------------------------
# pass 1
# --------------------------------------------------------------------------------------------


def abs_max_min(part: np.ndarray) -> tuple[float, float]:
    """``(max, min)`` of a non-empty array as Python floats; NaN propagates into both."""
    return float(part.max()), float(part.min())


# --------------------------------------------------------------------------------------------
# pass 2
# --------------------------------------------------------------------------------------------


def implementation() -> str:
    """Which kernels the histograms run on: "compiled" or "numpy" (same results; the provenance
    records it, for timings)."""
    from trtq.calib.collect import compiled

    return "compiled" if compiled.library() is not None else "numpy"


def _kernel(name: str):
    """The kernel ``name`` of trtq.calib.collect.compiled where it was built, else None (numpy)."""
    from trtq.calib.collect import compiled

    return getattr(compiled, name) if compiled.library() is not None else None


def two_pass_kernel():
    """The two-pass kernel, ``kernel(rows, scale, lanes, exceed_at, stride) -> (zeros, non-finite,
    exceeded)``: compiled, or None (:func:`_kernel`)."""
    return _kernel("histogram_f32")


# --------------------------------------------------------------------------------------------
# one pass (trtq.calib.collect.one_pass): max and power-of-two histogram together
# --------------------------------------------------------------------------------------------

POW2_OK, POW2_NONFINITE, POW2_TINY = 0, 1, 2  # pow2_histogram status
NO_EXPONENT = -(1 << 30)  # the compiled kernels' exponent for "only zeros so far" (_kernels.h)


def pow2_kernel():
    """The one-pass kernel, ``kernel(rows, stride, e0, lanes, min_exp) -> (e, max bits, zeros,
    status)``: compiled, or None (:func:`_kernel`)."""
    return _kernel("pow2_count")


def pow2_histogram(
    rows: np.ndarray, stride: int, exponent: Optional[int], num_bins: int, min_exp: int
) -> tuple[np.ndarray, Optional[int], float, int, int]:
    """Max and histogram of float32 ``rows`` ([R, n]) in one read (:func:`pow2_kernel`; see
    trtq.calib.collect.one_pass).

    Every element is read for the max; elements ``0, stride, ...`` of each row are counted over
    ``[0, 2**e)``, ``e`` starting at ``exponent`` (None: only zeros so far) and raised as the
    data needs. Returns ``(counts, e, max|x|, zeros, status)``: status :data:`POW2_NONFINITE` for a
    NaN / Inf, :data:`POW2_TINY` when the range would stay below ``2**min_exp`` (the caller counts
    those in float64); the other values are then incomplete."""
    kernel = pow2_kernel()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    lanes = np.zeros((4, num_bins), dtype=np.int32)  # a task holds < 2**31 elements
    none = NO_EXPONENT
    e0 = none if exponent is None else int(exponent)
    e, top, zeros, status = kernel(rows, int(stride), e0, lanes, int(min_exp))
    m = float(np.array(top, dtype=np.int32).view(np.float32))
    return lanes.sum(axis=0, dtype=np.int64), (None if e == none else int(e)), m, int(zeros), int(status)


def warm_up(one_pass: bool) -> None:
    """Load the kernel a calibration will use and run it once, on a side thread while the session
    starts (the first call loads the library)."""
    if one_pass:
        if pow2_kernel() is not None:
            pow2_histogram(np.ones((1, 8), np.float32), 1, None, 16, -100)
    elif two_pass_kernel() is not None:
        histogram_into(np.ones(8, np.float32), np.float32(1.0), np.zeros(16, np.int64))


def histogram_into(part: np.ndarray, scale: np.float32, counts: np.ndarray, stride: int = 1) -> tuple[int, int]:
    """Add the bin counts of ``floor(|part| * scale)`` (float32 arithmetic, clipped to the last bin)
    to ``counts`` (int64, one row per bin set: shape ``(num_bins,)``). With ``stride`` > 1 only the
    elements ``0, stride, 2 * stride ...`` of each row of ``part`` ([rows, n]; other shapes are one
    row) are counted.

    Returns ``(zeros, flags)``: elements whose scaled value is exactly 0, and :data:`NONFINITE` /
    :data:`EXCEEDED` bits. When NONFINITE is set the counts are incomplete and must be discarded.
    """
    num_bins = counts.shape[-1]
    scale = np.float32(scale)
    exceed_at = np.float32(num_bins * _EXCEED_TOLERANCE)
    rows = np.ascontiguousarray(part).reshape(part.shape[0] if part.ndim == 2 and stride > 1 else 1, -1)
    kernel = two_pass_kernel()
    if kernel is not None:
        lanes = np.zeros((4, num_bins), dtype=np.int64)
        zeros = 0
        nonfinite = exceeded = False
        if part.dtype == np.float32:
            zeros, nonfinite, exceeded = kernel(rows, scale, lanes, exceed_at, int(stride))
        else:  # float16 / float64: convert a chunk at a time
            flat = rows[:, ::stride].reshape(-1)
            buf = np.empty(min(_CHUNK, flat.size), np.float32)
            for s in range(0, flat.size, _CHUNK):
                f = buf[: min(_CHUNK, flat.size - s)]
                np.copyto(f, flat[s : s + f.size], casting="unsafe")
                z, nf, ex = kernel(f.reshape(1, -1), scale, lanes, exceed_at, 1)
                zeros, nonfinite, exceeded = zeros + z, nonfinite or nf, exceeded or ex
        counts += lanes.sum(axis=0)
        return int(zeros), (NONFINITE if nonfinite else 0) | (EXCEEDED if exceeded else 0)
    return _histogram_numpy(rows[:, ::stride].reshape(-1), scale, counts, exceed_at)


def _histogram_numpy(flat: np.ndarray, scale: np.float32, counts: np.ndarray, exceed_at) -> tuple[int, int]:
    num_bins = counts.shape[-1]
    size = min(_CHUNK, flat.size)
    f = np.empty(size, np.float32)
    k = np.empty(size, np.intp)
    zeros = 0
    flags = 0
    for s in range(0, flat.size, _CHUNK):
        m = min(_CHUNK, flat.size - s)
        fm, km = f[:m], k[:m]
        np.abs(flat[s : s + m], out=fm, casting="unsafe")  # float16/64 -> float32, as the kernel
        np.multiply(fm, scale, out=fm)
        top = fm.max()
        if not np.isfinite(top):
            return zeros, flags | NONFINITE
        if top >= num_bins:
            if top >= exceed_at:
                flags |= EXCEEDED
            np.minimum(fm, num_bins - 1, out=fm)
        np.copyto(km, fm, casting="unsafe")  # truncation == floor for values >= 0
        counts += np.bincount(km, minlength=num_bins)
        zeros += m - int(np.count_nonzero(fm))
    return zeros, flags


# --------------------------------------------------------------------------------------------
# range search (trtq.calib.search)
# --------------------------------------------------------------------------------------------


def level_sums(
    starts: np.ndarray, weights: np.ndarray, p1: np.ndarray, p0: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``A[j, t] = sum_k p1[starts[j, k], t]`` and ``B[j, t] = sum_k weights[k] * p0[starts[j, k], t]``
    (prefix sums ``p1``, ``p0``: [bins + 1, tensors]) as exact int64, identical on both paths.

    The compiled kernel (trtq.calib.collect.compiled) where it was built; else a numpy gather."""
    from trtq.calib.collect import compiled

    starts = np.ascontiguousarray(starts, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.int64)
    p1 = np.ascontiguousarray(p1, dtype=np.int64)
    p0 = np.ascontiguousarray(p0, dtype=np.int64)
    a = np.empty((starts.shape[0], p1.shape[1]), dtype=np.int64)
    b = np.empty_like(a)
    if compiled.library() is not None:
        compiled.level_sums(starts, weights, p1, p0, a, b)
        return a, b
    for t in range(p1.shape[1]):  # per tensor: [C, K] temporaries
        a[:, t] = p1[:, t][starts].sum(axis=1)
        b[:, t] = p0[:, t][starts] @ weights
    return a, b
