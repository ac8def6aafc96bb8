"""Segmentation outputs ``[N, C, H, W]`` (or ``[N, H, W, C]``: ``axis`` 3): masks of the candidate
vs the reference's.

* ``C == 1`` (a probability map, e.g. PP-OCR det): the mask is ``value > threshold``;
  ``iou`` = pixels in both masks / pixels in either, summed over all samples (1.0 when neither
  mask has a pixel anywhere).
* ``C > 1`` (per-class logits or probabilities): the mask of class k is where k is the arg-max
  over C; ``iou`` is the mean over classes of each class's IoU summed over all samples, counting
  only classes present in the reference or the candidate.

``pixel_agreement`` is the fraction of pixels with the same mask value (C == 1) or class (C > 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class SegmentAccumulator:
    """Streaming mask IoU of one ``[N, C, H, W]`` output (the classes on ``axis``: 1, or 3 for NHWC)."""

    def __init__(self, classes: int, threshold: float, axis: int = 1) -> None:
        self.classes = int(classes)
        self.axis = int(axis)
        self.threshold = float(threshold)
        bins = 2 if self.classes == 1 else self.classes
        self.inter = np.zeros(bins, np.int64)
        self.union = np.zeros(bins, np.int64)
        self.ref_pixels = np.zeros(bins, np.int64)
        self.same = 0
        self.pixels = 0

    def _labels(self, x: np.ndarray) -> np.ndarray:
        if self.classes == 1:
            return (np.take(x, 0, axis=self.axis) > self.threshold).astype(np.int64)
        return np.argmax(x, axis=self.axis)

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r, c = self._labels(np.asarray(ref)), self._labels(np.asarray(cand))
        bins = len(self.inter)
        # per class: |r == k and c == k| and |r == k or c == k|
        both = np.bincount(r[r == c], minlength=bins)[:bins]
        count_r = np.bincount(r.ravel(), minlength=bins)[:bins]
        count_c = np.bincount(c.ravel(), minlength=bins)[:bins]
        self.inter += both
        self.union += count_r + count_c - both
        self.ref_pixels += count_r
        self.same += int(both.sum())
        self.pixels += int(r.size)

    def metrics(self) -> dict[str, Any]:
        if self.classes == 1:  # class 1 is the mask, class 0 the background
            union = int(self.union[1])
            out = {"iou": float(self.inter[1] / union) if union else 1.0}
        else:
            seen = self.union > 0
            out = {"iou": float(np.mean(self.inter[seen] / self.union[seen])) if seen.any() else 1.0}
        out["pixel_agreement"] = self.same / self.pixels if self.pixels else math.nan
        if self.classes == 1:
            out["threshold"] = self.threshold
            out["reference_mask_fraction"] = int(self.ref_pixels[1]) / self.pixels if self.pixels else math.nan
        else:
            out["classes_present"] = int((self.union > 0).sum())
        if self.axis != 1:
            out["layout"] = "NHWC"
        return out
