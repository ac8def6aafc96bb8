"""The TensorRT engine build: a network from a ModelProto (Q/DQ, folded, cast by the caller) or
an ONNX file, optimization profiles, builder configuration, the cache calibrator of an implicit
build, the timing cache, and the plan with ``<plan>.json`` beside it (:func:`build_plan`).
Reading the cache, the Q/DQ checks and quantizing are :mod:`trtq.pipeline.build`'s: this module
calls no quantize step. How each mode maps onto the installed TensorRT is decided in
:func:`trtq.trt.compat.plan_build`.
"""

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trtq import __version__, interrupt, progress
from trtq.config import BuildOptions, ProfileShapes
from trtq.errors import CacheError, ConfigError, TrtqError
from trtq.fileio import atomic_path, atomic_write_bytes, sha256_file
from trtq.model import TensorSpec, check_shape, model_sha256, resolve_shapes
from trtq.trt import compat, module_loading
from trtq.trt.metadata import FORMAT, metadata_path, render_metadata
from trtq.trt.network import add_profiles, configure, network_inputs, parse_file, parse_model

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
DEFAULT_BATCH = 8  # same default as the Batcher when nothing says otherwise


class BuildProgress:
    """The build's progress lines (trtq.progress): its own steps, TensorRT's phases where it
    reports them (TensorRT >= 10, :func:`trtq.trt.compat.attach_progress_monitor`; nested ones
    indented), and a step line where nothing was shown for ``STEP_LINE_S``."""

    STEP_LINE_S = 2.0

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()
        self.phases: dict[str, tuple[float, int, int]] = {}  # phase -> (start, depth, steps)

    def line(self, text: str, depth: int = 0) -> None:
        self.last = time.monotonic()
        progress.note(f"build: {'  ' * depth}{text} ({self.last - self.t0:.1f} s)")

    def start(self, phase: str, parent: Optional[str], steps: int) -> None:
        depth = self.phases[parent][1] + 1 if parent in self.phases else 1
        self.phases[phase] = (time.monotonic(), depth, steps)
        self.line(f"{phase}: {steps} steps ...", depth)

    def step(self, phase: str, index: int) -> None:
        if time.monotonic() - self.last >= self.STEP_LINE_S and phase in self.phases:
            _, depth, steps = self.phases[phase]
            self.line(f"{phase}: step {index + 1}/{steps}", depth)

    def finish(self, phase: str) -> None:
        began, depth, _ = self.phases.pop(phase, (time.monotonic(), 1, 0))
        self.line(f"{phase}: done in {time.monotonic() - began:.1f} s", depth)


@dataclass
class BuildResult:
    plan_path: Path
    metadata: dict[str, Any]
    seconds: float
    coverage: Optional[Any] = None  # trtq.trt.coverage.Int8Coverage of an INT8 engine
    measured: Optional[Any] = None  # trtq.trt.format_guard.LayoutCheck: the engine's layouts and profile

    def layers(self) -> tuple[dict[str, float], list]:
        """(mean ms per layer, the inspector's layer list) of the engine built: the layout check's
        profile (D38), or a profile of its own where the check did not run."""
        if self.measured is not None:
            return self.measured.times, self.measured.inspected
        from trtq.trt.layers import measure_layers

        return measure_layers(self.plan_path)


# ------------------------------------------------------------------------------------------------
# shapes and optimization profiles (pure; unit-tested without TensorRT)
# ------------------------------------------------------------------------------------------------


def profile_from_options(spec: TensorSpec, p: ProfileShapes) -> tuple[Shape, Shape, Shape]:
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
) -> dict[str, tuple[Shape, Shape, Shape]]:
    """Optimization profile (min, opt, max) for every dynamic input.

    Order: ``build.profiles`` > ``data.shapes`` > ``data.batch_size`` for a dynamic batch dim >
    ``fallback_shapes`` (the shapes the cache was calibrated with) > batch 8
    (:func:`trtq.model.resolve_shapes`). A fixed shape gives min = opt = max.
    """
    names = {s.name for s in specs}
    for key in list(profiles) + list(shapes):
        if key not in names:
            raise ConfigError(
                f"build.profiles / data.shapes name '{key}', which is not a model input",
                "model inputs: " + ", ".join(sorted(names)),
            )
    for s in specs:
        if not s.is_dynamic and s.name in profiles:
            log.warning("input %s has a static shape: build.profiles.%s ignored", s.name, s.name)
    dynamic = [s for s in specs if s.is_dynamic]
    out = {s.name: profile_from_options(s, profiles[s.name]) for s in dynamic if s.name in profiles}
    rest = [s for s in dynamic if s.name not in profiles]
    fixed = resolve_shapes(
        rest,
        {s.name: shapes[s.name] for s in rest if s.name in shapes},
        batch_size,
        fallback=fallback_shapes or {},
        default_batch=DEFAULT_BATCH,
        error=ConfigError,
        hint=_profile_hint,
    )
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


# ------------------------------------------------------------------------------------------------
# the TensorRT build
# ------------------------------------------------------------------------------------------------


def build_plan(
    trt: Any,
    recipe: Any,
    model: Optional[Any],
    model_path: Path,
    output: Path,
    options: BuildOptions,
    profiles: Mapping[str, tuple[Shape, Shape, Shape]],
    *,
    table: Optional[Any] = None,
    cache_path: Optional[Path] = None,
    quant_info: Optional[dict[str, Any]] = None,
    started: Optional[float] = None,
) -> BuildResult:
    """Build ``output`` (a plan) and ``output.json`` from ``model`` (a ModelProto ready for the
    network: Q/DQ, folded, cast) or, when it is None, from the file ``model_path``; ``recipe`` is
    :func:`trtq.trt.compat.plan_build`'s, ``table`` the cache an implicit build's calibrator hands
    TensorRT. Nothing is written when the build fails."""
    t0 = time.perf_counter() if started is None else started
    with interrupt.deferred():  # signals are raised when TensorRT returns, never inside its callbacks
        logger = compat.make_logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(compat.creation_mask(trt, recipe.creation_flags))
        parser = trt.OnnxParser(network, logger)
        config = builder.create_builder_config()
        shown = BuildProgress()
        shown.line(f"parsing {model_path.name}")
        if model is not None:
            parse_model(trt, parser, logger, model, model_path, output.parent)
        else:
            parse_file(trt, parser, logger, model_path)
        del model  # the network holds what it needs
        compat.set_builder_flags(trt, config, recipe.builder_flags)
        configure(trt, config, options)
        add_profiles(builder, config, network, profiles, calibration=recipe.calibrator)
        calibrator = None
        if recipe.calibrator:
            table, calibrator = _cache_calibrator(trt, table, _opt_batch(profiles, network_inputs(network)))
            config.int8_calibrator = calibrator
        timing_path = Path(options.timing_cache) if options.timing_cache else None
        timing = _load_timing_cache(config, timing_path, logger)
        monitor = compat.attach_progress_monitor(trt, config, shown.start, shown.step, shown.finish)
        shown.line(f"building the engine (TensorRT {trt.__version__}{'' if monitor else ': no phase reports'})")
        with progress.task("build: building the engine"):  # "still working" lines between phases
            plan = _serialize(trt, builder, network, config, logger, model_path)
        shown.line("engine built")
        del monitor
    seconds = time.perf_counter() - t0
    if calibrator is not None and not calibrator.cache_reads:
        raise CacheError(
            "TensorRT did not read the calibration cache through the calibrator", "rebuild with --mode explicit"
        )
    meta = {**_engine_metadata(trt, logger, plan, options, recipe), "build_seconds": round(seconds, 3)}
    meta.update(
        model={"path": str(model_path), "sha256": model_sha256(model_path)},
        cache=(
            {
                "path": str(cache_path),
                "sha256": sha256_file(cache_path),
                "algorithm": table.algorithm,
                "tensors": len(table.amax),
            }
            if cache_path is not None
            else None
        ),
        quantize=quant_info or None,
        timing_cache=(
            {"path": str(timing_path), "loaded": timing[0], "problem": timing[1] or None} if timing_path else None
        ),
        tensorrt_warnings=len(logger.warnings),
        module_loading=module_loading.mode(),
    )
    write_plan(output, plan, meta)
    if timing_path is not None:
        data = compat.serialize_timing_cache(config)
        if data:
            atomic_write_bytes(timing_path, data)
    log.info("built %s (%s, %.1f s)", output, options.precision, seconds)
    return BuildResult(plan_path=output, metadata=_in_order(meta), seconds=seconds)


_META_ORDER = (
    "format",
    "trtq_version",
    "tensorrt_version",
    "gpu_name",
    "compute_capability",
    "precision",
    "mode",
    "fp16",
    "strongly_typed",
    "builder_flags",
    "model",
    "cache",
    "quantize",
    "build_seconds",
    "optimization_level",
    "workspace_mb",
    "tactic_sources",
    "timing_cache",
    "tensorrt_warnings",
    "inputs",
    "outputs",
)


def _in_order(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata keys in the order ``<plan>.json`` has always had them, then the optional ones
    (``tuning``: what build --tune-placement chose)."""
    return {**{k: meta[k] for k in _META_ORDER}, **{k: v for k, v in meta.items() if k not in _META_ORDER}}


def _cache_calibrator(trt: Any, table: Any, batch: int) -> tuple[Any, Any]:
    """The calibrator that hands TensorRT ``table`` (re-rendered for the installed TensorRT)."""
    from trtq.calib.cache import render_cache
    from trtq.trt.calibrator import CALIBRATOR_CLASSES, make_cache_calibrator

    if table.algorithm not in CALIBRATOR_CLASSES:
        # ONNX Runtime tables name no algorithm; the ranges are used as given whichever
        # calibrator reads them, as long as header and calibrator agree
        log.info("cache algorithm %s: read through the EntropyCalibration2 calibrator", table.algorithm)
        table = dataclasses.replace(table, algorithm="EntropyCalibration2")
    return table, make_cache_calibrator(trt, table.algorithm, render_cache(table, trt.__version__), batch)


def _load_timing_cache(config: Any, timing_path: Optional[Path], logger: Any) -> tuple[bool, Optional[str]]:
    timing_data = _read_timing_cache(timing_path)
    _, loaded, problem = compat.load_timing_cache(config, timing_data, logger)
    if timing_data and not loaded:
        log.warning("timing cache %s not used (%s): building without it and saving a new one", timing_path, problem)
    return loaded, problem


def build_failure_hint(error: str) -> str:
    """The fix to print under a failed build's first TensorRT error. An internal assertion is a
    graph TensorRT's builder cannot handle (more workspace never helps): the way out is another
    form of the graph around the layer -v names."""
    if "Assertion" in error:
        return (
            "TensorRT's builder cannot handle a layer of this graph (an internal assertion, not memory): "
            "run with -v to see the layer; leave it float (trtq quantize --exclude) or try another --placement"
        )
    return "run with -v for TensorRT's messages; try a larger --workspace-mb or another --precision"


def _serialize(trt: Any, builder: Any, network: Any, config: Any, logger: Any, model_path: Path) -> bytes:
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        errors = logger.take_errors()
        error = errors[0] if errors else "unknown error"
        raise TrtqError(
            f"TensorRT {trt.__version__} could not build {model_path.name}: {error}", build_failure_hint(error)
        )
    return compat.host_memory_bytes(blob)


def _engine_metadata(trt: Any, logger: Any, plan: bytes, options: BuildOptions, recipe: Any) -> dict[str, Any]:
    """What the built engine says about itself (loaded back once) and the settings it was built with."""
    from trtq.trt import cuda

    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise TrtqError("TensorRT cannot load the engine it just built", "run with -v for TensorRT's messages")
    io = compat.io_tensors(trt, engine)
    gpu_name, cc = cuda.device_info()
    return {
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
        "optimization_level": options.optimization_level,
        "workspace_mb": options.workspace_mb,
        "tactic_sources": list(options.tactic_sources) if options.tactic_sources is not None else None,
        "inputs": [_io_entry(engine, t, input_=True) for t in io if t.is_input],
        "outputs": [_io_entry(engine, t, input_=False) for t in io if not t.is_input],
    }


def write_plan(output: Path, plan: bytes, meta: dict[str, Any]) -> None:
    """``output`` and ``output.json`` (``meta``, its keys in order), each replaced atomically."""
    from trtq.interrupt import held_for_outputs

    # the plan and its metadata as one step for Ctrl-C / SIGTERM (a signal between the two replaces
    # would leave a new plan beside the old metadata)
    with held_for_outputs(), atomic_path(output) as tmp_plan, atomic_path(metadata_path(output)) as tmp_meta:
        tmp_plan.write_bytes(plan)
        tmp_meta.write_text(render_metadata(_in_order(meta)), encoding="utf-8")


def rewrite_metadata(output: Path, meta: dict[str, Any]) -> None:
    """Replace ``output.json`` (the plan stays as it is) with ``meta``, its keys in order."""
    from trtq.interrupt import held_for_outputs

    with held_for_outputs(), atomic_path(metadata_path(output)) as tmp_meta:
        tmp_meta.write_text(render_metadata(_in_order(meta)), encoding="utf-8")


def _opt_batch(profiles: Mapping[str, tuple[Shape, Shape, Shape]], inputs: Sequence[tuple[str, Shape]]) -> int:
    for name, shape in inputs:
        if name in profiles and profiles[name][1]:
            return int(profiles[name][1][0])
        if shape and shape[0] > 0:
            return int(shape[0])
    return 1


def _io_entry(engine: Any, t: Any, input_: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
    if input_ and any(d < 0 for d in t.shape):
        lo, opt, hi = compat.profile_shapes(engine, t.name, 0)
        entry["profile"] = {"min": list(lo), "opt": list(opt), "max": list(hi)}
    return entry
