"""TensorRT 8.6 / 10.x / 11.x differences, decided in one place.

Every function takes the ``tensorrt`` module (or, in unit tests, a small stand-in with the same
attribute names) as its first argument, so the decisions can be checked without TensorRT.
Decisions use the version string and ``hasattr``; enum *integer values* are never used for a
decision because TensorRT 11 renumbered them (``STRONGLY_TYPED`` is 1 in 10.x, 0 in 11.x).
Bit masks are always built from the installed module's own enum members.

Sources for the behaviour below (TensorRT Python API reference and migration guides):
  * 8.6: ``NetworkDefinitionCreationFlag.EXPLICIT_BATCH`` is required to parse ONNX; a Q/DQ
    network needs ``BuilderFlag.INT8``; calibrators (``IInt8EntropyCalibrator2`` ...) and
    ``IBuilderConfig.set_calibration_profile`` exist; the I/O tensor API (``num_io_tensors``,
    ``get_tensor_name``, ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``) exists
    beside the binding API; ``builder_optimization_level`` and ``set_memory_pool_limit`` exist.
  * 10.x: ``EXPLICIT_BATCH`` is deprecated and ignored (networks are always explicit batch);
    ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` added; calibrators deprecated (10.1) but work;
    binding API and ``execute_async_v2`` removed.
  * 11.x ("Removed Python APIs" in the 10.x -> 11.x migration guide): ``BuilderFlag.FP16/INT8/BF16/
    FP8``, ``IBuilderConfig.int8_calibrator``, ``set_calibration_profile``, the calibrator classes and
    ``platform_has_fast_int8`` are gone; networks are always strongly typed (INT8 only through
    Q/DQ, FP16 only through FP16 tensors in the ONNX).
  * cuda-python: ``from cuda import cudart`` (12.x), ``from cuda.bindings import runtime`` (12.6+
    and the only form in 13.x).

What has been verified, per version, and how:
  * 8.6.0: the real library on the GPU host (an H100 with the GPU bundle of shared/gpu-rig: the
    ``-m gpu`` tests build engines in every mode, calibrate with TensorRT's own calibrators, run
    and time the plans), and the real binding surface as for 10.x and 11.x below.
  * 10.x (the newest 10.x, 10.16.1.11) and 11.x (11.4.0.106): the real Python binding surface,
    never the library. The published binding wheel is imported on stub libraries that only satisfy
    its symbols (tests/trt/binding_harness.py), and tests/trt/test_binding_conformance.py checks
    every TensorRT name trtq/trt uses (found by a static scan, so a new use is checked without
    editing the test): that it exists in the versions where the code can reach it, that each call
    fits one of the binding's pybind11 signatures (argument count, keyword names, the types the
    scan can infer), that assigned properties are writable and that the logger, calibrator and
    profiler subclasses override real methods with the arguments TensorRT passes. The decisions in
    this module run on the real module there too (``plan_build`` for every precision and mode, the
    flag and tactic masks, dtype and severity names, the logger and calibrator subclasses built and
    called), and the test fakes answer them identically. What TensorRT 10 and 11 then do with a
    network (parse, build, engine results, cache formats) has not run here: it follows the
    documentation above.
"""

import contextlib
import importlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from trtq.errors import ConfigError, EnvironmentMissing, UsageError

log = logging.getLogger(__name__)

INSTALL_HINT = (
    'pip install tensorrt cuda-python (or pip install -e ".[gpu]" in the trtq checkout) on a machine with an NVIDIA GPU'
)
NO_GPU_HINT = "no CUDA GPU visible: check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES"


# ------------------------------------------------------------------------------------------------
# versions and imports
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class TrtVersion:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: Any) -> "TrtVersion":
        m = re.match(r"\s*(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?", str(text), re.ASCII)
        if not m:
            raise ConfigError(f"not a TensorRT version: {text!r}", "use MAJOR.MINOR.PATCH, e.g. 8.6.0")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def version_of(trt: Any) -> TrtVersion:
    return TrtVersion.parse(getattr(trt, "__version__", "0.0.0"))


def float_grouped_conv_is_unsafe(trt: Any) -> bool:
    """TensorRT 8.x: a grouped (depthwise) Conv left float between INT8 layers of a Q/DQ network
    built without an error into engines whose outputs were garbage (TensorRT 8.6.0; a 1x1 conv
    left float was fine, and so was a depthwise conv left float together with the 1x1 conv it
    feeds: docs/decisions.md D5). 10+ not run here."""
    return float_grouped_conv_is_unsafe_for(str(version_of(trt)))


def float_grouped_conv_is_unsafe_for(trt_version: Optional[str]) -> bool:
    """:func:`float_grouped_conv_is_unsafe` for the TensorRT a calibration cache was written for
    (its header), when the installed one is not the target (``trtq quantize`` on a CPU machine)."""
    return _before_10(trt_version)


def int8_attention_is_unsafe_for(trt_version: Optional[str]) -> bool:
    """TensorRT 8.x: PP-OCRv4 rec with its attention MatMuls and Softmax output quantized
    (``quantize.attention: int8``) built without an error into an engine that decoded 0.195 of 200
    lines as FP32 does, against 0.68 without them (TensorRT 8.6.0; ONNX Runtime running such a
    Q/DQ model: 0.665; docs/decisions.md D34). Isolated: the MatMul reading the Softmax output
    (Softmax x V) is the wrong one; Q x K^T alone was right. 10+ not run here."""
    return _before_10(trt_version)


def _before_10(trt_version: Optional[str]) -> bool:
    """A known TensorRT version below 10 (where the measured 8.6 faults apply; 10+ not run here)."""
    return bool(trt_version) and TrtVersion.parse(trt_version).major < 10


def centring_in_engines(trt: Any) -> Optional[str]:
    """Why ``quantize.center_activations`` stays off in builds on this TensorRT, or None where an
    engine has shown it exact and free at run time: 8.6 (docs/decisions.md D12; the Add form was
    slower there, and a Clip with a negative lower bound before QuantizeLinear was computed
    wrongly, see :mod:`trtq.quantize.centering`). 10 and 11 have not run here."""
    v = version_of(trt)
    if (v.major, v.minor) == (8, 6):
        return None
    return (
        f"centred engines have not been measured on TensorRT {v} (only on 8.6, where they were exact and "
        "as fast as uncentred ones: docs/decisions.md D12)"
    )


def onnx_limits(version: Optional[TrtVersion]) -> tuple[Optional[int], bool, str]:
    """(the newest ONNX opset its parser reads, None where trtq knows no limit; whether Q/DQ nodes
    may have FP16 scales; the version's name) for ``version``, or for 8.6 when None (no TensorRT
    installed: ``trtq build --fix-qdq`` lowers for the oldest TensorRT trtq runs on). 8.x: opset 17
    and float32 scales only (the 8.6 ONNX parser's operator support matrix; FP16 Q/DQ came with
    10.x's strong typing). 10 and 11: not run here, no limit assumed."""
    v = version or TrtVersion(8, 6, 0)
    if v.major < 10:
        return 17, False, str(v)
    return None, True, str(v)


def installed_version() -> Optional[TrtVersion]:
    """The installed TensorRT's version, None without one (no EnvironmentMissing)."""
    try:
        return version_of(import_tensorrt())
    except EnvironmentMissing:
        return None


def import_tensorrt(importer: Callable[[str], Any] = importlib.import_module) -> Any:
    """The ``tensorrt`` module, or EnvironmentMissing (exit 4) with an install hint."""
    try:
        return importer("tensorrt")
    except ImportError as e:
        raise EnvironmentMissing(f"TensorRT is not installed ({e})", INSTALL_HINT) from None
    except OSError as e:  # the bindings are there but libnvinfer cannot be loaded
        raise EnvironmentMissing(f"TensorRT cannot be loaded ({e})", INSTALL_HINT) from None


def import_cudart(importer: Callable[[str], Any] = importlib.import_module) -> Any:
    """The cuda-python runtime module: ``cuda.bindings.runtime`` (12.6+, 13.x) else ``cuda.cudart``."""
    return _cuda_python(("cuda.bindings.runtime", "cuda.cudart"), importer)


def import_cudriver(importer: Callable[[str], Any] = importlib.import_module) -> Any:
    """The cuda-python driver module: ``cuda.bindings.driver`` (12.6+, 13.x) else ``cuda.cuda``."""
    return _cuda_python(("cuda.bindings.driver", "cuda.cuda"), importer)


def _cuda_python(names: Sequence[str], importer: Callable[[str], Any]) -> Any:
    """The first of ``names`` that imports, or EnvironmentMissing (exit 4) with an install hint."""
    errors: list[str] = []
    for name in names:
        try:
            return importer(name)
        except ImportError as e:
            errors.append(str(e))
        except OSError as e:
            raise EnvironmentMissing(f"cuda-python cannot be loaded ({e})", INSTALL_HINT) from None
    raise EnvironmentMissing(f"cuda-python is not installed ({errors[-1]})", INSTALL_HINT)


# ------------------------------------------------------------------------------------------------
# capabilities
# ------------------------------------------------------------------------------------------------


def _enum_has(enum: Any, name: str) -> bool:
    return enum is not None and hasattr(enum, name)


def enum_names(enum: Any) -> list[str]:
    """Member names of a TensorRT (pybind11) enum, or of a stand-in class with upper-case attributes."""
    members = getattr(enum, "__members__", None)
    if isinstance(members, dict) and members:
        return sorted(members)
    return sorted(n for n in dir(enum) if n.isupper() and not n.startswith("_"))


def has_weak_typing(trt: Any) -> bool:
    """Precision builder flags (``BuilderFlag.INT8`` / ``FP16``) exist: TensorRT <= 10."""
    return _enum_has(getattr(trt, "BuilderFlag", None), "INT8")


def has_implicit_int8(trt: Any) -> bool:
    """Calibrators and ``IBuilderConfig.int8_calibrator`` exist: TensorRT <= 10 (removed in 11)."""
    cfg = getattr(trt, "IBuilderConfig", None)
    return (
        hasattr(trt, "IInt8Calibrator") and cfg is not None and hasattr(cfg, "int8_calibrator") and has_weak_typing(trt)
    )


def can_request_strong_typing(trt: Any) -> bool:
    """``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` exists (10.x; kept but ignored in 11)."""
    return _enum_has(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED")


def needs_explicit_batch_flag(trt: Any) -> bool:
    """8.x/9.x need EXPLICIT_BATCH to parse ONNX; 10 ignores it (deprecated), 11 removed it."""
    return version_of(trt).major < 10 and _enum_has(
        getattr(trt, "NetworkDefinitionCreationFlag", None), "EXPLICIT_BATCH"
    )


# ------------------------------------------------------------------------------------------------
# what to build with
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildRecipe:
    """How a build is set up on the installed TensorRT (names, never enum values)."""

    creation_flags: tuple[str, ...]  # NetworkDefinitionCreationFlag member names
    builder_flags: tuple[str, ...]  # BuilderFlag member names
    strongly_typed: bool  # tensor types come from the ONNX (explicitly requested, or TRT 11)
    quantize: bool  # explicit mode: insert Q/DQ from the cache before parsing
    quantizer_fp16: bool  # ask the quantizer to cast the non-quantized rest to FP16
    calibrator: bool  # implicit mode: a cache-reading calibrator is attached


def plan_build(trt: Any, precision: str, mode: str = "explicit", fp16: bool = False) -> BuildRecipe:
    """Decide network creation flags, builder flags and the quantizer's FP16 option.

    precision: "int8" | "fp16" | "fp32"; mode (int8 only): "explicit" | "implicit";
    fp16: let layers left in float run in FP16.
    """
    v = version_of(trt)
    weak = has_weak_typing(trt)
    creation: list[str] = ["EXPLICIT_BATCH"] if needs_explicit_batch_flag(trt) else []
    if precision == "fp32":
        return BuildRecipe(tuple(creation), (), not weak, False, False, False)
    if precision == "fp16":
        if not weak:
            raise UsageError(
                f"TensorRT {v} has no FP16 builder flag: its networks are strongly typed, so FP16 "
                "engines come from a model whose tensors are FP16",
                "convert the ONNX to FP16 (e.g. ModelOpt AutoCast) and build it with --precision fp32, "
                "or build --precision int8 --fp16",
            )
        return BuildRecipe(tuple(creation), ("FP16",), False, False, False, False)
    if precision != "int8":
        raise ConfigError(f"unknown precision {precision!r}", "use int8, fp16 or fp32")
    extra = ("FP16",) if fp16 else ()
    if mode == "implicit":
        if not has_implicit_int8(trt):
            raise UsageError(
                f"TensorRT {v} has no implicit INT8 (calibrators were removed in TensorRT 11)",
                "use --mode explicit: the same calibration cache becomes Q/DQ nodes",
            )
        return BuildRecipe(tuple(creation), ("INT8",) + extra, False, False, False, True)
    if mode != "explicit":
        raise ConfigError(f"unknown build mode {mode!r}", "use explicit or implicit")
    if not weak:
        # TensorRT 11: always strongly typed; INT8 comes from Q/DQ, FP16 from FP16 tensors.
        return BuildRecipe(tuple(creation), (), True, True, fp16, False)
    if v.major >= 10 and can_request_strong_typing(trt):
        # TensorRT 10: strongly typed Q/DQ network; no precision flags are allowed with it.
        return BuildRecipe(tuple(creation + ["STRONGLY_TYPED"]), (), True, True, fp16, False)
    # TensorRT 8.6: weakly typed; Q/DQ layers run in INT8 only with the INT8 flag.
    return BuildRecipe(tuple(creation), ("INT8",) + extra, False, True, False, False)


def float_reference_recipe(trt: Any) -> tuple[BuildRecipe, bool]:
    """How the FP16 engine an INT8 build is weighed against is built (``build --tune-placement``'s
    float reference): (the recipe, whether the model's float tensors must be cast to FP16 first).
    TensorRT <= 10 builds the FP32 model with the FP16 builder flag; TensorRT 11 has no precision
    flags, so its FP16 engine comes, strongly typed, from a model whose tensors are FP16."""
    if has_weak_typing(trt):
        return plan_build(trt, "fp16"), False
    return plan_build(trt, "fp32"), True


def creation_mask(trt: Any, names: Iterable[str]) -> int:
    """Bit mask for ``Builder.create_network`` from flag names (bits from the installed enum)."""
    enum = trt.NetworkDefinitionCreationFlag
    mask = 0
    for name in names:
        mask |= 1 << int(getattr(enum, name))
    return mask


def set_builder_flags(trt: Any, config: Any, names: Iterable[str]) -> None:
    for name in names:
        config.set_flag(getattr(trt.BuilderFlag, name))


def tactic_source_mask(trt: Any, names: Sequence[str]) -> int:
    """Mask for ``IBuilderConfig.set_tactic_sources`` from names such as ``JIT_CONVOLUTIONS``."""
    enum = trt.TacticSource
    available = enum_names(enum)
    mask = 0
    for raw in names:
        name = str(raw).strip().upper()
        if not name:
            continue
        if not hasattr(enum, name):
            raise ConfigError(
                f"unknown tactic source {raw!r} for TensorRT {version_of(trt)}",
                "choose from " + ", ".join(available),
            )
        mask |= 1 << int(getattr(enum, name))
    return mask


def set_workspace(trt: Any, config: Any, megabytes: int) -> None:
    if megabytes <= 0:
        raise ConfigError(f"build.workspace_mb must be positive, got {megabytes}")
    # the memory-pool API (8.4+) is the only one in 10 and 11 (max_workspace_size was removed)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(megabytes) << 20)


def set_optimization_level(config: Any, level: int) -> bool:
    """Set ``builder_optimization_level`` (8.6+); False when this TensorRT has no such setting."""
    if not 0 <= int(level) <= 5:
        raise ConfigError(f"build.optimization_level must be 0..5, got {level}")
    if not hasattr(config, "builder_optimization_level"):
        return False
    config.builder_optimization_level = int(level)
    return True


def set_detailed_profiling(trt: Any, config: Any) -> bool:
    """Keep each layer's precision, formats and tactic in the plan (8.2+; metadata only, no effect on
    speed), so the engine inspector can show them; False where this TensorRT cannot."""
    verbosity = getattr(getattr(trt, "ProfilingVerbosity", None), "DETAILED", None)
    if verbosity is None or not hasattr(config, "profiling_verbosity"):
        return False
    config.profiling_verbosity = verbosity
    return True


def engine_layers(trt: Any, engine: Any, context: Any = None) -> list:
    """The engine inspector's layer list (dicts when the plan was built with detailed profiling,
    names otherwise); [] where this TensorRT has no inspector."""
    if not hasattr(engine, "create_engine_inspector"):
        return []
    inspector = engine.create_engine_inspector()
    if context is not None:
        inspector.execution_context = context
    import json

    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON) or "{}", strict=False)
    return list(info.get("Layers", []))


def set_calibration_profile(config: Any, profile: Any) -> bool:
    """Profile used while calibrating dynamic inputs (8.6/10); False where it does not exist."""
    if not hasattr(config, "set_calibration_profile"):
        return False
    config.set_calibration_profile(profile)
    return True


def load_timing_cache(config: Any, data: Optional[bytes], logger: Any = None) -> tuple[Any, bool, str]:
    """Attach a timing cache made from ``data``: (cache, usable, why not).

    A corrupt or foreign cache (another TensorRT / GPU) gives a fresh empty cache, False and the
    reason: the build goes on, only slower. TensorRT 8.6 accepts garbage bytes without raising (it
    logs an error and starts empty), so the data also counts as unusable when TensorRT logged an
    error while reading it, or when the loaded cache serializes no larger than an empty one.
    Known TensorRT 8.5/8.6 bug (fixed in 10.x): a cache holding Myelin entries is refused by the
    same version that wrote it ("Myelin error from unknown graph ... will not be used").
    """
    empty = config.create_timing_cache(b"")
    usable = False
    reason = "no timing cache yet"
    cache = None
    if data:
        errors = getattr(logger, "errors", None)
        errors_before = len(errors) if isinstance(errors, list) else 0
        try:
            cache = config.create_timing_cache(data)
        except Exception as e:  # TensorRT raises on some corrupt inputs
            reason = f"TensorRT cannot read it ({e})"
            cache = None
        if cache is not None:
            try:
                usable = bool(config.set_timing_cache(cache, False))  # ignore_mismatch=False
                reason = "" if usable else "it was made by another TensorRT version or GPU"
            except Exception as e:
                reason = f"TensorRT refused it ({e})"
                usable = False
        if isinstance(errors, list) and len(errors) > errors_before:
            usable = False  # TensorRT complained about the data: not an error of the build
            reason = f"TensorRT refused it: {errors[errors_before]}"
            del errors[errors_before:]
        if usable and len(bytes(cache.serialize())) <= len(bytes(empty.serialize())):
            usable = False
            reason = "TensorRT loaded nothing from it"
    if not usable:
        cache = empty
        config.set_timing_cache(cache, False)
    return cache, usable, ("" if usable else reason)


def serialize_timing_cache(config: Any) -> Optional[bytes]:
    cache = config.get_timing_cache()
    if cache is None:
        return None
    return bytes(cache.serialize())


def host_memory_bytes(blob: Any) -> bytes:
    """``IHostMemory`` (build_serialized_network / serialize) -> bytes."""
    return bytes(memoryview(blob))


# ------------------------------------------------------------------------------------------------
# I/O tensors (the name-based API: present in 8.6, 10 and 11)
# ------------------------------------------------------------------------------------------------

# DataType member name -> numpy dtype name (names are stable across versions; values are not)
_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "INT8": "int8",
    "INT32": "int32",
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT64": "int64",
}


def dtype_name(trt_dtype: Any) -> str:
    """numpy dtype name for a TensorRT DataType (``bf16`` etc. come back as ``trt:<NAME>``)."""
    name = getattr(trt_dtype, "name", None) or str(trt_dtype).split(".")[-1]
    return _DTYPES.get(name, f"trt:{name}")


@dataclass(frozen=True)
class IOTensor:
    name: str
    is_input: bool
    shape: tuple[int, ...]  # -1 for dynamic dims
    dtype: str  # numpy dtype name


def io_tensors(trt: Any, engine: Any) -> list[IOTensor]:
    out: list[IOTensor] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        mode = engine.get_tensor_mode(name)
        if mode != trt.TensorIOMode.INPUT and mode != trt.TensorIOMode.OUTPUT:
            continue
        out.append(
            IOTensor(
                name=name,
                is_input=mode == trt.TensorIOMode.INPUT,
                shape=tuple(int(d) for d in engine.get_tensor_shape(name)),
                dtype=dtype_name(engine.get_tensor_dtype(name)),
            )
        )
    return out


def profile_shapes(engine: Any, name: str, profile: int = 0) -> tuple[tuple[int, ...], ...]:
    """(min, opt, max) of an input in an optimization profile."""
    shapes = engine.get_tensor_profile_shape(name, profile)
    return tuple(tuple(int(d) for d in s) for s in shapes)


def execute(context: Any, stream_handle: int) -> None:
    from trtq.errors import TrtqError

    if not context.execute_async_v3(stream_handle):
        raise TrtqError("TensorRT failed to enqueue the engine", "run with -v to see TensorRT's messages")


# ------------------------------------------------------------------------------------------------
# logging
# ------------------------------------------------------------------------------------------------

_ERRORS = {"INTERNAL_ERROR", "ERROR"}


def severity_name(severity: Any) -> str:
    name = getattr(severity, "name", None)
    return name if isinstance(name, str) else str(severity).split(".")[-1]


def make_logger(trt: Any) -> Any:
    """A ``trt.ILogger`` that forwards to :mod:`logging` and keeps errors for our exceptions."""

    base = trt.ILogger

    class TrtqLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            name = severity_name(severity)
            try:
                # TensorRT is chatty; its errors also reach the user through our exceptions, so
                # everything is logged below WARNING (visible with -v).
                if name in _ERRORS:
                    self.errors.append(msg)
                    log.info("TensorRT error: %s", msg)
                elif name == "WARNING":
                    self.warnings.append(msg)
                    log.info("TensorRT warning: %s", msg)
                elif name == "INFO":
                    log.debug("TensorRT: %s", msg)
            except KeyboardInterrupt:
                # a signal raised while TensorRT calls us from C++ crossed into it (pybind11 printed
                # the traceback, the build went on): builds run in interrupt.deferred(), and a caller
                # outside it still has the signal recorded for its next interrupt.check()
                pass

        def take_errors(self) -> list[str]:
            errs, self.errors = self.errors, []
            return errs

    return TrtqLogger()


def attach_progress_monitor(
    trt: Any,
    config: Any,
    start: Callable[[str, Optional[str], int], None],
    step: Callable[[str, int], None],
    finish: Callable[[str], None],
) -> Any:
    """TensorRT's build progress (``IProgressMonitor``: TensorRT >= 10; None where the installed
    one has none, or where the config takes none): ``start(phase, parent, steps)``,
    ``step(phase, step)`` and ``finish(phase)`` are called from the build. The caller keeps the
    returned monitor alive until the build returns; the build never stops on its account."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None or version_of(trt) < TrtVersion(10, 0, 0) or not hasattr(config, "progress_monitor"):
        return None

    class TrtqProgress(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: Optional[str], num_steps: int) -> None:
            with contextlib.suppress(Exception):  # progress never fails a build
                start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step_index: int) -> bool:
            with contextlib.suppress(Exception):
                step(phase_name, step_index)
            return True  # go on

        def phase_finish(self, phase_name: str) -> None:
            with contextlib.suppress(Exception):
                finish(phase_name)

    monitor = TrtqProgress()
    config.progress_monitor = monitor
    return monitor
