"""Per-layer quantization sensitivity: which quantized layers cost the most accuracy.

Two modes, both measured against the FP32 model with ONNX Runtime:

* ``only`` - quantize one layer at a time (everything else FP32) and measure the error it
  alone adds. Rows sorted by the task metric (``task_options``: detection F1, top-1, ...),
  then SQNR, lowest (worst) first.
* ``leave-one-out`` - quantize every layer but one and measure how much keeping that layer in
  float improves on the fully quantized model (``gain_db`` = SQNR with the layer float minus
  SQNR of the fully quantized model). Rows sorted by the task metric with the layer float,
  then by gain, largest first.

The layers are those ``quantize_model`` quantizes for these options and amax. Each row reports
the worst output: the lowest SQNR, mean / min cosine and top-1 agreement, the largest max abs
error. ``quantize_options.fp16`` is ignored here (it would add the same FP16 error to every row).

Cost and memory: the FP32 model runs once per batch; its valid outputs and the input batches are
kept in memory for the per-layer loop, at most ``limit`` samples (default
:data:`DEFAULT_SAMPLES`), so memory is about ``limit x (input + output bytes per sample)``.
Then each layer costs one quantize pass, one session built from the serialized model, and one
run over the cached batches.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trtq.compare.accuracy import fmt, gated_values, json_float, table
from trtq.compare.evaluate import (
    feeds_for,
    limited_batches,
    plan_outputs,
    split_accumulator,
    task_accumulators,
    with_task,
)
from trtq.compare.metrics import OutputAccumulator, OutputMetrics, Reference
from trtq.compare.onnx_runner import OnnxRunner
from trtq.compare.tasks import TaskSettings, output_producers
from trtq.errors import ConfigError, DataError, ModelError

log = logging.getLogger(__name__)

MODES = ("only", "leave-one-out")
DEFAULT_SAMPLES = 256  # samples cached for the per-layer loop when no limit is given

LayerProgress = Callable[[int, int, str], None]  # (layers done, layers in all, node name)


@dataclass(frozen=True)
class LayerRow:
    node: str
    op_type: str
    sqnr_db: float
    cosine_mean: float
    cosine_min: float
    top1_agreement: float | None
    max_abs_error: float
    gain_db: float | None = None  # leave-one-out only
    task_metric: float | None = None  # the worst output's task metric (ranked by first)
    task_metric_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "node": self.node,
            "op_type": self.op_type,
            "sqnr_db": json_float(self.sqnr_db),
            "cosine_mean": json_float(self.cosine_mean),
            "cosine_min": json_float(self.cosine_min),
            "top1_agreement": json_float(self.top1_agreement),
            "max_abs_error": json_float(self.max_abs_error),
        }
        if self.gain_db is not None:
            d["gain_db"] = json_float(self.gain_db)
        if self.task_metric_name is not None:
            d["task_metric"] = json_float(self.task_metric)
            d["task_metric_name"] = self.task_metric_name
        return d


def render_layer_table(rows: Sequence[LayerRow], mode: str = "only") -> str:
    """Aligned text table of the rows (in the order given)."""
    if mode == "only":
        title = "per-layer sensitivity: each layer quantized alone vs FP32, worst first"
    else:
        title = "per-layer sensitivity: all layers quantized but one; gain from keeping it in float, largest first"
    if not rows:
        return title + "\n(no layers)"
    metric = next((r.task_metric_name for r in rows if r.task_metric_name), None)
    if metric:
        title += (
            f"; ranked by {metric}, then SQNR"
            if mode == "only"
            else f"; ranked by {metric} with the layer float, then gain"
        )
    header = ["node", "op"] + ([metric] if metric else []) + ["SQNR dB", "cos mean", "cos min", "top-1", "max abs err"]
    if mode != "only":
        header.append("gain dB")
    body = []
    for r in rows:
        cells = (
            [r.node, r.op_type]
            + ([fmt(r.task_metric, ".4f")] if metric else [])
            + [
                fmt(r.sqnr_db, ".2f"),
                fmt(r.cosine_mean, ".6f"),
                fmt(r.cosine_min, ".6f"),
                fmt(r.top1_agreement, ".4f"),
                fmt(r.max_abs_error, ".4g"),
            ]
        )
        if mode != "only":
            cells.append(fmt(r.gain_db, "+.2f"))
        body.append(cells)
    return title + "\n" + table(header, body, left=2)


class _CachedBatch:
    __slots__ = ("feeds", "prepared", "reference", "rows", "valid")

    def __init__(self, feeds: dict[str, np.ndarray], rows: int, valid: int, reference: dict[str, np.ndarray]):
        self.feeds = feeds
        self.rows = rows
        self.valid = valid
        self.reference = reference
        # what every layer's comparison reads of the reference, once
        self.prepared = {name: Reference(value) for name, value in reference.items()}


def _worst(node: str, op_type: str, metrics: Sequence[OutputMetrics], gain_db: float | None = None) -> LayerRow:
    top1 = [m.top1_agreement for m in metrics if m.top1_agreement is not None]
    gated = [(label, value) for m, label, value in gated_values(metrics) if m.task is not None and m.task.task != "raw"]
    return LayerRow(
        node=node,
        op_type=op_type,
        sqnr_db=_nanmin(m.sqnr_db for m in metrics),
        cosine_mean=_nanmin(m.cosine_mean for m in metrics),
        cosine_min=_nanmin(m.cosine_min for m in metrics),
        top1_agreement=_nanmin(top1) if top1 else None,
        max_abs_error=-_nanmin(-m.max_abs_error for m in metrics),
        gain_db=gain_db,
        task_metric=_nanmin(v for _, v in gated) if gated else None,
        task_metric_name=" / ".join(sorted({label for label, _ in gated})) or None,
    )


def _nanmin(values: Iterable[float]) -> float:
    """Minimum where NaN wins (a NaN metric is the worst possible)."""
    out = math.inf
    for v in values:
        if math.isnan(v):
            return math.nan
        out = min(out, v)
    return out


def _low_first(value: float | None) -> float:
    """Sort value of a metric where lower is worse: NaN is the worst, a missing one ties."""
    if value is None:
        return 0.0
    return -math.inf if math.isnan(value) else value


def _sort_key_only(row: LayerRow) -> tuple[float, float, float]:
    return (_low_first(row.task_metric), _low_first(row.sqnr_db), _low_first(row.cosine_mean))


def _sort_key_gain(row: LayerRow) -> tuple[float, float, float]:
    gain = row.gain_db if row.gain_db is not None else 0.0
    task = row.task_metric if row.task_metric is not None else 0.0
    return (
        -(math.inf if math.isnan(task) else task),
        -(math.inf if math.isnan(gain) else gain),
        _low_first(row.sqnr_db),
    )


def per_layer_sensitivity(
    model: Any,
    amax: Mapping[str, float],
    quantize_options: Any,
    batches: Iterable[Any],
    mode: str = "only",
    top: int | None = None,
    limit: int | None = None,
    providers: Sequence[str] | None = None,
    progress: LayerProgress | None = None,
    task_options: Any = None,
    producers: Mapping[str, Any] | None = None,
    layers: Sequence[str] | None = None,
) -> list[LayerRow]:
    """Rank the layers ``quantize_model`` quantizes by the error each one causes.

    ``model`` is the FP32 ``onnx.ModelProto``; ``amax`` the calibration table; ``batches`` as
    for :func:`~trtq.compare.compare_models`. Returns rows sorted worst first, cut to ``top``.
    With ``task_options`` (a ``CompareOptions``) each row also carries the task metric of its
    worst output, and rows are ranked by it first (SQNR breaks ties); without, by SQNR.
    ``producers``: what makes each output, for the task inference (default: ``model``'s own,
    :func:`~trtq.compare.tasks.output_producers`; a caller that rewrote the graph passes the
    original's: an opset upgrade turns a Softmax output into a Reshape's). ``layers``: rank only
    these of the quantized layers (``only`` mode).
    """
    _check_arguments(mode, top, limit)
    from trtq.config import QuantizeOptions
    from trtq.quantize import quantize_model

    settings = TaskSettings.from_options(task_options) if task_options is not None else None
    options = quantize_options if quantize_options is not None else QuantizeOptions()
    if getattr(options, "fp16", False):
        options = dataclasses.replace(options, fp16=False)
    prepared, full, layers = _layers_to_rank(model, amax, options, layers)
    # node names are the quantizer's (it names unnamed nodes), so take op types from its model
    op_types = {n.name: n.op_type for n in full.model.graph.node}

    producers = output_producers(model) if producers is None else producers
    with OnnxRunner.from_model(model, providers, name="FP32 model") as fp32:
        names = [s.name for s in fp32.outputs]
        cached, plan = _cache_reference(
            fp32, names, batches, limit or DEFAULT_SAMPLES, producers, settings or TaskSettings()
        )
        if limit is None and len(cached) and sum(c.valid for c in cached) >= DEFAULT_SAMPLES:
            log.info("per-layer analysis uses the first %d samples (set a limit to change)", DEFAULT_SAMPLES)
    reported: list[bool] = []

    def measure(candidate_model: Any, label: str) -> list[OutputMetrics]:
        accs = {n: OutputAccumulator(n) for n in names}
        tasks = task_accumulators(plan, producers, settings) if settings else {}
        split = (
            split_accumulator(settings, cached[0].reference, cached[0].feeds) if settings and settings.split else None
        )
        with OnnxRunner.from_model(candidate_model, providers, name=label) as runner:
            for c in cached:
                out = plan.valid(runner.run(c.feeds), c.rows, c.valid, "candidate", runner)
                for n in names:
                    accs[n].update(c.prepared[n], out[n])
                    if n in tasks:
                        tasks[n].update(c.reference[n], out[n])
                if split is not None:
                    split.update(c.reference, out)
        metrics = [with_task(accs[n].result(), tasks[n], split) if n in tasks else accs[n].result() for n in names]
        if settings is not None and not reported:
            reported.append(_say_how_ranked(metrics))
        return metrics

    def variant(only: set[str]) -> Any:  # the model with just these layers quantized
        return quantize_model(prepared, amax, options, only_nodes=only).model if only else model

    rows = _rank(mode, layers, op_types, variant, measure, full.model, progress)
    return rows[: int(top)] if top is not None else rows


def _layers_to_rank(
    model: Any, amax: Mapping[str, float], options: Any, layers: Sequence[str] | None
) -> tuple[Any, Any, list[str]]:
    """(the prepared model, its full QuantizeResult, the quantized layers to rank: ``layers`` or all);
    ModelError (exit 3) when nothing is quantized."""
    from trtq.quantize import quantize_model
    from trtq.quantize.prepare import prepare_model

    prepared = prepare_model(model)[0]  # once: each variant would redo it (an opset upgrade, folding)
    full = quantize_model(prepared, amax, options)
    if not full.quantized:  # the model as given (or the cache, or --exclude) leaves nothing: invalid input, exit 3
        reasons = "; ".join(sorted({str(r) for _, r in full.left_float})[:2]) or "no Conv/Gemm/MatMul with a range"
        raise ModelError(
            f"no layer of the model is quantized ({reasons}), so there is nothing to rank for --per-layer / "
            "--float-layers",
            "check that the cache covers this model (trtq inspect-cache --model) and --exclude, or drop the flag",
        )
    wanted = set(full.quantized if layers is None else layers)
    return prepared, full, [n for n in full.quantized if n in wanted]


def _check_arguments(mode: str, top: int | None, limit: int | None) -> None:
    if mode not in MODES:
        raise ConfigError(f"unknown per-layer mode '{mode}'", "use one of: " + ", ".join(MODES))
    if top is not None and int(top) <= 0:
        raise ConfigError(f"--top must be a positive number of rows, got {top}")
    if limit is not None and int(limit) <= 0:
        raise DataError(f"per-layer limit must be a positive number of samples, got {limit}")


def _rank(
    mode: str,
    layers: list[str],
    op_types: Mapping[str, str],
    variant: Callable[[set[str]], Any],
    measure: Callable[[Any, str], list[OutputMetrics]],
    full_model: Any,
    progress: LayerProgress | None,
) -> list[LayerRow]:
    """One row per layer: each quantized alone (``only``) or each left float (``all-but``), sorted."""
    rows: list[LayerRow] = []
    if mode == "only":
        for i, node in enumerate(layers):
            rows.append(_worst(node, op_types.get(node, "?"), measure(variant({node}), node)))
            if progress is not None:
                progress(i + 1, len(layers), node)
        rows.sort(key=_sort_key_only)
        return rows
    baseline = _worst("", "", measure(full_model, "all layers quantized")).sqnr_db
    everything = set(layers)
    for i, node in enumerate(layers):
        row = _worst(node, op_types.get(node, "?"), measure(variant(everything - {node}), f"all but {node}"))
        rows.append(dataclasses.replace(row, gain_db=_gain(row.sqnr_db, baseline)))
        if progress is not None:
            progress(i + 1, len(layers), node)
    rows.sort(key=_sort_key_gain)
    return rows


def _gain(sqnr: float, baseline: float) -> float:
    if math.isinf(sqnr) and math.isinf(baseline) and sqnr == baseline:
        return 0.0  # both inf: quantizing this layer made no difference either way
    return sqnr - baseline


def _cache_reference(
    fp32: OnnxRunner,
    names: list[str],
    batches: Iterable[Any],
    limit: int,
    origins: Mapping[str, Any],
    settings: TaskSettings,
) -> tuple[list[_CachedBatch], Any]:
    cached: list[_CachedBatch] = []
    plan = None
    for batch, rows, valid in limited_batches(batches, limit):
        # copies: a batcher may reuse its buffers for the next batch
        feeds = {k: np.array(v, copy=True) for k, v in feeds_for(fp32, batch.arrays).items()}
        outputs = fp32.run(feeds)
        if plan is None:
            plan = plan_outputs(outputs, names, rows, origins, settings)
        reference = plan.valid(outputs, rows, valid, "reference", fp32)
        # float64 once: every layer's metrics read the reference in float64
        cached.append(
            _CachedBatch(feeds, rows, valid, {k: np.array(v, dtype=np.float64) for k, v in reference.items()})
        )
    if not cached:
        raise DataError("no samples for the per-layer analysis", "check data.inputs and data.limit")
    return cached, plan


def _say_how_ranked(metrics: Sequence[OutputMetrics]) -> bool:
    """Log, once, that the ranking falls back to SQNR where no output has a task metric."""
    if any(m.task is not None and m.task.gate_metric is not None for m in metrics):
        return True
    why = "; ".join(f"{m.name}: {m.task.how}" for m in metrics if m.task is not None)[:300]
    log.warning(
        "layers ranked by SQNR: compare could not tell what the outputs are for (%s); pass --task "
        "(and --layout, --scores/--boxes) to rank by the task metric",
        why or "no output",
    )
    return True
