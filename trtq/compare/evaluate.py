"""Run a reference and a candidate model on the same batches and accumulate metrics.

Batches are anything with ``index``, ``arrays`` (input name -> array, axis 0 = samples) and
``valid`` (rows ``valid:`` are padding), i.e. ``trtq.data.batcher.Batch``. Each runner gets the
arrays for its own inputs; outputs are compared on rows ``[:valid]`` only, batch axis first.

Which axis of an output is the batch (:func:`plan_outputs`, on the first batch): the one a task
``layout`` states (``--layout TNC``), else the one the graph's shape inference gives the inputs'
batch dim, else the only axis as long as the batch, else axis 0 when it is as long; an output with
no such axis is compared whole, as one sample per batch. A ``[T, N, C]`` output reaches the metrics
as ``[N, T, C]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Callable

import numpy as np

from trtq.compare.accuracy import CompareReport
from trtq.compare.metrics import OutputAccumulator
from trtq.compare.tasks import TaskAccumulator, TaskSettings, require_fit
from trtq.errors import DataError, ModelError

Progress = Callable[[int, int], None]  # (batches done, samples done)


def _names(specs: Sequence[Any]) -> list[str]:
    return [s.name for s in specs]


def _mismatch(kind: str, reference: Any, candidate: Any, ref_names: list[str], cand_names: list[str]) -> ModelError:
    return ModelError(
        f"the models' {kind} differ: reference {_label(reference)} has "
        f"{', '.join(ref_names) or 'none'}; candidate {_label(candidate)} has "
        f"{', '.join(cand_names) or 'none'}",
        f"compare models with the same {kind} names",
    )


def _label(runner: Any) -> str:
    return str(getattr(runner, "name", type(runner).__name__))


def _static(dim: Any) -> int | None:
    return int(dim) if isinstance(dim, (int, np.integer)) and int(dim) > 0 else None


def check_compatible(reference: Any, candidate: Any) -> list[str]:
    """Output names to compare, in the reference's order.

    ModelError when the input or output names differ, or when an output's rank or a static dim
    differs between the two models.
    """
    ref_in, cand_in = _names(reference.inputs), _names(candidate.inputs)
    if set(ref_in) != set(cand_in):
        raise _mismatch("inputs", reference, candidate, ref_in, cand_in)
    ref_out, cand_out = _names(reference.outputs), _names(candidate.outputs)
    if set(ref_out) != set(cand_out):
        raise _mismatch("outputs", reference, candidate, ref_out, cand_out)
    cand_specs = {s.name: s for s in candidate.outputs}
    for r in reference.outputs:
        c = cand_specs[r.name]
        if not r.shape or not c.shape:
            continue  # unknown shape on one side: checked on the real arrays
        dims_differ = any(
            _static(a) is not None and _static(b) is not None and _static(a) != _static(b)
            for a, b in zip(r.shape, c.shape)
        )
        if len(r.shape) != len(c.shape) or dims_differ:
            raise ModelError(
                f"output '{r.name}' has shape {_dims(r.shape)} in the reference but {_dims(c.shape)} in the candidate",
                "compare models built for the same output shapes",
            )
    return ref_out


def _dims(shape: Sequence[Any]) -> str:
    from trtq.model import format_shape

    return format_shape([_static(d) for d in shape])


def batch_rows(batch: Any) -> tuple[int, int]:
    """(rows in the batch arrays, valid rows)."""
    arrays = batch.arrays
    if not arrays:
        raise DataError(f"batch {getattr(batch, 'index', '?')} has no input arrays")
    first = np.asarray(next(iter(arrays.values())))
    rows = int(first.shape[0]) if first.ndim else 1
    valid = getattr(batch, "valid", None)
    valid = rows if valid is None else int(valid)
    if not 0 <= valid <= rows:
        raise DataError(f"batch {getattr(batch, 'index', '?')} says {valid} valid rows but has {rows}")
    return rows, valid


def feeds_for(runner: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays ``runner`` needs, by input name (DataError naming what is missing)."""
    feeds = {}
    for spec in runner.inputs:
        if spec.name not in arrays:
            raise DataError(
                f"the data has no array for model input '{spec.name}'",
                "data inputs: "
                + (", ".join(sorted(arrays)) or "none")
                + "; set data.inputs to the model's input names",
            )
        feeds[spec.name] = arrays[spec.name]
    return feeds


def valid_outputs(
    outputs: Mapping[str, np.ndarray],
    names: Sequence[str],
    rows: int,
    valid: int,
    side: str,
    runner: Any,
    axes: Mapping[str, int | None] | None = None,
) -> dict[str, np.ndarray]:
    """Rows ``[:valid]`` of each named output along its batch axis (``axes``; default axis 0 where
    it is as long as the batch), moved to the front; the whole output as one sample when it has no
    batch axis."""
    out = {}
    for name in names:
        if name not in outputs:
            raise ModelError(
                f"{side} {_label(runner)} returned no output '{name}'",
                "returned: " + ", ".join(sorted(outputs)),
            )
        arr = np.asarray(outputs[name])
        axis = axes.get(name) if axes is not None else (0 if arr.ndim >= 1 and arr.shape[0] == rows else None)
        if axis is not None and arr.ndim > axis and arr.shape[axis] == rows:
            out[name] = np.moveaxis(arr, axis, 0)[:valid] if axis else arr[:valid]
        else:
            out[name] = arr[None] if valid else arr[:0]
    return out


@dataclasses.dataclass
class OutputPlan:
    """How each output is read (see the module doc): its batch axis, and its split-head siblings."""

    names: list[str]
    axes: dict[str, int | None]
    siblings: dict[str, list[str]]

    def valid(
        self, outputs: Mapping[str, np.ndarray], rows: int, valid: int, side: str, runner: Any
    ) -> dict[str, np.ndarray]:
        return valid_outputs(outputs, self.names, rows, valid, side, runner, self.axes)


def _batch_axis(shape: Sequence[int], rows: int, stated: int | None, inferred: int | None) -> int | None:
    for axis in (stated, inferred):
        if axis is not None and axis < len(shape) and shape[axis] == rows:
            return axis
    matching = [i for i, d in enumerate(shape) if d == rows]
    if len(matching) == 1 or (matching and matching[0] == 0):
        return matching[0]
    return None


def plan_outputs(
    outputs: Mapping[str, np.ndarray],
    names: Sequence[str],
    rows: int,
    origins: Mapping[str, Any],
    settings: TaskSettings,
) -> OutputPlan:
    """The :class:`OutputPlan` for these outputs of a batch of ``rows`` rows (the first batch)."""
    from trtq.compare.tasks import sibling_heads

    axes = {}
    shapes = {}
    for name in names:
        shape = np.shape(outputs[name]) if name in outputs else ()
        origin = origins.get(name)
        axes[name] = _batch_axis(shape, rows, settings.batch_axis_of(len(shape)), getattr(origin, "batch_axis", None))
        if axes[name] is not None:
            shapes[name] = (rows,) + tuple(d for i, d in enumerate(shape) if i != axes[name])
    return OutputPlan(list(names), axes, sibling_heads(shapes))


def _batch_first(origin: Any, axis: int | None) -> Any:
    """``origin`` with its class axis counted as the output reaches the tasks (batch axis first)."""
    from trtq.compare.tasks import as_origin

    origin = as_origin(origin)
    if origin is None or not axis or origin.class_axis is None:
        return origin
    rank = origin.rank
    c = origin.class_axis % rank if rank else origin.class_axis
    if c < axis:
        c += 1
    elif c == axis:
        return dataclasses.replace(origin, class_axis=None, class_evidence="")
    return dataclasses.replace(origin, class_axis=c)


def compare_models(
    reference: Any,
    candidate: Any,
    batches: Iterable[Any],
    options: Any = None,
    progress: Progress | None = None,
    producers: Mapping[str, Any] | None = None,
) -> CompareReport:
    """Run both runners on every batch and return the metrics per output.

    ``options`` is a ``trtq.config.CompareOptions``: ``limit`` stops after that many valid
    samples; ``task`` and its settings pick the task metric of each output (``producers``: output
    name -> (op type, axis) of the reference node that makes it, from
    :func:`trtq.compare.tasks.output_producers`, helps the inference). The gates are applied by
    :meth:`CompareReport.gate`. Memory is bounded: one batch of outputs plus running sums.
    """
    return compare_many(reference, [candidate], batches, options, progress, producers)[0]


def compare_many(
    reference: Any,
    candidates: Sequence[Any],
    batches: Iterable[Any],
    options: Any = None,
    progress: Progress | None = None,
    producers: Mapping[str, Any] | None = None,
) -> list[CompareReport]:
    """:func:`compare_models` for several candidates on the same batches, the reference run once
    per batch; one report per candidate, in order."""
    names = next(check_compatible(reference, c) for c in candidates)
    limit = getattr(options, "limit", None)
    if limit is not None and int(limit) <= 0:
        raise DataError(f"compare limit must be a positive number of samples, got {limit}")
    settings = TaskSettings.from_options(options)
    origins = dict(producers or {})
    accumulators = [{n: OutputAccumulator(n) for n in names} for _ in candidates]
    task_accs: list[dict[str, TaskAccumulator]] = []
    split_accs: list[Any] = []
    plan = None
    samples = 0
    done = 0
    for batch, rows, valid in limited_batches(batches, limit):
        arrays = batch.arrays
        outputs = reference.run(feeds_for(reference, arrays))
        if plan is None:
            plan = plan_outputs(outputs, names, rows, origins, settings)
            task_accs = [task_accumulators(plan, origins, settings) for _ in candidates]
        ref = plan.valid(outputs, rows, valid, "reference", reference)
        if not split_accs and settings.split:
            split_accs = [split_accumulator(settings, ref, arrays) for _ in candidates]
        for i, (candidate, acc, task_acc) in enumerate(zip(candidates, accumulators, task_accs)):
            cand = plan.valid(candidate.run(feeds_for(candidate, arrays)), rows, valid, "candidate", candidate)
            for name in names:
                acc[name].update(ref[name], cand[name])
                task_acc[name].update(ref[name], cand[name])
            if split_accs:
                split_accs[i].update(ref, cand)
            if done == 0:
                require_fit(task_acc, settings)
        samples += valid
        done += 1
        if progress is not None:
            progress(done, samples)
    if samples == 0:
        raise DataError("no samples to compare", "check data.inputs and data.limit")
    return [
        CompareReport(
            reference=_label(reference),
            candidate=_label(candidate),
            samples=samples,
            batches=done,
            outputs=tuple(
                with_task(acc[n].result(), task_acc[n], split_accs[i] if split_accs else None) for n in names
            ),
            runtime=describe_runtime(candidate),
        )
        for i, (candidate, acc, task_acc) in enumerate(zip(candidates, accumulators, task_accs))
    ]


def task_accumulators(
    plan: OutputPlan, origins: Mapping[str, Any], settings: TaskSettings
) -> dict[str, TaskAccumulator]:
    """One :class:`TaskAccumulator` per output of ``plan``, each told its batch axis and siblings."""
    return {
        n: TaskAccumulator(
            n, settings, _batch_first(origins.get(n), plan.axes[n]), plan.siblings.get(n, ()), plan.axes[n] or 0
        )
        for n in plan.names
    }


def split_accumulator(settings: TaskSettings, ref: Mapping[str, np.ndarray], arrays: Mapping[str, Any]) -> Any:
    """The accumulator of ``--scores`` / ``--boxes`` split heads, checked on the first batch."""
    from trtq.compare.split_detect import SplitDetectAccumulator, SplitHeads

    acc = SplitDetectAccumulator(
        SplitHeads(settings.scores, settings.boxes, settings.box_format), settings.score_threshold, settings.nms_iou
    )
    acc.start(ref, arrays)
    return acc


def with_task(metrics: Any, task: TaskAccumulator, split: Any = None) -> Any:
    """``metrics`` (an OutputMetrics) carrying the task result of the same output: the split heads'
    detection result on the first ``--scores`` output. Top-1 agreement is kept for classify
    outputs only: on any other it would be a number with no meaning."""
    from trtq.compare.tasks import TASKS, TaskResult

    result = task.result()
    if split is not None and task.name == split.heads.scores[0]:
        result = TaskResult("detect", split.how, split.metrics())
    if result is not None and not TASKS.get(result.task).keeps_top1:
        metrics = dataclasses.replace(metrics, top1_agreement=None, top1_matches=None)
    return dataclasses.replace(metrics, task=result)


def describe_runtime(runner: Any) -> str:
    """What computed a runner's outputs, for reports: the engine's TensorRT, or ONNX Runtime and
    (for a Q/DQ model) the semantics it was run with."""
    describe = getattr(runner, "describe_runtime", None)
    return describe() if callable(describe) else type(runner).__name__


def limited_batches(batches: Iterable[Any], limit: int | None) -> Iterator[tuple[Any, int, int]]:
    """(batch, rows, valid) for batches with valid rows, ``valid`` cut so that at most
    ``limit`` samples are used in all; stops pulling batches once the limit is reached."""
    used = 0
    for batch in batches:
        rows, valid = batch_rows(batch)
        if limit is not None:
            valid = min(valid, int(limit) - used)
        if valid <= 0:
            continue
        used += valid
        yield batch, rows, valid
        if limit is not None and used >= limit:
            return  # do not pull (decode) another batch
