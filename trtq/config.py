"""Configuration: YAML file -> frozen dataclasses.

Precedence: dataclass defaults < YAML file (``--config``) < ``TRTQ_*`` environment < flags.

* Unknown keys are rejected with their full path (``data.inputs.x.preprocess.mena``).
* Relative paths in a YAML file are resolved against the folder of that file, so a config works
  from any working directory; paths given as flags or environment stay relative to the cwd.
* Environment variables name a scalar by its dotted path in upper case with ``_`` between parts,
  e.g. ``TRTQ_CALIBRATE_METHOD=max`` or ``TRTQ_DATA_BATCH_SIZE=16``.

This module is pure Python (no numpy/onnx) so that the CLI stays fast to import.
"""

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from trtq.errors import ConfigError


def _path_field(default=None):
    """A field holding a filesystem path (resolved against the YAML file's folder)."""
    return field(default=default, metadata={"path": True})


def _paths_field():
    """A field holding a tuple of paths or globs (each resolved against the YAML file's folder)."""
    return field(default=(), metadata={"path": True})


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------

Interpolation = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming", "opencv_linear"]


@dataclass(frozen=True)
class ResizeOptions:
    """How an image is resized before cropping.

    mode:
      none      keep the decoded size
      exact     resize to ``size`` = (h, w), ignoring the aspect ratio
      shorter   scale so the shorter side equals ``size[0]`` (torchvision ``Resize(256)``)
      longer    scale so the longer side equals ``size[0]``
      letterbox scale to fit inside ``size`` = (h, w) keeping the aspect ratio, then pad with
                ``pad_value`` (pixel units, before scale/mean/std) at ``anchor``
      height    PaddleOCR's text line: height ``h``, width from the aspect ratio capped at ``w``
                (wider lines squashed), padded to ``w`` with ``pad_value`` at ``anchor``
    """

    mode: Literal["none", "exact", "shorter", "longer", "letterbox", "height"] = "none"
    size: tuple[int, ...] = ()
    interpolation: Interpolation = "bilinear"
    pad_value: float = 0.0
    anchor: Literal["center", "top_left"] = "center"


@dataclass(frozen=True)
class PreprocessOptions:
    """Image -> tensor. Order: decode, EXIF-rotate, color, resize, center_crop, to float,
    ``x * scale``, ``(x - mean) / std`` per channel, layout, dtype."""

    color: Literal["rgb", "bgr", "gray"] = "rgb"
    resize: ResizeOptions = ResizeOptions()
    center_crop: tuple[int, ...] = ()
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    layout: Literal["nchw", "nhwc"] = "nchw"
    dtype: Literal["float32", "float16"] = "float32"


@dataclass(frozen=True)
class InputSource:
    """Where the samples for one model input come from: exactly one of images / files / npy."""

    images: Optional[str] = _path_field()  # folder, searched recursively
    files: tuple[str, ...] = _paths_field()  # explicit image paths, or one .txt list file
    npy: tuple[str, ...] = _paths_field()  # .npy files or globs; axis 0 is the sample axis
    preprocess: PreprocessOptions = PreprocessOptions()


@dataclass(frozen=True)
class DataOptions:
    inputs: dict[str, InputSource] = field(default_factory=dict)
    batch_size: Optional[int] = None  # default: the model's static batch dim, else 8
    last_batch: Literal["pad", "drop", "keep"] = "pad"
    limit: Optional[int] = None  # use at most this many samples
    shuffle: bool = False
    seed: int = 0
    workers: Optional[int] = None  # decode threads; default min(4, cpu count)
    prefetch: int = 4  # batches decoded ahead of the consumer
    skip_bad: bool = False
    # full shapes for inputs with dynamic dims, e.g. {x: [8, 3, 224, 224]}
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# calibrate / quantize / compare
# --------------------------------------------------------------------------------------------

WeightRounding = Literal["nearest", "gptq"]
Placement = Literal["auto", "standard", "fused", "shared"]


@dataclass(frozen=True)
class CalibrateOptions:
    # None: the backend's default, see DEFAULT_METHOD / resolved(); the names are trtq.calib.methods' (the
    # CLI checks them when it loads the config: trtq.cli.flags.load_checked_config)
    method: Optional[str] = None
    percentile: float = 99.99
    num_bins: int = 2048
    tensors: tuple[str, ...] = ()  # empty: every tensor a TensorRT cache can name
    output: str = _path_field("calibration.cache")
    trt_version: Optional[str] = None  # default: installed tensorrt, else DEFAULT_TRT_VERSION
    backend: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    providers: tuple[str, ...] = ()  # ONNX Runtime providers; default CUDA if present, else CPU
    save_stats: Optional[str] = _path_field()
    # bytes one batch of collected activations may take, e.g. "2G"; default 1/4 of available memory
    max_memory: Optional[str] = None
    # mse / percentile: elements of each tensor histogrammed per sample (a fixed prime stride past
    # this many; the max is over every element); 0 histograms every element (trtq.calib.collect.one_pass)
    hist_elements: int = 65536
    # where the statistics are taken. in-graph: by trtq's operator inside ONNX Runtime as each tensor
    # is made (trtq.calib.collect.ingraph; compiled kernels, CPU provider); outputs: every tensor exposed as a
    # graph output and histogrammed after the call; auto: in-graph where it runs
    collect: Literal["auto", "in-graph", "outputs"] = "auto"

    def resolved(self) -> "CalibrateOptions":
        """These options with ``method`` set: the backend's default when not given."""
        if self.method is not None:
            return self
        return dataclasses.replace(self, method=DEFAULT_METHOD[self.backend])


# mse: best INT8 agreement measured (benchmarks/README.md); TensorRT's calibrators have only MinMax and
# EntropyCalibration2, and the latter is its own default
DEFAULT_METHOD = {"onnxruntime": "mse", "tensorrt": "entropy"}


@dataclass(frozen=True)
class QuantizeOptions:
    output: Optional[str] = _path_field()
    exclude: tuple[str, ...] = ()  # node-name regexes or op types kept in float
    per_channel: bool = True
    fold_affine: bool = True  # fold a Conv's constant Mul/Add/Sub epilogue into its weights (trtq.quantize.affine_fold)
    fp16: bool = False  # cast the non-quantized rest to float16
    allow_stale: bool = False
    bias_correction: bool = False  # subtract the weight-rounding mean shift from biases (needs data)
    weight_rounding: WeightRounding = "nearest"  # gptq: levels that minimise each layer's output error (needs data)
    float_layers: int = 0  # leave this many of the most error-adding layers float (ranked on data)
    samples: int = 128  # calibration samples equalize, bias correction, gptq rounding and float_layers read
    center_activations: bool = False  # shift ReLU/Clip outputs so symmetric INT8 uses both halves
    # with center_activations: the tensors padded convs read too, through a constant border map after
    # each such conv (exact; TensorRT 8.6 runs those convs FP16: docs/decisions.md D42)
    center_padded: bool = False
    equalize: bool = False  # even out the channel ranges of Conv inputs (exact float rewrite; needs data)
    # auto: shared, or standard with center_activations (placement_used); fused / shared: Q/DQ so Concat /
    # residual Add / pooling groups stay INT8
    placement: Placement = "auto"
    # attention cores (Q x K^T, Softmax x V MatMuls): float, or int8 up to 512 keys (trtq.quantize.rules)
    attention: Literal["float", "int8"] = "float"
    # the placement a `build --tune-placement` search kept (its engine or .plan.json): placement,
    # attention and the nodes it left float replace the settings above (trtq.pipeline.placement_from)
    placement_from: Optional[str] = _path_field()
    # learn weight rounding and activation steps block by block, activations quantized (needs data and torch)
    reconstruct: bool = False
    iterations: int = 60  # reconstruct: training steps per block (fits EfficientNet-Lite0 on 2 cores)

    def placement_used(self) -> str:
        """The placement quantize applies: ``auto`` is shared (faster engines at the same task metric
        on every model of issue 34's table, docs/decisions.md D31), or standard with
        ``center_activations``, whose engine form is written for the standard pairs."""
        if self.placement != "auto":
            return self.placement
        return "standard" if self.center_activations else "shared"


@dataclass(frozen=True)
class CompareOptions:
    min_agreement: Optional[float] = None
    min_cosine: Optional[float] = None
    per_layer: bool = False
    limit: Optional[int] = None
    # how a Q/DQ ONNX candidate is run: "qdq" (what TensorRT computes) or "onnxruntime" (its int8 kernels)
    semantics: Literal["qdq", "onnxruntime"] = "qdq"
    # the candidate's non-quantized rest: fp32 as written, or cast to fp16 (an engine built with --fp16)
    float_rest: Literal["fp32", "fp16"] = "fp32"
    # what the outputs are for (trtq.compare.tasks): auto infers it from each output's shape
    task: str = "auto"  # auto or a task of trtq.compare.tasks (checked as method is)
    detect_format: Literal["auto", "v8", "v5"] = "auto"  # v8 [N, 4+C, A]; v5 [N, A, 5+C] objectness
    score_threshold: float = 0.25  # detect: a detection's least score
    nms_iou: float = 0.45  # detect: NMS drops a box overlapping a better one of its class by more
    mask_threshold: float = 0.5  # segment, one-channel maps: mask = value > this
    # where the graph does not say: ctc NTC / TNC (batch axis), segment NCHW / NHWC (class axis)
    layout: Literal["auto", "NTC", "TNC", "NCHW", "NHWC", "ntc", "tnc", "nchw", "nhwc"] = "auto"
    # split detector heads (per-stride score and box maps), paired in order, and how boxes are written
    scores: tuple[str, ...] = field(default=(), metadata={"csv": True})
    boxes: tuple[str, ...] = field(default=(), metadata={"csv": True})
    box_format: Literal["auto", "dfl", "ltrb", "xyxy", "cxcywh"] = "auto"


# --------------------------------------------------------------------------------------------
# build / bench
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileShapes:
    min: tuple[int, ...] = ()
    opt: tuple[int, ...] = ()
    max: tuple[int, ...] = ()


@dataclass(frozen=True)
class BuildOptions:
    mode: Literal["explicit", "implicit"] = "explicit"
    precision: Literal["int8", "fp16", "fp32"] = "int8"
    fp16: bool = False  # let layers left in float run in FP16
    output: Optional[str] = _path_field()
    workspace_mb: Optional[int] = None
    optimization_level: Optional[int] = None  # builder optimization level 0..5
    timing_cache: Optional[str] = _path_field()
    # e.g. [EDGE_MASK_CONVOLUTIONS, JIT_CONVOLUTIONS], or the flag's comma-separated string
    tactic_sources: Optional[tuple[str, ...]] = field(default=None, metadata={"csv": True})
    profiles: dict[str, ProfileShapes] = field(default_factory=dict)
    allow_stale: bool = False
    require_int8: bool = False  # a float layer between INT8 layers fails the build (exit 1)
    fix_qdq: bool = False  # lower what TensorRT cannot parse exactly (opset, FP16 scales, zero scales)
    # builds again while the engine stores a tensor padded to >= 8x its size (trtq.trt.format_guard)
    layout_rebuilds: int = 2
    # build the candidate placements, time them, keep the fastest within the tolerance (trtq.pipeline.tune)
    tune_placement: bool = False
    tune_tolerance: float = 0.005  # task metric a kept candidate may lose against the default placement's
    tune_sqnr_drop_db: float = 1.0  # the same, in dB of output SQNR, when no output has a task metric
    tune_builds: int = 8  # TensorRT builds the search may make
    # the FP16 engine without Q/DQ the kept INT8 engine is weighed against (trtq.pipeline.tune_float)
    tune_float: Literal["report", "keep", "off"] = "report"
    # a candidate that leaves float what TensorRT's implicit engine ran in float (trtq.pipeline.tune_guided)
    tune_guided: bool = True


@dataclass(frozen=True)
class BenchOptions:
    iterations: Optional[int] = None
    duration: float = 3.0  # seconds, used when iterations is not given
    warmup: float = 0.5  # seconds
    include_copies: bool = False
    cuda_graph: bool = False


@dataclass(frozen=True)
class TrtqConfig:
    model: Optional[str] = _path_field()
    # rewrite fixed declared input shapes, e.g. {input: [1, 3, 240, 320]} (--override-input-shape)
    model_input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    data: DataOptions = DataOptions()
    calibrate: CalibrateOptions = CalibrateOptions()
    quantize: QuantizeOptions = QuantizeOptions()
    compare: CompareOptions = CompareOptions()
    build: BuildOptions = BuildOptions()
    bench: BenchOptions = BenchOptions()


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

ENV_PREFIX = "TRTQ_"


def load_config(
    path: Optional[Union[str, Path]] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> TrtqConfig:
    """Build the effective config.

    ``overrides`` maps dotted keys to values (``{"calibrate.method": "max"}``); ``None`` values
    are ignored so unset CLI flags do not override anything.
    """
    raw: dict[str, Any] = {}
    base_dir: Optional[Path] = None
    if path is not None:
        raw = _read_yaml(Path(path))
        base_dir = Path(path).resolve().parent
    cfg = _convert(TrtqConfig, raw, "", base_dir)
    env_values = _env_overrides(os.environ if environ is None else environ)
    if env_values:
        cfg = apply_overrides(cfg, env_values, source="environment")
    if overrides:
        cfg = apply_overrides(cfg, {k: v for k, v in overrides.items() if v is not None}, "option")
    # defaults that depend on other settings, once every layer is in
    return dataclasses.replace(cfg, calibrate=cfg.calibrate.resolved())


def apply_overrides(cfg: Any, values: Mapping[str, Any], source: str = "option") -> Any:
    """Return a copy of dataclass ``cfg`` with dotted keys replaced (values are converted)."""
    for dotted, value in values.items():
        cfg = _replace_dotted(cfg, dotted.split("."), value, dotted, source)
    return cfg


def _unique_key_loader():
    """A yaml SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: let PyYAML report it
                    continue
                if first is not None:
                    raise ConfigError(
                        f"config key '{key}' appears twice in one mapping "
                        f"(lines {first} and {key_node.start_mark.line + 1})",
                        "keep one of them (YAML would silently use the last)",
                    )
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if path.exists() and not path.is_file():
        raise ConfigError(f"config path {path} is not a regular file", "pass a YAML file with --config")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}", "check the --config path") from None
    except OSError as e:
        raise ConfigError(
            f"cannot read config file {path}: {e.strerror}", "check the path and its permissions"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start})", "save it as UTF-8 (a YAML file, not a binary)"
        ) from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path}{where} is not valid YAML", "fix the syntax at that line") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must contain a mapping at the top level")
    return data


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    table = _scalar_paths(TrtqConfig, "")
    out: dict[str, Any] = {}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _ENV_IGNORED:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in table:
            raise ConfigError(
                f"unknown environment variable {name}",
                "unset it, or use one of " + ", ".join(sorted(ENV_PREFIX + k.upper() for k in table)),
            )
        import yaml  # here: without TRTQ_ variables a run does not import it

        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        out[table[key]] = value
    return out


# TRTQ_* variables with another meaning (read elsewhere, not config keys)
_ENV_IGNORED = {"TRTQ_TEST_MODELS", "TRTQ_BENCH_DIR", "TRTQ_GPU_TESTS", "TRTQ_NO_NATIVE", "TRTQ_SIGNAL_GRACE"}


def _scalar_paths(tp: Any, prefix: str) -> dict[str, str]:
    """Map env-style keys (``calibrate_method``) to dotted paths for every settable field."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(tp):
        dotted = f"{prefix}{f.name}"
        hint = typing.get_type_hints(tp)[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(_scalar_paths(hint, dotted + "."))
        elif typing.get_origin(hint) is dict:
            continue
        else:
            out[dotted.replace(".", "_")] = dotted
    return out


def _replace_dotted(obj: Any, parts, value: Any, dotted: str, source: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        raise ConfigError(f"unknown {source} key '{dotted}'")
    names = {f.name: f for f in dataclasses.fields(obj)}
    head = parts[0]
    if head not in names:
        raise ConfigError(f"unknown {source} key '{dotted}'")
    hint = typing.get_type_hints(type(obj))[head]
    if len(parts) == 1:
        new = _convert(hint, value, dotted, None, csv=bool(names[head].metadata.get("csv")))
    else:
        new = _replace_dotted(getattr(obj, head), parts[1:], value, dotted, source)
    return dataclasses.replace(obj, **{head: new})


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin in (tuple, tuple):
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _bad(path: str, value: Any, tp: Any) -> ConfigError:
    where = path or "config"
    return ConfigError(f"config key '{where}' must be {_type_name(tp)}, got {value!r}")


def _resolve_path(value: str, base_dir: Optional[Path]) -> str:
    """``value`` against the config's folder, its leading ``..`` taken off that folder
    (``configs/../out`` -> ``out``: exact, since ``base_dir`` is resolved, so no symlink is
    skipped; ``..`` later in the value is kept, as it may follow a symlink)."""
    p = Path(os.path.expanduser(value))
    if base_dir is not None and not p.is_absolute():
        parts = p.parts
        while parts and parts[0] == ".." and base_dir.parent != base_dir:
            base_dir, parts = base_dir.parent, parts[1:]
        p = base_dir.joinpath(*parts)
    return str(p)


def _convert(tp: Any, value: Any, path: str, base_dir: Optional[Path], is_path: bool = False, csv: bool = False) -> Any:
    """``value`` from YAML / the environment / a flag as type ``tp``; ConfigError naming ``path``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _convert_section(tp, value, path, base_dir)
    if origin is Union:
        return _convert_union(tp, args, value, path, base_dir, is_path, csv)
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in args:
            return value.lower()
        raise _bad(path, value, tp)
    if origin in (tuple, tuple):
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if csv and isinstance(value, str):
            items = [p.strip() for p in value.split(",") if p.strip()]
        return tuple(_convert(args[0], v, f"{path}[{i}]", base_dir, is_path) for i, v in enumerate(items))
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise _bad(path, value, tp)
        return {str(k): _convert(args[1], v, f"{path}.{k}", base_dir, is_path) for k, v in value.items()}
    return _convert_scalar(tp, value, path, base_dir, is_path)


def _convert_section(tp: Any, value: Any, path: str, base_dir: Optional[Path]) -> Any:
    """A config section (a dataclass) from a mapping; unknown keys are refused with the valid ones."""
    if value is None:
        return tp()
    if not isinstance(value, dict):
        raise _bad(path, value, tp)
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp)}
    kwargs = {}
    for key, sub in value.items():
        sub_path = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{sub_path}'",
                "valid keys here: " + ", ".join(fields),
            )
        f = fields[key]
        kwargs[key] = _convert(
            hints[key], sub, sub_path, base_dir, bool(f.metadata.get("path")), bool(f.metadata.get("csv"))
        )
    try:
        return tp(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section '{path or 'top level'}': {e}") from None


def _convert_union(
    tp: Any, args: tuple[Any, ...], value: Any, path: str, base_dir: Optional[Path], is_path: bool, csv: bool
) -> Any:
    """The first member type of an Optional / Union that takes ``value``."""
    if value is None and type(None) in args:
        return None
    last: Optional[ConfigError] = None
    for a in args:
        if a is type(None):
            continue
        try:
            return _convert(a, value, path, base_dir, is_path, csv)
        except ConfigError as e:
            last = e
    raise last if last is not None else _bad(path, value, tp)


def _convert_scalar(tp: Any, value: Any, path: str, base_dir: Optional[Path], is_path: bool) -> Any:
    """bool / int / float / str (a path resolved against the config's folder); bools are no numbers."""
    number = not isinstance(value, bool)
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and number and isinstance(value, int):
        return value
    if tp is float and number and isinstance(value, (int, float)):
        return float(value)
    if tp is str and number and isinstance(value, (str, int, float)):
        return _resolve_path(str(value), base_dir) if is_path else str(value)
    if tp in (bool, int, float, str):
        raise _bad(path, value, tp)
    raise ConfigError(f"config key '{path}' has an unsupported type")  # pragma: no cover


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-data view of a config (for provenance JSON and ``--dry-run`` output)."""
    return dataclasses.asdict(cfg)
