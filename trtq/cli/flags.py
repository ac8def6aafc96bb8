"""trtq's flags: the option groups several commands share, declared once (:func:`option_group`
hands their values to a command as one :class:`Flags` object), and the types that read them
(:class:`Number`: ASCII digits only; :class:`Registered`: the names of a registry; input and
output paths that click does not check, so that the library's one-line errors speak).
"""

import functools
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

import click

from trtq.errors import UsageError


class Flags(types.SimpleNamespace):
    """The values of one flag group, as attributes (``flags.batch_size``)."""


def option_group(name: str, *options: Callable) -> Callable:
    """A decorator that adds ``options`` (click.option decorators, in --help order) to a command
    and hands their values to it as one :class:`Flags` parameter ``name``: a group of flags that
    several commands share is declared once (as Polygraphy's argument groups are)."""

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = Flags(**{dest: kwargs.pop(dest) for dest in dests})
            return f(*args, **kwargs)

        command.__click_params__ = list(getattr(f, "__click_params__", []))  # type: ignore[attr-defined]
        before = len(command.__click_params__)  # type: ignore[attr-defined]
        for option in reversed(options):
            command = option(command)
        dests = [p.name for p in command.__click_params__[before:] if p.expose_value]  # type: ignore[attr-defined]
        return command

    return decorate


# --config / --json / -v / -q on every subcommand (they may also come before the subcommand)
common = option_group(
    "common",
    click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="YAML config file (relative paths inside it are relative to the file).",
    ),
    click.option("--json", "as_json", is_flag=True, default=None, help="Print the result as JSON on stdout."),
    click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv: debug, tracebacks)."),
    click.option("-q", "--quiet", is_flag=True, default=None, help="Only print errors on stderr."),
)


# input files: click checks nothing (its errors exit 2); the library reports missing, unreadable
# or wrong files as invalid input (exit 3)
IN_PATH = click.Path(readable=False)
# output files: click checks nothing either; trtq.outputs refuses a folder, a special file or an
# input (exit 2, one line) before any work
OUT_PATH = click.Path(readable=False)


class Number(click.ParamType):
    """An integer (``INT``) or a finite number (``FLOAT``) written with the ASCII digits 0-9, at most
    18 of them (trtq.formatting): click's INT and FLOAT take other scripts' digits (``--batch-size ١٢``),
    ``1_000``, ``nan``, ``inf`` and numbers of any length. ``low`` / ``high`` bound it."""

    def __init__(self, integer: bool, low: Optional[float] = None, high: Optional[float] = None):
        self.integer, self.low, self.high = integer, low, high
        self.name = "integer" if integer else "number"

    def convert(self, value, param, ctx):
        from trtq.formatting import ascii_float, ascii_int

        number = ascii_int(value) if self.integer else ascii_float(value)
        flag = max(param.opts, key=len) if param is not None and param.opts else "the value"
        if number is None:
            shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
            what = "a whole number" if self.integer else "a finite number"
            raise UsageError(
                f"{flag} must be {what} written with the digits 0-9 (at most 18 of them), got {shown!r}",
                f"e.g. {flag} {2 if self.integer else 0.5}",
            )
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise UsageError(f"{flag} must be in {self.low}..{self.high}, got {number}", f"e.g. {flag} {self.low}")
        return number

    def __repr__(self) -> str:
        return self.name.upper()


INT = Number(integer=True)
FLOAT = Number(integer=False)


class Seconds(Number):
    """A non-negative number of seconds, or of milliseconds with the suffix ``ms`` (``s`` may end
    a number of seconds): trtexec's --warmUp is in ms, its --duration in s, so a unit says which
    is meant."""

    def __init__(self) -> None:
        super().__init__(integer=False)
        self.name = "seconds"

    def convert(self, value, param, ctx):
        text = str(value).strip().lower()
        scale = 1.0
        if text.endswith("ms"):
            text, scale = text[:-2], 1e-3
        elif text.endswith("s"):
            text = text[:-1]
        flag = max(param.opts, key=len) if param is not None and param.opts else "the value"
        number = super().convert(text, param, ctx) if text else None
        if number is None or number < 0:
            raise UsageError(
                f"{flag} must be a time of at least 0 in seconds, or with ms or s after it, got {str(value)[:40]!r}",
                f"e.g. {flag} 0.5, {flag} 500ms",
            )
        return number * scale


SECONDS = Seconds()


class HiddenAliases(click.Option):
    """An option with extra spellings (``hidden_aliases``) that work but are not shown in --help:
    a former or another tool's name kept for old command lines."""

    def __init__(self, *args: Any, hidden_aliases: Sequence[str] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx):
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


# the names of trtq.data.presets.PRESETS (not imported here: the CLI stays fast to import)
PRESET_CHOICE = click.Choice(["imagenet", "inception", "yolo", "paddle", "unit", "raw"])


class Registered(click.Choice):
    """A click.Choice of a registry's names (trtq.calib.methods, trtq.compare.tasks), read when
    first needed: ``trtq --help`` imports neither registry."""

    def __init__(self, names: Callable[[], Sequence[str]], case_sensitive: bool = True):
        super().__init__((), case_sensitive)
        self._names = names

    @property
    def choices(self) -> Sequence[str]:
        return tuple(self._names())

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        pass


def _method_names() -> Sequence[str]:
    from trtq.calib.methods import METHODS

    return METHODS.names()


def _task_names() -> Sequence[str]:
    from trtq.compare.tasks import TASKS

    return ("auto", *TASKS.names())


OVERRIDE_KEY = "trtq.override_input_shapes"


def _remembered(key: str, *decls: str, **kwargs: Any) -> Callable:
    """A repeatable option whose values go to the click context's ``meta[key]``, not to the
    command (read where the config is merged)."""

    def remember(ctx, param, value):
        ctx.meta[key] = tuple(value or ())
        return value

    return click.option(*decls, multiple=True, expose_value=False, callback=remember, **kwargs)


override_option = _remembered(
    OVERRIDE_KEY,
    "--override-input-shape",
    metavar="INPUT=DIMS",
    help="Run the model at another declared input shape, e.g. input=1x3x240x320 or "
    "input:1x3x240x320 (checked by ONNX shape inference and one run; config model_input_shapes). "
    "INPUT=DIMS or INPUT:DIMS: the name is all before the last '=' (else the last ':') whose "
    "right side is dims, so input:0:1x3x240x320 names input:0.",
)


USER_MODEL_KEY = "trtq.user_model"  # the --model given, when --override-input-shape swapped cfg.model


SHAPES_KEY = "trtq.shapes"


# --shape, handed to settings.apply_data_flags through the click context (not a command parameter)
shape_option = _remembered(
    SHAPES_KEY,
    "--shape",
    metavar="[INPUT=]DIMS",
    help="Full shape of an input with dynamic dims, batch first, e.g. x=8x3x48x320 or "
    "x:8x3x48x320 (as data.shapes; presets are sized from it). The name is all before the last "
    "'=' (else the last ':') whose right side is dims: input:0:8x3x48x320 names input:0.",
)


def data_source(data_help: str, preprocess_help: str) -> Callable:
    """--data / --preprocess (and --shape) as the group ``source``; merged by trtq.cli.settings.apply_data_flags."""
    return option_group(
        "source",
        click.option("--data", "data", multiple=True, metavar="[INPUT=]PATH", help=data_help),
        click.option("--preprocess", type=PRESET_CHOICE, help=preprocess_help),
        shape_option,
    )


DATA_SOURCE = data_source(
    "Image folder, .txt file list, .npy file or glob; repeat per input as NAME=PATH.",
    "Preprocessing preset for image folders (instead of a config).",
)


# how the data is batched (data.* keys), for the commands that run the model over it
batching = option_group(
    "batching",
    click.option("--batch-size", type=INT, help="Samples per batch (default: model's batch dim, else 8)."),
    click.option("--limit", type=INT, help="Use at most N samples."),
    click.option("--workers", type=INT, help="Decode threads (default: min(4, CPUs))."),
    click.option("--skip-bad", is_flag=True, default=None, help="Skip undecodable images and report them."),
    click.option("--shuffle/--no-shuffle", default=None, help="Shuffle samples (seeded, deterministic)."),
    click.option("--seed", type=INT, help="Shuffle seed."),
)


# how the ranges are computed and written (calibrate.* keys)
calibration = option_group(
    "calib",
    click.option(
        "--method", type=Registered(_method_names), help="Range method (default mse; with --backend tensorrt: entropy)."
    ),
    click.option("--percentile", type=FLOAT, help="Percentile for --method percentile (default 99.99)."),
    click.option("--num-bins", type=INT, help="Histogram bins (default 2048)."),
    click.option(
        "--hist-elements",
        type=INT,
        metavar="N",
        help="mse/percentile: histogram at most N elements of each tensor per sample, a fixed "
        "stride (default 65536; 0: every element). The max always sees every element.",
    ),
    click.option(
        "--collect",
        type=click.Choice(["auto", "in-graph", "outputs"]),
        help="Take the statistics inside ONNX Runtime as each tensor is made (in-graph: inference's "
        "memory, no activation copied out; needs the compiled kernels and the CPU provider) or from "
        "tensors exposed as outputs (default auto: in-graph where it runs).",
    ),
    click.option(
        "--tensors",
        multiple=True,
        metavar="NAMES",
        help="Only these tensors (comma-separated or repeated); 'qdq': only the activations trtq "
        "quantize places Q/DQ on (explicit builds; ~15-50% of the tensors, up to 2x faster; the "
        "default for a cache written for TensorRT >= 11); 'all': every tensor.",
    ),
    click.option("-o", "--output", type=OUT_PATH, help="Cache path (default calibration.cache)."),
    click.option(
        "--trt-version", help="TensorRT version the cache header is written for (default: installed, else 10.16.0)."
    ),
    click.option(
        "--backend",
        type=click.Choice(["onnxruntime", "tensorrt"]),
        help="Who computes the ranges (default onnxruntime).",
    ),
    click.option("--providers", multiple=True, help="ONNX Runtime providers, e.g. CPUExecutionProvider."),
    click.option("--save-stats", type=OUT_PATH, help="Also save max + histograms (.npz) for --from-stats."),
    click.option(
        "--max-memory",
        metavar="SIZE",
        help="Memory one batch of exposed activations may take (--collect outputs, or where in-graph "
        "cannot run), e.g. 2G or 512M; more runs ONNX Runtime once per group of tensors (default: "
        "1/4 of available memory).",
    ),
)


sharding = option_group(
    "sharding",
    click.option(
        "--shard", metavar="I/N", help="Only shard I (0-based) of N of the samples; writes --save-stats, no cache."
    ),
    click.option("--ranges", type=IN_PATH, help="Pass 2 of a shard: histograms over these merged pass-1 ranges."),
    click.option(
        "--keep-batches",
        type=OUT_PATH,
        help="With --shard: pass 1 writes the decoded batches here, pass 2 reads them instead of decoding.",
    ),
)


# how the FP32 model is quantized (quantize.* keys)
quantizing = option_group(
    "quantizing",
    click.option(
        "--exclude",
        multiple=True,
        metavar="PATTERN",
        help="Keep nodes float: an op type, an exact node name, else a regex searched in node names (repeat).",
    ),
    click.option("--fp16", is_flag=True, default=None, help="Cast the non-quantized rest to float16."),
    click.option(
        "--per-channel/--per-tensor", default=None, help="Weight scales per output channel (default) or per tensor."
    ),
    click.option(
        "--fold-affine/--no-fold-affine",
        default=None,
        help="Fold a Conv's constant Mul/Add/Sub epilogue into its weights and bias before placing "
        "Q/DQ (default on; exact), so TensorRT can run the Conv and its Quantize as one INT8 layer.",
    ),
    click.option("--allow-stale", is_flag=True, default=None, help="Use a cache whose provenance names another model."),
    click.option(
        "--bias-correction",
        is_flag=True,
        default=None,
        help="Cancel the mean shift of INT8 weight rounding in Conv/Gemm biases (needs --data or a config with data).",
    ),
    click.option(
        "--weight-rounding",
        type=click.Choice(["nearest", "gptq"]),
        help="INT8 weight levels: nearest (default) or gptq, chosen for each layer's output error "
        "on the data (needs --data or a config with data).",
    ),
    click.option(
        "--float-layers",
        type=INT,
        metavar="N",
        help="Leave float the N layers that add the most error alone (ranked as compare --per-layer "
        "does, on the data).",
    ),
    click.option(
        "--samples",
        type=INT,
        help="Calibration samples --equalize, --bias-correction, gptq rounding, --reconstruct and --float-layers read "
        "(default 128).",
    ),
    click.option(
        "--center-activations",
        is_flag=True,
        default=None,
        help="Shift ReLU/Clip outputs that feed quantized Conv/Gemm to use both halves of INT8 "
        "(half the step; an exact rewrite of biases, clip bounds and pad values).",
    ),
    click.option(
        "--center-padded",
        is_flag=True,
        default=None,
        help="With --center-activations: also the outputs padded convs read, each such conv followed by a "
        "constant border map (exact; more accurate, but TensorRT 8.6 runs those convs FP16).",
    ),
    click.option(
        "--equalize",
        is_flag=True,
        default=None,
        help="Even out the channel ranges of Conv inputs on the data (an exact rewrite of the "
        "weights around them; needs --data or a config with data).",
    ),
    click.option(
        "--placement",
        type=click.Choice(["auto", "standard", "fused", "shared"]),
        help="Q/DQ placement: auto (default: shared, or standard with --center-activations), shared "
        "(one pair per tensor, read by its Concat/Add/pooling/Resize readers too, as ModelOpt places "
        "them), standard (the inputs of Conv/Gemm/MatMul and residual skips only: fewer roundings, "
        "more float layers in the engine) or fused (also a pair on every Split/Concat/pooling group "
        "member and residual Adds behind SiLU).",
    ),
    click.option(
        "--placement-from",
        type=IN_PATH,
        metavar="PLAN",
        help="Apply the placement a build --tune-placement search kept (its engine, .plan.json or --json "
        "output): placement, attention setting and the nodes it left float.",
    ),
    click.option(
        "--attention",
        type=click.Choice(["float", "int8"]),
        help="Attention cores (the Q x K^T and Softmax x V MatMuls): float (default) or int8 (Q/DQ on both "
        "inputs of both, the Softmax output among them; kept float beyond 512 keys).",
    ),
    click.option(
        "--reconstruct",
        is_flag=True,
        default=None,
        help="Learn weight rounding and activation scales block by block with activations quantized, "
        "against FP32 on the data; also writes the cache it implies (OUTPUT.cache). "
        'Needs pip install "trtq[reconstruct]".',
    ),
    click.option("--iterations", type=INT, help="Training steps per block for --reconstruct (default 60)."),
)


# compare --per-layer: rank the quantized layers by the error each adds
per_layer = option_group(
    "layers",
    click.option(
        "--per-layer", is_flag=True, default=None, help="Rank quantized layers by the error each adds (needs --cache)."
    ),
    click.option("--per-layer-mode", type=click.Choice(["only", "leave-one-out"]), default="only", show_default=True),
    click.option("--cache", type=IN_PATH, help="Calibration cache for --per-layer."),
    click.option("--top", type=INT, default=10, show_default=True, help="Rows of the per-layer table."),
)


# compare: how an .onnx candidate runs
candidate_run = option_group(
    "run",
    click.option(
        "--semantics",
        type=click.Choice(["qdq", "onnxruntime"]),
        help="How a Q/DQ .onnx candidate is run: qdq (default: the Q/DQ pairs as written, what TensorRT "
        "computes) or onnxruntime (its fused int8 kernels, as ONNX Runtime deploys it).",
    ),
    click.option(
        "--float-rest",
        type=click.Choice(["fp32", "fp16"]),
        help="How an .onnx candidate's layers outside the Q/DQ pairs run: fp32 (default, as written) or fp16 "
        "(cast to float16, as an engine built with --fp16 runs them; a model without Q/DQ: as an FP16 engine).",
    ),
)


# compare: what the outputs are for (the task metric that gates and ranks)
task = option_group(
    "task",
    click.option(
        "--task",
        type=Registered(_task_names),
        help="What the outputs are for; sets the task metric that --min-agreement gates and --per-layer "
        "ranks by (default auto: inferred from each output's shape, stated in the report).",
    ),
    click.option(
        "--detect-format",
        type=click.Choice(["auto", "v8", "v5"]),
        help="detect: YOLOv8 rows (4 box + class scores) or YOLOv5 rows (4 box, objectness, class scores).",
    ),
    click.option("--score-threshold", type=FLOAT, help="detect: least score of a detection (default 0.25)."),
    click.option("--nms-iou", type=FLOAT, help="detect: NMS IoU threshold, per class (default 0.45)."),
    click.option(
        "--mask-threshold", type=FLOAT, help="segment: a one-channel map's mask is value > this (default 0.5)."
    ),
    click.option(
        "--layout",
        type=click.Choice(["NTC", "TNC", "NCHW", "NHWC"], case_sensitive=False),
        help="Where the graph does not say: ctc NTC or TNC (batch axis), segment NCHW or NHWC.",
    ),
    click.option("--scores", help="detect, split heads: the score outputs, comma-separated (one per stride)."),
    click.option("--boxes", help="detect, split heads: the box outputs paired in order with --scores."),
    click.option(
        "--box-format",
        type=click.Choice(["auto", "dfl", "ltrb", "xyxy", "cxcywh"]),
        help="detect, split heads: dfl distributions (auto for 4 x (reg_max+1) values), ltrb distances "
        "in strides from the anchor point, or xyxy / cxcywh input pixels.",
    ),
)


# how TensorRT builds the engine (build.* keys)
engine = option_group(
    "engine",
    click.option(
        "--mode",
        type=click.Choice(["explicit", "implicit"]),
        help="explicit Q/DQ (default; TRT 11) or implicit calibrator (TRT <= 10).",
    ),
    click.option("--precision", type=click.Choice(["int8", "fp16", "fp32"]), help="Engine precision (default int8)."),
    click.option("--fp16", is_flag=True, default=None, help="Let layers left in float run in FP16."),
    click.option("--workspace-mb", type=INT, help="Builder workspace limit in MiB."),
    click.option(
        "--optimization-level",
        "--opt-level",
        "optimization_level",
        cls=HiddenAliases,
        hidden_aliases=("--opt-level",),
        type=Number(integer=True, low=0, high=5),
        help="Builder optimization level 0-5 (trtexec --builderOptimizationLevel).",
    ),
    click.option("--timing-cache", type=OUT_PATH, help="Load/save the builder timing cache here."),
    click.option(
        "--tactic-sources", help="Comma-separated tactic sources, e.g. EDGE_MASK_CONVOLUTIONS,JIT_CONVOLUTIONS."
    ),
    click.option(
        "--require-int8",
        is_flag=True,
        default=None,
        help="Exit 1 when a layer of the INT8 engine fell back to float between INT8 layers (for CI).",
    ),
    click.option(
        "--layout-rebuilds",
        type=Number(integer=True, low=0, high=10),
        help="Build again, at most N times (default 2), while the engine stores a tensor padded to 8x its "
        "size or more, such as a 3-channel input 32 channels wide; 0: never.",
    ),
    click.option(
        "--fix-qdq",
        is_flag=True,
        default=None,
        help="Lower what TensorRT cannot parse when it is exact (opset, FP16 Q/DQ scales, zero scales on "
        "all-zero weight channels); refuse the rest.",
    ),
)


# build --tune-placement (build.tune_* keys; --limit: the samples its candidates are scored on)
tuning = option_group(
    "tuning",
    click.option(
        "--tune-placement",
        is_flag=True,
        default=None,
        help="Build the candidate Q/DQ placements (standard, shared, fallback layers left float), time "
        "them and keep the fastest whose task metric on --data stays within --tune-tolerance of the default's.",
    ),
    click.option(
        "--tune-tolerance",
        type=FLOAT,
        help="--tune-placement: task metric a kept candidate may lose (default 0.005; outputs without a "
        "task: build.tune_sqnr_drop_db dB of SQNR, default 1).",
    ),
    click.option("--tune-builds", type=INT, help="--tune-placement: TensorRT builds it may make (default 8)."),
    click.option(
        "--tune-guided/--no-tune-guided",
        default=None,
        help="--tune-placement: build TensorRT's implicit INT8 engine (TensorRT <= 10) and try leaving "
        "float what it ran in float (default on; one build of --tune-builds, plus the candidate's).",
    ),
    click.option(
        "--tune-float",
        type=click.Choice(["report", "keep", "off"]),
        help="--tune-placement: also build the FP16 engine without Q/DQ and say when it is faster than "
        "the kept INT8 engine (report, default), write it then (keep), or skip it (off).",
    ),
    click.option("--limit", type=INT, help="--tune-placement: score on at most N samples."),
)
