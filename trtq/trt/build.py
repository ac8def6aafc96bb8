"""ONNX model (+ calibration cache) -> TensorRT engine plan, with ``<plan>.json`` beside it.

Modes (``BuildOptions.precision`` / ``mode``):
  * a model that already has Q/DQ nodes (trtq quantize, ONNX Runtime quantize_static QDQ, a QAT
    export) is built as it is: INT8 explicit, no cache (one given is refused), checked first by
    :func:`trtq.qdq_info.check_for_tensorrt`.
  * int8 explicit (default; the only INT8 mode on TensorRT 11): the cache's amax table becomes
    Q/DQ nodes (:func:`trtq.quantize.quantize_model`), the Q/DQ model is parsed from memory.
  * int8 implicit (TensorRT <= 10): the FP32 model is built with a calibrator that hands TensorRT
    the cache, re-rendered for the installed TensorRT, and never any data.
  * fp16 / fp32: the plain model, no cache, for comparison.
How each mode maps onto the installed TensorRT is decided in :func:`trtq.trt.compat.plan_build`.
"""
import dataclasses
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trtq import __version__
from trtq.config import BuildOptions, DataOptions, ProfileShapes, QuantizeOptions
from trtq.errors import CacheError, ConfigError, ModelError, TrtqError, UsageError
from trtq.fileio import atomic_path, atomic_write_bytes, sha256_file
from trtq.model import TensorSpec, check_shape, resolve_shapes
from trtq.trt import compat
from trtq.trt.network import add_profiles, configure, parse_file, parse_model
from trtq.trt.metadata import FORMAT, metadata_path, render_metadata

log = logging.getLogger(__name__)

Shape = Tuple[int, ...]
DEFAULT_BATCH = 8  # same default as the Batcher when nothing says otherwise


@dataclass
class BuildResult:
    plan_path: Path
    metadata: Dict[str, Any]
    seconds: float


# ------------------------------------------------------------------------------------------------
# shapes and optimization profiles (pure; unit-tested without TensorRT)
# ------------------------------------------------------------------------------------------------


def profile_from_options(spec: TensorSpec, p: ProfileShapes) -> Tuple[Shape, Shape, Shape]:
    """(min, opt, max) from ``build.profiles.<name>``; a missing one is taken from the others."""
    opt = p.opt or p.max or p.min
    lo = p.min or opt
    hi = p.max or opt
    key = f"build.profiles.{spec.name}"
    lo = check_shape(spec, lo, key + ".min", ConfigError)
    opt = check_shape(spec, opt, key + ".opt", ConfigError)
    hi = check_shape(spec, hi, key + ".max", ConfigError)
    if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
        raise ConfigError(f"{key} needs min <= opt <= max in every dim, got {list(lo)} {list(opt)} {list(hi)}")
    return lo, opt, hi


def _profile_hint(s: TensorSpec) -> str:
    return f"set build.profiles.{s.name} (min/opt/max) or data.shapes.{s.name}"


def resolve_profiles(
    specs: Sequence[TensorSpec],
    profiles: Mapping[str, ProfileShapes],
    shapes: Mapping[str, Sequence[int]],
    batch_size: Optional[int],
    fallback_shapes: Optional[Mapping[str, Sequence[int]]] = None,
) -> Dict[str, Tuple[Shape, Shape, Shape]]:
    """Optimization profile (min, opt, max) for every dynamic input.

    Order: ``build.profiles`` > ``data.shapes`` > ``data.batch_size`` for a dynamic batch dim >
    ``fallback_shapes`` (the shapes the cache was calibrated with) > batch 8
    (:func:`trtq.model.resolve_shapes`). A fixed shape gives min = opt = max.
    """
    names = {s.name for s in specs}
    for key in list(profiles) + list(shapes):
        if key not in names:
            raise ConfigError(f"build.profiles / data.shapes name '{key}', which is not a model input",
                              "model inputs: " + ", ".join(sorted(names)))
    for s in specs:
        if not s.is_dynamic and s.name in profiles:
            log.warning("input %s has a static shape: build.profiles.%s ignored", s.name, s.name)
    dynamic = [s for s in specs if s.is_dynamic]
    out = {s.name: profile_from_options(s, profiles[s.name]) for s in dynamic if s.name in profiles}
    rest = [s for s in dynamic if s.name not in profiles]
    fixed = resolve_shapes(rest, {s.name: shapes[s.name] for s in rest if s.name in shapes}, batch_size,
                           fallback=fallback_shapes or {}, default_batch=DEFAULT_BATCH, error=ConfigError,
                           hint=_profile_hint)
    out.update((name, (shape, shape, shape)) for name, shape in fixed.items())
    return {s.name: out[s.name] for s in dynamic}


def _read_timing_cache(path: Optional[Path]) -> Optional[bytes]:
    if path is None or not path.exists():
        return None
    try:
        return path.read_bytes()
    except OSError as e:
        log.warning("cannot read timing cache %s (%s): building without it", path, e.strerror)
        return None


def _quantize_summary(result: Any) -> Dict[str, int]:
    """Counts from a QuantizeResult (quantized nodes, nodes left float, amax the cache lacked)."""
    out: Dict[str, int] = {}
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
            len(missing), ", ".join(list(missing)[:3]),
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


def prequantized_model(model: Any, model_path: Path, options: BuildOptions, cache_path: Optional[Path],
                       quantize_options: QuantizeOptions) -> Any:
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
        log.warning("%s is already quantized: %s apply when trtq quantizes an FP32 model and are ignored",
                    model_path.name, ", ".join(ignored))
    log.info("%s has Q/DQ nodes (%d activations, %d weights): building it as it is (INT8 explicit%s)",
             model_path.name, len(info.activations), info.weights, ", FP16 rest" if options.fp16 else "")
    return info


def explicit_only_settings(q: QuantizeOptions) -> List[str]:
    """The quantize.* settings a build of the Q/DQ model would use that differ from their defaults
    (an implicit build has no Q/DQ model, so it cannot honour them)."""
    default = QuantizeOptions()
    keys = ("exclude", "per_channel", "bias_correction", "weight_rounding", "float_layers", "center_activations")
    return [f"quantize.{k}" for k in keys if getattr(q, k) != getattr(default, k)]


# ------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------


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
    from trtq.model import input_specs, load_model
    from trtq.trt import cuda

    model_path, output = Path(model_path), Path(output)
    quantize_options = quantize_options or QuantizeOptions()
    data_options = data_options or DataOptions()
    if output.suffix == ".onnx" or output.resolve() == model_path.resolve():
        raise UsageError(f"refusing to write the engine over {output}", "choose an output path ending in .plan")

    # everything that can be checked without TensorRT first: model, cache, shapes
    model = load_model(model_path)
    specs = input_specs(model)
    prequantized = prequantized_model(model, model_path, options, cache_path, quantize_options)
    if options.precision == "int8" and cache_path is None and prequantized is None:
        raise UsageError("an INT8 build needs a calibration cache, or a model with Q/DQ nodes",
                         "pass --cache calibration.cache (from trtq calibrate), or a Q/DQ model (trtq quantize)")
    if options.precision != "int8" and cache_path is not None:
        log.info("precision %s: the calibration cache is not used", options.precision)
        cache_path = None

    table = None
    provenance = None
    if cache_path is not None:
        from trtq.calib.cache import read_cache
        from trtq.calib.freshness import check_cache_for_model

        table = read_cache(Path(cache_path))
        provenance = check_cache_for_model(
            Path(cache_path), model_path, options.allow_stale or quantize_options.allow_stale, amax=table.amax
        )
    fallback = ((provenance or {}).get("data") or {}).get("shapes") or {}
    profiles = resolve_profiles(
        specs, options.profiles, data_options.shapes, data_options.batch_size,
        fallback if isinstance(fallback, dict) else {},
    )

    if options.precision == "int8" and options.mode == "implicit":
        unused = explicit_only_settings(quantize_options)
        if unused:
            log.warning("build.mode implicit builds the FP32 model with TensorRT's calibrator: %s apply only to "
                        "explicit (Q/DQ) builds and are ignored", ", ".join(unused))
    trt = compat.import_tensorrt()
    if prequantized is not None:
        refuse_float_grouped_convs_feeding_int8(trt, model, model_path)
    cuda.require_gpu()
    recipe = compat.plan_build(trt, options.precision, options.mode, options.fp16)
    logger = compat.make_logger(trt)
    t0 = time.perf_counter()
    builder = trt.Builder(logger)
    network = builder.create_network(compat.creation_mask(trt, recipe.creation_flags))
    parser = trt.OnnxParser(network, logger)
    config = builder.create_builder_config()
    quant_info: Dict[str, Any] = {}
    calibrator = None

    if prequantized is not None:
        from trtq.qdq_info import fold_constant_dequantize

        quant_info = dict(prequantized.summary(), source="model")
        folded = fold_constant_dequantize(model)
        if folded:
            log.info("%d int32 biases behind DequantizeLinear folded to float (TensorRT keeps biases float)", folded)
            quant_info["folded_int32_biases"] = folded
        if recipe.quantizer_fp16:  # strongly typed (TensorRT 10+): the float rest is FP16 only if its tensors are
            from trtq.quantize.fp16 import cast_float_rest

            model = cast_float_rest(model, prequantized.activations)
            quant_info["fp16_rest"] = True
        parse_model(trt, parser, logger, model, model_path, output.parent)
    elif recipe.quantize:
        qopts = quantize_options
        centring_off = compat.centring_in_engines(trt) if qopts.center_activations else None
        if centring_off:
            log.warning("quantize.center_activations is not used in TensorRT builds: %s; build the Q/DQ model "
                        "of trtq quantize --center-activations yourself to try it", centring_off)
            qopts = dataclasses.replace(qopts, center_activations=False)
        if recipe.quantizer_fp16 != qopts.fp16 and recipe.quantizer_fp16:
            qopts = dataclasses.replace(qopts, fp16=True)
        from trtq.pipeline.quantize import quantize_for, warn_float_grouped_convs

        qresult = quantize_for(model, table.amax, qopts, data_options, str(compat.version_of(trt)))
        if compat.float_grouped_conv_is_unsafe(trt):
            warn_float_grouped_convs(str(compat.version_of(trt)), qresult)
        quant_info = _quantize_summary(qresult)
        parse_model(trt, parser, logger, qresult.model, model_path, output.parent)
    else:
        parse_file(trt, parser, logger, model_path)
    del model  # the network holds what it needs

    compat.set_builder_flags(trt, config, recipe.builder_flags)
    configure(trt, config, options)
    add_profiles(builder, config, network, profiles, calibration=recipe.calibrator)
    if recipe.calibrator:
        from trtq.calib.cache import render_cache
        from trtq.trt.calibrator import CALIBRATOR_CLASSES, make_cache_calibrator

        if table.algorithm not in CALIBRATOR_CLASSES:
            # ONNX Runtime tables name no algorithm; the ranges are used as given whichever
            # calibrator reads them, as long as header and calibrator agree
            log.info("cache algorithm %s: read through the EntropyCalibration2 calibrator", table.algorithm)
            table = dataclasses.replace(table, algorithm="EntropyCalibration2")
        batch = _opt_batch(profiles, specs)
        calibrator = make_cache_calibrator(trt, table.algorithm, render_cache(table, trt.__version__), batch)
        config.int8_calibrator = calibrator

    timing_path = Path(options.timing_cache) if options.timing_cache else None
    timing_data = _read_timing_cache(timing_path)
    _, timing_loaded, timing_problem = compat.load_timing_cache(config, timing_data, logger)
    if timing_data and not timing_loaded:
        log.warning("timing cache %s not used (%s): building without it and saving a new one",
                    timing_path, timing_problem)

    blob = builder.build_serialized_network(network, config)
    if blob is None:
        errors = logger.take_errors()
        raise TrtqError(
            f"TensorRT {trt.__version__} could not build {model_path.name}: {errors[0] if errors else 'unknown error'}",
            "run with -v for TensorRT's messages; try a larger --workspace-mb or another --precision",
        )
    plan = compat.host_memory_bytes(blob)
    seconds = time.perf_counter() - t0
    if calibrator is not None and not calibrator.cache_reads:
        raise CacheError(
            "TensorRT did not read the calibration cache through the calibrator",
            "rebuild with --mode explicit",
        )

    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise TrtqError("TensorRT cannot load the engine it just built", "run with -v for TensorRT's messages")
    io = compat.io_tensors(trt, engine)
    gpu_name, cc = cuda.device_info()
    meta: Dict[str, Any] = {
        "format": FORMAT,
        "trtq_version": __version__,
        "tensorrt_version": str(trt.__version__),
        "gpu_name": gpu_name,
        "compute_capability": cc,
        "precision": options.precision,
        "mode": options.mode if options.precision == "int8" else None,
        "fp16": bool(options.fp16),
        "strongly_typed": recipe.strongly_typed,
        "builder_flags": list(recipe.builder_flags),
        "model": {"path": str(model_path), "sha256": sha256_file(model_path)},
        "cache": (
            {"path": str(cache_path), "sha256": sha256_file(cache_path), "algorithm": table.algorithm,
             "tensors": len(table.amax)}
            if cache_path is not None else None
        ),
        "quantize": quant_info or None,
        "build_seconds": round(seconds, 3),
        "optimization_level": options.optimization_level,
        "workspace_mb": options.workspace_mb,
        "tactic_sources": list(options.tactic_sources) if options.tactic_sources is not None else None,
        "timing_cache": (
            {"path": str(timing_path), "loaded": timing_loaded, "problem": timing_problem or None}
            if timing_path else None
        ),
        "tensorrt_warnings": len(logger.warnings),
        "inputs": [_io_entry(engine, t, input_=True) for t in io if t.is_input],
        "outputs": [_io_entry(engine, t, input_=False) for t in io if not t.is_input],
    }
    del engine, runtime

    from trtq.interrupt import held_for_outputs

    # the plan and its metadata as one step for Ctrl-C / SIGTERM (a signal between the two replaces
    # would leave a new plan beside the old metadata)
    with held_for_outputs(), atomic_path(output) as tmp_plan, atomic_path(metadata_path(output)) as tmp_meta:
        tmp_plan.write_bytes(plan)
        tmp_meta.write_text(render_metadata(meta), encoding="utf-8")
    if timing_path is not None:
        data = compat.serialize_timing_cache(config)
        if data:
            atomic_write_bytes(timing_path, data)
    log.info("built %s (%s, %.1f s)", output, options.precision, seconds)
    return BuildResult(plan_path=output, metadata=meta, seconds=seconds)


def _opt_batch(profiles: Mapping[str, Tuple[Shape, Shape, Shape]], specs: Sequence[TensorSpec]) -> int:
    for s in specs:
        if s.name in profiles and profiles[s.name][1]:
            return int(profiles[s.name][1][0])
        if s.shape and isinstance(s.shape[0], int):
            return int(s.shape[0])
    return 1


def _io_entry(engine: Any, t: Any, input_: bool) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
    if input_ and any(d < 0 for d in t.shape):
        lo, opt, hi = compat.profile_shapes(engine, t.name, 0)
        entry["profile"] = {"min": list(lo), "opt": list(opt), "max": list(hi)}
    return entry
