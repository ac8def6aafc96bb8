"""Which task an output serves, and the task metric compare gates and ranks layers by.

Tasks: ``classify`` (:mod:`~trtq.compare.classify`), ``detect`` (:mod:`~trtq.compare.detect`,
split heads :mod:`~trtq.compare.split_detect`), ``segment`` (:mod:`~trtq.compare.segment`), ``ctc``
(:mod:`~trtq.compare.ctc`) and ``raw`` (the tensor metrics only). Outputs reach the tasks batch
axis first (:mod:`~trtq.compare.evaluate` moves a ``[T, N, C]`` output's batch axis to the front).

``auto`` infers the task of each output from its shape, what the graph says about it
(:class:`~trtq.compare.origin.OutputOrigin`: which axis holds the classes, which op computed the
values) and, for detection heads, the first batch's values. Where the evidence does not settle the
layout, the output is ``raw`` with the reason and the flags that would score it: a confident number
on a guessed layout is worse than none.

* ``[N, C]`` (also ``[N, C, 1, 1]``), C > 1: classify; ``raw`` when the values come from a
  normalisation or pooling (features, not class scores);
* ``[N, C, H, W]`` with H, W > 1: segment, the class axis from the graph (NCHW ops, a Softmax's
  axis, a Transpose to NHWC); ``raw`` when the graph does not say;
* ``[N, T, C]`` whose classes are the last axis by a Softmax / LogSoftmax: ctc (from ``[T, N, C]``
  too);
* ``[N, A, K]`` sharing A with another output: split detector heads, ``raw`` until ``--scores`` and
  ``--boxes`` name them;
* other ``[N, a, b]`` with the smaller of a, b >= 5 and the larger >= 4x it, whose first batch
  holds pixel boxes and scores within [0, 1]: detect (YOLOv8 ``[N, 4+C, A]`` when a < b, else
  YOLOv5 ``[N, A, 5+C]``; ``detect_format`` picks otherwise);
* anything else: raw, with the reason.

An explicit task applies to every output it fits; the others are scored raw (the report says
so), and a task that fits no output is a UsageError (exit 2). ``layout`` states what inference
would read from the graph: ``NTC`` / ``TNC`` for ctc, ``NCHW`` / ``NHWC`` for segment.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from trtq.compare.classify import ClassifyAccumulator
from trtq.compare.ctc import CtcAccumulator
from trtq.compare.detect import DetectAccumulator, Layout
from trtq.compare.origin import FEATURE_OPS, OutputOrigin, output_origins
from trtq.compare.segment import SegmentAccumulator
from trtq.compare.split_detect import BOX_FORMATS
from trtq.errors import ConfigError, UsageError
from trtq.registry import Registry

DETECT_FORMATS = ("auto", "v8", "v5")
SOFTMAX_OPS = ("Softmax", "LogSoftmax")
DETECT_MIN_ROW = 5  # 4 box values and at least one score
DETECT_MIN_RATIO = 4  # anchors >= 4x the row length
_SLACK = 1e-3  # probabilities a little outside [0, 1] from rounding


def output_producers(model: Any) -> dict[str, OutputOrigin]:
    """Graph output name -> :class:`~trtq.compare.origin.OutputOrigin` (the producing op, its axis,
    and the layout evidence of the graph)."""
    return output_origins(model)


def as_origin(producer: Any) -> OutputOrigin | None:
    """An :class:`OutputOrigin` from one, or from an ``(op, axis)`` pair (what a lone node says)."""
    if producer is None or isinstance(producer, OutputOrigin):
        return producer
    op, axis = producer
    from trtq.compare.origin import _NCHW

    class_axis = axis if op in SOFTMAX_OPS and axis is not None else (-1 if op in SOFTMAX_OPS else None)
    how = f"{op} over axis {class_axis}" if op in SOFTMAX_OPS else ""
    if op in _NCHW:
        class_axis, how = 1, f"{op} output (channels on axis 1)"
    return OutputOrigin(op=op, axis=axis, class_axis=class_axis, class_evidence=how, source=op)


@dataclass(frozen=True)
class TaskSettings:
    task: str = "auto"
    detect_format: str = "auto"
    score_threshold: float = 0.25
    nms_iou: float = 0.45
    mask_threshold: float = 0.5
    layout: str = "auto"
    scores: tuple[str, ...] = ()
    boxes: tuple[str, ...] = ()
    box_format: str = "auto"

    @classmethod
    def from_options(cls, options: Any) -> TaskSettings:
        """From a ``CompareOptions`` (or anything with the same fields; missing ones default)."""
        values = {f.name: getattr(options, f.name, None) for f in dataclasses.fields(cls)}
        for key in ("scores", "boxes"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        if isinstance(values.get("layout"), str):
            values["layout"] = values["layout"].upper() if values["layout"].lower() != "auto" else "auto"
        settings = cls(**{k: v for k, v in values.items() if v is not None})
        settings.check()
        return settings

    def check(self) -> None:
        if self.task != "auto" and self.task not in TASKS:
            raise ConfigError(f"unknown compare task '{self.task}'", "use one of: auto, " + ", ".join(TASKS.names()))
        if self.detect_format not in DETECT_FORMATS:
            raise ConfigError(
                f"unknown detect format '{self.detect_format}'", "use one of: " + ", ".join(DETECT_FORMATS)
            )
        for flag, value in (("--score-threshold", self.score_threshold), ("--nms-iou", self.nms_iou)):
            if not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"{flag} must be between 0 and 1, got {value}", "give a fraction, e.g. 0.25")
        if not math.isfinite(float(self.mask_threshold)):
            raise ConfigError(
                f"--mask-threshold must be a finite number, got {self.mask_threshold}",
                "give the value that separates mask from background, e.g. 0.5",
            )
        if self.layout != "auto":
            row = TASKS.find(self.task)
            allowed = row.layouts if row is not None and row.layouts else None
            if allowed is None:
                laid = sorted((t for t in TASKS.rows() if t.layouts), key=lambda t: t.name)
                raise ConfigError(
                    "--layout is for --task "
                    + " or ".join(f"{t.name} ({', '.join(t.layouts)})" for t in laid)
                    + f", not --task {self.task}",
                    "drop --layout, or pass --task " + " / ".join(t.name for t in laid),
                )
            if self.layout not in allowed:
                raise ConfigError(
                    f"--layout {self.layout} is not a {self.task} layout", "use one of: " + ", ".join(allowed)
                )
        if self.box_format not in BOX_FORMATS:
            raise ConfigError(f"unknown --box-format '{self.box_format}'", "use one of: " + ", ".join(BOX_FORMATS))
        if self.scores or self.boxes:
            if self.task != "detect":
                raise ConfigError(
                    "--scores / --boxes name split detector heads: they go with --task detect", "add --task detect"
                )
            if len(self.scores) != len(self.boxes):
                raise ConfigError(
                    f"--scores names {len(self.scores)} output(s) and --boxes {len(self.boxes)}",
                    "name one box output for each score output, in the same order",
                )

    @property
    def split(self) -> bool:
        return bool(self.scores)

    def batch_axis_of(self, rank: int) -> int | None:
        """The batch axis ``layout`` states for an output of this rank (None: not stated)."""
        if self.task == "ctc" and rank == 3 and self.layout in TASKS.get("ctc").layouts:
            return self.layout.index("N")
        return None


@dataclass(frozen=True)
class TaskResult:
    task: str
    how: str  # why this task: "given (--task)" or the inference's reason
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def gate_metric(self) -> str | None:
        row = TASKS.find(self.task)
        return row.gate[0] if row is not None and row.gate else None

    @property
    def gate_label(self) -> str | None:
        row = TASKS.find(self.task)
        return row.gate[1] if row is not None and row.gate else None

    @property
    def value(self) -> float | None:
        """The task metric (None for raw, or where it is undefined: see ``undefined``)."""
        key = self.gate_metric
        return None if key is None else self.metrics.get(key)

    @property
    def undefined(self) -> str | None:
        """Why the task metric has no value (e.g. no reference detections), else None."""
        reason = self.metrics.get("undefined")
        return str(reason) if reason else None


# --------------------------------------------------------------------------------------------
# the tasks: one registry, one row a task
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One task an output can serve: whether it fits an output, what scores it, what it gates.

    Everything that names tasks reads this table: ``--task``'s choices, the check of
    ``compare.task`` (``TASKS.get``), :class:`TaskSettings`, :func:`fits`,
    :class:`TaskAccumulator` and the gate. A new task is one accumulator (``update(ref, cand)``,
    ``metrics()``), its fit test and one ``TASKS.register`` call (:data:`TASKS`, a
    trtq.registry.Registry)."""

    name: str
    # None when the task can score an output of this batch-first shape, else why not:
    # (shape, settings, origin) -> str | None
    fits: Callable[[Sequence[int], Any, Any], str | None]
    # the accumulator of one output, chosen on its first batch: (TaskAccumulator, shape) -> it
    # (None: the tensor metrics only); it may add to the accumulator's ``how``
    accumulator: Callable[[Any, tuple], Any] | None = None
    gate: tuple[str, str] | None = None  # the metric it gates (--min-agreement) and ranks by, its printed name
    layouts: tuple[str, ...] = ()  # the --layout values it takes
    keeps_top1: bool = False  # its metric is top-1 agreement, which the tensor metrics keep for it
    per_sample: bool = False  # its metric is a fraction of samples: it moves in steps of 1 / samples


TASKS: Registry[Task] = Registry("compare.task", also=("auto",))


def gated_task_names() -> tuple[str, ...]:
    """The tasks that have a task metric."""
    return tuple(t.name for t in TASKS.rows() if t.gate is not None)


def moves_per_sample(label: str) -> bool:
    """Whether the task metric printed as ``label`` is a fraction of samples (top-1 agreement,
    sequence agreement), so it moves in steps of 1 / samples; mask IoU (pixels) and detection F1
    (boxes) move in finer steps."""
    return any(t.per_sample for t in TASKS.rows() if t.gate is not None and t.gate[1] == label)


def reported_apart(task: str) -> bool:
    """Its task metric is printed beside the tensor metrics (every gated task but those whose metric
    is top-1 agreement, which the tensor metrics keep)."""
    row = TASKS.find(task)
    return row is not None and row.gate is not None and not row.keeps_top1


def _dims(shape: Sequence[int]) -> str:
    return "[N, " + ", ".join(str(d) for d in shape[1:]) + "]"


def _layout(shape: Sequence[int], detect_format: str) -> Layout:
    channels_first = shape[1] < shape[2]
    objectness = detect_format == "v5" or (detect_format == "auto" and not channels_first)
    return Layout(channels_first=channels_first, objectness=objectness)


def _segment_axis(origin: OutputOrigin | None, layout: str) -> tuple[int | None, str]:
    """The class axis of a 4-D output (1 or 3) and the words for it; None when unknown."""
    if layout in ("NCHW", "NHWC"):
        return layout.index("C"), f"--layout {layout}"
    if origin is not None and origin.class_axis is not None and origin.class_axis % 4 in (1, 3):
        return origin.class_axis % 4, origin.class_evidence
    return None, ""


def fits(task: str, shape: Sequence[int], settings: TaskSettings, origin: Any = None) -> str | None:
    """None when ``task`` can score an output of this (batch-first) shape, else why not."""
    if task not in TASKS:
        raise ConfigError(f"unknown compare task '{task}'", "use one of: " + ", ".join(TASKS.names()))
    return TASKS.get(task).fits(shape, settings, origin)


def _fits_raw(shape: Sequence[int], settings: TaskSettings, origin: Any) -> str | None:
    return None


def _fits_classify(shape: Sequence[int], settings: TaskSettings, origin: Any) -> str | None:
    ok = len(shape) >= 2 and shape[1] > 1 and all(d == 1 for d in shape[2:])
    return None if ok else "classify needs [N, C] scores (C > 1, trailing dims 1)"


def _fits_segment(shape: Sequence[int], settings: TaskSettings, origin: Any) -> str | None:
    if len(shape) != 4:
        return "segment needs [N, C, H, W] or [N, H, W, C] maps"
    axis, _ = _segment_axis(as_origin(origin), settings.layout)
    spatial = [shape[i] for i in (1, 2, 3) if i != (axis or 1)]
    return None if spatial[0] * spatial[1] > 1 else "segment needs maps of more than one pixel"


def _fits_ctc(shape: Sequence[int], settings: TaskSettings, origin: Any) -> str | None:
    ok = len(shape) == 3 and shape[2] > 1
    return None if ok else "ctc needs [N, T, C] or [T, N, C] scores (C > 1, class 0 the blank)"


def _fits_detect(shape: Sequence[int], settings: TaskSettings, origin: Any) -> str | None:
    if len(shape) != 3:
        return "detect needs [N, 4+C, A], [N, A, 4+C] or [N, A, 5+C]"
    layout = _layout(shape, settings.detect_format)
    row = (
        min(shape[1], shape[2])
        if settings.detect_format == "auto"
        else (shape[1] if layout.channels_first else shape[2])
    )
    need = DETECT_MIN_ROW + int(layout.objectness)
    return None if row >= need else f"detect ({layout.name}) needs rows of at least {need} values"


def _classify_accumulator(acc: Any, shape: tuple) -> Any:
    return ClassifyAccumulator(int(np.prod(shape[1:])))


def _detect_accumulator(acc: Any, shape: tuple) -> Any:
    s = acc.settings
    return DetectAccumulator(_layout(shape, s.detect_format), s.score_threshold, s.nms_iou)


def _segment_accumulator(acc: Any, shape: tuple) -> Any:
    axis, how = _segment_axis(acc.origin, acc.settings.layout)
    if axis is None:  # an explicit --task segment on a graph that does not say: the NCHW convention
        axis, how = 1, "NCHW assumed: pass --layout NHWC if the classes are the last axis"
    if acc.settings.task != "auto":
        acc.how += f", {'NCHW' if axis == 1 else 'NHWC'} ({how})"
    return SegmentAccumulator(shape[axis], acc.settings.mask_threshold, axis)


def _ctc_accumulator(acc: Any, shape: tuple) -> Any:
    return CtcAccumulator("TNC" if acc.batch_axis == 1 else "NTC")


TASKS.register(
    Task(
        "classify",
        _fits_classify,
        _classify_accumulator,
        ("top1_agreement", "top-1 agreement"),
        keeps_top1=True,
        per_sample=True,
    )
)
TASKS.register(Task("detect", _fits_detect, _detect_accumulator, ("f1", "detection F1")))
TASKS.register(Task("segment", _fits_segment, _segment_accumulator, ("iou", "mask IoU"), layouts=("NCHW", "NHWC")))
TASKS.register(
    Task(
        "ctc",
        _fits_ctc,
        _ctc_accumulator,
        ("sequence_agreement", "sequence agreement"),
        layouts=("NTC", "TNC"),
        per_sample=True,
    )
)
TASKS.register(Task("raw", _fits_raw))


def _classify_or_features(shape: Sequence[int], origin: OutputOrigin | None) -> tuple[str, str]:
    dims = _dims(shape)
    source = origin.source if origin is not None else None
    if source in FEATURE_OPS and not (origin is not None and origin.op in SOFTMAX_OPS + ("Sigmoid",)):
        return "raw", (
            f"{dims} is made by {source}: features rather than class scores, so top-1 would mean "
            "nothing; pass --task classify if they are class scores"
        )
    return "classify", f"inferred: {dims} class scores, argmax over axis 1"


def _sequence(shape: Sequence[int], origin: OutputOrigin | None, batch_axis: int) -> tuple[str, str] | None:
    """ctc when the classes are the last axis by a Softmax / LogSoftmax, else None."""
    if origin is None or origin.class_axis is None or not origin.class_evidence.startswith(SOFTMAX_OPS):
        return None
    if origin.class_axis % len(shape) != 2:
        return None
    layout = "TNC" if batch_axis == 1 else "NTC"
    return "ctc", (
        f"inferred: {layout} {_dims(shape)} with classes on the last axis by "
        f"{origin.class_evidence} (CTC time steps x classes)"
    )


def _yolo_values_problem(values: np.ndarray | None, layout: Layout) -> str | None:
    """Why the first batch of a YOLO-shaped output does not hold a YOLO head's values, else None:
    boxes in input pixels (not all within [-1, 1]), scores (objectness, classes) within [0, 1]."""
    if values is None:
        return None
    from trtq.compare.detect import rows

    r = rows(values, layout)
    r = r[np.isfinite(r).all(axis=-1)]
    if not r.size:
        return None
    scores, boxes = r[:, 4:], r[:, :4]
    if scores.min() < -_SLACK or scores.max() > 1 + _SLACK:
        return f"its score values span {scores.min():.3g}..{scores.max():.3g}, not probabilities"
    if np.abs(boxes).max() <= 1 + _SLACK:
        return "its box values all lie within [-1, 1], not pixel coordinates"
    return None


def infer(
    shape: Sequence[int],
    producer: Any = None,
    values: np.ndarray | None = None,
    siblings: Sequence[str] = (),
    batch_axis: int = 0,
) -> tuple[str, str]:
    """(task, how it was inferred) for an output of this batch-first shape.

    ``producer``: its :class:`OutputOrigin` (or an ``(op, axis)`` pair); ``values``: the first batch
    (batch first), read for detection heads; ``siblings``: other 3-D outputs with the same second
    dim (split detector heads); ``batch_axis``: where the batch was in the model's output."""
    origin = as_origin(producer)
    dims = _dims(shape)
    if len(shape) >= 2 and shape[1] > 1 and all(d == 1 for d in shape[2:]):
        return _classify_or_features(shape, origin)
    if len(shape) == 4:
        axis, how = _segment_axis(origin, "auto")
        if axis is None:
            return "raw", (
                f"{dims} could be NCHW or NHWC maps and the graph does not say which axis holds the "
                "classes: pass --task segment --layout NCHW or --layout NHWC"
            )
        h, w = [shape[i] for i in (1, 2, 3) if i != axis]
        if h <= 1 or w <= 1:
            return "raw", f"no task inferred for {dims}"
        classes = shape[axis]
        layout = "NCHW" if axis == 1 else "NHWC"
        kind = "a probability map, thresholded" if classes == 1 else f"class maps, argmax over axis {axis}"
        return "segment", f"inferred: {layout} {dims} is {kind} ({how})"
    if len(shape) == 3:
        found = _sequence(shape, origin, batch_axis)
        if found is not None:
            return found
        if siblings:
            return "raw", (
                f"{dims} shares its {shape[1]} anchors with {', '.join(siblings)}: split detector "
                "heads (scores and boxes apart); pass --task detect --scores NAME[,...] --boxes "
                "NAME[,...] --box-format dfl|ltrb|xyxy|cxcywh to score them"
            )
        small, large = sorted(shape[1:])
        if small >= DETECT_MIN_ROW and large >= DETECT_MIN_RATIO * small:
            layout = _layout(shape, "auto")
            problem = _yolo_values_problem(values, layout)
            if problem is not None:
                return "raw", (
                    f"{dims} is shaped like a YOLO head but {problem}: pass --task detect "
                    "(--detect-format v8|v5) if it is one"
                )
            if shape[1] < shape[2]:
                how = f"YOLOv8 head: {shape[1]} rows (4 box + {shape[1] - 4} class) x {shape[2]} anchors"
            else:
                how = f"YOLOv5 head: {shape[1]} anchors x {shape[2]} values (4 box, objectness, {shape[2] - 5} class)"
            return "detect", f"inferred: {dims} is a {how}"
        return "raw", f"{dims} could be detect or ctc: pass --task to score it"
    return "raw", f"no task inferred for {dims}"


class TaskAccumulator:
    """The task metric of one output, chosen on the first batch (see the module doc)."""

    def __init__(
        self, name: str, settings: TaskSettings, producer: Any = None, siblings: Sequence[str] = (), batch_axis: int = 0
    ) -> None:
        self.name = name
        self.settings = settings
        self.origin = as_origin(producer)
        self.siblings = tuple(siblings)
        self.batch_axis = batch_axis
        self.task: str | None = None
        self.how = ""
        self.misfit: str | None = None  # why an explicit task did not fit this output
        self.shape: tuple[int, ...] = ()
        self._impl: Any = None

    def _choose(self, shape: tuple[int, ...], values: np.ndarray) -> None:
        requested = self.settings.task
        self.shape = shape
        if self.settings.split:  # compare scores the named heads together (split_detect); the rest is raw
            named = self.name in self.settings.scores + self.settings.boxes
            self.task = "raw"
            self.how = (
                f"one of the split detector heads scored with '{self.settings.scores[0]}'"
                if named
                else "not named by --scores / --boxes"
            )
            return
        if requested == "auto":
            self.task, self.how = infer(shape, self.origin, values, self.siblings, self.batch_axis)
        else:
            self.misfit = fits(requested, shape, self.settings, self.origin)
            if self.misfit is None:
                self.task, self.how = requested, "given (--task)"
                if requested == "ctc" and self.batch_axis == 1:
                    self.how += ", TNC"
            else:
                self.task, self.how = "raw", f"--task {requested} does not fit {_dims(shape)}"
        make = TASKS.get(self.task).accumulator
        self._impl = make(self, shape) if make is not None else None

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        if self.task is None:
            self._choose(tuple(int(d) for d in np.shape(ref)), np.asarray(ref))
        if self._impl is not None and len(ref):
            self._impl.update(ref, cand)

    def result(self) -> TaskResult | None:
        if self.task is None:
            return None
        return TaskResult(self.task, self.how, self._impl.metrics() if self._impl is not None else {})


def sibling_heads(shapes: Mapping[str, Sequence[int]]) -> dict[str, list[str]]:
    """Output name -> the other 3-D outputs with the same second dim (batch-first shapes): the
    score and box maps of split detector heads share their anchor count."""
    by_anchors: dict[int, list[str]] = {}
    for name, shape in shapes.items():
        if len(shape) == 3 and shape[1] > 1:
            by_anchors.setdefault(int(shape[1]), []).append(name)
    return {name: [o for o in group if o != name] for group in by_anchors.values() if len(group) > 1 for name in group}


def require_fit(accumulators: Mapping[str, TaskAccumulator], settings: TaskSettings) -> None:
    """UsageError when an explicit task fits none of the outputs (call after the first batch), or
    when ``--task detect`` would read split detector heads as YOLO heads."""
    if settings.task in ("auto", "raw"):
        return
    seen = [a for a in accumulators.values() if a.task is not None]
    if settings.task == "detect" and not settings.split:
        split = [a for a in seen if a.siblings and a.misfit is None]
        if split:
            names = [split[0].name, *split[0].siblings]
            raise UsageError(
                f"outputs {', '.join(names)} share their anchors: split detector heads, not one YOLO head each",
                "name them: --task detect --scores NAME[,...] --boxes NAME[,...]",
            )
    if settings.split:
        return
    if seen and all(a.misfit is not None for a in seen):
        raise UsageError(
            f"--task {settings.task} does not fit the model's outputs ("
            + ", ".join(f"'{a.name}' is {_dims(a.shape)}" for a in seen)
            + f"): {seen[0].misfit}",
            "pass the --task the outputs are for, or --task raw (leave it out to infer it)",
        )
