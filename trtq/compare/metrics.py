"""Streaming accuracy metrics for one model output: reference vs candidate.

:class:`OutputAccumulator` keeps only running sums, minima and maxima (a few floats per output),
so comparing a million samples costs no more memory than comparing one batch. All arithmetic is
in float64 whatever the outputs' dtype.

Metrics (per output; a "sample" is one row along axis 0):

* top-1 agreement - fraction of samples whose arg-max class is the same; only for outputs that
  look like classifier scores: 2-D ``[N, C]`` with ``C > 1`` (otherwise None).
* cosine similarity - per sample over the flattened row; mean and minimum are reported. Two
  all-zero rows count as 1.0, one all-zero row against a non-zero one as 0.0.
* max / mean absolute error over all elements, and max |reference| for scale.
* SQNR in dB - ``10 * log10(sum(ref^2) / sum((ref - cand)^2))``: +inf when the outputs are
  identical, -inf when the reference is all zeros and the candidate is not.
* non-finite - count of NaN / Inf elements in either output (metrics then read nan or inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtq.errors import ModelError


@dataclass(frozen=True)
class OutputMetrics:
    name: str
    sample_shape: tuple[int, ...]  # shape of one sample (the output's shape without axis 0)
    samples: int
    top1_agreement: float | None
    top1_matches: int | None
    cosine_mean: float
    cosine_min: float
    max_abs_error: float
    mean_abs_error: float
    sqnr_db: float
    ref_max_abs: float
    nonfinite: int
    task: Any | None = None  # a tasks.TaskResult: the task metric of this output


def looks_like_scores(array: np.ndarray) -> bool:
    """Classifier-score shaped: ``[N, C]`` with more than one class, also with trailing 1x1 dims
    (``[N, 1000, 1, 1]`` from a 1x1-conv head): top-1 is the argmax over C."""
    return array.ndim >= 2 and array.shape[1] > 1 and all(d == 1 for d in array.shape[2:])


def cosine_rows(ref: np.ndarray, cand: np.ndarray, norm_r: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity of each row pair (float64 arrays of shape [n, k]); ``norm_r``: the
    reference rows' squared norms, when the caller has them."""
    dot = np.einsum("ij,ij->i", ref, cand)
    if norm_r is None:
        norm_r = np.einsum("ij,ij->i", ref, ref)  # squared norms
    norm_c = np.einsum("ij,ij->i", cand, cand)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        denom = np.sqrt(norm_r * norm_c)  # one sqrt: identical rows give exactly 1.0
        cos = dot / denom
    both_zero = (norm_r == 0) & (norm_c == 0)
    one_zero = (denom == 0) & ~both_zero
    cos[both_zero] = 1.0
    cos[one_zero] = 0.0
    return np.clip(cos, -1.0, 1.0)  # rounding can leave 1 + 1e-16; clip keeps NaN as NaN


def sqnr_db(signal_energy: float, noise_energy: float) -> float:
    if math.isnan(signal_energy) or math.isnan(noise_energy):
        return math.nan
    if noise_energy == 0.0:
        return math.inf
    if signal_energy == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal_energy / noise_energy)


class Reference:
    """A reference batch of one output with what every comparison against it reads computed once
    (``compare --per-layer`` compares one reference with a candidate per layer): the float64 rows,
    their squared norms, energy, largest magnitude and non-finite count. Pass it to
    :meth:`OutputAccumulator.update` in place of the array; :attr:`array` is the array itself."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.asarray(array)
        a = self.array.reshape(1) if self.array.ndim == 0 else self.array
        n = a.shape[0]
        self.rows = a.astype(np.float64, copy=False).reshape(n, -1)
        self.norms = np.einsum("ij,ij->i", self.rows, self.rows)
        self.energy = float(np.einsum("ij,ij->", self.rows, self.rows))
        self.max_abs = float(np.abs(self.rows).max()) if self.rows.size else 0.0
        self.nonfinite = int(np.count_nonzero(~np.isfinite(self.rows)))

    def __len__(self) -> int:
        return len(self.rows)


class OutputAccumulator:
    """Running sums for one output. Feed it ``update(ref, cand)`` with the valid rows only."""

    def __init__(self, name: str):
        self.name = name
        self.sample_shape: tuple[int, ...] | None = None
        self.samples = 0
        self.elements = 0
        self.scores = True  # stays True while every update looked like classifier scores
        self.top1_matches = 0
        self.cos_sum = 0.0
        self.cos_min = math.inf
        self.max_abs = 0.0
        self.abs_sum = 0.0
        self.ref_energy = 0.0
        self.err_energy = 0.0
        self.ref_max_abs = 0.0
        self.nonfinite = 0

    def update(self, ref: np.ndarray | Reference, cand: np.ndarray) -> None:
        prepared = ref if isinstance(ref, Reference) else None
        ref = prepared.array if prepared is not None else np.asarray(ref)
        cand = np.asarray(cand)
        if ref.shape != cand.shape:
            raise ModelError(
                f"output '{self.name}' has shape {list(ref.shape)} in the reference but "
                f"{list(cand.shape)} in the candidate",
                "compare models built for the same output shapes",
            )
        if ref.ndim == 0:  # a scalar output is one sample
            ref, cand = ref.reshape(1), cand.reshape(1)
        n = ref.shape[0]
        if n == 0:
            return
        if self.sample_shape is None:
            self.sample_shape = tuple(int(d) for d in ref.shape[1:])
        self.scores = self.scores and looks_like_scores(ref)

        r = prepared.rows if prepared is not None else ref.astype(np.float64, copy=False).reshape(n, -1)
        c = cand.astype(np.float64, copy=False).reshape(n, -1)
        ref_nonfinite = prepared.nonfinite if prepared is not None else int(np.count_nonzero(~np.isfinite(r)))
        self.nonfinite += ref_nonfinite + int(np.count_nonzero(~np.isfinite(c)))
        diff = np.abs(r - c)
        cos = cosine_rows(r, c, prepared.norms if prepared is not None else None)

        if self.scores:
            self.top1_matches += int(np.count_nonzero(np.argmax(r, 1) == np.argmax(c, 1)))
        self.samples += n
        self.elements += r.size
        self.cos_sum += float(cos.sum())
        # np.min / np.max propagate NaN (Python's min / max would drop it)
        self.cos_min = float(np.min([self.cos_min, float(cos.min())]))
        if r.size:
            self.max_abs = float(np.max([self.max_abs, float(diff.max())]))
            ref_max = prepared.max_abs if prepared is not None else float(np.abs(r).max())
            self.ref_max_abs = float(np.max([self.ref_max_abs, ref_max]))
        self.abs_sum += float(diff.sum())
        self.ref_energy += prepared.energy if prepared is not None else float(np.einsum("ij,ij->", r, r))
        self.err_energy += float(np.einsum("ij,ij->", diff, diff))

    def result(self) -> OutputMetrics:
        n = self.samples
        scores = self.scores and n > 0
        return OutputMetrics(
            name=self.name,
            sample_shape=self.sample_shape or (),
            samples=n,
            top1_agreement=(self.top1_matches / n) if scores else None,
            top1_matches=self.top1_matches if scores else None,
            cosine_mean=(self.cos_sum / n) if n else math.nan,
            cosine_min=self.cos_min if n else math.nan,
            max_abs_error=self.max_abs,
            mean_abs_error=(self.abs_sum / self.elements) if self.elements else math.nan,
            sqnr_db=sqnr_db(self.ref_energy, self.err_energy),
            ref_max_abs=self.ref_max_abs,
            nonfinite=self.nonfinite,
        )
