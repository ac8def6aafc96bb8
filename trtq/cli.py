"""trtq command line: parse flags, load the config, call the library, map errors to exit codes.

The only module that imports click. numpy / onnx / onnxruntime / tensorrt are imported inside the
commands, so ``trtq --help`` stays fast and works without them.

Exit codes: 0 ok, 1 operation failed, 2 usage/config error, 3 invalid input (data, model, cache),
4 environment missing (TensorRT, GPU), 130 interrupted.
"""
import functools
import json
import logging
import os
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Optional
from collections.abc import Sequence

import click

from trtq import __version__
from trtq.errors import TrtqError, UsageError
import contextlib

log = logging.getLogger("trtq")

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


# ------------------------------------------------------------------------------------------------
# shared plumbing
# ------------------------------------------------------------------------------------------------


class _State:
    def __init__(self) -> None:
        self.verbose = 0
        self.quiet = False
        self.json = False


class _StdoutGuard:
    """While a command runs, only its result reaches stdout.

    Libraries print to stdout (ONNX Runtime's Python layer prints its provider fallback banner,
    C++ code writes to file descriptor 1): that would break ``--json`` and pipes. So during the
    command ``sys.stdout`` is stderr and fd 1 points at fd 2; :func:`_emit` writes the result to
    the saved stdout.
    """

    def __init__(self) -> None:
        self.saved_stdout = sys.stdout
        self.result = sys.stdout
        self.saved_fd: Optional[int] = None
        self.own = None
        self.engaged = False

    def engage(self) -> None:
        if self.engaged:
            return
        self.engaged = True
        self.saved_stdout = self.result = sys.stdout
        try:
            sys.stdout.flush()
            uses_fd1 = sys.stdout.fileno() == 1
        except (AttributeError, OSError, ValueError):
            uses_fd1 = False
        try:
            self.saved_fd = os.dup(1)
            os.dup2(2, 1)
        except OSError:
            self.saved_fd = None
        if uses_fd1 and self.saved_fd is not None:
            self.own = open(os.dup(self.saved_fd), "w", encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
                            errors=getattr(sys.stdout, "errors", None) or "strict")
            self.result = self.own
        sys.stdout = sys.stderr

    def restore(self) -> None:
        if not self.engaged:
            return
        self.engaged = False
        try:
            if self.own is not None:
                self.own.flush()
        finally:
            sys.stdout = self.saved_stdout
            if self.saved_fd is not None:
                os.dup2(self.saved_fd, 1)
                os.close(self.saved_fd)
                self.saved_fd = None
            if self.own is not None:
                with contextlib.suppress(OSError):
                    self.own.close()
                self.own = None


_guard = _StdoutGuard()


def _state() -> _State:
    ctx = click.get_current_context()
    root = ctx.find_root()
    if root.obj is None:
        root.obj = _State()
    return root.obj


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    logger = logging.getLogger("trtq")
    logger.handlers[:] = []
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("trtq: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


class _Flags(types.SimpleNamespace):
    """The values of one flag group, as attributes (``flags.batch_size``)."""


def _option_group(name: str, *options: Callable) -> Callable:
    """A decorator that adds ``options`` (click.option decorators, in --help order) to a command
    and hands their values to it as one :class:`_Flags` parameter ``name``: a group of flags that
    several commands share is declared once (as Polygraphy's argument groups are)."""

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = _Flags(**{dest: kwargs.pop(dest) for dest in dests})
            return f(*args, **kwargs)

        command.__click_params__ = list(getattr(f, "__click_params__", []))  # type: ignore[attr-defined]
        before = len(command.__click_params__)  # type: ignore[attr-defined]
        for option in reversed(options):
            command = option(command)
        dests = [p.name for p in command.__click_params__[before:] if p.expose_value]  # type: ignore[attr-defined]
        return command

    return decorate


# --config / --json / -v / -q on every subcommand (they may also come before the subcommand)
_common = _option_group(
    "common",
    click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="YAML config file (relative paths inside it are relative to the file)."),
    click.option("--json", "as_json", is_flag=True, default=None, help="Print the result as JSON on stdout."),
    click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv: debug, tracebacks)."),
    click.option("-q", "--quiet", is_flag=True, default=None, help="Only print errors on stderr."),
)


def _apply_common(common: _Flags) -> _State:
    st = _state()
    if common.as_json:
        st.json = True
    if common.verbose:
        st.verbose = max(st.verbose, common.verbose)
    if common.quiet:
        st.quiet = True
    _setup_logging(st.verbose, st.quiet)
    _guard.engage()
    ctx = click.get_current_context(silent=True)
    if ctx is not None:  # the guard lasts one command, also when click's own main runs it (CliRunner)
        ctx.find_root().call_on_close(_guard.restore)
    return st


def _emit(st: _State, data: Any, text: str) -> None:
    if st.json:
        click.echo(json.dumps(data, indent=2, sort_keys=False, default=str), file=_guard.result)
    else:
        click.echo(text, file=_guard.result)
    _guard.result.flush()


def _load_config(config_path: Optional[Path], overrides: dict[str, Any]):
    """The effective config; with model_input_shapes / --override-input-shape, ``model`` is a
    rewritten copy of the model at those input shapes (checked, removed when the command ends)."""
    import dataclasses

    cfg = load_checked_config(config_path, overrides)
    flags = click.get_current_context().meta.get(_OVERRIDE_KEY, ())
    if flags:
        from trtq.input_override import parse_override

        cfg = dataclasses.replace(cfg, model_input_shapes={**cfg.model_input_shapes, **parse_override(flags)})
    if cfg.model_input_shapes and cfg.model:
        from trtq.input_override import write_overridden

        click.get_current_context().meta[_USER_MODEL_KEY] = cfg.model  # what the output checks protect
        cfg = dataclasses.replace(cfg, model=write_overridden(cfg.model, cfg.model_input_shapes))
    return cfg


def load_checked_config(config_path: Optional[Path], overrides: dict[str, Any]):
    """:func:`trtq.config.load_config`, with the method and task names checked against their
    registries (trtq.calib.methods, trtq.compare.tasks) as the config's other values are when it
    loads: one line, exit 2, for every command (a case other than theirs is taken, as for the
    config's fixed choices)."""
    import dataclasses

    from trtq.config import load_config

    cfg = load_config(config_path, overrides)
    if cfg.calibrate.method is not None:
        from trtq.calib import methods

        method = methods.get(_canonical(cfg.calibrate.method, methods.names())).name
        cfg = dataclasses.replace(cfg, calibrate=dataclasses.replace(cfg.calibrate, method=method))
    if cfg.compare.task != "auto":
        from trtq.compare.tasks import get_task, task_names

        task = _canonical(cfg.compare.task, ("auto", *task_names()))
        task = task if task == "auto" else get_task(task).name
        cfg = dataclasses.replace(cfg, compare=dataclasses.replace(cfg.compare, task=task))
    return cfg


def _canonical(value: Any, names: Sequence[str]) -> Any:
    return value.lower() if isinstance(value, str) and value not in names and value.lower() in names else value


class _Registered(click.Choice):
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
    from trtq.calib.methods import names

    return names()


def _task_names() -> Sequence[str]:
    from trtq.compare.tasks import task_names

    return ("auto", *task_names())


_OVERRIDE_KEY = "trtq.override_input_shapes"


def _remember_overrides(ctx, param, value):
    ctx.meta[_OVERRIDE_KEY] = tuple(value or ())
    return value


def _override_option(f):
    return click.option("--override-input-shape", multiple=True, metavar="INPUT=DIMS", expose_value=False,
                        callback=_remember_overrides,
                        help="Run the model at another declared input shape, e.g. input=1x3x240x320 (checked "
                             "by ONNX shape inference and one run; config model_input_shapes).")(f)


_USER_MODEL_KEY = "trtq.user_model"  # the --model given, when --override-input-shape swapped cfg.model


def _declare(cfg, config_path, inputs=(), models=(), outputs=(), data: bool = True) -> None:
    """The command's declaration of what it reads and writes, checked by the one guard
    (trtq.outputs.guard) before it writes anything: every command calls this once, with every file
    it writes (side files included) as ``outputs``. The config file, the model (``cfg.model``, the
    user's file when --override-input-shape made a copy; its external data too) and, with ``data``,
    the files and folders of ``cfg.data.inputs`` are inputs of every command."""
    from trtq.outputs import Declared, data_paths, guard

    files, folders = data_paths(cfg.data.inputs) if data else ([], [])
    model = click.get_current_context().meta.get(_USER_MODEL_KEY) or cfg.model
    guard(Declared.of(inputs=[("config file", config_path), *inputs, *files], folders=folders,
                      models=[("model", model), *models], outputs=outputs))


def _split_csv(values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def _source_for_path(path: str):
    """InputSource for a --data path: folder -> images, .npy/glob -> npy, .txt/image -> files."""
    from trtq.config import InputSource

    p = Path(path)
    if any(ch in path for ch in "*?[") or p.suffix.lower() == ".npy":
        return InputSource(npy=(path,))
    if p.is_dir():
        return InputSource(images=path)
    if p.suffix.lower() == ".txt" or p.is_file():
        return InputSource(files=(path,))
    from trtq.errors import DataError

    raise DataError(f"data path not found: {path}", "pass an image folder, a .txt file list, or .npy files")


def _parse_shape_flags(items: Sequence[str], specs, base: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """--shape [INPUT=]DIMS (DIMS like 8x3x48x320 or 8,3,48,320) merged over data.shapes."""
    from trtq.input_override import parse_dims

    by_name = {s.name: s for s in specs}
    shapes = dict(base)
    seen: dict[str, str] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep:
            if len(specs) != 1:
                raise UsageError(f"the model has {len(specs)} inputs: give --shape INPUT=DIMS",
                                 "inputs: " + ", ".join(by_name))
            name = specs[0].name
        elif name not in by_name:
            raise UsageError(f"--shape names '{name}', which is not a model input", "inputs: " + ", ".join(by_name))
        parsed = parse_dims(dims)
        if parsed is None:
            raise UsageError(f"--shape {item}: the dims must be positive integers (digits 0-9, each below 2**31)",
                             f"write every dim of {by_name[name].describe()}, e.g. --shape {name}=8x3x224x224")
        if name in seen:
            raise UsageError(f"--shape gives input '{name}' twice ({seen[name]} and {item})",
                             "pass one --shape per input")
        seen[name] = item
        shapes[name] = parsed
    return shapes


def _apply_data_flags(cfg, source: _Flags):
    """Merge --data [NAME=]PATH, --shape and --preprocess PRESET into cfg.data (needs the model).
    A preset is sized from the input's full shape: data.shapes / --shape where given."""
    import dataclasses

    data, preprocess = source.data, source.preprocess

    shape_flags = click.get_current_context().meta.get(_SHAPES_KEY, ())
    if not data and not preprocess and not shape_flags:
        return cfg
    if not cfg.model:
        raise UsageError("--data/--preprocess/--shape need a model", "pass --model MODEL.onnx")
    from trtq.model import input_specs, load_model
    from trtq.data.presets import preset

    specs = input_specs(load_model(cfg.model))
    by_name = {s.name: s for s in specs}
    shapes = _parse_shape_flags(shape_flags, specs, dict(cfg.data.shapes))
    inputs = dict(cfg.data.inputs)
    given: dict[str, str] = {}
    for item in data:
        name, sep, path = item.partition("=")
        if sep and name not in by_name and _looks_like_input_name(name) and not Path(item).exists():
            raise UsageError(f"the model has no input '{name}'", "inputs: " + ", ".join(by_name))
        if not sep or name not in by_name:
            if len(specs) != 1 and not (sep and name in by_name):
                raise UsageError(
                    f"the model has {len(specs)} inputs: give --data NAME=PATH",
                    "inputs: " + ", ".join(by_name),
                )
            name, path = (specs[0].name, item) if not (sep and name in by_name) else (name, path)
        if name in given:
            raise UsageError(f"--data gives input '{name}' twice ({given[name]} and {path})",
                             "pass one --data per input (a glob or a folder holds many files)")
        given[name] = path
        old = inputs.get(name)
        src = _source_for_path(path)
        if old is not None:
            src = dataclasses.replace(src, preprocess=old.preprocess)
        elif src.npy == () and preprocess is None:
            raise UsageError(
                f"images for input '{name}' need preprocessing",
                "pass --preprocess imagenet|inception|yolo|paddle|unit|raw, or a config with "
                f"data.inputs.{name}.preprocess",
            )
        inputs[name] = src
    if preprocess:
        for name, src in list(inputs.items()):
            if name in by_name:
                shape = shapes.get(name) or by_name[name].shape
                inputs[name] = dataclasses.replace(src, preprocess=preset(preprocess, shape))
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, inputs=inputs, shapes=shapes))


def _looks_like_input_name(text: str) -> bool:
    """A NAME in --data NAME=PATH (not a path that happens to contain '=')."""
    return bool(text) and "/" not in text and os.sep not in text and not text.startswith((".", "~"))


# input files: click checks nothing (its errors exit 2); the library reports missing, unreadable
# or wrong files as invalid input (exit 3)
_IN_PATH = click.Path(readable=False)
# output files: click checks nothing either; trtq.outputs refuses a folder, a special file or an
# input (exit 2, one line) before any work
_OUT_PATH = click.Path(readable=False)


class _Number(click.ParamType):
    """An integer (``_INT``) or a finite number (``_FLOAT``) written with the ASCII digits 0-9, at most
    18 of them (trtq.numbers): click's INT and FLOAT take other scripts' digits (``--batch-size ١٢``),
    ``1_000``, ``nan``, ``inf`` and numbers of any length. ``low`` / ``high`` bound it."""

    def __init__(self, integer: bool, low: Optional[float] = None, high: Optional[float] = None):
        self.integer, self.low, self.high = integer, low, high
        self.name = "integer" if integer else "number"

    def convert(self, value, param, ctx):
        from trtq.numbers import ascii_float, ascii_int

        number = ascii_int(value) if self.integer else ascii_float(value)
        flag = max(param.opts, key=len) if param is not None and param.opts else "the value"
        if number is None:
            shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
            what = "a whole number" if self.integer else "a finite number"
            raise UsageError(f"{flag} must be {what} written with the digits 0-9 (at most 18 of them), got {shown!r}",
                             f"e.g. {flag} {2 if self.integer else 0.5}")
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise UsageError(f"{flag} must be in {self.low}..{self.high}, got {number}", f"e.g. {flag} {self.low}")
        return number

    def __repr__(self) -> str:
        return self.name.upper()


_INT = _Number(integer=True)
_FLOAT = _Number(integer=False)

# the names of trtq.data.presets.PRESETS (not imported here: the CLI stays fast to import)
_PRESET_CHOICE = click.Choice(["imagenet", "inception", "yolo", "paddle", "unit", "raw"])


_SHAPES_KEY = "trtq.shapes"


def _remember_shapes(ctx, param, value):
    ctx.meta[_SHAPES_KEY] = tuple(value or ())
    return value


def _shape_option(f):
    """--shape, handed to _apply_data_flags through the click context (not a command parameter)."""
    return click.option("--shape", multiple=True, metavar="[INPUT=]DIMS", expose_value=False, callback=_remember_shapes,
                        help="Full shape of an input with dynamic dims, batch first, e.g. x=8x3x48x320 "
                             "(as data.shapes; presets are sized from it).")(f)


def _data_source(data_help: str, preprocess_help: str) -> Callable:
    """--data / --preprocess (and --shape) as the group ``source``; merged by :func:`_apply_data_flags`."""
    return _option_group(
        "source",
        click.option("--data", "data", multiple=True, metavar="[INPUT=]PATH", help=data_help),
        click.option("--preprocess", type=_PRESET_CHOICE, help=preprocess_help),
        _shape_option,
    )


_DATA_SOURCE = _data_source("Image folder, .txt file list, .npy file or glob; repeat per input as NAME=PATH.",
                            "Preprocessing preset for image folders (instead of a config).")

# how the data is batched (data.* keys), for the commands that run the model over it
_batching = _option_group(
    "batching",
    click.option("--batch-size", type=_INT, help="Samples per batch (default: model's batch dim, else 8)."),
    click.option("--limit", type=_INT, help="Use at most N samples."),
    click.option("--workers", type=_INT, help="Decode threads (default: min(4, CPUs))."),
    click.option("--skip-bad", is_flag=True, default=None, help="Skip undecodable images and report them."),
    click.option("--shuffle/--no-shuffle", default=None, help="Shuffle samples (seeded, deterministic)."),
    click.option("--seed", type=_INT, help="Shuffle seed."),
)


def _data_overrides(batching: _Flags) -> dict[str, Any]:
    return {f"data.{key}": value for key, value in vars(batching).items()}


class _ProgressLine:
    """One self-rewriting progress line on stderr (only when stderr is a TTY or --progress)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.width = 0

    def __call__(self, p) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        final = p.batches_done == p.batches
        if not final and now - self.last < (0.2 if self.tty else 2.0):
            return
        self.last = now
        rate = p.samples_done / p.elapsed if p.elapsed > 0 else 0.0
        eta = ""
        if 0 < p.batches_done < p.batches:
            secs = p.elapsed / p.batches_done * (p.batches - p.batches_done)
            eta = f"  ETA {int(secs // 60)}:{int(secs % 60):02d}"
        line = (f"pass {p.stage_index}/{p.stages} ({p.stage}): {p.batches_done}/{p.batches} batches, "
                f"{p.samples_done} samples, {rate:.1f} samples/s{eta}")
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
            if final:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ------------------------------------------------------------------------------------------------
# the group
# ------------------------------------------------------------------------------------------------


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from trtq.calib.collect.kernels import implementation

    # the kernels: "numpy" on an install that built no compiled kernels (slower)
    click.echo(f"trtq, version {__version__} (histogram kernels: {implementation()})")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and the histogram kernels this install uses (compiled or numpy).")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv: debug, tracebacks).")
@click.option("-q", "--quiet", is_flag=True, help="Only print errors on stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """trtq: ONNX model + representative data -> calibrated, fast INT8 TensorRT engine.

    \b
    Typical flow:
      trtq calibrate --model m.onnx --data images/ --preprocess imagenet -o calibration.cache
      trtq quantize  --model m.onnx --cache calibration.cache -o m.qdq.onnx
      trtq compare   --reference m.onnx --candidate m.qdq.onnx --data images/ --preprocess imagenet
      trtq build     --model m.onnx --cache calibration.cache -o m.plan
      trtq bench     m.plan
    """
    st = _State()
    st.verbose, st.quiet = verbose, quiet
    ctx.obj = st
    _setup_logging(verbose, quiet)


# ------------------------------------------------------------------------------------------------
# calibrate
# ------------------------------------------------------------------------------------------------


# how the ranges are computed and written (calibrate.* keys)
_calibration = _option_group(
    "calib",
    click.option("--method", type=_Registered(_method_names),
                 help="Range method (default mse; with --backend tensorrt: entropy)."),
    click.option("--percentile", type=_FLOAT, help="Percentile for --method percentile (default 99.99)."),
    click.option("--num-bins", type=_INT, help="Histogram bins (default 2048)."),
    click.option("--hist-elements", type=_INT, metavar="N",
                 help="mse/percentile: histogram at most N elements of each tensor per sample, a fixed "
                      "stride (default 65536; 0: every element). The max always sees every element."),
    click.option("--collect", type=click.Choice(["auto", "in-graph", "outputs"]),
                 help="Take the statistics inside ONNX Runtime as each tensor is made (in-graph: inference's "
                      "memory, no activation copied out; needs the compiled kernels and the CPU provider) or from "
                      "tensors exposed as outputs (default auto: in-graph where it runs)."),
    click.option("--tensors", multiple=True, metavar="NAMES",
                 help="Only these tensors (comma-separated or repeated); 'qdq': only the activations trtq "
                      "quantize places Q/DQ on (explicit builds; ~15-50% of the tensors, up to 2x faster; the "
                      "default for a cache written for TensorRT >= 11); 'all': every tensor."),
    click.option("-o", "--output", type=_OUT_PATH, help="Cache path (default calibration.cache)."),
    click.option("--trt-version",
                 help="TensorRT version the cache header is written for (default: installed, else 10.16.0)."),
    click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt"]),
                 help="Who computes the ranges (default onnxruntime)."),
    click.option("--providers", multiple=True, help="ONNX Runtime providers, e.g. CPUExecutionProvider."),
    click.option("--save-stats", type=_OUT_PATH,
                 help="Also save max + histograms (.npz) for --from-stats."),
    click.option("--max-memory", metavar="SIZE",
                 help="Memory one batch of exposed activations may take (--collect outputs, or where in-graph "
                      "cannot run), e.g. 2G or 512M; more runs ONNX Runtime once per group of tensors (default: "
                      "1/4 of available memory)."),
)

_sharding = _option_group(
    "sharding",
    click.option("--shard", metavar="I/N",
                 help="Only shard I (0-based) of N of the samples; writes --save-stats, no cache."),
    click.option("--ranges", type=_IN_PATH,
                 help="Pass 2 of a shard: histograms over these merged pass-1 ranges."),
    click.option("--keep-batches", type=_OUT_PATH,
                 help="With --shard: pass 1 writes the decoded batches here, pass 2 reads them instead of decoding."),
)


def _calibrate_overrides(model: Optional[str], calib: _Flags) -> dict[str, Any]:
    overrides = {f"calibrate.{key}": getattr(calib, key)
                 for key in ("method", "percentile", "num_bins", "output", "trt_version", "backend", "save_stats",
                             "max_memory", "hist_elements", "collect")}
    overrides.update({"model": model, "calibrate.tensors": _split_csv(calib.tensors) or None,
                      "calibrate.providers": list(calib.providers) or None})
    return overrides


@cli.command()
@_override_option
@_common
@click.option("-m", "--model", type=_IN_PATH, help="FP32 ONNX model.")
@_DATA_SOURCE
@_batching
@_calibration
@click.option("--from-stats", type=_IN_PATH, help="Compute the cache from saved statistics (no model run).")
@click.option("--dry-run", is_flag=True, help="Show the input spec and a summary of the batches; write nothing.")
@click.option("--progress/--no-progress", default=None, help="Progress on stderr (default: when stderr is a terminal).")
@_sharding
def calibrate(common, model, source, batching, calib, from_stats, dry_run, progress, sharding):
    """Run the FP32 model over the data and write a TensorRT calibration.cache (+ .json provenance)."""
    st = _apply_common(common)
    config_path = common.config_path
    cfg = _load_config(config_path, {**_calibrate_overrides(model, calib), **_data_overrides(batching)})
    shard, ranges, keep_batches = sharding.shard, sharding.ranges, sharding.keep_batches
    shard_spec = _shard_flags(shard, ranges, from_stats, cfg)
    if keep_batches and shard_spec is None:
        raise UsageError("--keep-batches is for the two passes of a shard", "pass --shard I/N with it")
    if from_stats:
        from trtq.pipeline.calibrate import calibrate_from_stats

        from trtq.pipeline.calibrate import warn_range_flags

        _declare(cfg, config_path, inputs=[("statistics file", from_stats)], outputs=_calibrate_outputs(cfg, None))
        result = warn_range_flags(cfg, calibrate_from_stats(cfg, Path(from_stats)))
        _emit(st, result.to_dict(), _calibration_text(result))
        return
    cfg = _apply_data_flags(cfg, source)
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    if not cfg.data.inputs:
        raise UsageError("no calibration data given",
                         "pass --data DIR --preprocess PRESET, or a config with data.inputs")
    if dry_run:
        _declare(cfg, config_path)  # reads the model and the data, writes nothing
        _dry_run(st, cfg)
        return
    # pass 2 of a shard (--ranges) reads the batches pass 1 kept; pass 1 writes them
    _declare(cfg, config_path, inputs=[("ranges file", ranges), ("kept batches file", keep_batches if ranges else None)],
             outputs=_calibrate_outputs(cfg, shard_spec, None if ranges else keep_batches))
    show = progress if progress is not None else sys.stderr.isatty()
    from trtq.pipeline.calibrate import calibrate as run_calibrate

    result = run_calibrate(cfg, progress=_ProgressLine(bool(show) and not st.quiet), shard=shard_spec,
                           ranges=Path(ranges) if ranges else None,
                           keep_batches=Path(keep_batches) if keep_batches else None)
    _emit(st, result.to_dict(), _calibration_text(result))


def _calibrate_outputs(cfg, shard_spec, keep_batches: Optional[str] = None) -> list:
    """What calibrate writes: the cache and its provenance JSON (not a shard), the statistics
    (--save-stats), the decoded batches of pass 1 of a shard (--keep-batches)."""
    cache = cfg.calibrate.output
    outputs = [] if shard_spec is not None else [("cache", cache), ("provenance file", f"{cache}.json")]
    return outputs + [("statistics file", cfg.calibrate.save_stats), ("kept batches file", keep_batches)]


def _shard_flags(shard, ranges, from_stats, cfg):
    """--shard / --ranges: parsed (I, N) or None; UsageError for combinations that make no sense."""
    if shard is None and ranges is None:
        return None
    if ranges is not None and shard is None:
        raise UsageError("--ranges is for pass 2 of a sharded calibration", "pass --shard I/N with it")
    if from_stats:
        raise UsageError("--shard calibrates a part of the data; --from-stats reads statistics",
                         "merge the shards with trtq merge-stats, then run --from-stats alone")
    if cfg.calibrate.backend == "tensorrt":
        raise UsageError("--shard needs the onnxruntime backend", "drop --backend tensorrt")
    from trtq.calib.shard import parse_shard

    spec = parse_shard(shard)
    if not cfg.calibrate.save_stats:
        raise UsageError("--shard writes statistics, not a cache", f"pass --save-stats part-{spec[0]}.npz")
    return spec


@cli.command("merge-stats")
@click.argument("stats", nargs=-1, required=True, type=_IN_PATH)
@_common
@click.option("-o", "--output", type=_OUT_PATH, required=True, help="Merged statistics (.npz).")
def merge_stats(stats, common, output):
    """Merge the --save-stats files of the N shards of one pass (trtq calibrate --shard I/N)."""
    st = _apply_common(common)
    from trtq.calib.shard import merge_stats_files

    _declare(load_checked_config(common.config_path, {}), common.config_path, data=False,
             inputs=[("shard file", p) for p in stats], outputs=[("merged statistics file", output)])
    r = merge_stats_files([Path(p) for p in stats], Path(output))
    nxt = ("next: trtq calibrate --shard I/N --ranges {0} --save-stats hist-I.npz" if r.pass_name == "ranges"
           else "next: trtq calibrate --from-stats {0} --method METHOD").format(r.output)
    _emit(st, r.to_dict(), f"merged {r.shards} shard(s) of pass {r.pass_name}: {r.samples} samples, "
                           f"{r.tensors} tensors -> {r.output}\n{nxt}")


def _calibration_text(r) -> str:
    from trtq.calib.cache import version_code

    lines = []
    if r.batches:
        lines.append(f"calibrated {r.samples} samples ({r.batches} batches) with {r.method} in {r.seconds:.1f} s "
                     f"({r.samples / r.seconds if r.seconds else 0:.1f} samples/s)")
    else:
        lines.append(f"computed {r.method} ranges from saved statistics ({r.samples} samples)")
    zero = f" ({len(r.zero_tensors)} zero or below 1e-8 on every sample: scale floored)" if r.zero_tensors else ""
    lines.append(f"tensors     {len(r.amax)}{zero}")
    if getattr(r, "range_flags", None):
        from trtq.calib.range_check import RATIO

        lines.append(f"ranges      {r.method}: {len(r.range_flags)} quantized tensor(s) cost > {RATIO:g}x mse's "
                     f"expected INT8 error, worst {r.range_flags[0].describe()}; consider --method mse")
    if r.skipped:
        lines.append(f"skipped     {len(r.skipped)} bad samples: " + ", ".join(p for p, _ in r.skipped[:3])
                     + (" ..." if len(r.skipped) > 3 else ""))
    if r.cache_path:
        lines.append(f"cache       {r.cache_path}  (TRT-{version_code(r.trt_version)}-{r.algorithm})")
        lines.append(f"provenance  {r.cache_path}.json")
    if r.stats_path:
        lines.append(f"statistics  {r.stats_path}")
    return "\n".join(lines)


def _dry_run(st: _State, cfg) -> None:
    from trtq.data.batcher import Batcher
    from trtq.data.summary import summarize
    from trtq.model import input_specs, load_model

    specs = input_specs(load_model(cfg.model))
    batcher = Batcher(cfg.data, specs)
    summary = summarize(batcher)
    data = {
        "model": str(cfg.model),
        "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in specs],
        "batches": batcher.describe(),
        "summary": summary.to_dict(),
    }
    lines = [f"model   {cfg.model}"]
    for s in specs:
        lines.append(f"input   {s.describe()}  -> batches of {list(batcher.shapes[s.name])}")
    lines.append(summary.render_text() if hasattr(summary, "render_text") else json.dumps(summary.to_dict(), indent=2))
    _emit(st, data, "\n".join(lines))


# ------------------------------------------------------------------------------------------------
# inspect-cache
# ------------------------------------------------------------------------------------------------


@cli.command("inspect-cache")
@click.argument("cache", type=_IN_PATH)
@_common
@click.option("-m", "--model", type=_IN_PATH, help="Check the cache against this ONNX model.")
@click.option("--diff", "other", type=_IN_PATH, help="Compare with another cache.")
@click.option("--sort", "sort_key", type=click.Choice(["name", "amax", "scale", "rel-diff", "file"]), default="file",
              show_default=True, help="Row order.")
@click.option("--top", type=_INT, help="Show only the first N rows.")
def inspect_cache(cache, common, model, other, sort_key, top):
    """Decode a calibration cache (TensorRT or ONNX Runtime format): header, scales, amax, gaps, diffs."""
    st = _apply_common(common)
    from trtq.calib import cache_inspect as ic

    _declare(load_checked_config(common.config_path, {"model": model}), common.config_path, data=False,  # writes nothing
             inputs=[("cache", cache), ("cache provenance", f"{cache}.json"), ("other cache", other),
                     ("other cache provenance", f"{other}.json" if other else None)])
    table = ic.load_for_inspection(Path(cache))
    result: dict[str, Any] = {"summary": ic.summarize(table, Path(cache), sort=sort_key, top=top)}
    if model:
        from trtq.model import load_model

        from trtq.calib.cache import read_provenance

        selection = ((read_provenance(Path(cache)) or {}).get("collection") or {}).get("tensors")
        result["model_check"] = ic.check_against_model(table, load_model(model), selection)
    if other:
        result["diff"] = ic.diff(table, ic.load_for_inspection(Path(other)), sort=sort_key, top=top)
    _emit(st, ic.to_jsonable(result), ic.render_text(result))
    check = result.get("model_check")
    if check is not None and check.verdict in ic.FAILING_VERDICTS:
        from trtq.errors import CacheError

        raise CacheError(f"{cache} is not usable for {model}: {check.verdict}: {check.message}",
                         "re-run trtq calibrate for this model")


# ------------------------------------------------------------------------------------------------
# quantize
# ------------------------------------------------------------------------------------------------


# how the FP32 model is quantized (quantize.* keys)
_quantizing = _option_group(
    "quantizing",
    click.option("--exclude", multiple=True, metavar="PATTERN",
                 help="Keep nodes float: an op type, an exact node name, else a regex searched in node names "
                      "(repeat)."),
    click.option("--fp16", is_flag=True, default=None, help="Cast the non-quantized rest to float16."),
    click.option("--per-channel/--per-tensor", default=None,
                 help="Weight scales per output channel (default) or per tensor."),
    click.option("--allow-stale", is_flag=True, default=None, help="Use a cache whose provenance names another model."),
    click.option("--bias-correction", is_flag=True, default=None,
                 help="Cancel the mean shift of INT8 weight rounding in Conv/Gemm biases (needs --data or a config "
                      "with data)."),
    click.option("--weight-rounding", type=click.Choice(["nearest", "gptq"]),
                 help="INT8 weight levels: nearest (default) or gptq, chosen for each layer's output error "
                      "on the data (needs --data or a config with data)."),
    click.option("--float-layers", type=_INT, metavar="N",
                 help="Leave float the N layers that add the most error alone (ranked as compare --per-layer "
                      "does, on the data)."),
    click.option("--samples", type=_INT,
                 help="Calibration samples --equalize, --bias-correction, gptq rounding and --float-layers read "
                      "(default 128)."),
    click.option("--center-activations", is_flag=True, default=None,
                 help="Shift ReLU/Clip outputs that feed quantized Conv/Gemm to use both halves of INT8 "
                      "(half the step; an exact rewrite of biases, clip bounds and pad values)."),
    click.option("--equalize", is_flag=True, default=None,
                 help="Even out the channel ranges of Conv inputs on the data (an exact rewrite of the "
                      "weights around them; needs --data or a config with data)."),
)


@cli.command()
@_override_option
@_common
@click.option("-m", "--model", type=_IN_PATH, help="FP32 ONNX model.")
@click.option("--cache", type=_IN_PATH, required=True, help="calibration.cache (trtq, TensorRT or ONNX Runtime).")
@click.option("-o", "--output", type=_OUT_PATH, help="Q/DQ model path (default MODEL.qdq.onnx).")
@_quantizing
@_data_source("Data for --equalize, --bias-correction, --weight-rounding gptq and --float-layers, as for "
              "calibrate.",
              "Preprocessing preset for --data.")
def quantize(common, model, cache, output, quantizing, source):
    """Write an explicit Q/DQ ONNX model (TensorRT 8.6/10/11 ready) from a calibration cache."""
    st = _apply_common(common)
    config_path = common.config_path
    cfg = _load_config(config_path, {"model": model, "quantize.output": output,
                                     **{f"quantize.{k}": v for k, v in vars(quantizing).items()},
                                     "quantize.exclude": list(quantizing.exclude) or None})
    cfg = _apply_data_flags(cfg, source)
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    from trtq.pipeline.quantize import quantize_file

    out = Path(cfg.quantize.output) if cfg.quantize.output else Path(cfg.model).with_suffix(".qdq.onnx")
    _declare(cfg, config_path, inputs=[("cache", cache), ("cache provenance", f"{cache}.json")],
             outputs=[("output model", out)])
    result = quantize_file(Path(cfg.model), Path(cache), out, cfg.quantize, cfg.data, cfg.compare)
    data = result.to_dict()
    data["output"] = str(out)
    lines = [f"quantized   {len(result.quantized)} nodes -> {out}"]
    from trtq.pipeline.quantize import DATA_STEP_NOTES

    lines += [f"            {note}" for note in result.notes if note.startswith(DATA_STEP_NOTES)]
    if result.left_float:
        lines.append(f"left float  {len(result.left_float)} nodes:")
        lines += [f"  {name}: {reason}" for name, reason in result.left_float[:20]]
        if len(result.left_float) > 20:
            lines.append(f"  ... {len(result.left_float) - 20} more (see --json)")
    if result.missing_amax:
        lines.append(f"missing     {len(result.missing_amax)} tensors not in the cache (their consumers stay float): "
                     + ", ".join(result.missing_amax[:5]) + (" ..." if len(result.missing_amax) > 5 else ""))
    _emit(st, data, "\n".join(lines))


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------


@cli.command()
@_common
@click.option("--cache", type=_IN_PATH, required=True,
              help="calibration.cache (its .json provenance is read too).")
@click.option("--stats", type=_IN_PATH,
              help="Its --save-stats file (histograms, every method's range).")
@click.option("--compare", "compare_json", type=_IN_PATH,
              help="trtq compare --json output (accuracy, --per-layer).")
@click.option("--quantize", "quantize_json", type=_IN_PATH,
              help="trtq quantize --json output (layers left float).")
@click.option("--bench", "bench_json", type=_IN_PATH, help="trtq bench --json output (latency).")
@click.option("-o", "--output", type=_OUT_PATH, default="report.html", show_default=True,
              help="HTML file to write (self-contained).")
def report(common, cache, stats, compare_json, quantize_json, bench_json, output):
    """Write one self-contained HTML page: histograms and ranges per tensor, sensitivity, accuracy, latency."""
    st = _apply_common(common)
    from trtq import interrupt
    from trtq.fileio import atomic_write_text
    from trtq.report.data import build_report, summary
    from trtq.report.page import render_html

    _declare(load_checked_config(common.config_path, {}), common.config_path, data=False,
             inputs=[("cache", cache), ("cache provenance", f"{cache}.json"), ("statistics file", stats),
                     ("compare JSON", compare_json), ("quantize JSON", quantize_json), ("bench JSON", bench_json)],
             outputs=[("report", output)])
    opt = lambda v: Path(v) if v else None  # noqa: E731
    data = build_report(Path(cache), opt(stats), opt(compare_json), opt(quantize_json), opt(bench_json))
    page = render_html(data)
    with interrupt.held_for_outputs():  # the one output: once in place, a signal no longer says "interrupted"
        atomic_write_text(Path(output), page)
    s = summary(data)
    text = (f"report      {output}\ntensors     {s['tensors']} ({s['with_histogram']} with histograms, "
            f"{s['clipping']} clip > 0.01 %)")
    _emit(st, dict(data, report=str(output)), text)


# ------------------------------------------------------------------------------------------------
# compare
# ------------------------------------------------------------------------------------------------


# compare --per-layer: rank the quantized layers by the error each adds
_per_layer = _option_group(
    "layers",
    click.option("--per-layer", is_flag=True, default=None,
                 help="Rank quantized layers by the error each adds (needs --cache)."),
    click.option("--per-layer-mode", type=click.Choice(["only", "leave-one-out"]), default="only", show_default=True),
    click.option("--cache", type=_IN_PATH, help="Calibration cache for --per-layer."),
    click.option("--top", type=_INT, default=10, show_default=True, help="Rows of the per-layer table."),
)


# compare: what the outputs are for (the task metric that gates and ranks)
_task = _option_group(
    "task",
    click.option("--task", type=_Registered(_task_names),
                 help="What the outputs are for; sets the task metric that --min-agreement gates and --per-layer "
                      "ranks by (default auto: inferred from each output's shape, stated in the report)."),
    click.option("--detect-format", type=click.Choice(["auto", "v8", "v5"]),
                 help="detect: YOLOv8 rows (4 box + class scores) or YOLOv5 rows (4 box, objectness, class scores)."),
    click.option("--score-threshold", type=_FLOAT, help="detect: least score of a detection (default 0.25)."),
    click.option("--nms-iou", type=_FLOAT, help="detect: NMS IoU threshold, per class (default 0.45)."),
    click.option("--mask-threshold", type=_FLOAT,
                 help="segment: a one-channel map's mask is value > this (default 0.5)."),
    click.option("--layout", type=click.Choice(["NTC", "TNC", "NCHW", "NHWC"], case_sensitive=False),
                 help="Where the graph does not say: ctc NTC or TNC (batch axis), segment NCHW or NHWC."),
    click.option("--scores", help="detect, split heads: the score outputs, comma-separated (one per stride)."),
    click.option("--boxes", help="detect, split heads: the box outputs paired in order with --scores."),
    click.option("--box-format", type=click.Choice(["auto", "dfl", "ltrb", "xyxy", "cxcywh"]),
                 help="detect, split heads: dfl distributions (auto for 4 x (reg_max+1) values), ltrb distances "
                      "in strides from the anchor point, or xyxy / cxcywh input pixels."),
)


@cli.command()
@_override_option
@_common
@click.option("--reference", type=_IN_PATH,
              help="Reference model (.onnx, FP32). Default: model: from the config.")
@click.option("--candidate", type=_IN_PATH, required=True,
              help="Candidate (.onnx Q/DQ or .plan engine).")
@_DATA_SOURCE
@_batching
@click.option("--min-agreement", type=_FLOAT, help="Fail (exit 1) when an output's task metric (top-1 agreement, "
              "detection F1, mask IoU, CTC sequence agreement) is below this.")
@click.option("--min-cosine", type=_FLOAT, help="Fail (exit 1) when mean cosine similarity is below this.")
@_per_layer
@click.option("--semantics", type=click.Choice(["qdq", "onnxruntime"]),
              help="How a Q/DQ .onnx candidate is run: qdq (default: the Q/DQ pairs as written, what TensorRT "
                   "computes) or onnxruntime (its fused int8 kernels, as ONNX Runtime deploys it).")
@_task
def compare(common, reference, candidate, source, batching, min_agreement, min_cosine, layers, semantics, task):
    """Run reference and candidate on the same batches and report how close the candidate is."""
    st = _apply_common(common)
    cfg = _load_config(common.config_path, {
        "model": reference, "compare.min_agreement": min_agreement, "compare.min_cosine": min_cosine,
        "compare.per_layer": layers.per_layer, "compare.limit": batching.limit, "compare.semantics": semantics,
        "compare.task": task.task, "compare.detect_format": task.detect_format,
        "compare.score_threshold": task.score_threshold, "compare.nms_iou": task.nms_iou,
        "compare.mask_threshold": task.mask_threshold, "compare.layout": task.layout,
        "compare.scores": task.scores, "compare.boxes": task.boxes, "compare.box_format": task.box_format,
        **_data_overrides(batching),
    })
    cfg = _apply_data_flags(cfg, source)
    per_layer_mode, cache, top = layers.per_layer_mode, layers.cache, layers.top
    if not cfg.model:
        raise UsageError("no reference model given", "pass --reference MODEL.onnx or set model: in the config")
    if not cfg.data.inputs:
        raise UsageError("no data given", "pass --data DIR --preprocess PRESET, or a config with data.inputs")
    from trtq.pipeline.compare import run_compare

    _declare(cfg, common.config_path, models=[("candidate", candidate)],  # writes nothing
             inputs=[("cache", cache), ("cache provenance", f"{cache}.json" if cache else None)])
    report, layers = run_compare(cfg, Path(candidate), Path(cache) if cache else None,
                                 per_layer_mode if cfg.compare.per_layer else None, top)
    data_out = report.to_dict()
    text = report.render_text()
    if layers is not None:
        from trtq.compare.sensitivity import render_layer_table

        data_out["per_layer"] = [row.to_dict() for row in layers]
        text += "\n\n" + render_layer_table(layers, per_layer_mode)
    _emit(st, data_out, text)
    failed = report.gate(cfg.compare)
    if failed:
        from trtq.errors import TrtqError

        raise TrtqError("accuracy gate failed: " + "; ".join(failed))


# ------------------------------------------------------------------------------------------------
# build / bench (TensorRT)
# ------------------------------------------------------------------------------------------------


# how TensorRT builds the engine (build.* keys)
_engine = _option_group(
    "engine",
    click.option("--mode", type=click.Choice(["explicit", "implicit"]),
                 help="explicit Q/DQ (default; TRT 11) or implicit calibrator (TRT <= 10)."),
    click.option("--precision", type=click.Choice(["int8", "fp16", "fp32"]), help="Engine precision (default int8)."),
    click.option("--fp16", is_flag=True, default=None, help="Let layers left in float run in FP16."),
    click.option("--workspace-mb", type=_INT, help="Builder workspace limit in MiB."),
    click.option("--opt-level", "optimization_level", type=_Number(integer=True, low=0, high=5),
                 help="Builder optimization level 0-5."),
    click.option("--timing-cache", type=_OUT_PATH, help="Load/save the builder timing cache here."),
    click.option("--tactic-sources",
                 help="Comma-separated tactic sources, e.g. EDGE_MASK_CONVOLUTIONS,JIT_CONVOLUTIONS."),
)


@cli.command()
@_override_option
@_common
@click.option("-m", "--model", type=_IN_PATH,
              help="ONNX model: FP32 (INT8 needs --cache), or already quantized (Q/DQ: built as it is).")
@click.option("--cache", type=_IN_PATH, help="calibration.cache (INT8 from an FP32 model).")
@click.option("-o", "--output", type=_OUT_PATH, help="Engine path (default MODEL.plan).")
@_engine
@click.option("--exclude", multiple=True, metavar="PATTERN",
              help="Keep nodes float (explicit mode): an op type, an exact node name, else a name regex.")
@click.option("--allow-stale", is_flag=True, default=None, help="Use a cache whose provenance names another model.")
def build(common, model, cache, output, engine, exclude, allow_stale):
    """Build a TensorRT engine (.plan + .plan.json) from an FP32 model and a cache, or from a Q/DQ model."""
    st = _apply_common(common)
    config_path = common.config_path
    cfg = _load_config(config_path, {
        "model": model, "build.output": output, **{f"build.{k}": v for k, v in vars(engine).items()},
        "build.tactic_sources": _split_csv([engine.tactic_sources]) if engine.tactic_sources else None,
        "build.allow_stale": allow_stale, "quantize.exclude": list(exclude) or None,
        "quantize.allow_stale": allow_stale,
    })
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    from trtq.pipeline.build import build_engine

    out = Path(cfg.build.output) if cfg.build.output else Path(cfg.model).with_suffix(".plan")
    _declare(cfg, config_path, inputs=[("cache", cache), ("cache provenance", f"{cache}.json" if cache else None)],
             outputs=[("engine", out), ("engine metadata", f"{out}.json"), ("timing cache", cfg.build.timing_cache)])
    result = build_engine(
        Path(cfg.model), out, cfg.build, cache_path=Path(cache) if cache else None,
        quantize_options=cfg.quantize, data_options=cfg.data,
    )
    md = result.metadata
    source = ", Q/DQ from the model" if (md.get("quantize") or {}).get("source") == "model" else ""
    steps = "".join(f"steps      {note}\n" for note in (md.get("quantize") or {}).get("steps") or ())
    text = (f"built {out} in {result.seconds:.1f} s\n"
            f"precision  {md.get('precision')} ({md.get('mode', '')}{source})\n{steps}"
            f"tensorrt   {md.get('tensorrt_version')} on {md.get('gpu_name')} (sm {md.get('compute_capability')})\n"
            f"metadata   {out}.json")
    _emit(st, {"plan": str(out), "seconds": round(result.seconds, 3), "metadata": md}, text)


@cli.command()
@click.argument("plans", nargs=-1, required=True, type=_IN_PATH)
@_common
@click.option("--iterations", type=_INT, help="Timed iterations (default: run for --duration).")
@click.option("--duration", type=_FLOAT, help="Seconds to time (default 3).")
@click.option("--warmup", type=_FLOAT, help="Warm-up seconds (default 0.5).")
@click.option("--include-copies", is_flag=True, default=None, help="Time host->device and device->host copies too.")
@click.option("--cuda-graph", is_flag=True, default=None, help="Launch through a captured CUDA graph.")
@click.option("--layers", "layers", type=_INT, default=None, is_flag=False, flag_value=25, metavar="[N]",
              help="Also profile each plan layer by layer and show its N slowest layers (default 25) with their "
                   "precision (--json: all layers).")
def bench(plans, common, iterations, duration, warmup, include_copies, cuda_graph, layers):
    """Time TensorRT engines with CUDA events (several plans: ratios to the first)."""
    st = _apply_common(common)
    if layers is not None and layers <= 0:
        raise UsageError(f"--layers must be a positive number of rows, got {layers}", "e.g. --layers 30")
    cfg = _load_config(common.config_path, {
        "bench.iterations": iterations, "bench.duration": duration, "bench.warmup": warmup,
        "bench.include_copies": include_copies, "bench.cuda_graph": cuda_graph,
    })
    from trtq.errors import ModelError
    from trtq.fileio import non_regular_kind

    _declare(cfg, common.config_path, data=False, inputs=[("engine", p) for p in plans])  # writes nothing
    for p in plans:  # before TensorRT is loaded: a wrong path is the user's first problem
        if not Path(p).exists():
            raise ModelError(f"engine not found: {p}", "check the path, or build it with trtq build")
        if non_regular_kind(p):
            raise ModelError(f"engine path {p} is {non_regular_kind(p)}", "pass a .plan file from trtq build")
        if not os.access(p, os.R_OK):
            raise ModelError(f"cannot read engine {p}: permission denied", "fix its permissions")
    from trtq.trt.bench import bench_plans, render_table

    results = bench_plans([Path(p) for p in plans], cfg.bench)
    if layers is None:
        _emit(st, [r.to_dict() for r in results], render_table(results))
        return
    from trtq.trt.layers import profile_layers, render_layers

    profiles = [profile_layers(Path(p)) for p in plans]
    _emit(st, [dict(r.to_dict(), layers=pr.to_dict()) for r, pr in zip(results, profiles)],
          render_table(results) + "\n\n" + render_layers(profiles, layers))


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------


def _on_signal(signum, frame) -> None:
    """SIGINT / SIGTERM: unwind (temporary files removed by trtq.fileio); a second one exits at once.

    Inside an import the exception is not raised: an exception thrown into the initialisation of a
    C extension (onnx's pybind11 module) crashed the interpreter (SIGSEGV). Inside a finalizer
    (``__del__``) neither: Python would print it as "Exception ignored" and drop it (zipfile's
    ``ZipFile.__del__`` while --from-stats reads its .npz: exit 0 and a traceback on stderr). The signal
    is sent again once the main thread has left the import machinery or the finalizer.
    """
    from trtq import interrupt

    global _redelivering, _stopping
    again = _redelivering
    _redelivering = False
    if _finishing or interrupt.committed() or _stopping:  # the command is over (or its outputs are in place),
        return  # or a second signal is stopping the process: that stands
    if interrupt.requested() is not None and not again:
        _stopping = True  # a re-sent signal that lands in here must not raise into the clean-up below
        from trtq.fileio import remove_pending_temp_files

        remove_pending_temp_files()
        try:
            what = b"terminated" if signum == signal.SIGTERM else b"interrupted"
            os.write(2, b"trtq: " + what + b" again; stopped at once, nothing was written\n")
        except OSError:
            pass
        os._exit(EXIT_TERMINATED if interrupt.requested() == signal.SIGTERM else EXIT_INTERRUPTED)
    if again and interrupt.raised():
        return  # a batch loop's interrupt.check() raised it while the signal was being re-sent
    interrupt.request(signum)
    if interrupt.holding():  # final outputs being written together: let them finish (see held_for_outputs)
        return
    if interrupt.deferring():  # inside TensorRT's C++: raised when it returns (see interrupt.deferred)
        return
    if _in_import(frame) or _in_finalizer(frame):
        import threading

        threading.Thread(target=_redeliver_after_import, args=(signum,), name="trtq-signal", daemon=True).start()
        return
    interrupt.raise_requested()


_redelivering = False
_finishing = False
_stopping = False


def _in_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _redeliver_after_import(signum: int) -> None:
    global _redelivering
    import threading

    main_id = threading.main_thread().ident
    while True:
        frame = sys._current_frames().get(main_id)
        if frame is None or not (_in_import(frame) or _in_finalizer(frame)):
            break
        time.sleep(0.005)
        del frame
    _redelivering = True
    os.kill(os.getpid(), signum)


SIGNAL_GRACE_S = 10.0  # a signalled process that has not stopped by itself this long after it is stopped


def _signal_grace() -> float:
    try:
        return max(0.0, float(os.environ.get("TRTQ_SIGNAL_GRACE", SIGNAL_GRACE_S)))
    except ValueError:
        return SIGNAL_GRACE_S


def _start_signal_watchdog() -> None:
    """The real process always ends after SIGINT / SIGTERM, even when its main thread cannot.

    The Python handler (:func:`_on_signal`) runs only on the main thread, between two bytecodes. A
    main thread blocked in C (waiting for the import lock or a module lock that another thread
    holds, in a library call) never runs it, and a signal that arrives inside an import is deferred
    until the import is over, which is never when the import waits for a thread that is stuck. The
    C-level handler writes every signal to the wakeup fd, whatever the main thread does; this thread
    reads it and, if the command is still running ``TRTQ_SIGNAL_GRACE`` seconds (default 10) later
    and is not putting its final outputs in place, stops the process as a second signal would:
    temporary files removed, one line, exit 130 / 143 (every thread's stack first when faulthandler
    is on, e.g. PYTHONFAULTHANDLER=1)."""
    import threading

    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError):  # not the main thread, or no pipe left: the handlers alone
        return
    threading.Thread(target=_watchdog, args=(r, _signal_grace()), name="trtq-signal-watchdog", daemon=True).start()


def _watchdog(fd: int, grace: float) -> None:
    import faulthandler  # imported now: when it fires, the import lock may be what is stuck

    from trtq import interrupt

    data = b""
    while not data:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline or _finishing or interrupt.holding() or interrupt.committed():
        time.sleep(0.05)  # the command is over, or its outputs are being put in place: it ends by itself
    signum = interrupt.requested() or data[0]
    try:
        what = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
        os.write(2, b"trtq: " + what + b"; the command did not stop within %.0f s of the signal, stopped it; "
                 b"nothing was written\n" % grace)
        if faulthandler.is_enabled():
            faulthandler.dump_traceback(all_threads=True)
    except OSError:
        pass
    for module, clean_up in (("trtq.fileio", "remove_pending_temp_files"), ("trtq.input_override", "remove_temp_models")):
        loaded = sys.modules.get(module)  # not imported here: the import lock may be what is stuck
        if loaded is not None:
            getattr(loaded, clean_up)()
    os._exit(EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED)


def _install_signal_handlers(previous: Optional[dict[int, Any]] = None) -> dict[int, Any]:
    previous = {} if previous is None else previous  # filled as it goes: a signal may cut it short
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)
    except ValueError:  # not the main thread: leave signals alone
        pass
    return previous


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point: run the CLI, turn every failure into one line and an exit code."""
    from trtq import interrupt

    args = list(sys.argv[1:] if argv is None else argv)
    verbose = sum(a.count("v") for a in args if a.startswith("-") and not a.startswith("--") and set(a[1:]) <= {"v", "q"})
    verbose += args.count("--verbose")
    interrupt.reset()
    previous: dict[int, Any] = {}
    code = 0
    try:
        try:
            _install_signal_handlers(previous)
            if argv is None:  # the real process (in-process callers keep their own signal handling)
                _start_signal_watchdog()
            code = _run(args, verbose)
        except KeyboardInterrupt as e:  # a signal once the handlers were in place, before _run's own handling
            code = _interrupted(e)
    finally:
        _guard.restore()
        if argv is not None:  # called in-process (tests): give the caller its handlers back
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if argv is None:
        # the command is over: leave without the interpreter's shutdown (tearing down numpy, onnx,
        # ONNX Runtime takes a while, during which Python has reset the signal handlers:
        # a Ctrl-C there killed the process and lost its exit code)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _run(args: list[str], verbose: int) -> int:
    global _finishing
    _finishing = False
    from trtq.fileio import only_declared_outputs

    try:
        try:
            with only_declared_outputs():  # a command writes only what its guard checked (trtq.outputs)
                rv = cli.main(args=args, prog_name="trtq", standalone_mode=False)
        finally:
            _finishing = True
            # backstop: a write that a signal cut off between its steps leaves no temporary file
            from trtq.fileio import remove_pending_temp_files
            from trtq.input_override import remove_temp_models

            remove_pending_temp_files()
            remove_temp_models()
    except TrtqError as e:
        return _fail(e, str(e), e.exit_code, verbose)
    except click.exceptions.Abort as e:  # click turns KeyboardInterrupt (Terminated too) into Abort
        return _interrupted(e.__cause__ if isinstance(e.__cause__, KeyboardInterrupt) else KeyboardInterrupt())
    except click.exceptions.ClickException as e:
        return _click_error(e)
    except KeyboardInterrupt as e:  # Terminated included
        return _interrupted(e)
    except MemoryError:
        return _fail(None, "out of memory; lower --batch-size or --workers", 1, verbose)
    except BrokenPipeError:
        return 1
    except ImportError as e:  # a dependency is missing or broken: the environment, not trtq (exit 4)
        name = getattr(e, "name", None) or "a dependency"
        return _fail(e, f"cannot import {name} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                        f"install it (pip install -e . installs all of trtq's dependencies)", 4, verbose)
    except OSError as e:  # an operating-system failure that no library turned into a TrtqError
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        return _fail(e, f"system error{where}: {e.strerror or type(e).__name__}; check the path, its "
                        "permissions and the free disk space", 1, verbose)
    except Exception as e:  # a bug: still one line, the traceback only with -vv
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return _fail(e, f"internal error: {type(e).__name__}: {msg} (run with -vv for the traceback; please report it)", 1, verbose)
    return rv if isinstance(rv, int) else 0


def _click_error(e: click.exceptions.ClickException) -> int:
    """click's own errors (unknown flag or command, a value its type refuses) as the one line every
    trtq error is, exit 2 for usage errors."""
    message = " ".join(e.format_message().split()).rstrip(".")
    if not isinstance(e, click.exceptions.UsageError):
        click.echo(f"trtq: error: {message}", err=True)
        return e.exit_code
    ctx = e.ctx
    where = ctx.command_path if ctx is not None and ctx.command_path else "trtq"
    click.echo(f"trtq: error: {message}; see '{where} --help'", err=True)
    return 2


def _interrupted(e: KeyboardInterrupt) -> int:
    from trtq.interrupt import Terminated

    if isinstance(e, Terminated):
        click.echo("trtq: terminated (SIGTERM); nothing was written", err=True)
        return EXIT_TERMINATED
    click.echo("trtq: interrupted; nothing was written", err=True)
    return EXIT_INTERRUPTED


def _fail(exc: Optional[BaseException], message: str, code: int, verbose: int) -> int:
    if exc is not None and verbose > 1:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    click.echo(f"trtq: error: {message}", err=True)
    return code


if __name__ == "__main__":  # pragma: no cover
    main()
