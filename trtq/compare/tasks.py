"""Which task an output serves, and the task metric compare gates and ranks layers by.

Tasks: ``classify`` (:mod:`~trtq.compare.classify`), ``detect`` (:mod:`~trtq.compare.detect`),
``segment`` (:mod:`~trtq.compare.segment`), ``ctc`` (:mod:`~trtq.compare.ctc`) and ``raw``
(the tensor metrics only). ``auto`` infers the task of each output from its shape (the first
batch's) and the op that produces it in the reference model:

* ``[N, C]`` with C > 1, also with trailing 1x1 dims: classify;
* ``[N, C, H, W]`` with H, W > 1: segment;
* ``[N, T, C]`` made by a Softmax / LogSoftmax over the last axis: ctc;
* other ``[N, a, b]`` with the smaller of a, b >= 5 and the larger >= 4x it: detect (YOLOv8
  ``[N, 4+C, A]`` when a < b, else YOLOv5 ``[N, A, 5+C]``; ``detect_format`` picks otherwise);
* anything else: raw, with the reason.

An explicit task applies to every output it fits; the others are scored raw (the report says
so), and a task that fits no output is a UsageError (exit 2).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np

from trtq.compare.classify import ClassifyAccumulator
from trtq.compare.ctc import CtcAccumulator
from trtq.compare.detect import DetectAccumulator, Layout
from trtq.compare.segment import SegmentAccumulator
from trtq.errors import ConfigError, UsageError

TASKS = ("classify", "detect", "segment", "ctc", "raw")
DETECT_FORMATS = ("auto", "v8", "v5")
# the metric each task gates (--min-agreement) and ranks layers by, with its printed name
GATE_METRIC = {
    "classify": ("top1_agreement", "top-1 agreement"),
    "detect": ("f1", "detection F1"),
    "segment": ("iou", "mask IoU"),
    "ctc": ("sequence_agreement", "sequence agreement"),
}
SOFTMAX_OPS = ("Softmax", "LogSoftmax")
DETECT_MIN_ROW = 5  # 4 box values and at least one score
DETECT_MIN_RATIO = 4  # anchors >= 4x the row length


@dataclass(frozen=True)
class TaskSettings:
    task: str = "auto"
    detect_format: str = "auto"
    score_threshold: float = 0.25
    nms_iou: float = 0.45
    mask_threshold: float = 0.5

    @classmethod
    def from_options(cls, options: Any) -> TaskSettings:
        """From a ``CompareOptions`` (or anything with the same fields; missing ones default)."""
        values = {f.name: getattr(options, f.name, None) for f in dataclasses.fields(cls)}
        settings = cls(**{k: v for k, v in values.items() if v is not None})
        settings.check()
        return settings

    def check(self) -> None:
        if self.task not in ("auto",) + TASKS:
            raise ConfigError(f"unknown compare task '{self.task}'", "use one of: auto, " + ", ".join(TASKS))
        if self.detect_format not in DETECT_FORMATS:
            raise ConfigError(f"unknown detect format '{self.detect_format}'",
                              "use one of: " + ", ".join(DETECT_FORMATS))
        for flag, value in (("--score-threshold", self.score_threshold), ("--nms-iou", self.nms_iou)):
            if not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"{flag} must be between 0 and 1, got {value}", "give a fraction, e.g. 0.25")
        if not math.isfinite(float(self.mask_threshold)):
            raise ConfigError(f"--mask-threshold must be a finite number, got {self.mask_threshold}",
                              "give the value that separates mask from background, e.g. 0.5")


@dataclass(frozen=True)
class TaskResult:
    task: str
    how: str  # why this task: "given (--task)" or the inference's reason
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def gate_metric(self) -> str | None:
        return GATE_METRIC[self.task][0] if self.task in GATE_METRIC else None

    @property
    def gate_label(self) -> str | None:
        return GATE_METRIC[self.task][1] if self.task in GATE_METRIC else None

    @property
    def value(self) -> float | None:
        """The task metric (None for raw)."""
        key = self.gate_metric
        return None if key is None else self.metrics.get(key)


def output_producers(model: Any) -> dict[str, tuple[str, int | None]]:
    """Graph output name -> (op type of the node that makes it, its ``axis`` attribute or None)."""
    from onnx import helper

    makers = {out: node for node in model.graph.node for out in node.output}
    found = {}
    for o in model.graph.output:
        node = makers.get(o.name)
        if node is None:
            continue
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), None)
        found[o.name] = (node.op_type, axis)
    return found


def _dims(shape: Sequence[int]) -> str:
    return "[N, " + ", ".join(str(d) for d in shape[1:]) + "]"


def _layout(shape: Sequence[int], detect_format: str) -> Layout:
    channels_first = shape[1] < shape[2]
    objectness = detect_format == "v5" or (detect_format == "auto" and not channels_first)
    return Layout(channels_first=channels_first, objectness=objectness)


def fits(task: str, shape: Sequence[int], settings: TaskSettings) -> str | None:
    """None when ``task`` can score an output of this (batch) shape, else why not."""
    if task == "raw":
        return None
    if task == "classify":
        ok = len(shape) >= 2 and shape[1] > 1 and all(d == 1 for d in shape[2:])
        return None if ok else "classify needs [N, C] scores (C > 1, trailing dims 1)"
    if task == "segment":
        ok = len(shape) == 4 and shape[2] * shape[3] > 1
        return None if ok else "segment needs [N, C, H, W] maps"
    if task == "ctc":
        ok = len(shape) == 3 and shape[2] > 1
        return None if ok else "ctc needs [N, T, C] scores (C > 1, class 0 the blank)"
    if task == "detect":
        if len(shape) != 3:
            return "detect needs [N, 4+C, A], [N, A, 4+C] or [N, A, 5+C]"
        layout = _layout(shape, settings.detect_format)
        row = min(shape[1], shape[2]) if settings.detect_format == "auto" else (
            shape[1] if layout.channels_first else shape[2])
        need = DETECT_MIN_ROW + int(layout.objectness)
        return None if row >= need else f"detect ({layout.name}) needs rows of at least {need} values"
    raise ConfigError(f"unknown compare task '{task}'", "use one of: " + ", ".join(TASKS))


def infer(shape: Sequence[int], producer: tuple[str, int | None] | None) -> tuple[str, str]:
    """(task, how it was inferred) for an output of this (batch) shape."""
    dims = _dims(shape)
    if len(shape) >= 2 and shape[1] > 1 and all(d == 1 for d in shape[2:]):
        return "classify", f"inferred: {dims} class scores, argmax over axis 1"
    if len(shape) == 4 and shape[2] > 1 and shape[3] > 1:
        kind = "a probability map, thresholded" if shape[1] == 1 else "class maps, argmax over axis 1"
        return "segment", f"inferred: {dims} is {kind}"
    if len(shape) == 3:
        op, axis = producer or (None, None)
        if op in SOFTMAX_OPS and axis in (-1, 2, None):
            return "ctc", f"inferred: {dims} made by {op} over the last axis (CTC time steps x classes)"
        small, large = sorted(shape[1:])
        if small >= DETECT_MIN_ROW and large >= DETECT_MIN_RATIO * small:
            if shape[1] < shape[2]:
                how = f"YOLOv8 head: {shape[1]} rows (4 box + {shape[1] - 4} class) x {shape[2]} anchors"
            else:
                how = f"YOLOv5 head: {shape[1]} anchors x {shape[2]} values (4 box, objectness, {shape[2] - 5} class)"
            return "detect", f"inferred: {dims} is a {how}"
        return "raw", f"{dims} could be detect or ctc: pass --task to score it"
    return "raw", f"no task inferred for {dims}"


class TaskAccumulator:
    """The task metric of one output, chosen on the first batch (see the module doc)."""

    def __init__(self, name: str, settings: TaskSettings,
                 producer: tuple[str, int | None] | None = None) -> None:
        self.name = name
        self.settings = settings
        self.producer = producer
        self.task: str | None = None
        self.how = ""
        self.misfit: str | None = None  # why an explicit task did not fit this output
        self.shape: tuple[int, ...] = ()
        self._impl: Any = None

    def _choose(self, shape: tuple[int, ...]) -> None:
        requested = self.settings.task
        self.shape = shape
        if requested == "auto":
            self.task, self.how = infer(shape, self.producer)
        else:
            self.misfit = fits(requested, shape, self.settings)
            if self.misfit is None:
                self.task, self.how = requested, "given (--task)"
            else:
                self.task, self.how = "raw", f"--task {requested} does not fit {_dims(shape)}"
        s = self.settings
        if self.task == "classify":
            self._impl = ClassifyAccumulator(int(np.prod(shape[1:])))
        elif self.task == "detect":
            layout = _layout(shape, s.detect_format)
            self._impl = DetectAccumulator(layout, s.score_threshold, s.nms_iou)
        elif self.task == "segment":
            self._impl = SegmentAccumulator(shape[1], s.mask_threshold)
        elif self.task == "ctc":
            self._impl = CtcAccumulator()

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        if self.task is None:
            self._choose(tuple(int(d) for d in np.shape(ref)))
        if self._impl is not None and len(ref):
            self._impl.update(ref, cand)

    def result(self) -> TaskResult | None:
        if self.task is None:
            return None
        return TaskResult(self.task, self.how, self._impl.metrics() if self._impl is not None else {})


def require_fit(accumulators: Mapping[str, TaskAccumulator], settings: TaskSettings) -> None:
    """UsageError when an explicit task fits none of the outputs (call after the first batch)."""
    if settings.task in ("auto", "raw"):
        return
    seen = [a for a in accumulators.values() if a.task is not None]
    if seen and all(a.misfit is not None for a in seen):
        raise UsageError(
            f"--task {settings.task} does not fit the model's outputs ("
            + ", ".join(f"'{a.name}' is {_dims(a.shape)}" for a in seen) + f"): {seen[0].misfit}",
            "pass the --task the outputs are for, or --task raw (leave it out to infer it)",
        )
