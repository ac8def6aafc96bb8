"""The mse and entropy range searches for many tensors at once, in closed form.

Same rules and the same choices as :func:`trtq.calib.stats.mse_errors` /
:func:`trtq.calib.stats.entropy_divergences` (those stay the per-tensor reference), computed for all
candidates of all tensors of one bin count together instead of one candidate block at a time.

**mse.** With ``o_b = 2b + 1`` (twice a bin centre, in bin widths ``w``) and a candidate ``a = j*w``,
a bin below ``j`` goes to int8 level ``k = round(127 * o_b / (2j))`` and its error is
``(w/254)^2 * (127*o_b - 2kj)^2``; a bin at or above ``j`` is clipped to ``a``, error
``(w/2)^2 * (o_b - 2j)^2``. The bins of one level are contiguous: level ``k >= 1`` starts at bin
``S_k(j) = (((2k-1)*j) // 127 + 1) // 2`` (the first bin whose exact ``t`` is above ``k - 0.5``).
With prefix sums ``P0 = cum c``, ``P1 = cum c*o``, ``P2 = cum c*o^2`` and Abel summation over the
levels, the in-range error of candidate ``j`` (in units of ``(w/254)^2``) is

    16129 P2[j] - 508 j (127 P1[j] - A_j) + 4 j^2 (16129 P0[j] - B_j),
    A_j = sum_k P1[S_k(j)],   B_j = sum_k (2k-1) P0[S_k(j)]            (k = 1 .. 127)

``S_k(j)`` depends on ``j`` only, so ``A`` and ``B`` are 127 gathers per candidate for all tensors
together (:func:`trtq.calib.collect.kernels.level_sums`, compiled or numpy, both exact). The in-range and
clipped sums are exact integers (int64: wrap-around in the intermediate terms cancels, the result
is below 2^63 where :func:`mse_fits` says so); the reference sums the same terms in float64, so the
two differ by its rounding only and pick the same candidate (tie rule: relative 1e-12, first wins).
The one exception: candidates whose errors are *exactly* equal but which the reference's rounding
puts more than 1e-12 apart (seen only on histograms of one or two spikes sitting on a quantisation
level, where the reference's ``x - q`` cancels); there the first of the exact ties wins, as the
rule says.

An exact tie (``127 * o_b == (2k-1) * j``: ``t`` exactly ``k - 0.5``) is put in level ``k - 1``
here, where the reference's float rounding may pick ``k``: the error is the same either way
(``(127*o_b - 2kj)^2 = j^2`` for both levels), so the bins' error sums do not depend on it.

**entropy.** Every candidate ``i`` with the same ``m = i // 128`` shares its first 127 groups
``[g*m, (g+1)*m)``; only the last group ``[127*m, i)`` and the tail differ. So the cross term
``sum_g S_g log(G_g / k_g)`` is 16 sums of 127 groups plus one term per candidate.
"""

import functools
import math
from collections.abc import Sequence

import numpy as np

INT8_LEVELS = 127


def mse_fits(total: int, num_bins: int) -> bool:
    """Whether the exact int64 sums hold: every candidate's error, ``<= total * (2*num_bins)^2``
    in its units, must stay below 2^62."""
    return int(total) * (2 * int(num_bins)) ** 2 < 2**62


@functools.lru_cache(maxsize=4)
def _level_starts(j0: int, nb: int) -> np.ndarray:
    """``S_k(j)`` for ``k = 1 .. 127`` and ``j = j0 .. nb``: [candidates, 127] int64."""
    js = np.arange(j0, nb + 1, dtype=np.int64)
    k = np.arange(1, INT8_LEVELS + 1, dtype=np.int64)
    m = (2 * k[None, :] - 1) * js[:, None]
    return (m // INT8_LEVELS + 1) // 2


def mse_errors_many(counts: np.ndarray, maxima: np.ndarray, start_bin: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Candidate indices ``j`` and the squared error [T, candidates] of every tensor (rows of
    ``counts`` [T, bins] int64, all with ``mse_fits``); the same quantity as the reference's
    ``mse_errors`` (float64, to rounding)."""
    from trtq.calib.collect.kernels import level_sums

    counts = np.asarray(counts, dtype=np.int64)
    t, nb = counts.shape
    js = np.arange(min(max(int(start_bin), 1), nb), nb + 1, dtype=np.int64)
    o = 2 * np.arange(nb, dtype=np.int64) + 1
    zero = np.zeros((t, 1), dtype=np.int64)
    p0 = np.concatenate([zero, np.cumsum(counts, axis=1)], axis=1)  # [T, nb+1]
    p1 = np.concatenate([zero, np.cumsum(counts * o, axis=1)], axis=1)
    p2 = np.concatenate([zero, np.cumsum(counts * (o * o), axis=1)], axis=1)
    odd = 2 * np.arange(1, INT8_LEVELS + 1, dtype=np.int64) - 1
    a_sum, b_sum = level_sums(_level_starts(int(js[0]), nb), odd, p1.T, p0.T)  # [C, T]
    a_sum, b_sum = a_sum.T, b_sum.T
    w = np.asarray(maxima, dtype=np.float64) / nb
    j = js[None, :]
    inside = 16129 * p2[:, js] - 508 * j * (127 * p1[:, js] - a_sum) + 4 * j * j * (16129 * p0[:, js] - b_sum)
    u0, u1, u2 = p0[:, -1:] - p0[:, js], p1[:, -1:] - p1[:, js], p2[:, -1:] - p2[:, js]
    clipped = u2 - 4 * j * u1 + 4 * j * j * u0  # sum c (o - 2j)^2 over bins >= j
    err = inside.astype(np.float64) + 16129.0 * clipped.astype(np.float64)
    return js, err * (w * w / 64516.0)[:, None]


def first_min_rel(err: np.ndarray) -> np.ndarray:
    """Per row, the first index within relative 1e-12 of the row's minimum (the reference's rule)."""
    best = err.min(axis=1, keepdims=True)
    return np.argmax(err <= best * (1.0 + 1e-12) + 1e-300, axis=1)


def mse_amax_many(counts: Sequence[np.ndarray], maxima: Sequence[float], start_bin: int = 128) -> list[float]:
    """``mse_amax`` of every tensor; rows whose counts are too large for the exact int64 sums (or
    all zero, or max 0) are left to the reference (returned as None)."""
    if not len(counts):
        return []
    c = np.stack([np.asarray(x, dtype=np.int64) for x in counts])
    m = np.asarray(maxima, dtype=np.float64)
    totals = c.sum(axis=1)
    ok = (m > 0) & (totals > 0) & np.array([mse_fits(int(n), c.shape[1]) for n in totals], dtype=bool)
    from trtq.calib.collect.kernels import parallel_map

    def search(part: np.ndarray) -> list[float]:
        js, err = mse_errors_many(c[part], m[part], start_bin)
        return [float(js[i] * (m[r] / c.shape[1])) for r, i in zip(part, first_min_rel(err))]

    out: list = [None] * len(c)
    idx = np.flatnonzero(ok)
    # parts of at most 32 tensors side by side on the cores (the gathers run in C without the GIL,
    # and so do numpy's larger operations), each with temporaries of [32, candidates]: faster on
    # two cores than parts of 64 one at a time, in no more memory (docs/decisions.md D22)
    parts = np.array_split(idx, -(-idx.size // 32)) if idx.size else []
    for part, found in zip(parts, parallel_map(search, parts)):
        for r, a in zip(part, found):
            out[r] = a
    return out


def entropy_divergences_many(counts: np.ndarray, num_quantized_bins: int = 128) -> np.ndarray:
    """KL of every candidate ``i = nq .. bins`` of every tensor: [T, candidates] (see
    ``trtq.calib.stats.entropy_divergences`` for the rule; same values to rounding)."""
    c = np.asarray(counts, dtype=np.int64)
    t, nb = c.shape
    nq = int(num_quantized_bins)
    cf = c.astype(np.float64)
    total = cf.sum(axis=1)[:, None]  # [T, 1]
    cand = np.arange(nq, nb + 1)
    zero = np.zeros((t, 1))
    cum = np.concatenate([zero, np.cumsum(cf, axis=1)], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        clogc = np.where(cf > 0, cf * np.log(np.where(cf > 0, cf, 1.0)), 0.0)
    cum_clogc = np.concatenate([zero, np.cumsum(clogc, axis=1)], axis=1)
    cum_nz = np.concatenate([np.zeros((t, 1), dtype=np.int64), np.cumsum(c > 0, axis=1)], axis=1)
    m = cand // nq
    tail = total - cum[:, cand]
    last_c = cf[:, cand - 1]
    last_p = last_c + tail
    # the first nq - 1 groups depend on m only
    shared = np.zeros((t, nb // nq + 1))
    for mm in np.unique(m):
        s = np.arange(nq - 1) * mm
        g_mass = cum[:, s + mm] - cum[:, s]
        k = (cum_nz[:, s + mm] - cum_nz[:, s]).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(g_mass > 0, g_mass / np.where(k > 0, k, 1.0), 1.0)
            shared[:, mm] = (g_mass * np.log(ratio)).sum(axis=1)
    start = (nq - 1) * m
    g_last = cum[:, cand] - cum[:, start]
    s_last = g_last + tail
    k_last = (cum_nz[:, cand] - cum_nz[:, start]).astype(np.float64) + ((last_p > 0) & (last_c == 0))
    floored = (g_last == 0) & (tail > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        last_term = np.where(last_p > 0, last_p * np.log(np.where(last_p > 0, last_p, 1.0)), 0.0)
        plogp = cum_clogc[:, cand - 1] + last_term
        ratio = np.where(g_last > 0, g_last / np.where(k_last > 0, k_last, 1.0), 1.0)
        cross = shared[:, m] + s_last * np.log(ratio)
        kl = (plogp - cross) / total + np.log(cum[:, cand] / total)
        kl = kl + np.where(floored, (tail / total) * -math.log(1e-4), 0.0)
    kl[cum[:, cand] == 0] = np.inf
    return kl


def entropy_choices(counts: Sequence[np.ndarray], num_quantized_bins: int = 128, tie_abs: float = 1e-12) -> list:
    """Per tensor, the candidate ``i`` with the least KL (the first within ``tie_abs`` of it), or
    None when no candidate is finite (an empty histogram)."""
    out: list = []
    for lo in range(0, len(counts), 64):  # bounded temporaries: [64, candidates]
        kl = entropy_divergences_many(np.stack(counts[lo : lo + 64]), num_quantized_bins)
        best = kl.min(axis=1, keepdims=True)
        first = np.argmax(kl <= best + tie_abs, axis=1)
        out += [
            int(num_quantized_bins) + int(i) if math.isfinite(float(b)) else None for i, b in zip(first, best[:, 0])
        ]
    return out
