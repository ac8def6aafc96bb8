"""``trtq build``'s file-level step: read and check the model and the cache, decide how the
network model is made (a Q/DQ model as it is, the FP32 model quantized with the cache, or the
plain file), then hand it to :func:`trtq.trt.build.build_plan`.

Modes (``BuildOptions.precision`` / ``mode``):
  * a model that already has Q/DQ nodes (trtq quantize, ONNX Runtime quantize_static QDQ, a QAT
    export) is built as it is: INT8 explicit, no cache (one given is refused), checked first by
    :func:`trtq.qdq_info.check_for_tensorrt`.
  * int8 explicit (default; the only INT8 mode on TensorRT 11): the cache's amax table becomes
    Q/DQ nodes (:func:`trtq.pipeline.quantize.quantize_for`), the Q/DQ model is parsed from memory.
  * int8 implicit (TensorRT <= 10): the FP32 model is built with a calibrator that hands TensorRT
    the cache, re-rendered for the installed TensorRT, and never any data.
  * fp16 / fp32: the plain model, no cache, for comparison.
How each mode maps onto the installed TensorRT is decided in :func:`trtq.trt.compat.plan_build`.
Before anything else the model is checked for what the installed TensorRT cannot parse, and
lowered exactly with ``--fix-qdq`` (:mod:`trtq.pipeline.lower`); after the build an INT8 engine's
coverage is read back from its inspector and profile (:func:`checked_coverage`, ``--require-int8``).
"""

import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from trtq.config import BuildOptions, DataOptions, QuantizeOptions
from trtq.errors import ModelError, UsageError
from trtq.trt import compat
from trtq.trt.build import BuildResult, build_plan, resolve_profiles, rewrite_metadata

log = logging.getLogger(__name__)


def build(cfg, model_path: Path, cache_path: Optional[Path], output: Path) -> BuildResult:
    """``trtq build``'s step: the engine ``output`` (and ``output.json``) of ``model_path`` with the
    ranges of ``cache_path`` (None: a Q/DQ model or a float engine), as ``cfg.build`` says;
    ``cfg.quantize`` and ``cfg.data`` for an explicit INT8 build that quantizes."""
    return build_engine(
        Path(model_path),
        Path(output),
        cfg.build,
        cache_path=Path(cache_path) if cache_path else None,
        quantize_options=cfg.quantize,
        data_options=cfg.data,
    )


def build_engine(
    model_path: Path,
    output: Path,
    options: BuildOptions,
    *,
    cache_path: Optional[Path] = None,
    quantize_options: Optional[QuantizeOptions] = None,
    data_options: Optional[DataOptions] = None,
) -> BuildResult:
    """Build ``output`` (a plan) and ``output.json``; nothing is written when the build fails."""
    inputs = checked_build_inputs(model_path, output, options, cache_path, quantize_options, data_options)
    t0 = time.perf_counter()
    network = network_for(inputs, inputs.quantize_options)
    inputs.model = None  # the network model holds what TensorRT needs
    result = build_network(inputs, network, Path(output), options, started=t0)
    if options.precision == "int8":
        result.coverage = checked_coverage(result.plan_path, options.require_int8, result.measured)
    return result


@dataclasses.dataclass
class BuildInputs:
    """What ``trtq build`` checked and read before TensorRT builds: one build's, or the candidates'
    of ``build --tune-placement`` (:mod:`trtq.pipeline.tune`), which quantize one model many ways."""

    trt: Any
    recipe: Any
    model: Any  # the (lowered) ONNX model
    model_path: Path
    prequantized: Any  # its QdqInfo when it has Q/DQ nodes already
    cache_path: Optional[Path]
    table: Any
    fallback: dict  # the shapes the cache was calibrated with
    profiles: dict
    lowered: Any  # what --fix-qdq lowered
    quantize_options: QuantizeOptions
    data_options: DataOptions


@dataclasses.dataclass
class Network:
    """The model TensorRT parses (None: the file as it is), what quantizing it did (the plan
    metadata's ``quantize``) and the nodes that got Q/DQ on their inputs (trtq quantized it)."""

    model: Any
    info: dict
    quantized: tuple = ()


def checked_build_inputs(
    model_path: Path,
    output: Path,
    options: BuildOptions,
    cache_path: Optional[Path] = None,
    quantize_options: Optional[QuantizeOptions] = None,
    data_options: Optional[DataOptions] = None,
) -> BuildInputs:
    """Everything checked that can be before TensorRT builds (model, cache, shapes, then TensorRT
    and the GPU); a UsageError / ModelError / CacheError for what cannot be built."""
    from trtq.trt import cuda, module_loading

    model_path, output = Path(model_path), Path(output)
    quantize_options = quantize_options or QuantizeOptions()
    data_options = data_options or DataOptions()
    if output.suffix == ".onnx" or output.resolve() == model_path.resolve():
        raise UsageError(f"refusing to write the engine over {output}", "choose an output path ending in .plan")
    if options.require_int8 and options.precision != "int8":
        raise UsageError(
            f"--require-int8 checks an INT8 engine, and this build is {options.precision}",
            "drop --require-int8, or build --precision int8",
        )
    # everything that can be checked without TensorRT first: model, cache, shapes
    model, prequantized, cache_path, table, fallback, profiles, lowered = _checked_inputs(
        model_path, options, cache_path, quantize_options, data_options
    )
    module_loading.prefer_eager()  # before CUDA starts: the builder times tactics with their kernels loaded (D39)
    trt = compat.import_tensorrt()
    if prequantized is not None:
        refuse_float_grouped_convs_feeding_int8(trt, model, model_path)
    cuda.require_gpu()
    recipe = compat.plan_build(trt, options.precision, options.mode, options.fp16)
    return BuildInputs(
        trt,
        recipe,
        model,
        model_path,
        prequantized,
        cache_path,
        table,
        fallback,
        profiles,
        lowered,
        quantize_options,
        data_options,
    )


def network_for(inputs: BuildInputs, quantize_options: QuantizeOptions) -> Network:
    """The network model of ``inputs`` with ``quantize_options`` (the tuner varies the placement
    and the nodes left float), checked where trtq made or changed it."""
    network_model, quant_info, quantized = _network_model(
        inputs.trt,
        inputs.model,
        inputs.model_path,
        inputs.prequantized,
        inputs.recipe,
        inputs.table,
        quantize_options,
        inputs.data_options,
        inputs.cache_path,
        inputs.profiles,
        inputs.fallback,
    )
    if inputs.lowered:  # --fix-qdq: TensorRT parses the lowered model, never the file
        quant_info = dict(quant_info, lowered=inputs.lowered)
        network_model = inputs.model if network_model is None else network_model
    return Network(network_model, quant_info, tuple(quantized))


def build_network(
    inputs: BuildInputs,
    network: Network,
    output: Path,
    options: BuildOptions,
    started: Optional[float] = None,
) -> BuildResult:
    """TensorRT builds ``network`` into ``output`` (+ ``output.json``), and builds it again while the
    engine stores a tensor padded to many times its size (:func:`rebuilt_while_padded`): every
    engine trtq builds and times (build, the tune's candidates, guide and FP16 reference) comes
    from here."""

    def once() -> BuildResult:
        return build_plan(
            inputs.trt,
            inputs.recipe,
            network.model,
            inputs.model_path,
            output,
            options,
            inputs.profiles,
            table=inputs.table,
            cache_path=inputs.cache_path,
            quant_info=network.info,
            started=started,
        )

    return rebuilt_while_padded(once(), once, options)


def rebuilt_while_padded(result: BuildResult, build: Callable[[], BuildResult], options: BuildOptions) -> BuildResult:
    """``result``, or the result of ``build()`` called again, at most ``options.layout_rebuilds``
    times, while the engine stores a tensor padded to many times its size and the layers around it
    take a share of its time worth a rebuild (:mod:`trtq.trt.format_guard`: TensorRT picks such
    layouts in some builds and not in others), and stops early when a rebuild picks the same padded
    layouts again (then TensorRT picks them every time). A rebuild that fails keeps the engine
    built before it. When it rebuilt or a padded tensor is left, the plan's metadata says so
    (``layout_rebuilds``: the rebuilds that succeeded). The kept engine's profile stays on the
    result (``measured``) for its INT8 coverage."""
    from trtq.errors import TrtqError
    from trtq.trt.layers import padded_layouts

    rebuilds, before = 0, None
    while True:
        try:
            check = padded_layouts(result.plan_path)
        except Exception as e:  # the engine is built and valid: a failed check never fails the build
            log.warning("layouts of %s not checked: %s", result.plan_path.name, e)
            return result
        result.measured = check
        if not check.worth_rebuilding() or rebuilds >= options.layout_rebuilds:
            break
        if before is not None and check.same_layouts(before):
            log.info("%s: the rebuild chose the same padded layouts: keeping them", result.plan_path.name)
            break
        before = check
        worst = max(check.padded, key=lambda p: p.ratio)
        log.warning(
            "%s stores %s (%s) at %.1fx its size in %s, %.1f%% of its time: building again (%d of at most %d; "
            "--layout-rebuilds)",
            result.plan_path.name,
            worst.tensor,
            "x".join(map(str, worst.dims)),
            worst.ratio,
            worst.format,
            100 * check.share,
            rebuilds + 1,
            options.layout_rebuilds,
        )
        try:
            result = build()
        except TrtqError as e:  # nothing was written: the engine built before stays, and is valid
            log.warning("%s: building again failed (%s): keeping the engine built before", result.plan_path.name, e)
            break
        rebuilds += 1
    if rebuilds or check.padded:
        result.metadata["layout_rebuilds"] = check.record(rebuilds)
        rewrite_metadata(result.plan_path, result.metadata)
    return result


def checked_coverage(plan: Path, require_int8: bool, measured: Any = None) -> Any:
    """The INT8 coverage of the engine just built (:mod:`trtq.trt.coverage`), from ``measured`` (the
    layout check's profile of that engine, :class:`trtq.trt.format_guard.LayoutCheck`) or a profile
    of its own; with ``require_int8`` a TrtqError (exit 1) naming the layers that fell back to float
    between INT8 layers, or saying why the engine could not be checked. The plan stays written: it
    is a valid engine."""
    from trtq.errors import TrtqError
    from trtq.formatting import first_few
    from trtq.trt.coverage import int8_coverage
    from trtq.trt.layers import engine_coverage

    try:
        coverage = int8_coverage(measured.inspected, measured.times) if measured is not None else engine_coverage(plan)
        why = "" if coverage is not None else "the plan keeps no per-layer detail"
    except TrtqError as e:
        coverage, why = None, str(e)
    if coverage is None:
        if require_int8:
            raise TrtqError(
                f"--require-int8: cannot read the INT8 coverage of {plan.name} ({why})",
                "run with -v for TensorRT's messages; the engine inspector needs TensorRT 8.2 or newer",
            )
        log.warning("INT8 coverage of %s not measured: %s", plan.name, why)
        return None
    fallbacks = coverage.fallbacks
    if require_int8 and fallbacks:
        raise TrtqError(
            f"--require-int8: {len(fallbacks)} layer(s) of {plan.name} fell back to float between INT8 layers: "
            f"{first_few(fallbacks, 8)}",
            "see them with trtq bench --layers; put Q/DQ on their inputs so they run in INT8, or drop --require-int8",
        )
    return coverage


def _checked_inputs(
    model_path: Path,
    options: BuildOptions,
    cache_path: Optional[Path],
    quantize_options: QuantizeOptions,
    data_options: DataOptions,
) -> tuple:
    """(model, its Q/DQ form or None, the cache path used, its table, its calibrated shapes, the
    optimization profiles, what --fix-qdq lowered): the model, the cache and the shapes checked
    before TensorRT loads."""
    from trtq.model import input_specs, load_model
    from trtq.pipeline.lower import tensorrt_parseable

    model, lowered = tensorrt_parseable(load_model(model_path), model_path, options.fix_qdq, data_options)
    prequantized = prequantized_model(model, model_path, options, cache_path, quantize_options)
    if options.precision == "int8" and cache_path is None and prequantized is None:
        raise UsageError(
            "an INT8 build needs a calibration cache, or a model with Q/DQ nodes",
            "pass --cache calibration.cache (from trtq calibrate), or a Q/DQ model (trtq quantize)",
        )
    if options.precision != "int8" and cache_path is not None:
        log.info("precision %s: the calibration cache is not used", options.precision)
        cache_path = None
    table, fallback = _read_cache(cache_path, model_path, options.allow_stale or quantize_options.allow_stale)
    profiles = resolve_profiles(
        input_specs(model), options.profiles, data_options.shapes, data_options.batch_size, fallback
    )
    if options.precision == "int8" and options.mode == "implicit":
        _refuse_qdq_only_cache(cache_path)
        unused = explicit_only_settings(quantize_options)
        if unused:
            log.warning(
                "build.mode implicit builds the FP32 model with TensorRT's calibrator: %s apply only to "
                "explicit (Q/DQ) builds and are ignored",
                ", ".join(unused),
            )
    return model, prequantized, cache_path, table, fallback, profiles, lowered


def _network_model(
    trt: Any,
    model: Any,
    model_path: Path,
    prequantized: Any,
    recipe: Any,
    table: Any,
    quantize_options: QuantizeOptions,
    data_options: DataOptions,
    cache_path: Optional[Path],
    profiles: dict,
    fallback: dict,
) -> tuple[Any, dict[str, Any], list[str]]:
    """(the model TensorRT parses, None for the file as it is; what quantizing it did; the nodes
    trtq gave Q/DQ inputs), checked where trtq made or changed it."""
    quantized: list[str] = []
    if prequantized is not None:
        network_model, quant_info = _prequantized_network_model(model, prequantized, recipe)
    elif recipe.quantize:
        network_model, quant_info, quantized = _quantized_network_model(
            trt, model, table, recipe, quantize_options, data_options, cache_path
        )
    else:
        network_model, quant_info = None, {}
    rewritten = (recipe.quantize and prequantized is None) or bool(
        quant_info.get("folded_int32_biases") or quant_info.get("fp16_rest")
    )
    if network_model is not None and rewritten:  # trtq made or changed it: TensorRT gets it checked
        from trtq.model_check import check_produced_model
        from trtq.pipeline.quantize import check_batch

        min_shapes = {name: shapes[0] for name, shapes in profiles.items()}
        check_produced_model(
            network_model,
            f"the Q/DQ model built from {model_path.name}",
            check_batch(network_model, data_options, min_shapes or fallback),
            model if network_model is not model else None,
        )
    return network_model, quant_info, quantized


def qdq_only_cache(cache_path: Optional[Path]) -> bool:
    """Whether the cache was calibrated with ``--tensors qdq``: it has ranges only for the
    activations an explicit build reads, where an implicit build needs every tensor's."""
    if cache_path is None:
        return False
    from trtq.calib.cache import read_provenance

    prov = read_provenance(Path(cache_path)) or {}
    return ((prov.get("collection") or {}).get("tensors")) == "qdq"


def _refuse_qdq_only_cache(cache_path: Optional[Path]) -> None:
    """An implicit build needs a range for every tensor TensorRT runs in INT8 (:func:`qdq_only_cache`)."""
    if qdq_only_cache(cache_path):
        raise UsageError(
            f"{Path(cache_path).name} was calibrated with --tensors qdq: it has ranges only for the "
            "activations Q/DQ placement reads, and an implicit build needs every tensor's",
            "build explicitly (drop --mode implicit), or calibrate without --tensors qdq",
        )


def _read_cache(cache_path: Optional[Path], model_path: Path, allow_stale: bool) -> tuple[Any, dict[str, Any]]:
    """(the cache's table, the input shapes its provenance says it was calibrated with), checked
    against the model; (None, {}) without a cache."""
    if cache_path is None:
        return None, {}
    from trtq.calib.cache import read_cache
    from trtq.calib.freshness import check_cache_for_model

    table = read_cache(Path(cache_path))
    provenance = check_cache_for_model(Path(cache_path), model_path, allow_stale, amax=table.amax)
    fallback = ((provenance or {}).get("data") or {}).get("shapes") or {}
    return table, fallback if isinstance(fallback, dict) else {}


def _prequantized_network_model(model: Any, prequantized: Any, recipe: Any) -> tuple[Any, dict[str, Any]]:
    """A Q/DQ model as TensorRT takes it: int32 biases folded, the float rest FP16 when strongly typed."""
    from trtq.qdq_info import fold_constant_dequantize

    quant_info: dict[str, Any] = dict(prequantized.summary(), source="model")
    folded = fold_constant_dequantize(model)
    if folded:
        log.info("%d int32 biases behind DequantizeLinear folded to float (TensorRT keeps biases float)", folded)
        quant_info["folded_int32_biases"] = folded
    if recipe.quantizer_fp16:  # strongly typed (TensorRT 10+): the float rest is FP16 only if its tensors are
        from trtq.quantize.fp16 import cast_float_rest

        model = cast_float_rest(model, prequantized.activations)
        quant_info["fp16_rest"] = True
    return model, quant_info


def _quantized_network_model(
    trt: Any,
    model: Any,
    table: Any,
    recipe: Any,
    qopts: QuantizeOptions,
    data_options: DataOptions,
    cache_path: Optional[Path],
) -> tuple[Any, dict[str, Any], list[str]]:
    """The FP32 model quantized with the cache's amax for the installed TensorRT (and the nodes
    that got Q/DQ on their inputs)."""
    from trtq.calib.cache import read_provenance
    from trtq.pipeline.quantize import DATA_STEP_NOTES, quantize_for, remeasure_from, warn_float_grouped_convs

    centring_off = compat.centring_in_engines(trt) if qopts.center_activations else None
    if centring_off:
        log.warning(
            "quantize.center_activations is not used in TensorRT builds: %s; build the Q/DQ model "
            "of trtq quantize --center-activations yourself to try it",
            centring_off,
        )
        qopts = dataclasses.replace(qopts, center_activations=False, center_padded=False)
    if recipe.quantizer_fp16 != qopts.fp16 and recipe.quantizer_fp16:
        qopts = dataclasses.replace(qopts, fp16=True)
    remeasure = None
    if qopts.equalize and cache_path:
        remeasure = remeasure_from(read_provenance(cache_path), table.algorithm)
    qresult = quantize_for(model, table.amax, qopts, data_options, str(compat.version_of(trt)), remeasure)
    if compat.float_grouped_conv_is_unsafe(trt):
        warn_float_grouped_convs(str(compat.version_of(trt)), qresult)
    summary = _quantize_summary(qresult)
    # what the data steps did (equalized channels, float layers chosen, ...), as trtq quantize says it
    steps = [note for note in qresult.notes if note.startswith(DATA_STEP_NOTES)]
    for note in steps:
        log.info("%s", note)
    if steps:
        summary["steps"] = steps
    return qresult.model, summary, list(qresult.quantized)


def _quantize_summary(result: Any) -> dict[str, Any]:
    """Counts from a QuantizeResult (quantized nodes, nodes left float, amax the cache lacked)."""
    out: dict[str, Any] = {}
    for attr in ("quantized", "left_float", "missing_amax"):
        value = getattr(result, attr, None)
        if isinstance(value, (list, tuple, dict, set)):
            out[attr] = len(value)
    if isinstance(getattr(result, "qdq_pairs", None), int):
        out["qdq_pairs"] = result.qdq_pairs
    if getattr(result, "centred", None):
        out["centred"] = len(result.centred)
    missing = getattr(result, "missing_amax", None) or []
    if missing:
        log.warning(
            "the cache has no amax for %d tensor(s) the Q/DQ rules wanted (e.g. %s): those stay float",
            len(missing),
            ", ".join(list(missing)[:3]),
        )
    return out


def refuse_float_grouped_convs_feeding_int8(trt: Any, model: Any, model_path: Path) -> None:
    """TensorRT 8 built Q/DQ networks in which a float grouped/depthwise Conv feeds an INT8 layer
    into engines with garbage outputs (see compat.float_grouped_conv_is_unsafe): refuse such a
    model (trtq quantize with a TensorRT 10 cache, or another tool's output) instead."""
    if not compat.float_grouped_conv_is_unsafe(trt):
        return
    from trtq.quantize.float_choice import float_grouped_convs_in_qdq_model

    risky, consumers = float_grouped_convs_in_qdq_model(model)
    if consumers:
        raise ModelError(
            f"{model_path.name}: the float grouped/depthwise Conv {risky[0]} feeds the INT8 layer {consumers[0]}"
            f"{f' (and {len(consumers) - 1} more)' if len(consumers) > 1 else ''}; TensorRT "
            f"{compat.version_of(trt)} builds such engines with wrong outputs",
            "quantize again with a cache for TensorRT 8 (trtq calibrate --trt-version 8.6.0), which leaves those "
            f"layers float too, or add --exclude '^{re.escape(consumers[0])}$'",
        )


def prequantized_model(
    model: Any, model_path: Path, options: BuildOptions, cache_path: Optional[Path], quantize_options: QuantizeOptions
) -> Any:
    """The model's :class:`~trtq.qdq_info.QdqInfo` when it already has Q/DQ nodes (then it
    is built as it is: INT8, explicit, no cache), else None. Refuses what cannot go with it."""
    from trtq.qdq_info import check_for_tensorrt, read_qdq

    info = read_qdq(model)
    if not info.is_qdq and not info.other_ops:
        return None
    check_for_tensorrt(info, model_path.name)
    if cache_path is not None:
        raise UsageError(
            f"{model_path.name} already has Q/DQ nodes: its scales come from the model, so --cache would not be used",
            "drop --cache to build it as it is, or pass the FP32 model with --cache to quantize it again",
        )
    if options.precision != "int8":
        raise UsageError(
            f"{model_path.name} has Q/DQ nodes, so it builds as INT8 only (not {options.precision})",
            "drop --precision, or build the FP32 model for an FP16/FP32 engine",
        )
    if options.mode == "implicit":
        raise UsageError(
            f"{model_path.name} has Q/DQ nodes: TensorRT builds it explicitly, there is nothing to calibrate",
            "drop --mode implicit (use the FP32 model for an implicit build)",
        )
    ignored = explicit_only_settings(quantize_options)
    if ignored:
        log.warning(
            "%s is already quantized: %s apply when trtq quantizes an FP32 model and are ignored",
            model_path.name,
            ", ".join(ignored),
        )
    log.info(
        "%s has Q/DQ nodes (%d activations, %d weights): building it as it is (INT8 explicit%s)",
        model_path.name,
        len(info.activations),
        info.weights,
        ", FP16 rest" if options.fp16 else "",
    )
    return info


def explicit_only_settings(q: QuantizeOptions) -> list[str]:
    """The quantize.* settings a build of the Q/DQ model would use that differ from their defaults
    (an implicit build has no Q/DQ model, so it cannot honour them)."""
    default = QuantizeOptions()
    keys = (
        "exclude",
        "per_channel",
        "bias_correction",
        "weight_rounding",
        "float_layers",
        "center_activations",
        "center_padded",
        "equalize",
        "placement",
        "attention",
        "placement_from",
    )
    return [f"quantize.{k}" for k in keys if getattr(q, k) != getattr(default, k)]
