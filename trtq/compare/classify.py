"""Classifier outputs ``[N, C]`` (also ``[N, C, 1, 1]``): does the candidate pick the same class?

* top-1 agreement - fraction of samples whose arg-max class over C is the reference's;
* top-5 agreement - fraction of samples whose reference arg-max class is among the candidate's 5
  highest scores (left out when C < 5).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TOP_K = 5


class ClassifyAccumulator:
    """Streaming top-1 / top-5 agreement of one classifier output."""

    def __init__(self, classes: int) -> None:
        self.classes = int(classes)
        self.samples = 0
        self.top1 = 0
        self.top5 = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        n = len(ref)
        r = np.asarray(ref).reshape(n, -1)  # trailing 1x1 dims dropped
        c = np.asarray(cand).reshape(n, -1)
        best = np.argmax(r, axis=1)
        self.top1 += int(np.count_nonzero(best == np.argmax(c, axis=1)))
        if self.classes >= TOP_K:
            # the reference's class is in the candidate's top 5 when fewer than 5 classes score higher
            own = c[np.arange(n), best][:, None]
            self.top5 += int(np.count_nonzero(np.sum(c > own, axis=1) < TOP_K))
        self.samples += n

    def metrics(self) -> dict[str, Any]:
        n = self.samples
        out = {"top1_agreement": self.top1 / n if n else math.nan}
        if self.classes >= TOP_K:
            out["top5_agreement"] = self.top5 / n if n else math.nan
        out.update(top1_matches=self.top1, classes=self.classes)
        return out
