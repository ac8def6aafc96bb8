"""A sanity check of a method's ranges against mse's on the same histograms.

entropy and max can wreck a model that mse calibrates well: entropy by clipping a tensor whose
large values matter (detection heads, CTC logits), max by stretching a step over rare outliers.
Both show on the histogram the ranges came from: the expected squared INT8 error of the range
(:func:`quantization_error`, the error model of :func:`trtq.calib.stats.mse_errors`) against that
of mse's range, which minimises it. A tensor whose error is more than :data:`RATIO` times mse's is
flagged; the caller decides which tensors matter (those the Q/DQ model quantizes) and warns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RATIO = 10.0  # flag a range whose expected error is above this multiple of mse's
INT8_LEVELS = 127


@dataclass(frozen=True)
class RangeFlag:
    tensor: str
    ratio: float  # expected squared error of the method's range / mse's
    clipped: float  # fraction of values above the method's range
    mse_clipped: float  # fraction above mse's range

    def describe(self) -> str:
        return (
            f"{self.tensor} ({self.ratio:.0f}x mse's error, clips {100 * self.clipped:.3g}% "
            f"vs {100 * self.mse_clipped:.3g}%)"
        )


def _centres(counts: np.ndarray, top: float) -> np.ndarray:
    return (np.arange(counts.size) + 0.5) * (float(top) / counts.size)


def quantization_error(counts: np.ndarray, top: float, amax: float) -> float:
    """Expected squared error (summed over the histogram over ``[0, top]``) of INT8 with range
    ``amax``: every value at its bin centre, rounded to the step ``amax / 127``, clipped at amax."""
    c = np.asarray(counts, dtype=np.float64)
    if amax <= 0 or top <= 0 or not c.sum():
        return 0.0
    x = _centres(c, top)
    step = amax / INT8_LEVELS
    q = np.minimum(np.round(x / step), INT8_LEVELS) * step
    return float(np.dot(c, (x - q) ** 2))


def clipped_fraction(counts: np.ndarray, top: float, amax: float) -> float:
    """Fraction of the values whose bin centre lies above ``amax``."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    return float(c[_centres(c, top) > amax].sum() / total) if total else 0.0


def range_flags(
    amax: Mapping[str, float],
    mse_amax: Mapping[str, float],
    maxima: Mapping[str, float],
    counts: Mapping[str, np.ndarray],
    tops: Mapping[str, float] | None = None,
    tensors: Sequence[str] | None = None,
) -> list[RangeFlag]:
    """The tensors (of ``tensors``, default all) whose ``amax`` costs more than :data:`RATIO` times
    the expected error of ``mse_amax`` on the same histogram (over ``[0, tops[n]]``, else
    ``[0, maxima[n]]``), worst first."""
    flags = []
    for name in tensors if tensors is not None else list(amax):
        if name not in counts or name not in mse_amax:
            continue
        top = float((tops or {}).get(name, maxima[name]))
        best = quantization_error(counts[name], top, float(mse_amax[name]))
        got = quantization_error(counts[name], top, float(amax[name]))
        if got > RATIO * best and got > 0:
            ratio = got / best if best > 0 else float("inf")
            flags.append(
                RangeFlag(
                    name,
                    ratio,
                    clipped_fraction(counts[name], top, float(amax[name])),
                    clipped_fraction(counts[name], top, float(mse_amax[name])),
                )
            )
    return sorted(flags, key=lambda f: -f.ratio)


def check_ranges(method: str, amax: Mapping, maxima: Mapping, counts: Any, zeros: Any, tops: Any) -> list[RangeFlag]:
    """:func:`range_flags` of ``method``'s ranges against mse's on the same histograms (none for mse
    itself, or without histograms)."""
    if method == "mse" or counts is None:
        return []
    from trtq.calib.methods import compute_all

    mse = compute_all("mse", maxima, counts, 99.99, zeros, tops)
    return range_flags(amax, mse, maxima, counts, tops)
