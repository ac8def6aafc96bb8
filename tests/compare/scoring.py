"""Plain-Python scoring of task outputs, written apart from trtq.compare's code, that the tests
hold compare's numbers against (loops over lists, no shared helpers)."""

import itertools
from collections.abc import Sequence

import numpy as np


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def yolo_detections(sample: np.ndarray, v5: bool, conf: float, nms_iou: float) -> list[tuple[int, float, list]]:
    """(class, score, [x1, y1, x2, y2]) after per-class NMS, for one sample's [A, K] rows."""
    found = []
    for row in sample.astype(np.float64).tolist():
        cls = row[5:] if v5 else row[4:]
        k = max(range(len(cls)), key=lambda i: cls[i])
        score = cls[k] * (row[4] if v5 else 1.0)
        if score > conf:
            cx, cy, w, h = row[:4]
            found.append((k, score, [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]))
    kept = []
    for det in sorted(found, key=lambda d: -d[1]):
        if all(d[0] != det[0] or iou(d[2], det[2]) <= nms_iou for d in kept):
            kept.append(det)
    return kept[:300]


def detection_f1(ref: np.ndarray, cand: np.ndarray, v5: bool, conf=0.25, nms_iou=0.45):
    """(precision, recall, F1, matched, n_ref, n_cand) of rows [N, A, K]."""
    matched = n_ref = n_cand = 0
    for r, c in zip(ref, cand):
        rd, cd = yolo_detections(r, v5, conf, nms_iou), yolo_detections(c, v5, conf, nms_iou)
        n_ref += len(rd)
        n_cand += len(cd)
        used = set()
        for k, _, box in sorted(cd, key=lambda d: -d[1]):
            best, best_iou = None, -1.0
            for j, (rk, _, rbox) in enumerate(rd):
                if j not in used and rk == k and iou(box, rbox) > best_iou:
                    best, best_iou = j, iou(box, rbox)
            if best is not None and best_iou >= 0.5:
                used.add(best)
                matched += 1
    if n_ref == n_cand == 0:
        return 1.0, 1.0, 1.0, 0, 0, 0
    p = matched / n_cand if n_cand else 0.0
    rc = matched / n_ref if n_ref else 0.0
    f1 = 2 * p * rc / (p + rc) if p + rc else 0.0
    return p, rc, f1, matched, n_ref, n_cand


def ctc_lines(probs: np.ndarray) -> list[list[int]]:
    return [[k for k, _ in itertools.groupby(row.tolist()) if k != 0] for row in probs.argmax(-1)]


def levenshtein(a: Sequence[int], b: Sequence[int]) -> int:
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[-1][-1]


def ctc_scores(ref: np.ndarray, cand: np.ndarray) -> tuple[float, float]:
    """(sequence agreement, character error rate)."""
    r, c = ctc_lines(ref), ctc_lines(cand)
    same = sum(a == b for a, b in zip(r, c))
    edits = sum(levenshtein(a, b) for a, b in zip(r, c))
    return same / len(r), edits / sum(len(a) for a in r)


def mask_iou(ref: np.ndarray, cand: np.ndarray, threshold: float) -> float:
    a, b = ref > threshold, cand > threshold
    return float(np.logical_and(a, b).sum() / np.logical_or(a, b).sum())
