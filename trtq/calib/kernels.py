"""Per-array work of the two calibration passes, spread over the CPU cores.

* :func:`abs_max_min` - ``(max, min)`` of an array (numpy; its reductions release the GIL).
* :func:`histogram_into` - add the counts of ``floor(|x| * scale)`` (clipped to the last bin) of
  one array to ``counts``, and report exact zeros, non-finite values and values past the last edge.

``histogram_into`` has two implementations that give bit-identical counts:

* a numba kernel (``pip install numba``, the ``fast`` extra), used when numba imports: per block of
  4096 elements a vectorised max, then the counts (no clamp where the max is below the last bin),
  ~1.1-1.3 ns per element per core on the 2-core CI machine;
* a numpy fallback on small reused scratch buffers (~5 ns per element).

``TRTQ_NO_NUMBA=1`` forces the fallback (the tests compare the two). Work is split into parts of
at most :data:`PART` elements and run on a thread pool as wide as the usable cores; each part has
its own counts, summed at the end, so the result is independent of the split and the thread count.
"""
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, TypeVar
from collections.abc import Iterable

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
_kernel_lock = threading.Lock()  # its own: compiling must not hold up the pool (calibrate warms up during pass 1)
_numba_kernel = None
_numba_state = "untried"  # "untried" | "ok" | "missing"


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
    return [flat[i:i + size] for i in range(0, flat.size, size)] or [flat]


# --------------------------------------------------------------------------------------------
# pass 1
# --------------------------------------------------------------------------------------------


def abs_max_min(part: np.ndarray) -> tuple[float, float]:
    """``(max, min)`` of a non-empty array as Python floats; NaN propagates into both."""
    return float(part.max()), float(part.min())


# --------------------------------------------------------------------------------------------
# pass 2
# --------------------------------------------------------------------------------------------


def numba_enabled() -> bool:
    """True when the numba kernel is in use (numba installed and TRTQ_NO_NUMBA not set)."""
    return _kernel() is not None


def _kernel():
    global _numba_kernel, _numba_state
    if os.environ.get("TRTQ_NO_NUMBA", "").strip() not in ("", "0"):
        return None
    if _numba_state == "untried":
        with _kernel_lock:
            if _numba_state == "untried":
                try:
                    _numba_kernel = _compile_numba()
                    _numba_state = "ok"
                except ImportError:
                    _numba_state = "missing"
    return _numba_kernel


def _compile_numba():
    import numba

    u = np.uint64

    @numba.njit(nogil=True, cache=True)
    def histogram_f32(x, bits, scale, counts, exceed_at, stride):  # pragma: no cover - compiled
        # x: float32 [rows, n], bits: the same memory as int32; elements 0, stride, ... of each row
        # are counted. counts: int64[4, num_bins]; lane j takes every 4th counted element, so that
        # runs of one bin (a ReLU's zeros) do not serialise on one counter. Block by block: the
        # max of the counted elements first (integer max of the bit patterns, vectorised for stride
        # 1); below the last bin (the usual case) the counting loop needs no clamp or flags.
        # Unsigned indices: numba's signed ones carry a wraparound check that stops vectorisation.
        nb = counts.shape[1]
        flast = np.float32(nb - 1)
        l0, l1, l2, l3 = counts[0], counts[1], counts[2], counts[3]
        one = np.empty(1, np.int32)
        one_f = one.view(np.float32)
        mask = np.int32(0x7FFFFFFF)
        st = u(stride)
        zeros = 0
        exceeded = False
        step = 4096 - 4096 % stride if stride <= 1024 else stride * 4  # blocks start on the stride
        for r in range(x.shape[0]):
            xr = x[r]
            br = bits[r]
            for s in range(0, x.shape[1], step):
                seg = xr[s:s + step]
                bseg = br[s:s + step]
                n = u(seg.size)
                m = np.int32(0)
                if stride == 1:
                    for i in range(seg.size):
                        v = bseg[u(i)] & mask
                        m = v if v > m else m
                else:
                    p = u(0)
                    while p < n:
                        v = bseg[p] & mask
                        m = v if v > m else m
                        p += st
                if m >= 0x7F800000:  # Inf or NaN: the caller discards the counts
                    return zeros, True, exceeded
                one[0] = m
                clamp = not (one_f[0] * scale < flast)
                p = u(0)
                while p + u(3) * st < n:
                    y0 = abs(seg[p]) * scale
                    y1 = abs(seg[p + st]) * scale
                    y2 = abs(seg[p + u(2) * st]) * scale
                    y3 = abs(seg[p + u(3) * st]) * scale
                    zeros += (y0 == 0) + (y1 == 0) + (y2 == 0) + (y3 == 0)
                    if clamp:  # values past the top go to the last bin
                        exceeded |= (y0 >= exceed_at) | (y1 >= exceed_at) | (y2 >= exceed_at) | (y3 >= exceed_at)
                        y0 = min(y0, flast)
                        y1 = min(y1, flast)
                        y2 = min(y2, flast)
                        y3 = min(y3, flast)
                    l0[u(y0)] += 1
                    l1[u(y1)] += 1
                    l2[u(y2)] += 1
                    l3[u(y3)] += 1
                    p += u(4) * st
                while p < n:
                    y0 = abs(seg[p]) * scale
                    zeros += y0 == 0
                    exceeded |= y0 >= exceed_at
                    l0[u(min(y0, flast))] += 1
                    p += st
        return zeros, False, exceeded

    return histogram_f32


# --------------------------------------------------------------------------------------------
# one pass (trtq.calib.pow2): max and power-of-two histogram together
# --------------------------------------------------------------------------------------------

NO_EXPONENT = -(1 << 30)  # pow2_histogram: only zeros seen so far
POW2_OK, POW2_NONFINITE, POW2_TINY = 0, 1, 2  # pow2_histogram status
_pow2_kernel = None
_pow2_state = "untried"


def _compile_pow2():
    import numba

    u = np.uint64

    @numba.njit(nogil=True, cache=True)
    def pow2_count(x, bits, stride, e0, lanes, min_exp):  # pragma: no cover - compiled
        # x: float32 [rows, n], bits: the same memory as int32; elements 0, stride, ... of each row
        # counted into lanes (int32 [4, num_bins]) over [0, 2**e). Each block of the row is read for
        # its max first: when that passes 2**e the lanes merge into the wider range before counting.
        nb = lanes.shape[1]
        l0, l1, l2, l3 = lanes[0], lanes[1], lanes[2], lanes[3]
        e = e0
        scale = np.float32(0.0) if e == NO_EXPONENT else np.float32(nb * 2.0 ** (-e))
        top = 0
        zeros = 0
        mask = np.int32(0x7FFFFFFF)
        st = u(stride)
        step = 4096 - 4096 % stride if stride <= 1024 else stride * 4  # blocks start on the stride
        for r in range(x.shape[0]):
            xr = x[r]
            br = bits[r]
            for s in range(0, x.shape[1], step):
                # max |x| as the int32 bit patterns of float32 (order-preserving for |x|; NaN >
                # Inf); unsigned indexing lets LLVM vectorise (signed indices carry a wraparound check)
                seg = br[s:s + step]
                m = np.int32(0)
                for i in range(seg.size):
                    v = seg[u(i)] & mask
                    m = v if v > m else m
                if m >= 0x7F800000:  # Inf or NaN
                    return e, top, zeros, 1
                top = max(top, m)
                # a normal max m is below 2**((m >> 23) - 126); a denormal one is below any min_exp
                em = (m >> 23) - 126 if m >= 0x00800000 else (min_exp - 1 if m > 0 else NO_EXPONENT)
                if em > e:
                    if em < min_exp:
                        return e, top, zeros, 2
                    if e != NO_EXPONENT:  # bin b over 2**e is bin b >> d over 2**(e + d)
                        d = min(em - e, 62)
                        for j in range(lanes.shape[0]):
                            for b in range(nb):
                                c = lanes[j, b]
                                lanes[j, b] = 0
                                lanes[j, b >> d] += c
                    e = em
                    scale = np.float32(nb * 2.0 ** (-e))
                # bins of elements 0, stride, ... of the block (all below num_bins now); four
                # lanes in turn, so that runs of one bin (a ReLU's zeros) do not serialise
                seg = xr[s:s + step]
                n = u(seg.size)
                p = u(0)
                while p + u(3) * st < n:
                    y0 = abs(seg[p]) * scale
                    y1 = abs(seg[p + st]) * scale
                    y2 = abs(seg[p + u(2) * st]) * scale
                    y3 = abs(seg[p + u(3) * st]) * scale
                    zeros += (y0 == 0) + (y1 == 0) + (y2 == 0) + (y3 == 0)
                    l0[u(y0)] += 1
                    l1[u(y1)] += 1
                    l2[u(y2)] += 1
                    l3[u(y3)] += 1
                    p += u(4) * st
                while p < n:
                    y0 = abs(seg[p]) * scale
                    zeros += y0 == 0
                    l0[u(y0)] += 1
                    p += st
        return e, top, zeros, 0

    return pow2_count


def pow2_kernel():
    """The compiled one-pass kernel, or None (numba missing or TRTQ_NO_NUMBA set)."""
    global _pow2_kernel, _pow2_state
    if os.environ.get("TRTQ_NO_NUMBA", "").strip() not in ("", "0"):
        return None
    if _pow2_state == "untried":
        with _kernel_lock:
            if _pow2_state == "untried":
                try:
                    _pow2_kernel, _pow2_state = _compile_pow2(), "ok"
                except ImportError:
                    _pow2_state = "missing"
    return _pow2_kernel


def pow2_histogram(rows: np.ndarray, stride: int, exponent: Optional[int], num_bins: int,
                   min_exp: int) -> tuple[np.ndarray, Optional[int], float, int, int]:
    """Max and histogram of float32 ``rows`` ([R, n]) in one read (numba; see trtq.calib.pow2).

    Every element is read for the max; elements ``0, stride, ...`` of each row are counted over
    ``[0, 2**e)``, ``e`` starting at ``exponent`` (None: only zeros so far) and raised as the
    data needs. Returns ``(counts, e, max|x|, zeros, status)``: status :data:`POW2_NONFINITE` for a
    NaN / Inf, :data:`POW2_TINY` when the range would stay below ``2**min_exp`` (the caller counts
    those in float64); the other values are then incomplete."""
    kernel = pow2_kernel()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    lanes = np.zeros((4, num_bins), dtype=np.int32)  # a task holds < 2**31 elements
    e0 = NO_EXPONENT if exponent is None else int(exponent)
    e, top, zeros, status = kernel(rows, rows.view(np.int32), int(stride), e0, lanes, int(min_exp))
    m = float(np.array(top, dtype=np.int32).view(np.float32))
    return lanes.sum(axis=0, dtype=np.int64), (None if e == NO_EXPONENT else int(e)), m, int(zeros), int(status)


def warm_up(one_pass: bool) -> None:
    """Load the kernel a calibration will use, and run it once (numba loads its compiled code on
    the first call: ~0.25 s, done on a side thread while the session starts)."""
    if one_pass:
        if pow2_kernel() is not None:
            pow2_histogram(np.ones((1, 8), np.float32), 1, None, 16, -100)
    elif _kernel() is not None:
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
    kernel = _kernel()
    if kernel is not None:
        lanes = np.zeros((4, num_bins), dtype=np.int64)
        zeros = 0
        nonfinite = exceeded = False
        if part.dtype == np.float32:
            zeros, nonfinite, exceeded = kernel(rows, rows.view(np.int32), scale, lanes, exceed_at, int(stride))
        else:  # float16 / float64: convert a chunk at a time
            flat = rows[:, ::stride].reshape(-1)
            buf = np.empty(min(_CHUNK, flat.size), np.float32)
            for s in range(0, flat.size, _CHUNK):
                f = buf[:min(_CHUNK, flat.size - s)]
                np.copyto(f, flat[s:s + f.size], casting="unsafe")
                z, nf, ex = kernel(f.reshape(1, -1), f.reshape(1, -1).view(np.int32), scale, lanes, exceed_at, 1)
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
        np.abs(flat[s:s + m], out=fm, casting="unsafe")  # float16/64 -> float32, as the kernel
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

_level_kernel = None
_level_state = "untried"


def _compile_level_sums():
    import numba

    @numba.njit(nogil=True, cache=True)
    def level_sums(starts, weights, p1, p0, a_out, b_out):  # pragma: no cover - compiled
        # a_out[j, t] = sum_k p1[starts[j, k], t]; b_out[j, t] = sum_k weights[k] * p0[starts[j, k], t]
        # (tensors innermost: contiguous, vectorised)
        a_out[:] = 0
        b_out[:] = 0
        for j in range(starts.shape[0]):
            for k in range(starts.shape[1]):
                s = starts[j, k]
                wk = weights[k]
                for t in range(p1.shape[1]):
                    a_out[j, t] += p1[s, t]
                    b_out[j, t] += wk * p0[s, t]

    return level_sums


def level_sums(starts: np.ndarray, weights: np.ndarray, p1: np.ndarray,
               p0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``A[j, t] = sum_k p1[starts[j, k], t]`` and ``B[j, t] = sum_k weights[k] * p0[starts[j, k], t]``
    (prefix sums ``p1``, ``p0``: [bins + 1, tensors]) as exact int64, identical on both paths.

    numba when it imports (``TRTQ_NO_NUMBA`` unset); else a numpy gather."""
    global _level_kernel, _level_state
    use_numba = os.environ.get("TRTQ_NO_NUMBA", "").strip() in ("", "0")
    if use_numba and _level_state == "untried":
        with _kernel_lock:
            if _level_state == "untried":
                try:
                    _level_kernel, _level_state = _compile_level_sums(), "ok"
                except ImportError:
                    _level_state = "missing"
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.int64)
    p1 = np.ascontiguousarray(p1, dtype=np.int64)
    p0 = np.ascontiguousarray(p0, dtype=np.int64)
    a = np.empty((starts.shape[0], p1.shape[1]), dtype=np.int64)
    b = np.empty_like(a)
    if use_numba and _level_kernel is not None:
        _level_kernel(starts, weights, p1, p0, a, b)
        return a, b
    for t in range(p1.shape[1]):  # per tensor: [C, K] temporaries
        a[:, t] = p1[:, t][starts].sum(axis=1)
        b[:, t] = p0[:, t][starts] @ weights
    return a, b
