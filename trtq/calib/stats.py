"""The range rules of the histogram methods, and the statistics file that keeps histograms.

The rules turn one tensor's ``(counts, max_value)`` into its ``amax`` (symmetric int8,
``scale = amax/127``): :func:`entropy_amax` (TensorRT's EntropyCalibration2 search),
:func:`percentile_amax` and :func:`mse_amax` (with :func:`entropy_divergences` and :func:`mse_errors`,
the per-tensor references of trtq.calib.search). Which method runs which rule, and what each needs,
is the registry of trtq.calib.methods. The histograms come from trtq.calib.collect.

A tensor whose ``max|x|`` is 0 (always exactly zero) has no usable edges: its histogram puts every
value in bin 0 and every method returns ``amax = 0.0``. Callers decide what to write for it (a
TensorRT scale must be > 0; ``trtq calibrate`` floors it: trtq.calib.methods.finalize_amax).
"""

import io
import itertools
import json
import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np

from trtq import interrupt
from trtq.calib.collect.accumulators import DEFAULT_NUM_BINS
from trtq.errors import CacheError, ConfigError
from trtq.fileio import atomic_write_bytes, require_input_file

MAX_NUM_BINS = 1 << 20  # TensorRT's calibrators use 2048; a million int64 bins is 8 MiB a tensor


def check_num_bins(num_bins: int, tensors: int) -> None:
    """ConfigError, before any work, for a bin count below 1 or above MAX_NUM_BINS, or whose int64
    histograms for ``tensors`` tensors would take more than half the available memory."""
    from trtq.memory import available_memory

    if not 1 <= int(num_bins) <= MAX_NUM_BINS:
        raise ConfigError(
            f"num_bins must be a positive integer up to {MAX_NUM_BINS}, got {num_bins}",
            f"e.g. --num-bins {DEFAULT_NUM_BINS} (TensorRT's)",
        )
    need = int(num_bins) * 8 * max(int(tensors), 1)
    avail = available_memory()
    if avail and need > avail // 2:
        raise ConfigError(
            f"--num-bins {num_bins} needs {need / 2**30:.1f} GiB of histograms for {tensors} tensors, "
            f"more than half of the {avail / 2**30:.1f} GiB available",
            f"use fewer bins, e.g. --num-bins {DEFAULT_NUM_BINS}",
        )


NUM_QUANTIZED_BINS = 128  # int8 magnitude levels the entropy search merges into
INT8_LEVELS = 127  # symmetric int8: q in [-127, 127]
EMPTY_Q_COUNT = 1e-4  # entropy: floor of an empty Q bin facing a non-empty P bin, in counts
STATS_FORMAT = "trtq-stats/1"  # histograms over [0, max] (two passes)
STATS_FORMAT_POW2 = "trtq-stats/2"  # histograms over [0, top], top a power of two (trtq.calib.collect.one_pass)

# Two candidates whose criterion differs by less than this count as tied (the first one wins).
# The criteria are sums of thousands of float64 terms; summation order alone moves them by ~1e-15.
TIE_ABS = 1e-12


# --------------------------------------------------------------------------------------------
# methods: (counts, max_value) -> amax
# --------------------------------------------------------------------------------------------


def check_hist(counts, max_value: float) -> tuple[np.ndarray, float]:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size == 0:
        raise ValueError("counts must be a non-empty 1-D histogram")
    if c.dtype.kind not in "iu":
        raise ValueError(f"counts must be integers, got {c.dtype}")
    if np.any(c < 0):
        raise ValueError("counts must be non-negative")
    m = float(max_value)
    if not math.isfinite(m) or m < 0:
        raise ValueError(f"max_value must be finite and >= 0, got {max_value}")
    return c.astype(np.int64), m


def _first_min(values: np.ndarray) -> int:
    """Index of the first value within TIE_ABS of the minimum (inf values never win unless all are inf)."""
    best = float(np.min(values))
    if not math.isfinite(best):
        return int(np.argmin(values))
    return int(np.flatnonzero(values <= best + TIE_ABS)[0])


def entropy_divergences(counts, num_quantized_bins: int = NUM_QUANTIZED_BINS) -> np.ndarray:
    """KL(P||Q) for every candidate ``i`` in ``num_quantized_bins .. len(counts)`` (index ``i - nq``).

    For candidate ``i`` (``c = counts``, ``n = nq = 128``):

    * ``P = c[:i]`` with the tail ``sum(c[i:])`` added to ``P[i-1]``.
    * ``Q``: ``c[:i]`` cut into ``n`` groups of ``m = i // n`` consecutive bins, group ``g`` being
      ``[g*m, (g+1)*m)`` for ``g < n-1`` and the last group ``[(n-1)*m, i)`` taking the remainder
      ``i % n`` bins too. Each group's mass (summed from ``c``, *without* the tail) is spread evenly
      over the bins of the group where ``P > 0``; bins where ``P == 0`` stay 0 (as in the published
      TensorRT/MXNet implementation, non-emptiness is taken from ``P``).
    * ``P`` and ``Q`` are normalised; ``KL = sum over P>0 of p*log(p/q)``.
    * Where ``P > 0`` but ``Q == 0`` the bin of ``Q`` is floored at ``1e-4`` of one count before
      normalising (``q = 1e-4 / C_i``), about what an empty bin gets from the smoothing in the
      MXNet / ONNX Runtime port of this algorithm. This happens only at ``P[i-1]`` when the whole
      last group is empty in ``c`` but the tail ``T`` is not, and costs
      ``(T/N) * log((T/N) / (1e-4/C_i))``: a penalty proportional to the clipped mass. So a few
      isolated far outliers (tiny ``T``) are clipped, while cutting off a real mode (say the
      saturated top of a HardSigmoid, or most of a spiky image input) never wins. Skipping the
      term instead rewards cutting off mass; a fixed penalty (MNN and ncnn add 1.0) pins ``amax``
      to the max whenever outliers exist. A candidate with ``c[:i]`` all zero has no ``Q`` at all
      and is rejected (``+inf``). No other smoothing is applied.

    Vectorised over candidates with prefix sums: for group ``g`` with mass ``G``, ``P``-mass ``S``
    and ``k`` non-empty bins, ``sum_b P_b log Q_b = S * log(G / k)``, so
    ``KL = (sum P log P - sum_g S_g log(G_g / k_g)) / N + log(C_i / N)`` with ``N = sum(c)``,
    ``C_i = sum(c[:i])``, plus ``(T/N) * -log(1e-4)`` for a floored candidate. Float error is
    ~1e-14 absolute.
    """
    c = np.asarray(counts, dtype=np.int64)
    nb = c.size
    nq = int(num_quantized_bins)
    if nb < nq:
        raise ConfigError(f"the entropy method needs at least {nq} histogram bins, got {nb}", "use --num-bins 2048")
    cf = c.astype(np.float64)
    total = float(cf.sum())
    cand = np.arange(nq, nb + 1)  # candidate i
    if total == 0:
        return np.full(cand.size, np.inf)
    zero = np.zeros(1)
    cum = np.concatenate([zero, np.cumsum(cf)])  # cum[k] = sum c[:k]
    with np.errstate(divide="ignore", invalid="ignore"):
        clogc = np.where(cf > 0, cf * np.log(np.where(cf > 0, cf, 1.0)), 0.0)
    cum_clogc = np.concatenate([zero, np.cumsum(clogc)])
    cum_nz = np.concatenate([[0], np.cumsum(c > 0)])

    m = cand // nq  # bins per group (>= 1)
    g = np.arange(nq)
    starts = g[None, :] * m[:, None]  # [C, nq]
    stops = starts + m[:, None]
    stops[:, -1] = cand  # the last group takes the remainder

    tail = total - cum[cand]  # sum c[i:]
    last_c = cf[cand - 1]  # c[i-1]
    last_p = last_c + tail  # P[i-1]

    G = cum[stops] - cum[starts]  # group mass from c
    S = G.copy()
    S[:, -1] += tail  # P-mass of the last group
    k = (cum_nz[stops] - cum_nz[starts]).astype(np.float64)
    # non-emptiness from P: bin i-1 is non-empty in P when the tail is > 0 even if c[i-1] == 0
    k[:, -1] += (last_p > 0) & (last_c == 0)

    # floored case: last group empty in c, tail > 0; then P over that group is the tail at i-1 and
    # its term with q = EMPTY_Q_COUNT / C_i is the regular formula's plus (T/N) * -log(EMPTY_Q_COUNT)
    floored = (G[:, -1] == 0) & (tail > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        last_term = np.where(last_p > 0, last_p * np.log(np.where(last_p > 0, last_p, 1.0)), 0.0)
        plogp = cum_clogc[cand - 1] + last_term
        ratio = np.where(G > 0, G / np.where(k > 0, k, 1.0), 1.0)
        cross = (S * np.log(ratio)).sum(axis=1)  # groups with G == 0 add 0 here (ratio 1)
        kl = (plogp - cross) / total + np.log(cum[cand] / total)
    kl = kl + np.where(floored, (tail / total) * -math.log(EMPTY_Q_COUNT), 0.0)
    kl[cum[cand] == 0] = np.inf
    return kl


def entropy_amax(counts, max_value: float, num_quantized_bins: int = NUM_QUANTIZED_BINS) -> float:
    """TensorRT EntropyCalibration2: ``amax = (i + 0.5) * bin_width`` for the candidate ``i``
    (``num_quantized_bins .. num_bins``, step 1) with the smallest KL divergence (the first one
    on ties, see :func:`entropy_divergences`). ``bin_width = max_value / num_bins``."""
    c, m = check_hist(counts, max_value)
    if m == 0.0:
        return 0.0
    kl = entropy_divergences(c, num_quantized_bins)
    if not np.isfinite(kl).any():  # nothing to search (empty histogram): keep the full range
        return m
    i = int(num_quantized_bins) + _first_min(kl)
    return (i + 0.5) * (m / c.size)


def percentile_amax(counts, max_value: float, percentile: float = 99.99) -> float:
    """Upper edge of the first bin at which the cumulative count reaches ``percentile`` % of all
    values: ``amax = (k + 1) * bin_width`` with ``k`` the smallest index where
    ``sum(counts[:k+1]) >= percentile / 100 * sum(counts)``. Resolution is one bin width, always
    rounding the range up (never clipping more than asked)."""
    p = float(percentile)
    if not (0.0 < p <= 100.0):
        raise ConfigError(f"percentile must be in (0, 100], got {percentile}", "e.g. --percentile 99.99")
    c, m = check_hist(counts, max_value)
    total = int(c.sum())
    if m == 0.0 or total == 0:
        return 0.0 if m == 0.0 else m
    cum = np.cumsum(c)
    target = p / 100.0 * total
    k = int(np.searchsorted(cum, target, side="left"))  # first cum[k] >= target
    k = min(k, c.size - 1)
    return (k + 1) * (m / c.size)


def mse_errors(counts, max_value: float, start_bin: int = NUM_QUANTIZED_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Candidate amax values and the squared quantisation error of each, summed over the histogram.

    Error model: every value in bin ``b`` is represented by the bin centre ``x_b = (b + 0.5) * w``
    (``w = max_value / num_bins``). For a candidate ``amax = a`` the int8 step is ``s = a / 127`` and
    the value is fake-quantised as ``q(x) = s * min(round(x / s), 127)`` (round half to even, as
    numpy), so values beyond ``a`` are clipped to ``a``. The error is ``sum_b counts_b * (x_b - q(x_b))^2``
    (the mean differs only by the constant total). Candidates are the bin edges
    ``a = j * w`` for ``j = start_bin .. num_bins`` (``start_bin`` is clamped to ``1 .. num_bins``).

    Computed per block of candidates: bins below the block's largest candidate directly; bins above
    it are all clipped, and ``sum c_b (x_b - a)^2`` over them is evaluated exactly in integers from
    ``sum c``, ``sum c (2b+1)``, ``sum c (2b+1)^2``.
    """
    c, m = check_hist(counts, max_value)
    nb = c.size
    j0 = min(max(int(start_bin), 1), nb)
    w = m / nb
    js = np.arange(j0, nb + 1)
    cand = js * w
    err = np.zeros(js.size)
    nz = np.flatnonzero(c)
    if nz.size == 0:
        return cand, err
    cnt = c[nz].astype(np.float64)
    x = (nz + 0.5) * w
    # exact integer prefix sums over the non-empty bins: sum c, sum c(2b+1), sum c(2b+1)^2
    ci = [int(v) for v in c[nz]]
    odd = [2 * int(b) + 1 for b in nz]
    p0 = [0] + list(itertools.accumulate(ci))
    p1 = [0] + list(itertools.accumulate(cc * o for cc, o in zip(ci, odd)))
    p2 = [0] + list(itertools.accumulate(cc * o * o for cc, o in zip(ci, odd)))
    block = 64
    for lo in range(0, js.size, block):
        jb = js[lo : lo + block]
        j_hi = int(jb[-1])
        n_band = int(np.searchsorted(nz, j_hi))  # bins b < j_hi
        if n_band:
            a = jb[:, None] * w
            t = x[None, :n_band] * (INT8_LEVELS / a)
            q = np.minimum(np.round(t), INT8_LEVELS) * (a / INT8_LEVELS)
            d = x[None, :n_band] - q
            err[lo : lo + jb.size] = (d * d) @ cnt[:n_band]
        if n_band < nz.size:  # bins >= j_hi: clipped to a for every candidate of the block
            u0, u1, u2 = p0[-1] - p0[n_band], p1[-1] - p1[n_band], p2[-1] - p2[n_band]
            for k, j in enumerate(jb):
                two_j = 2 * int(j)
                exact = u2 - 2 * two_j * u1 + two_j * two_j * u0  # 4 * sum c (b + 0.5 - j)^2
                err[lo + k] += float(exact) * (w * w / 4.0)
    return cand, err


def mse_amax(counts, max_value: float, start_bin: int = NUM_QUANTIZED_BINS) -> float:
    """Candidate amax (a bin edge) with the least squared error (see :func:`mse_errors`); the
    smallest one on ties (relative 1e-12)."""
    c, m = check_hist(counts, max_value)
    if m == 0.0 or int(c.sum()) == 0:
        return 0.0 if m == 0.0 else m
    cand, err = mse_errors(c, m, start_bin)
    best = float(err.min())
    i = int(np.flatnonzero(err <= best * (1.0 + 1e-12) + 1e-300)[0])
    return float(cand[i])


def without_zeros(counts, zeros: int) -> np.ndarray:
    """A copy of ``counts`` with the ``zeros`` exact zeros taken out of bin 0 (what entropy sees)."""
    c = np.array(counts, dtype=np.int64)
    if not 0 <= int(zeros) <= c[0]:
        raise ValueError(f"zeros ({zeros}) must be between 0 and the count of bin 0 ({c[0]})")
    c[0] -= int(zeros)
    return c


# --------------------------------------------------------------------------------------------
# statistics file (.npz, no pickle)
# --------------------------------------------------------------------------------------------


@dataclass
class StatsFile:
    maxima: dict[str, float]
    counts: dict[str, np.ndarray]
    meta: dict
    num_bins: int
    zeros: dict[str, int] = field(default_factory=dict)  # empty for files written before trtq saved them
    tops: Optional[dict[str, float]] = None  # upper edges of power-of-two histograms; None: [0, max]

    @property
    def edges(self) -> str:
        """``"max"`` (histograms over [0, max]) or ``"pow2"`` (over [0, top], trtq.calib.collect.one_pass)."""
        return "max" if self.tops is None else "pow2"

    def top(self, name: str) -> float:
        """Upper edge of ``name``'s histogram."""
        return self.maxima[name] if self.tops is None else self.tops[name]


def save_stats(
    path: Union[str, Path],
    maxima: Mapping[str, float],
    counts: Mapping[str, np.ndarray],
    meta: Optional[dict] = None,
    zeros: Optional[Mapping[str, int]] = None,
    tops: Optional[Mapping[str, float]] = None,
) -> None:
    """Write max and histogram of every tensor to one ``.npz`` (atomically).

    Layout: ``header`` = UTF-8 JSON as uint8 (format, tensor names in order, num_bins, meta);
    ``maxima`` float64 ``[T]``; ``counts`` int64 ``[T, num_bins]``; ``zeros`` int64 ``[T]`` (exact
    zeros, part of bin 0; all 0 when not given). Names are free text (``:``,
    spaces, ``/`` ...): they live in the JSON, never in array keys. With ``tops`` (power-of-two
    histograms) the format is ``trtq-stats/2`` and ``tops`` float64 ``[T]`` holds the upper edges;
    without, ``trtq-stats/1`` (edges ``[0, max]``), which earlier trtq versions read too.
    """
    names = list(maxima)
    if set(counts) != set(names):
        raise ValueError("maxima and counts must name the same tensors")
    bins = {int(np.asarray(counts[n]).size) for n in names}
    if len(bins) > 1:
        raise ValueError(f"histograms of different sizes: {sorted(bins)}")
    num_bins = bins.pop() if bins else DEFAULT_NUM_BINS
    fmt = STATS_FORMAT if tops is None else STATS_FORMAT_POW2
    header = {"format": fmt, "names": names, "num_bins": num_bins, "meta": dict(meta or {})}
    try:
        blob = json.dumps(header, sort_keys=True, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ValueError(f"statistics meta must be plain JSON data: {e}") from None
    mx = np.array([float(maxima[n]) for n in names], dtype=np.float64)
    ct = np.zeros((len(names), num_bins), dtype=np.int64)
    for i, n in enumerate(names):
        ct[i] = np.asarray(counts[n], dtype=np.int64)
    zr = np.array([int((zeros or {}).get(n, 0)) for n in names], dtype=np.int64)
    if np.any(zr < 0) or (len(names) and np.any(zr > ct[:, 0])):
        raise ValueError("zeros must be between 0 and the count of bin 0")
    arrays = {"header": np.frombuffer(blob, dtype=np.uint8), "maxima": mx, "counts": ct, "zeros": zr}
    if tops is not None:
        tp = np.array([float(tops[n]) for n in names], dtype=np.float64)
        if np.any(~np.isfinite(tp)) or np.any(tp < mx):
            raise ValueError("tops must be finite and at least the maxima")
        arrays["tops"] = tp
    atomic_write_bytes(path, _npz_bytes(arrays))


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The .npz archive, built in memory (then written atomically by the caller).

    A signal that cuts numpy's savez short leaves its ZipFile with an open member: numpy's own
    clean-up (ZipFile.close) then fails with "Can't close the ZIP file while there is an open writing
    handle", which replaced the interrupt, and ZipFile.__del__ failed once more into the closed
    temporary file ("Exception ignored ..." and a traceback). In memory the archive's file stays
    open for __del__, and a failure while a signal is pending is that signal."""
    buf = io.BytesIO()
    try:
        np.savez_compressed(buf, **arrays)
    except Exception:
        interrupt.check()  # a SIGINT / SIGTERM cut the archive short: that is what stopped it
        raise
    return buf.getvalue()


def _stats_error(path: Path, what: str) -> CacheError:
    return CacheError(
        f"{path} is not a trtq statistics file ({what})",
        "pass a file written by trtq calibrate --save-stats, or re-run that command",
    )


def load_stats(path: Union[str, Path]) -> StatsFile:
    """Read a file written by :func:`save_stats`; CacheError (with the fix) on anything wrong."""
    path = Path(path)
    require_input_file(
        path,
        CacheError,
        "statistics file",
        "check the path, or run trtq calibrate --save-stats",
        "pass a .npz file written by trtq calibrate --save-stats",
    )
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CacheError(f"cannot read statistics file {path}: {e.strerror}", "check its permissions") from None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            keys = set(z.files)
            if not {"header", "maxima", "counts"} <= keys:
                raise _stats_error(path, "missing arrays: " + ", ".join(sorted({"header", "maxima", "counts"} - keys)))
            header_arr = z["header"]
            mx = z["maxima"]
            ct = z["counts"]
            zr = z["zeros"] if "zeros" in keys else None
            tp = z["tops"] if "tops" in keys else None
    except CacheError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, RuntimeError) as e:
        what = "truncated or corrupt" if raw[:2] == b"PK" else "not an .npz archive"
        raise _stats_error(path, f"{what}: {type(e).__name__}") from None
    except Exception as e:  # zlib.error and other decoder failures
        raise _stats_error(path, f"corrupt: {type(e).__name__}") from None
    if header_arr.dtype != np.uint8 or header_arr.ndim != 1:
        raise _stats_error(path, "bad header array")
    try:
        header = json.loads(header_arr.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _stats_error(path, "header is not JSON") from None
    if not isinstance(header, dict) or header.get("format") not in (STATS_FORMAT, STATS_FORMAT_POW2):
        fmt = header.get("format") if isinstance(header, dict) else None
        raise _stats_error(path, f"format {fmt!r}, expected {STATS_FORMAT!r} or {STATS_FORMAT_POW2!r}")
    pow2 = header["format"] == STATS_FORMAT_POW2
    names = header.get("names")
    num_bins = header.get("num_bins")
    meta = header.get("meta", {})
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or not isinstance(num_bins, int)
        or not isinstance(meta, dict)
    ):
        raise _stats_error(path, "bad header fields")
    if len(set(names)) != len(names):
        raise _stats_error(path, "duplicate tensor names")
    t = len(names)
    if mx.dtype != np.float64 or mx.shape != (t,):
        raise _stats_error(path, f"maxima has shape {mx.shape} {mx.dtype}, expected ({t},) float64")
    if ct.dtype != np.int64 or ct.shape != (t, num_bins):
        raise _stats_error(path, f"counts has shape {ct.shape} {ct.dtype}, expected ({t}, {num_bins}) int64")
    if not np.all(np.isfinite(mx)) or np.any(mx < 0) or np.any(ct < 0):
        raise _stats_error(path, "negative or non-finite values")
    if zr is not None and (zr.dtype != np.int64 or zr.shape != (t,) or np.any(zr < 0) or (t and np.any(zr > ct[:, 0]))):
        raise _stats_error(path, "bad zeros array")
    if pow2 != (tp is not None):
        raise _stats_error(path, "tops array and format disagree")
    if tp is not None and (
        tp.dtype != np.float64 or tp.shape != (t,) or not np.all(np.isfinite(tp)) or np.any(tp < mx)
    ):
        raise _stats_error(path, "bad tops array")
    return StatsFile(
        maxima={n: float(v) for n, v in zip(names, mx)},
        counts={n: ct[i].copy() for i, n in enumerate(names)},
        meta=meta,
        num_bins=num_bins,
        zeros={} if zr is None else {n: int(zr[i]) for i, n in enumerate(names)},
        tops=None if tp is None else {n: float(tp[i]) for i, n in enumerate(names)},
    )
