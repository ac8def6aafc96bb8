"""YOLO-style detection outputs: box and score error, and detections after NMS vs the reference's.

Layouts (one row per anchor, K values per row):

* YOLOv8: ``[N, 4+C, A]`` (or ``[N, A, 4+C]``): box ``cx, cy, w, h``, then C class scores; a
  row's score is its best class score.
* YOLOv5: ``[N, A, 5+C]``: box, objectness, C class scores; a row's score is objectness x its
  best class score.

Metrics: ``box_sqnr_db`` over the 4 box values of every row, ``score_sqnr_db`` over the rest
(objectness and class scores). Detections: rows whose score is above ``score_threshold``, greedy
NMS per class at ``nms_iou`` (at most :data:`MAX_DETECTIONS` a sample, from the
:data:`MAX_CANDIDATES` best rows), on both outputs. A candidate detection matches a reference
detection of the same sample and class with IoU >= :data:`MATCH_IOU` (each reference detection
matches once; candidates taken best score first, each to its highest-IoU free reference box).
precision = matches / candidate detections, recall = matches / reference detections, F1 their
harmonic mean. With no reference detection at all there is nothing to agree with: F1, precision
and recall are None and ``undefined`` says why (never 1.0 for an output on which nothing was
detected, which is what a score map misread as a YOLO head looks like).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trtq.compare.metrics import sqnr_db

MATCH_IOU = 0.5
MAX_DETECTIONS = 300
MAX_CANDIDATES = 3000


@dataclass(frozen=True)
class Layout:
    channels_first: bool  # [N, K, A] (YOLOv8 export) rather than [N, A, K]
    objectness: bool  # YOLOv5: column 4 is objectness

    @property
    def name(self) -> str:
        return "v5" if self.objectness else "v8"


@dataclass(frozen=True)
class Detections:
    boxes: np.ndarray  # [D, 4] x1, y1, x2, y2
    scores: np.ndarray  # [D]
    labels: np.ndarray  # [D] int


def rows(output: np.ndarray, layout: Layout) -> np.ndarray:
    """``[N, A, K]`` float64 view of a detection output in either orientation."""
    x = np.asarray(output, dtype=np.float64)
    return np.swapaxes(x, 1, 2) if layout.channels_first else x


def xyxy(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = (cxcywh[:, i] for i in range(4))
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with each of ``boxes`` [M, 4] (0 where the union is empty)."""
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    area = max(box[2] - box[0], 0) * max(box[3] - box[1], 0)
    areas = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    union = area + areas - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(
    boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, iou: float, max_keep: int = MAX_DETECTIONS
) -> np.ndarray:
    """Indices kept by greedy per-class NMS, best score first: a box is dropped when it overlaps
    a kept box of its class by IoU > ``iou``."""
    order = np.argsort(-scores, kind="stable")
    if boxes.size:  # move each class to its own region so that classes never overlap
        span = float(np.max(np.abs(boxes))) * 2 + 1
        boxes = boxes + (labels * span)[:, None]
    keep = []
    while order.size and len(keep) < max_keep:
        best = order[0]
        keep.append(best)
        rest = order[1:]
        order = rest[box_iou(boxes[best], boxes[rest]) <= iou]
    return np.asarray(keep, dtype=np.int64)


def detections(sample_rows: np.ndarray, layout: Layout, score_threshold: float, nms_iou: float) -> Detections:
    """The detections of one sample's ``[A, K]`` rows."""
    classes = sample_rows[:, 5:] if layout.objectness else sample_rows[:, 4:]
    labels = np.argmax(classes, axis=1)
    scores = classes[np.arange(len(classes)), labels]
    if layout.objectness:
        scores = scores * sample_rows[:, 4]
    picked = np.flatnonzero(scores > score_threshold)
    if picked.size > MAX_CANDIDATES:
        picked = picked[np.argsort(-scores[picked], kind="stable")[:MAX_CANDIDATES]]
    boxes = xyxy(sample_rows[picked, :4])
    kept = nms(boxes, scores[picked], labels[picked], nms_iou)
    return Detections(boxes[kept], scores[picked][kept], labels[picked][kept])


def match_count(ref: Detections, cand: Detections, iou: float = MATCH_IOU) -> int:
    """Candidate detections matched to a free reference detection of the same class."""
    free = np.ones(len(ref.scores), dtype=bool)
    matched = 0
    for i in np.argsort(-cand.scores, kind="stable"):
        options = np.flatnonzero(free & (ref.labels == cand.labels[i]))
        if not options.size:
            continue
        overlaps = box_iou(cand.boxes[i], ref.boxes[options])
        best = int(np.argmax(overlaps))
        if overlaps[best] >= iou:
            free[options[best]] = False
            matched += 1
    return matched


def prf(matched: int, ref_count: int, cand_count: int) -> tuple[float | None, float | None, float | None]:
    """(precision, recall, F1); None each when the reference has no detection."""
    if ref_count == 0:
        return None, None, None
    precision = matched / cand_count if cand_count else 0.0
    recall = matched / ref_count
    return precision, recall, 2.0 * matched / (ref_count + cand_count)


class DetectAccumulator:
    """Streaming detection agreement of one YOLO-style output."""

    def __init__(self, layout: Layout, score_threshold: float, nms_iou: float) -> None:
        self.layout = layout
        self.score_threshold = float(score_threshold)
        self.nms_iou = float(nms_iou)
        self.energy = {"box": [0.0, 0.0], "score": [0.0, 0.0]}  # [signal, noise]
        self.ref_count = 0
        self.cand_count = 0
        self.matched = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r, c = rows(ref, self.layout), rows(cand, self.layout)
        for part, cols in (("box", slice(0, 4)), ("score", slice(4, None))):
            diff = r[..., cols] - c[..., cols]
            self.energy[part][0] += float(np.sum(r[..., cols] ** 2))
            self.energy[part][1] += float(np.sum(diff**2))
        for ref_rows, cand_rows in zip(r, c):
            ref_det = detections(ref_rows, self.layout, self.score_threshold, self.nms_iou)
            cand_det = detections(cand_rows, self.layout, self.score_threshold, self.nms_iou)
            self.ref_count += len(ref_det.scores)
            self.cand_count += len(cand_det.scores)
            self.matched += match_count(ref_det, cand_det)

    def metrics(self) -> dict[str, Any]:
        precision, recall, f1 = prf(self.matched, self.ref_count, self.cand_count)
        out: dict[str, Any] = {}
        if f1 is None:
            out["undefined"] = (
                f"the reference made no detection above score {self.score_threshold:g} "
                "(lower --score-threshold, or check --task)"
            )
        return {
            **out,
            "f1": f1,
            "precision": precision,
            "recall": recall,
            "box_sqnr_db": sqnr_db(*self.energy["box"]),
            "score_sqnr_db": sqnr_db(*self.energy["score"]),
            "reference_detections": self.ref_count,
            "candidate_detections": self.cand_count,
            "matched": self.matched,
            "score_threshold": self.score_threshold,
            "nms_iou": self.nms_iou,
            "layout": self.layout.name,
        }
