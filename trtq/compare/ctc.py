"""CTC text recognition outputs ``[N, T, C]`` (PP-OCR rec style): decoded lines vs the reference.

Each sample is decoded greedily: the arg-max class at every time step, repeats merged, blank
(class 0) dropped. Metrics over all samples:

* sequence agreement - fraction of samples whose candidate line is exactly the reference's;
* character error rate - total edit distance (insertions, deletions, substitutions) from the
  reference lines to the candidate lines, divided by the reference lines' total length. When the
  reference decodes to no characters at all it is 0.0 if the candidate does too, else inf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

BLANK = 0


def greedy_decode(probs: np.ndarray) -> list[list[int]]:
    """Greedy CTC decode of ``[N, T, C]`` scores: one list of class ids per sample."""
    best = np.argmax(np.asarray(probs), axis=-1)  # [N, T]
    lines = []
    for row in best:
        keep = np.ones(row.shape, dtype=bool)
        keep[1:] = row[1:] != row[:-1]  # merge repeats
        keep &= row != BLANK
        lines.append([int(c) for c in row[keep]])
    return lines


def edit_distance(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Levenshtein distance between two sequences (unit costs), O(len(a) * len(b)) time."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(
                min(
                    previous[j] + 1,  # delete x
                    current[j - 1] + 1,  # insert y
                    previous[j - 1] + (x != y),
                )
            )  # substitute
        previous = current
    return previous[-1]


class CtcAccumulator:
    """Streaming sequence agreement and character error rate of one ``[N, T, C]`` output
    (``layout``: the model's, ``NTC`` or ``TNC``; the accumulator sees batch-first rows)."""

    def __init__(self, layout: str = "NTC") -> None:
        self.layout = layout
        self.samples = 0
        self.exact = 0
        self.edits = 0
        self.ref_chars = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        for r, c in zip(greedy_decode(ref), greedy_decode(cand)):
            self.samples += 1
            self.exact += int(r == c)
            self.edits += edit_distance(r, c)
            self.ref_chars += len(r)

    def metrics(self) -> dict[str, Any]:
        cer = self.edits / self.ref_chars if self.ref_chars else 0.0 if self.edits == 0 else math.inf
        return {
            "sequence_agreement": self.exact / self.samples if self.samples else math.nan,
            "cer": cer,
            "matching_lines": self.exact,
            "reference_chars": self.ref_chars,
            "edits": self.edits,
            "layout": self.layout,
        }
