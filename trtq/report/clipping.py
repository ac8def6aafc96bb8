"""How many values a range clips, counted on a saved histogram without guessing inside a bin.

A value *clips* when ``|x| > amax``. The statistics of ``trtq calibrate --save-stats`` hold, per
tensor, the exact ``max|x|`` and a histogram of ``|x|`` over ``[0, top)`` in ``n`` equal bins of width
``w = top / n``: value ``x`` is counted in bin ``floor(|x| / w)`` (trtq.calib.collect.kernels; the
two-pass histograms put ``max`` itself in the last bin). So bin ``k`` holds exactly the values in
``[k w, (k + 1) w)``, and the rule is:

1. ``amax >= max`` (within :data:`REL_TOL`): nothing clips, exactly. A cache stores ``amax`` as a
   float32 scale, which moves a range set at the max by ~1e-8 of itself; the values it leaves above
   are within that sliver of the max and round to the top INT8 level anyway.
2. ``amax`` on a bin edge ``j w`` (within :data:`REL_TOL`, again for the float32 scale): the values
   in bins ``j ..`` clip, exactly (up to values equal to ``amax``, which the histogram cannot tell
   apart; two-pass bins are computed in float32, which can move a value within ~1e-7 of an edge
   to the bin beside it). ``percentile`` and ``mse`` ranges are bin edges of their histogram.
3. ``amax`` inside bin ``j``: bins above ``j`` clip for certain; how much of bin ``j`` lies above
   ``amax`` the histogram cannot say, so the count is *conservative*: all of bin ``j`` (an upper
   bound, never a share of it), with the certain count beside it. ``entropy`` ranges sit in the
   middle of a bin (TensorRT's ``(i + 0.5) w``) and land here on their own histogram.

The counts are of the values the histogram holds: every element, or the per-sample stride that
``hist_elements`` chose (the provenance says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REL_TOL = 1e-6  # a range this close (relative) to the max or to a bin edge is taken as on it


@dataclass(frozen=True)
class Clip:
    """Values above a range: ``at_least`` certain, ``at_most`` the conservative count (equal when
    the histogram decides, ``exact``), out of ``total``."""

    at_least: int
    at_most: int
    total: int

    @property
    def exact(self) -> bool:
        return self.at_least == self.at_most

    @property
    def fraction(self) -> float:
        """The conservative share (``at_most / total``)."""
        return self.at_most / self.total if self.total else 0.0

    @property
    def fraction_at_least(self) -> float:
        return self.at_least / self.total if self.total else 0.0


def clip_count(counts: np.ndarray, top: float, max_value: float, amax: float) -> Clip:
    """The values of the histogram ``counts`` over ``[0, top)`` (``max_value`` the exact max) that
    ``amax`` clips, by the module's rule."""
    c = np.asarray(counts, dtype=np.int64)
    total = int(c.sum())
    a = float(amax)
    if total == 0 or not math.isfinite(a) or a >= max_value * (1.0 - REL_TOL) or top <= 0:
        return Clip(0, 0, total)
    if a <= 0:
        above = total - int(c[0]) if max_value > 0 else 0  # bin 0 may hold zeros, which do not clip
        return Clip(above, total, total)
    n = c.size
    pos = a / (top / n)
    edge = round(pos)
    if abs(pos - edge) <= REL_TOL * max(pos, 1.0):  # on an edge: bins edge.. clip
        above = int(c[min(edge, n) :].sum())
        return Clip(above, above, total)
    j = min(int(pos), n - 1)
    certain = int(c[j + 1 :].sum())
    return Clip(certain, certain + int(c[j]), total)
