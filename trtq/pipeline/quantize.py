"""File-level quantize step: model file + cache file -> Q/DQ model file (used by quantize and build)."""

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from trtq.config import QuantizeOptions
from trtq.errors import ModelError, UsageError
from trtq.fileio import atomic_path
from trtq.formatting import first_few

log = logging.getLogger(__name__)

# the notes the text output shows
DATA_STEP_NOTES = (
    "equalized channels",
    "float layers",
    "centred activations",
    "centred through padding",
    "centring in engine form",
    "weight rounding",
    "bias correction",
    "reconstruct",
)


def quantized_model(model_path: Path, cache_path: Path, options: QuantizeOptions, data=None):
    """Read model and cache, refuse a stale cache, and return the QuantizeResult (not saved).

    ``data`` (DataOptions) feeds the data-driven steps (bias correction, gptq rounding) the options ask for."""
    return _quantized(model_path, cache_path, options, data)[0]


def _quantized(model_path: Path, cache_path: Path, options: QuantizeOptions, data, task_options=None, batches=None):
    """(QuantizeResult, the FP32 model, the input shapes the cache was calibrated with)."""
    from trtq.calib.cache import read_cache
    from trtq.calib.freshness import check_cache_for_model
    from trtq.model import load_model
    from trtq.trt import compat

    check_options(options)
    model = load_model(model_path)
    table = read_cache(Path(cache_path))
    provenance = check_cache_for_model(Path(cache_path), Path(model_path), options.allow_stale, table.amax)
    result = quantize_for(
        model,
        table.amax,
        options,
        data,
        table.trt_version,
        remeasure_from(provenance, table.algorithm),
        task_options,
        batches=batches,
    )
    refuse_nothing_quantized(result, Path(model_path))
    if compat.float_grouped_conv_is_unsafe_for(table.trt_version):
        warn_float_grouped_convs(table.trt_version, result)
    shapes = ((provenance or {}).get("data") or {}).get("shapes")
    return result, model, shapes if isinstance(shapes, dict) else None


def quantize_for(
    model,
    amax: Mapping[str, float],
    options: QuantizeOptions,
    data,
    trt_version: Optional[str],
    remeasure=None,
    task_options=None,
    batches=None,
):
    """``quantize_model`` as quantize and build run it: the sample batches of ``data`` (DataOptions)
    that the data-driven steps read, the equalized model (``options.equalize``; ``remeasure``, a
    :class:`~trtq.quantize.equalize.Remeasure`: how its scaled tensors get their amax, default
    mse), the ``float_layers`` choice, and for a TensorRT 8 target (``trt_version``) the consumers
    of float grouped Convs left float too and a warning for INT8 attention
    (:func:`warn_int8_attention`). ``task_options`` (CompareOptions): what the outputs are
    for, when the float-layer ranking cannot infer it (``compare.task``, ``layout``, ...).
    ``batches`` (the Python API): a function of the input specs and a sample limit that returns the
    in-memory batch source read instead of ``data`` (fed as it is: a batch-1 model is not widened)."""
    from trtq.pipeline.placement_from import with_tuned_placement
    from trtq.quantize import quantize_model
    from trtq.trt import compat

    check_options(options)
    options = with_tuned_placement(options, model)
    fp32 = model  # the user's graph, before batching or equalizing
    given = batches
    batches = sample_batches(model, options, data, given)
    declared = None
    if batches is not None and given is None:
        model, batches, declared = batched_if_identical(model, batches, data, options)
    notes, producers = [], None
    if options.equalize:
        from trtq.compare.tasks import output_producers
        from trtq.quantize.equalize import Remeasure, equalize_model

        producers = output_producers(model)  # the ranking's task inference reads the user's graph
        model, amax, notes = equalize_model(model, amax, batches, remeasure or Remeasure())
    result = quantize_model(
        model,
        amax,
        options,
        data=batches,
        float_grouped_consumers=compat.float_grouped_conv_is_unsafe_for(trt_version),
        keep_float=choose_float_layers(model, amax, options, batches, producers, task_options),
    )
    result.notes[:0] = notes
    if declared is not None:
        declared(result.model)
    _warn_unmatched_exclude(result.notes)
    if options.attention == "int8":  # as configured, or as --placement-from set it
        warn_int8_attention(trt_version, fp32, result)
    return result


def _warn_unmatched_exclude(notes) -> None:
    """One warning line when --exclude (quantize.exclude) has entries that name no node: a typo
    would otherwise quantize what the user meant to keep float, silently."""
    from trtq.quantize import UNMATCHED_EXCLUDE

    for note in notes:
        if note.startswith(UNMATCHED_EXCLUDE):
            log.warning(
                "%s (op types, exact node names or regexes searched in node names: see the names in "
                "trtq quantize --json's quantized and left_float)",
                note,
            )


def check_options(options: QuantizeOptions) -> None:
    """Refuse options that do not combine (reconstruct's, centring with another placement: exit 2)
    and a missing torch (exit 4) before anything is read."""
    from trtq.quantize import check_centering_options, check_reconstruct_options

    check_reconstruct_options(options)
    check_centering_options(options)
    if options.reconstruct:
        from trtq.quantize.reconstruct import require_torch

        require_torch()


def batched_if_identical(model, batches, data, options: QuantizeOptions):
    """(model, batches, restore) for the data steps of a model whose inputs fix a batch of 1: the
    model with a dynamic batch dim and its batches of 8, when :func:`trtq.calib.collect.batch_one.probe` finds
    every activation the steps read bit-identical batched and one sample at a time (as calibrate
    feeds such a model), and ``restore(model)`` that gives a result the user's input and output
    declarations back; else (model, batches, None) unchanged."""
    import dataclasses

    from trtq.calib.collect.batch_one import fixed_batch_one, widen_if_identical
    from trtq.calib.collect.budget import resolve_budget
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs
    from trtq.quantize import planned_activations

    specs = input_specs(model)
    if not fixed_batch_one(specs, data):
        return model, batches, None
    planned = planned_activations(model, (options.placement_used(),))
    tensors = list(dict.fromkeys(planned + [o.name for o in model.graph.output]))
    # the steps read Conv / Gemm / MatMul inputs and the outputs, whatever axis carries the batch
    wide, wide_specs, wide_data, mode = widen_if_identical(
        model, specs, batches.options, tensors, (), resolve_budget(None), any_axis=True
    )
    if mode != "batched":
        log.info("data steps on a batch-1 model: one sample per call (%s)", mode or "not batch-1")
        return model, batches, None
    log.info("data steps on a batch-1 model: fed in batches of %d (activations identical)", wide_data.batch_size)

    def restore(result_model) -> None:
        kinds = {vi.name: vi for vi in list(model.graph.input) + list(model.graph.output)}
        for vi in list(result_model.graph.input) + list(result_model.graph.output):
            if vi.name in kinds:
                vi.type.CopyFrom(kinds[vi.name].type)

    return wide, Batcher(dataclasses.replace(wide_data, limit=batches.options.limit), wide_specs), restore


def remeasure_from(provenance, algorithm: Optional[str] = None):
    """How :func:`quantize_for` re-measures what it equalizes: the cache's calibration method from
    its provenance; for a cache without one, what its header's algorithm computes (MinMax: max,
    EntropyCalibration: entropy), else mse (trtq's default)."""
    from trtq.quantize.equalize import Remeasure

    default = Remeasure()
    method = (provenance or {}).get("method")
    if isinstance(method, dict) and isinstance(method.get("name"), str):
        return Remeasure(
            method["name"],
            float(method.get("percentile", default.percentile)),
            int(method.get("num_bins", default.num_bins)),
        )
    if algorithm in _TENSORRT_ALGORITHMS:  # a cache without provenance: what TensorRT's calibrator computes
        from trtq.calib.methods import tensorrt_method

        return Remeasure(tensorrt_method(algorithm))
    return default


# the headers of TensorRT's own calibrators (MinMax, the entropy ones)
_TENSORRT_ALGORITHMS = ("MinMaxCalibration", "EntropyCalibration", "EntropyCalibration2")


def refuse_nothing_quantized(result, model_path: Path) -> None:
    """A model with Conv/Gemm/MatMul that came out without a single Q/DQ pair is an error: its
    "INT8" model would be the FP32 model, and every accuracy gate would pass on it."""
    from collections import Counter

    from trtq.quantize.float_choice import WEIGHTED_OPS

    if result.quantized:
        return
    weighted = [n for n in result.model.graph.node if n.op_type in WEIGHTED_OPS]
    if not weighted:
        return
    names = {n.name for n in weighted}
    reasons = Counter(reason for node, reason in result.left_float if node in names)
    if reasons:
        top = "; ".join(f"{count}x {reason}" for reason, count in reasons.most_common(3))
        why = f"every one stays float ({top})"
    else:
        why = "none of them has a constant weight and ranged inputs the placement rules accept"
    raise ModelError(
        f"{model_path.name}: quantized 0 of its {len(weighted)} Conv/Gemm/MatMul nodes: {why}",
        "check --exclude and the cache (trtq inspect-cache --model); weights computed at run time "
        "from graph inputs cannot be quantized ahead of time",
    )


RANK_SAMPLES = 64  # samples the float_layers ranking settles its choice on (at most)
SCREEN_SAMPLES = 8  # samples every layer is first ranked on, when there are many layers
SHORTLIST = 3  # that many times float_layers (at least 6) go on from the screen to the full ranking


def choose_float_layers(
    fp32, amax: Mapping[str, float], options: QuantizeOptions, data, producers=None, task_options=None
) -> dict[str, str]:
    """The ``options.float_layers`` layers that cost the most when quantized alone, ranked as
    ``compare --per-layer`` ranks them: by the task metric of the task each output's shape implies
    (top-1 agreement, detection F1, sequence agreement, ...; SQNR breaks ties, and ranks alone for
    raw outputs), nearest rounding; name -> reason. Empty when the options ask for none or there is
    no data. Passed to ``quantize_model(keep_float=...)``. ``producers``: as for
    :func:`~trtq.compare.sensitivity.per_layer_sensitivity`.

    The ranking costs a model run per layer and sample, so every layer is first screened on
    ``SCREEN_SAMPLES`` samples, and the ``SHORTLIST x float_layers`` worst (at least 6) are ranked
    on ``RANK_SAMPLES``; a model with no more layers than that is ranked on ``RANK_SAMPLES`` alone.

    Measured (PP-OCRv4 rec, 200 Chinese lines, benchmarks/bench_rec_lines.py): 8 float layers by
    the CTC sequence agreement 0.805 against 0.765 by SQNR; EfficientNet-Lite0's worst four layers
    are the same either way."""
    if options.float_layers <= 0 or data is None:
        return {}
    import dataclasses

    from trtq import progress
    from trtq.compare.sensitivity import per_layer_sensitivity
    from trtq.config import CompareOptions

    base = dataclasses.replace(options, float_layers=0, bias_correction=False, weight_rounding="nearest")
    limit = min(options.samples, RANK_SAMPLES, getattr(data, "num_samples", None) or RANK_SAMPLES)
    tasks = task_options or CompareOptions()
    shortlist = max(6, SHORTLIST * options.float_layers)
    layers = None
    screen = min(limit, SCREEN_SAMPLES)
    if screen < limit and len(quantize_model_layers(fp32, amax, base)) > shortlist:
        with progress.task(f"float layers: screening on {screen} samples") as shown:
            rows = per_layer_sensitivity(
                fp32,
                amax,
                base,
                data,
                mode="only",
                limit=screen,
                task_options=tasks,
                producers=producers,
                progress=progress.callback(shown),
            )
        layers = [r.node for r in rows[:shortlist]]
        log.info(
            "float layers: %d layers screened on %d samples; the %d worst ranked on %d",
            len(rows),
            screen,
            shortlist,
            limit,
        )
    with progress.task(f"float layers: ranking on {limit} samples") as shown:
        rows = per_layer_sensitivity(
            fp32,
            amax,
            base,
            data,
            mode="only",
            top=options.float_layers,
            limit=limit,
            task_options=tasks,
            producers=producers,
            layers=layers,
            progress=progress.callback(shown),
        )
    return {r.node: f"float_layers: {_alone(r)} quantized alone, among the {options.float_layers} worst" for r in rows}


def quantize_model_layers(fp32, amax: Mapping[str, float], options: QuantizeOptions) -> list[str]:
    """The layers ``quantize_model`` quantizes with these options (planning only: no data)."""
    from trtq.quantize import quantize_model

    return list(quantize_model(fp32, amax, options).quantized)


def _alone(row) -> str:
    sqnr = f"SQNR {row.sqnr_db:.1f} dB"
    if row.task_metric_name is None or row.task_metric is None:
        return sqnr
    return f"{row.task_metric_name} {row.task_metric:.4f}, {sqnr}"


def needs_data(options: QuantizeOptions) -> bool:
    return (
        options.bias_correction
        or options.weight_rounding != "nearest"
        or options.float_layers > 0
        or options.equalize
        or options.reconstruct
    )


def sample_batches(model, options: QuantizeOptions, data, batches=None):
    """The batches the data-driven steps read (bias correction, gptq rounding, float_layers: the
    first ``options.samples`` of ``data``, or of ``batches(specs, limit)``, the Python API's
    in-memory source), or None when the options ask for none of them."""
    if options.float_layers < 0:
        raise UsageError(f"float_layers must be >= 0, got {options.float_layers}")
    if options.samples < 1:
        raise UsageError(f"quantize samples must be >= 1, got {options.samples}")
    if not needs_data(options):
        return None
    import dataclasses

    from trtq.data.batcher import Batcher
    from trtq.model import input_specs

    if batches is not None:
        return batches(input_specs(model), options.samples)
    if data is None or not data.inputs:
        what = (
            "reconstruct"
            if options.reconstruct
            else "equalize"
            if options.equalize
            else "bias correction"
            if options.bias_correction
            else f"{options.weight_rounding} weight rounding"
            if options.weight_rounding != "nearest"
            else "float_layers"
        )
        raise UsageError(
            f"{what} needs calibration data", "pass --data DIR --preprocess PRESET, or a config with data.inputs"
        )
    limit = min(options.samples, data.limit) if data.limit else options.samples
    return Batcher(dataclasses.replace(data, limit=limit), input_specs(model))


def save_model(model, output: Path, feeds=None, original=None, what: Optional[str] = None) -> None:
    """Check an ONNX model trtq made (:func:`trtq.model_check.check_produced_model`: the full
    checker and one ONNX Runtime run on ``feeds``, default a synthetic batch) and write it
    atomically (external data is not used: Q/DQ adds little). ``original``: the model it was made
    from."""
    import onnx

    from trtq.model_check import check_produced_model

    check_produced_model(model, what or f"{Path(output).name}", feeds, original)
    from trtq.interrupt import held_for_outputs

    # the model is the command's one output: a signal once it is being put in place is dropped (it
    # is complete, exit 0), never an exit 143 with the new model already written over the old one
    with held_for_outputs(), atomic_path(output) as tmp:
        onnx.save(model, str(tmp))


def check_batch(model, data, shapes=None, batches=None):
    """The batch a produced model is test-run on: the first sample of ``data`` (DataOptions), or
    the first batch of ``batches(specs, 1)`` (the Python API's), at ``model``'s inputs where data
    is given and readable, else a synthetic batch at ``shapes`` (the shapes the cache was
    calibrated with) or the declared ones."""
    import dataclasses

    from trtq.errors import TrtqError
    from trtq.model_check import synthetic_feeds

    if batches is not None:
        from trtq.model import input_specs

        return dict(next(iter(batches(input_specs(model), 1))).arrays)
    if data is not None and data.inputs:
        from trtq.data.batcher import Batcher
        from trtq.model import input_specs

        try:
            batch = next(iter(Batcher(dataclasses.replace(data, limit=1), input_specs(model))), None)
        except TrtqError as e:
            log.info("the produced model is test-run on a synthetic batch: the data is not usable (%s)", e)
            batch = None
        if batch is not None:
            return dict(batch.arrays)
    try:
        return synthetic_feeds(model, shapes)
    except (TypeError, ValueError):  # shapes of another form in an old provenance: the declared ones
        return synthetic_feeds(model)


def warn_float_grouped_convs(trt_version: str, result) -> list[str]:
    """Log what the TensorRT 8 float grouped-conv workaround (``quantize_model(float_grouped_consumers=
    True)``, for a TensorRT 8 build or a cache written for TensorRT 8) left float; returns those
    consumers. Float grouped Convs it could not protect (no quantized consumer found, and a reader
    that is not a float weighted layer) get a warning to check the engine."""
    from trtq.quantize.float_choice import GROUPED_CONSUMER_REASON, float_grouped_convs, unresolved_readers
    from trtq.quantize.graph import GraphIndex

    index = GraphIndex(result.model)
    risky = float_grouped_convs(index, result.left_float)
    extra = [n for n, why in result.left_float if why == GROUPED_CONSUMER_REASON]
    if not extra:  # float readers only (the layer it feeds left float too) is the pair that built right
        risky = unresolved_readers(index, risky, result.quantized)
    shown = first_few(risky, 3)
    if extra:
        log.warning(
            "TensorRT %s builds wrong engines when a float grouped/depthwise Conv (%s) feeds INT8 layers: "
            "also leaving float %s",
            trt_version,
            shown,
            first_few(extra),
        )
    elif risky:
        log.warning(
            "%d grouped/depthwise Conv(s) left float between INT8 layers (%s): TensorRT %s built such "
            "engines with wrong outputs in our tests; check this engine with trtq compare",
            len(risky),
            shown,
            trt_version,
        )
    return extra


def warn_int8_attention(trt_version: Optional[str], fp32, result) -> list[str]:
    """Warn when ``result`` quantized the Softmax x V MatMuls of ``fp32`` for a TensorRT that
    computed them wrongly in our tests (:func:`trtq.trt.compat.int8_attention_is_unsafe_for`);
    returns those MatMuls. The score MatMuls (Q x K^T) alone in INT8 were right (D34)."""
    from trtq.quantize.rules import attention_matmuls
    from trtq.trt import compat

    if not compat.int8_attention_is_unsafe_for(trt_version):
        return []
    quantized = set(result.quantized)
    cores = [name for name in attention_matmuls(fp32, values_only=True) if name in quantized]
    if cores:
        log.warning(
            "%d attention MatMul(s) quantized for TensorRT %s read the Softmax output (%s): TensorRT 8.6.0 "
            "computed those wrongly in PP-OCRv4 rec's engine (docs/decisions.md D34); check this engine with "
            "trtq compare (--tune-placement scores it), --exclude them, or keep --attention float",
            len(cores),
            trt_version,
            first_few(cores, 3),
        )
    return cores


def _warn_tensorrt8_float_convs(result) -> None:
    from trtq.quantize.float_choice import grouped_conv_consumers
    from trtq.quantize.graph import GraphIndex

    risky, consumers = grouped_conv_consumers(GraphIndex(result.model), result.left_float, result.quantized)
    if consumers:
        log.warning(
            "for TensorRT 8: a float grouped/depthwise Conv (%s) feeding INT8 layers gave wrong "
            "engines on 8.6.0; also --exclude %s (trtq build does that itself)",
            ", ".join(risky[:3]),
            " --exclude ".join(f"'^{re.escape(n)}$'" for n in consumers[:3]),
        )


def reconstructed_cache_path(output: Path) -> Path:
    """Where ``quantize --reconstruct`` writes the cache its learned activation scales imply."""
    return Path(output).with_suffix(".cache")


def quantize(
    cfg,
    model_path: Path,
    cache_path: Path,
    output: Optional[Path],
    learned_cache: Optional[Path] = None,
    *,
    batches=None,
):
    """``trtq quantize``'s step: the Q/DQ model of ``model_path`` with the ranges of ``cache_path``
    (``cfg.quantize``; the data steps read ``cfg.data``, float layers rank by ``cfg.compare``),
    checked and written to ``output``; with reconstruct, ``learned_cache`` gets the cache of
    ``cache_path`` with the learned activation ranges. The QuantizeResult. The Python API
    (trtq.api) passes ``output`` None (checked the same way, not written) and ``batches`` (see
    :func:`quantize_for`)."""
    from trtq.interrupt import held_for_outputs

    options, data, task_options = cfg.quantize, cfg.data, cfg.compare
    result, fp32, shapes = _quantized(model_path, cache_path, options, data, task_options, batches)
    what = f"the Q/DQ model of {Path(model_path).name}"
    feeds = check_batch(result.model, data, shapes, batches)
    if output is None:
        from trtq.model_check import check_produced_model

        check_produced_model(result.model, what, feeds, fp32)
    else:
        with held_for_outputs():  # the model and its cache are put in place as one step
            save_model(result.model, output, feeds, fp32, what)
            if learned_cache is not None and result.learned_amax:
                _write_learned_cache(Path(cache_path), learned_cache, result.learned_amax)
    for note in result.notes:
        if note.startswith(DATA_STEP_NOTES):
            log.info("%s", note)
    _warn_tensorrt8_float_convs(result)
    for name in result.missing_amax[:10]:
        log.warning("no amax for tensor %s in %s: its consumers stay float", name, cache_path)
    return result


def _write_learned_cache(cache_path: Path, output: Path, learned: Mapping[str, float]) -> None:
    """The cache of ``cache_path`` (same header and entries) with the ``learned`` amax, atomically."""
    from trtq.calib.cache import CalibrationTable, read_cache, write_cache

    table = read_cache(cache_path)
    amax = dict(table.amax, **learned)
    write_cache(output, CalibrationTable(table.trt_version, table.algorithm, amax), table.trt_version)
    log.info("reconstruct: the cache of the learned activation scales: %s", output)
