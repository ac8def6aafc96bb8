"""A command's settings: the shared state of ``-v`` / ``-q`` / ``--json`` (:class:`State`), the config
(file < environment < flags, the registered names checked: :func:`load_checked_config`), the data
flags merged into it (:func:`apply_data_flags`) and the one declaration of what the command reads
and writes (:func:`declare`, checked by trtq.outputs before any work).
"""

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import click

from trtq.cli import process
from trtq.cli.flags import OVERRIDE_KEY, SHAPES_KEY, USER_MODEL_KEY, Flags
from trtq.errors import UsageError


class State:
    def __init__(self) -> None:
        self.verbose = 0
        self.quiet = False
        self.json = False


def state() -> State:
    ctx = click.get_current_context()
    root = ctx.find_root()
    if root.obj is None:
        root.obj = State()
    return root.obj


def setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    logger = logging.getLogger("trtq")
    logger.handlers[:] = []
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("trtq: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def apply_common(common: Flags) -> State:
    st = state()
    if common.as_json:
        st.json = True
    if common.verbose:
        st.verbose = max(st.verbose, common.verbose)
    if common.quiet:
        st.quiet = True
    setup_logging(st.verbose, st.quiet)
    from trtq import progress

    progress.configure(not st.quiet)  # the long steps' progress on stderr (a bar on a terminal)
    process.stdout_guard.engage()
    ctx = click.get_current_context(silent=True)
    if ctx is not None:  # the guard lasts one command, also when click's own main runs it (CliRunner)
        ctx.find_root().call_on_close(process.stdout_guard.restore)
        ctx.find_root().call_on_close(lambda: progress.configure(False))
        # the whole command as a task: "still working" lines wherever no step reports for a while
        ctx.with_resource(progress.task(f"trtq {ctx.info_name}"))
    return st


def load_config(config_path: Optional[Path], overrides: dict[str, Any]):
    """The effective config; with model_input_shapes / --override-input-shape, ``model`` is a
    rewritten copy of the model at those input shapes (checked, removed when the command ends)."""
    import dataclasses

    cfg = load_checked_config(config_path, overrides)
    flags = click.get_current_context().meta.get(OVERRIDE_KEY, ())
    if flags:
        from trtq.input_override import parse_override

        cfg = dataclasses.replace(cfg, model_input_shapes={**cfg.model_input_shapes, **parse_override(flags)})
    if cfg.model_input_shapes and cfg.model:
        from trtq.input_override import write_overridden

        click.get_current_context().meta[USER_MODEL_KEY] = cfg.model  # what the output checks protect
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

        method = methods.METHODS.get(_canonical(cfg.calibrate.method, methods.METHODS.names())).name
        cfg = dataclasses.replace(cfg, calibrate=dataclasses.replace(cfg.calibrate, method=method))
    if cfg.compare.task != "auto":
        from trtq.compare.tasks import TASKS

        task = _canonical(cfg.compare.task, ("auto", *TASKS.names()))
        task = task if task == "auto" else TASKS.get(task).name
        cfg = dataclasses.replace(cfg, compare=dataclasses.replace(cfg.compare, task=task))
    return cfg


def _canonical(value: Any, names: Sequence[str]) -> Any:
    return value.lower() if isinstance(value, str) and value not in names and value.lower() in names else value


def declare(cfg, config_path, inputs=(), models=(), outputs=(), data: bool = True) -> None:
    """The command's declaration of what it reads and writes, checked by the one guard
    (trtq.outputs.guard) before it writes anything: every command calls this once, with every file
    it writes (side files included) as ``outputs``. The config file, the model (``cfg.model``, the
    user's file when --override-input-shape made a copy; its external data too) and, with ``data``,
    the files and folders of ``cfg.data.inputs`` are inputs of every command."""
    from trtq.outputs import Declared, data_paths, guard

    files, folders = data_paths(cfg.data.inputs) if data else ([], [])
    model = click.get_current_context().meta.get(USER_MODEL_KEY) or cfg.model
    guard(
        Declared.of(
            inputs=[("config file", config_path), *inputs, *files],
            folders=folders,
            models=[("model", model), *models],
            outputs=outputs,
        )
    )


def begin_without_data(common: Flags, overrides: Optional[dict[str, Any]] = None, inputs=(), outputs=()):
    """(State, config) of a command that runs no model over data (merge-stats, inspect-cache,
    report): -v / -q / --json applied, the config loaded, what it reads and writes declared."""
    st = apply_common(common)
    cfg = load_checked_config(common.config_path, overrides or {})
    declare(cfg, common.config_path, data=False, inputs=inputs, outputs=outputs)
    return st, cfg


def output_path(cfg: Any, configured: Optional[str], suffix: str) -> Path:
    """Where a command writes what it makes of ``cfg.model``: the configured path, else the model's
    with ``suffix``; UsageError when no model was given."""
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    return Path(configured) if configured else Path(cfg.model).with_suffix(suffix)


def declare_with_cache(cfg: Any, config_path: Optional[Path], cache: Optional[str], outputs: list) -> None:
    """:func:`declare` for a command that reads a calibration cache (and its provenance), maybe a
    tuned engine's metadata (``quantize.placement_from``), and writes ``outputs``."""
    tuned = getattr(cfg.quantize, "placement_from", None)
    declare(
        cfg,
        config_path,
        inputs=[
            ("cache", cache),
            ("cache provenance", f"{cache}.json" if cache else None),
            ("tuned placement", tuned),
            ("tuned engine metadata", f"{tuned}.json" if tuned else None),
        ],
        outputs=outputs,
    )


def split_csv(values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def source_for_path(path: str):
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


def parse_shape_flags(items: Sequence[str], specs, base: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """--shape [INPUT=]DIMS or INPUT:DIMS (DIMS like 8x3x48x320 or 8,3,48,320; the name as
    trtq.input_override.split_shape_flag reads it) merged over data.shapes."""
    from trtq.input_override import parse_dims, split_shape_flag

    by_name = {s.name: s for s in specs}
    shapes = dict(base)
    seen: dict[str, str] = {}
    for item in items:
        reading = split_shape_flag(item)
        if reading is not None:
            name, dims = reading[0], item[len(reading[0]) + 1 :]
        elif "=" in item or item.rpartition(":")[0] in by_name:  # a name with dims that do not parse
            name, _, dims = item.rpartition("=" if "=" in item else ":")
        else:
            name, dims = "", item
        if not name:
            if len(specs) != 1:
                raise UsageError(
                    f"the model has {len(specs)} inputs: give --shape INPUT=DIMS", "inputs: " + ", ".join(by_name)
                )
            name = specs[0].name
        elif name not in by_name:
            raise UsageError(f"--shape names '{name}', which is not a model input", "inputs: " + ", ".join(by_name))
        parsed = parse_dims(dims)
        if parsed is None:
            raise UsageError(
                f"--shape {item}: the dims must be positive integers (digits 0-9, each below 2**31)",
                f"write every dim of {by_name[name].describe()}, e.g. --shape {name}=8x3x224x224",
            )
        if name in seen:
            raise UsageError(
                f"--shape gives input '{name}' twice ({seen[name]} and {item})", "pass one --shape per input"
            )
        seen[name] = item
        shapes[name] = parsed
    return shapes


def apply_data_flags(cfg, source: Flags):
    """Merge --data [NAME=]PATH, --shape and --preprocess PRESET into cfg.data (needs the model).
    A preset is sized from the input's full shape: data.shapes / --shape where given."""
    import dataclasses

    data, preprocess = source.data, source.preprocess

    shape_flags = click.get_current_context().meta.get(SHAPES_KEY, ())
    if not data and not preprocess and not shape_flags:
        return cfg
    if not cfg.model:
        raise UsageError("--data/--preprocess/--shape need a model", "pass --model MODEL.onnx")
    from trtq.data.presets import preset
    from trtq.model import input_specs, load_model

    specs = input_specs(load_model(cfg.model))
    by_name = {s.name: s for s in specs}
    shapes = parse_shape_flags(shape_flags, specs, dict(cfg.data.shapes))
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
            raise UsageError(
                f"--data gives input '{name}' twice ({given[name]} and {path})",
                "pass one --data per input (a glob or a folder holds many files)",
            )
        given[name] = path
        old = inputs.get(name)
        src = source_for_path(path)
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


def data_overrides(batching: Flags) -> dict[str, Any]:
    return {f"data.{key}": value for key, value in vars(batching).items()}


def calibrate_overrides(model: Optional[str], calib: Flags) -> dict[str, Any]:
    overrides = {
        f"calibrate.{key}": getattr(calib, key)
        for key in (
            "method",
            "percentile",
            "num_bins",
            "output",
            "trt_version",
            "backend",
            "save_stats",
            "max_memory",
            "hist_elements",
            "collect",
        )
    }
    overrides.update(
        {
            "model": model,
            "calibrate.tensors": split_csv(calib.tensors) or None,
            "calibrate.providers": list(calib.providers) or None,
        }
    )
    return overrides


def quantize_overrides(model: Optional[str], output: Optional[str], quantizing: Flags) -> dict[str, Any]:
    """The config keys ``trtq quantize``'s flags set."""
    return {
        "model": model,
        "quantize.output": output,
        **{f"quantize.{k}": v for k, v in vars(quantizing).items()},
        "quantize.exclude": list(quantizing.exclude) or None,
    }


def build_overrides(
    model: Optional[str],
    output: Optional[str],
    engine: Flags,
    exclude: Sequence[str],
    allow_stale: Optional[bool],
    tuning: Flags,
) -> dict[str, Any]:
    """The config keys ``trtq build``'s flags set (--exclude and --allow-stale apply to its quantize
    step too; --limit is the samples --tune-placement scores on)."""
    return {
        "model": model,
        "build.output": output,
        **{f"build.{k}": v for k, v in vars(engine).items()},
        "build.tactic_sources": split_csv([engine.tactic_sources]) if engine.tactic_sources else None,
        "build.allow_stale": allow_stale,
        "quantize.exclude": list(exclude) or None,
        "quantize.allow_stale": allow_stale,
        **{f"build.{k}": v for k, v in vars(tuning).items() if k != "limit"},
        "compare.limit": tuning.limit,
    }


def calibrate_outputs(cfg, shard_spec, keep_batches: Optional[str] = None) -> list:
    """What calibrate writes: the cache and its provenance JSON (not a shard), the statistics
    (--save-stats), the decoded batches of pass 1 of a shard (--keep-batches)."""
    cache = cfg.calibrate.output
    outputs = [] if shard_spec is not None else [("cache", cache), ("provenance file", f"{cache}.json")]
    return outputs + [("statistics file", cfg.calibrate.save_stats), ("kept batches file", keep_batches)]


def shard_flags(shard, ranges, from_stats, cfg):
    """--shard / --ranges: parsed (I, N) or None; UsageError for combinations that make no sense."""
    if shard is None and ranges is None:
        return None
    if ranges is not None and shard is None:
        raise UsageError("--ranges is for pass 2 of a sharded calibration", "pass --shard I/N with it")
    if from_stats:
        raise UsageError(
            "--shard calibrates a part of the data; --from-stats reads statistics",
            "merge the shards with trtq merge-stats, then run --from-stats alone",
        )
    if cfg.calibrate.backend == "tensorrt":
        raise UsageError("--shard needs the onnxruntime backend", "drop --backend tensorrt")
    from trtq.calib.shard import parse_shard

    spec = parse_shard(shard)
    if not cfg.calibrate.save_stats:
        raise UsageError("--shard writes statistics, not a cache", f"pass --save-stats part-{spec[0]}.npz")
    return spec
