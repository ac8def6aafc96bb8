"""Detectors whose boxes and class scores are separate outputs, one pair per stride.

Anchor-free heads (PicoDet, NanoDet, GFL, FCOS-style) export, per stride, a score map
``[N, HW, C]`` and a box map ``[N, HW, K]``; SSD / RetinaNet-style heads export ``[N, A, 4]`` box
regressions beside ``[N, A, C]`` scores. compare scores them only when told which outputs are
which (``--task detect --scores S1,S2 --boxes B1,B2``, paired in order) and how boxes are written
(``--box-format``):

* ``dfl``: ``K = 4 (R + 1)``, per side a distribution over R + 1 distances (softmax, then its
  expectation), in strides, from the anchor point (GFL / PicoDet / NanoDet / YOLOv8's DFL);
* ``ltrb``: ``K = 4`` distances left, top, right, bottom from the anchor point, in strides;
* ``xyxy`` / ``cxcywh``: ``K = 4`` boxes in input pixels (anchors not needed).

Anchor points: the centres of a stride's grid over the model input, ``((x + 0.5) s, (y + 0.5) s)``;
the stride is the one whose ``ceil(H / s) x ceil(W / s)`` grid has exactly HW cells. Scores outside
[0, 1] are logits and go through a sigmoid. The decoded boxes and scores of all pairs are then
scored as one YOLOv8-style output (:class:`~trtq.compare.detect.DetectAccumulator`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtq.compare.detect import DetectAccumulator, Layout
from trtq.errors import UsageError

BOX_FORMATS = ("auto", "dfl", "ltrb", "xyxy", "cxcywh")
STRIDES = (2, 4, 8, 16, 32, 64, 128, 256)
_PROBABILITY_SLACK = 1e-3


@dataclass(frozen=True)
class SplitHeads:
    scores: tuple[str, ...]
    boxes: tuple[str, ...]
    box_format: str = "auto"


def _hint() -> str:
    return "pass --task detect --scores NAME[,NAME...] --boxes NAME[,NAME...] (paired in order) and --box-format"


def image_size(arrays: Mapping[str, np.ndarray]) -> tuple[int, int] | None:
    """(H, W) of the model's image input: the one 4-D input, NCHW or NHWC (channels 1, 3 or 4)."""
    images = [a for a in arrays.values() if np.ndim(a) == 4]
    if len(images) != 1:
        return None
    shape = np.shape(images[0])
    if shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4):
        return int(shape[2]), int(shape[3])
    if shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4):
        return int(shape[1]), int(shape[2])
    return (int(shape[2]), int(shape[3])) if shape[1] in (1, 3, 4) else None


def _stride(cells: int, hw: tuple[int, int] | None) -> int | None:
    if hw is None:
        return None
    h, w = hw
    for s in STRIDES:
        if math.ceil(h / s) * math.ceil(w / s) == cells:
            return s
    return None


def _centres(cells: int, stride: int, width: int) -> np.ndarray:
    cols = math.ceil(width / stride)
    idx = np.arange(cells)
    return np.stack([(idx % cols + 0.5) * stride, (idx // cols + 0.5) * stride], axis=1).astype(np.float64)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


@dataclass(frozen=True)
class _Pair:
    scores: str
    boxes: str
    fmt: str
    stride: int | None
    width: int | None
    logits: bool


class SplitDetectAccumulator:
    """Detection agreement of split heads (see the module doc), fed whole output dicts."""

    def __init__(self, heads: SplitHeads, score_threshold: float, nms_iou: float) -> None:
        if len(heads.scores) != len(heads.boxes) or not heads.scores:
            raise UsageError(
                f"--scores names {len(heads.scores)} output(s) and --boxes {len(heads.boxes)}",
                "name one box output for each score output, in the same order",
            )
        self.heads = heads
        self.detect = DetectAccumulator(Layout(channels_first=False, objectness=False), score_threshold, nms_iou)
        self.pairs: list[_Pair] = []
        self.how = ""

    def start(self, ref: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
        """Check the named outputs on the first batch (batch-first arrays) and fix the decoding."""
        hw = image_size(inputs)
        pairs, formats = [], set()
        for s_name, b_name in zip(self.heads.scores, self.heads.boxes):
            for name in (s_name, b_name):
                if name not in ref:
                    raise UsageError(
                        f"--scores / --boxes name '{name}', which is not a model output",
                        "outputs: " + ", ".join(sorted(ref)),
                    )
            s, b = np.asarray(ref[s_name]), np.asarray(ref[b_name])
            if s.ndim != 3 or b.ndim != 3 or s.shape[1] != b.shape[1]:
                raise UsageError(
                    f"scores '{s_name}' {list(s.shape)} and boxes '{b_name}' {list(b.shape)} are not "
                    "[N, A, C] and [N, A, K] with the same A",
                    _hint(),
                )
            fmt = self._format(b.shape[2], b_name)
            stride = None
            if fmt in ("dfl", "ltrb"):
                stride = _stride(b.shape[1], hw)
                if stride is None:
                    raise UsageError(
                        f"cannot place the {b.shape[1]} anchors of '{b_name}' on a grid over the "
                        f"model input ({'unknown size' if hw is None else f'{hw[0]}x{hw[1]}'})",
                        "--box-format dfl / ltrb need one stride grid per output pair",
                    )
            finite = s[np.isfinite(s)]
            logits = bool(finite.size and (finite.min() < -_PROBABILITY_SLACK or finite.max() > 1 + _PROBABILITY_SLACK))
            pairs.append(_Pair(s_name, b_name, fmt, stride, None if hw is None else hw[1], logits))
            formats.add(fmt)
        self.pairs = pairs
        strides = [p.stride for p in pairs if p.stride]
        self.how = (
            f"given (--scores/--boxes): {len(pairs)} pair(s), boxes {'/'.join(sorted(formats))}"
            + (f", strides {', '.join(map(str, strides))}" if strides else "")
            + (", scores are logits (sigmoid applied)" if any(p.logits for p in pairs) else "")
        )

    def _format(self, k: int, name: str) -> str:
        fmt = self.heads.box_format
        if fmt == "auto":
            if k > 4 and k % 4 == 0:
                return "dfl"
            raise UsageError(
                f"boxes '{name}' have {k} values per anchor: say how they are written",
                "pass --box-format ltrb, xyxy or cxcywh (dfl needs 4 x (reg_max + 1) values)",
            )
        if fmt == "dfl" and (k % 4 or k <= 4):
            raise UsageError(
                f"--box-format dfl needs 4 x (reg_max + 1) values per anchor; '{name}' has {k}",
                "pass --box-format ltrb, xyxy or cxcywh",
            )
        if fmt != "dfl" and k != 4:
            raise UsageError(
                f"--box-format {fmt} needs 4 values per anchor; '{name}' has {k}",
                "pass --box-format dfl for distributions",
            )
        return fmt

    def _rows(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """[N, A, 4 + C] rows: boxes as cx, cy, w, h in input pixels, then class scores."""
        parts = []
        for p in self.pairs:
            scores = np.asarray(outputs[p.scores], dtype=np.float64)
            if p.logits:
                scores = 1.0 / (1.0 + np.exp(-scores))
            boxes = np.asarray(outputs[p.boxes], dtype=np.float64)
            if p.fmt in ("dfl", "ltrb"):
                if p.fmt == "dfl":
                    n, a, k = boxes.shape
                    dist = _softmax(boxes.reshape(n, a, 4, k // 4), axis=3) @ np.arange(k // 4, dtype=np.float64)
                else:
                    dist = boxes
                dist = dist * p.stride
                c = _centres(boxes.shape[1], p.stride, p.width)[None]
                x1, y1 = c[..., 0] - dist[..., 0], c[..., 1] - dist[..., 1]
                x2, y2 = c[..., 0] + dist[..., 2], c[..., 1] + dist[..., 3]
                boxes = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=-1)
            elif p.fmt == "xyxy":
                boxes = np.stack(
                    [
                        (boxes[..., 0] + boxes[..., 2]) / 2,
                        (boxes[..., 1] + boxes[..., 3]) / 2,
                        boxes[..., 2] - boxes[..., 0],
                        boxes[..., 3] - boxes[..., 1],
                    ],
                    axis=-1,
                )
            parts.append(np.concatenate([boxes, scores], axis=-1))
        widths = {part.shape[-1] for part in parts}
        if len(widths) != 1:
            raise UsageError(
                "the score outputs name different numbers of classes", "pair score maps of one detector head"
            )
        return np.concatenate(parts, axis=1)

    def update(self, ref: Mapping[str, np.ndarray], cand: Mapping[str, np.ndarray]) -> None:
        self.detect.update(self._rows(ref), self._rows(cand))

    def metrics(self) -> dict[str, Any]:
        out = self.detect.metrics()
        out["layout"] = "split heads"
        return out

    @property
    def names(self) -> Sequence[str]:
        return list(self.heads.scores) + list(self.heads.boxes)
