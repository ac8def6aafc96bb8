"""The numba kernels behind trtq.calib.collect.kernels (imported only when numba is wanted: importing numba
costs ~0.2 s, and the first call of each kernel ~0.25 s to load its cached machine code).

Two habits make these loops fast on numba: indices are unsigned (numba's signed indexing adds a
wraparound check that kept LLVM from vectorising the max loop: 0.9 -> 0.12 ns per element), and
the max of a block of float32 is taken on their int32 bit patterns (``bits & 0x7FFFFFFF`` orders
like ``|x|``; NaN and Inf are the patterns from ``0x7F800000`` up). Counts go to four lanes in
turn, so that runs of one bin (a ReLU's zeros) do not serialise on one counter.
"""
import numba
import numpy as np

NO_EXPONENT = -(1 << 30)  # pow2_count: only zeros seen so far (kernels.NO_EXPONENT, _kernels.c's too)

U = np.uint64
NONFINITE_BITS = 0x7F800000  # |x| bit patterns from here up are Inf or NaN
SMALLEST_NORMAL_BITS = 0x00800000
BLOCK = 4096  # elements read for a max, then counted while they are in L1


@numba.njit(nogil=True, cache=True, inline="always")
def block_step(stride):  # pragma: no cover - compiled
    """Elements per block: a multiple of the stride, so that blocks pick what one pass over the row
    would pick."""
    return BLOCK - BLOCK % stride if stride <= BLOCK // 4 else stride * 4


@numba.njit(nogil=True, cache=True, inline="always")
def block_max_bits(bits, stride):  # pragma: no cover - compiled
    """Max of ``|x|`` over elements 0, stride, ... of a block, as an int32 bit pattern."""
    m = np.int32(0)
    mask = np.int32(0x7FFFFFFF)
    if stride == 1:
        for i in range(bits.size):
            v = bits[U(i)] & mask
            m = v if v > m else m
    else:
        n = U(bits.size)
        st = U(stride)
        p = U(0)
        while p < n:
            v = bits[p] & mask
            m = v if v > m else m
            p += st
    return m


@numba.njit(nogil=True, cache=True, inline="always")
def count_block(seg, stride, scale, lanes):  # pragma: no cover - compiled
    """Add ``floor(|x| * scale)`` of elements 0, stride, ... of ``seg`` to ``lanes`` (every value
    already known below the last bin); returns the exact zeros among them."""
    l0, l1, l2, l3 = lanes[0], lanes[1], lanes[2], lanes[3]
    zeros = 0
    n = U(seg.size)
    st = U(stride)
    p = U(0)
    while p + U(3) * st < n:
        y0 = abs(seg[p]) * scale
        y1 = abs(seg[p + st]) * scale
        y2 = abs(seg[p + U(2) * st]) * scale
        y3 = abs(seg[p + U(3) * st]) * scale
        zeros += (y0 == 0) + (y1 == 0) + (y2 == 0) + (y3 == 0)
        l0[U(y0)] += 1
        l1[U(y1)] += 1
        l2[U(y2)] += 1
        l3[U(y3)] += 1
        p += U(4) * st
    while p < n:
        y0 = abs(seg[p]) * scale
        zeros += y0 == 0
        l0[U(y0)] += 1
        p += st
    return zeros


@numba.njit(nogil=True, cache=True, inline="always")
def count_block_clipped(seg, stride, scale, lanes, exceed_at):  # pragma: no cover - compiled
    """:func:`count_block` for a block that reaches the last bin: values past it count there;
    returns (zeros, any value at or above ``exceed_at``)."""
    flast = np.float32(lanes.shape[1] - 1)
    zeros = 0
    exceeded = False
    n = U(seg.size)
    st = U(stride)
    p = U(0)
    j = U(0)
    while p < n:
        y = abs(seg[p]) * scale
        zeros += y == 0
        exceeded |= y >= exceed_at
        lanes[j & U(3), U(min(y, flast))] += 1
        p += st
        j += U(1)
    return zeros, exceeded


@numba.njit(nogil=True, cache=True)
def histogram_f32(x, bits, scale, counts, exceed_at, stride):  # pragma: no cover - compiled
    """Two-pass histograms (fixed scale): ``x`` float32 [rows, n], ``bits`` the same memory as int32;
    elements 0, stride, ... of each row counted into ``counts`` (int64 [4, num_bins]). Returns
    (zeros, non-finite seen, a value at or above ``exceed_at``); after a non-finite value the
    counts are incomplete."""
    flast = np.float32(counts.shape[1] - 1)
    one = np.empty(1, np.int32)
    one_f = one.view(np.float32)
    zeros = 0
    exceeded = False
    step = block_step(stride)
    for r in range(x.shape[0]):
        xr = x[r]
        br = bits[r]
        for s in range(0, x.shape[1], step):
            m = block_max_bits(br[s:s + step], stride)
            if m >= NONFINITE_BITS:
                return zeros, True, exceeded
            one[0] = m
            if one_f[0] * scale < flast:  # the usual case: no clamp, no flags
                zeros += count_block(xr[s:s + step], stride, scale, counts)
            else:
                z, ex = count_block_clipped(xr[s:s + step], stride, scale, counts, exceed_at)
                zeros += z
                exceeded |= ex
    return zeros, False, exceeded


@numba.njit(nogil=True, cache=True)
def pow2_count(x, bits, stride, e0, lanes, min_exp):  # pragma: no cover - compiled
    """One-pass histograms over ``[0, 2**e)`` (trtq.calib.collect.one_pass): every element of ``x`` (float32
    [rows, n], ``bits`` its int32 view) read for the max, elements 0, stride, ... of each row
    counted into ``lanes`` (int32 [4, num_bins]). Block by block: the max first; when it passes
    ``2**e`` the lanes merge into the wider range (bin b -> b >> d, exact), then the block is
    counted. Returns (e, max bits, zeros, status 0 / 1 non-finite / 2 range below 2**min_exp)."""
    nb = lanes.shape[1]
    e = e0
    scale = np.float32(0.0) if e == NO_EXPONENT else np.float32(nb * 2.0 ** (-e))
    top = 0
    zeros = 0
    step = block_step(stride)
    for r in range(x.shape[0]):
        xr = x[r]
        br = bits[r]
        for s in range(0, x.shape[1], step):
            m = block_max_bits(br[s:s + step], 1)  # every element: the max is exact
            if m >= NONFINITE_BITS:
                return e, top, zeros, 1
            top = max(top, m)
            # a normal max m is below 2**((m >> 23) - 126); a denormal one is below any min_exp
            em = (m >> 23) - 126 if m >= SMALLEST_NORMAL_BITS else (min_exp - 1 if m > 0 else NO_EXPONENT)
            if em > e:
                if em < min_exp:
                    return e, top, zeros, 2
                if e != NO_EXPONENT:
                    d = min(em - e, 62)
                    for j in range(lanes.shape[0]):
                        for b in range(nb):
                            c = lanes[j, b]
                            lanes[j, b] = 0
                            lanes[j, b >> d] += c
                e = em
                scale = np.float32(nb * 2.0 ** (-e))
            zeros += count_block(xr[s:s + step], stride, scale, lanes)
    return e, top, zeros, 0


@numba.njit(nogil=True, cache=True)
def level_sums(starts, weights, p1, p0, a_out, b_out):  # pragma: no cover - compiled
    """a_out[j, t] = sum_k p1[starts[j, k], t]; b_out[j, t] = sum_k weights[k] * p0[starts[j, k], t]
    (tensors innermost: contiguous, vectorised)."""
    a_out[:] = 0
    b_out[:] = 0
    for j in range(starts.shape[0]):
        for k in range(starts.shape[1]):
            s = starts[j, k]
            wk = weights[k]
            for t in range(p1.shape[1]):
                a_out[j, t] += p1[s, t]
                b_out[j, t] += wk * p0[s, t]
