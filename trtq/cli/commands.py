"""trtq's commands (Click): each parses its flags, loads the config, declares what it reads and
writes, calls its one pipeline step (``step(cfg, inputs..., outputs...)``) and prints the result.

numpy / onnx / onnxruntime / tensorrt are imported inside the commands, so ``trtq --help`` stays
fast and works without them.
"""

import logging
from pathlib import Path
from typing import Optional

import click

from trtq import __version__
from trtq.cli import exit_codes, flags, process, settings, text
from trtq.errors import UsageError

log = logging.getLogger(__name__)


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from trtq.calib.collect.kernels import implementation

    # the kernels: "numpy" on an install that built no compiled kernels (slower)
    click.echo(f"trtq, version {__version__} (histogram kernels: {implementation()})")
    ctx.exit()


@click.group(
    cls=exit_codes.GroupWithExitCodes,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the histogram kernels this install uses (compiled or numpy).",
)
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
    st = settings.State()
    st.verbose, st.quiet = verbose, quiet
    ctx.obj = st
    settings.setup_logging(verbose, quiet)


def _path(value: Optional[str]) -> Optional[Path]:
    return Path(value) if value else None


@cli.command()
@flags.override_option
@flags.common
@click.option("-m", "--model", type=flags.IN_PATH, help="FP32 ONNX model.")
@flags.DATA_SOURCE
@flags.batching
@flags.calibration
@click.option("--from-stats", type=flags.IN_PATH, help="Compute the cache from saved statistics (no model run).")
@click.option("--dry-run", is_flag=True, help="Show the input spec and a summary of the batches; write nothing.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress on stderr (default on: a line rewritten in place on a terminal, else a line "
    "every 2 s; -q turns it off).",
)
@flags.sharding
def calibrate(common, model, source, batching, calib, from_stats, dry_run, progress, sharding):
    """Run the FP32 model over the data and write a TensorRT calibration.cache (+ .json provenance)."""
    from trtq.pipeline import calibrate as step

    st = settings.apply_common(common)
    config_path = common.config_path
    cfg = settings.load_config(
        config_path, {**settings.calibrate_overrides(model, calib), **settings.data_overrides(batching)}
    )
    shard, ranges, keep_batches = sharding.shard, sharding.ranges, sharding.keep_batches
    shard_spec = settings.shard_flags(shard, ranges, from_stats, cfg)
    if keep_batches and shard_spec is None:
        raise UsageError("--keep-batches is for the two passes of a shard", "pass --shard I/N with it")
    cache, statistics = Path(cfg.calibrate.output), _path(cfg.calibrate.save_stats)
    if from_stats:
        settings.declare(
            cfg, config_path, inputs=[("statistics file", from_stats)], outputs=settings.calibrate_outputs(cfg, None)
        )
        result = step.calibrate_from_stats(cfg, Path(from_stats), cache)
        process.emit(st, result.to_dict(), text.calibration_text(result))
        return
    cfg = settings.apply_data_flags(cfg, source)
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    if not cfg.data.inputs:
        raise UsageError(
            "no calibration data given", "pass --data DIR --preprocess PRESET, or a config with data.inputs"
        )
    if dry_run:
        settings.declare(cfg, config_path)  # reads the model and the data, writes nothing
        process.emit(st, *text.dry_run_text(cfg, step.summarize_data(cfg)))
        return
    # pass 2 of a shard (--ranges) reads the batches pass 1 kept; pass 1 writes them
    settings.declare(
        cfg,
        config_path,
        inputs=[("ranges file", ranges), ("kept batches file", keep_batches if ranges else None)],
        outputs=settings.calibrate_outputs(cfg, shard_spec, None if ranges else keep_batches),
    )
    show = progress if progress is not None else True
    if not show:
        from trtq import progress as steps

        steps.configure(False)  # --no-progress: no "still working" lines either
    result = step.calibrate(
        cfg,
        _path(ranges),
        None if shard_spec else cache,
        statistics,
        keep_batches=_path(keep_batches),
        shard=shard_spec,
        progress=text.ProgressLine(bool(show) and not st.quiet),
    )
    process.emit(st, result.to_dict(), text.calibration_text(result))


@cli.command("merge-stats")
@click.argument("stats", nargs=-1, required=True, type=flags.IN_PATH)
@flags.common
@click.option("-o", "--output", type=flags.OUT_PATH, required=True, help="Merged statistics (.npz).")
def merge_stats(stats, common, output):
    """Merge the --save-stats files of the N shards of one pass (trtq calibrate --shard I/N)."""
    from trtq.pipeline.calibrate import merge_stats as step

    st, cfg = settings.begin_without_data(
        common, inputs=[("shard file", p) for p in stats], outputs=[("merged statistics file", output)]
    )
    r = step(cfg, [Path(p) for p in stats], Path(output))
    process.emit(st, r.to_dict(), text.merge_text(r))


@cli.command("inspect-cache")
@click.argument("cache", type=flags.IN_PATH)
@flags.common
@click.option("-m", "--model", type=flags.IN_PATH, help="Check the cache against this ONNX model.")
@click.option("--diff", "other", type=flags.IN_PATH, help="Compare with another cache.")
@click.option(
    "--sort",
    "sort_key",
    type=click.Choice(["name", "amax", "scale", "rel-diff", "file"]),
    default="file",
    show_default=True,
    help="Row order.",
)
@click.option("--top", type=flags.INT, help="Show only the first N rows.")
def inspect_cache(cache, common, model, other, sort_key, top):
    """Decode a calibration cache (TensorRT or ONNX Runtime format): header, scales, amax, gaps, diffs."""
    from trtq.calib import cache_inspect as ic
    from trtq.pipeline.inspect_cache import inspect_cache as step
    from trtq.pipeline.inspect_cache import unusable

    st, cfg = settings.begin_without_data(
        common,
        {"model": model},  # writes nothing
        inputs=[
            ("cache", cache),
            ("cache provenance", f"{cache}.json"),
            ("other cache", other),
            ("other cache provenance", f"{other}.json" if other else None),
        ],
    )
    result = step(cfg, Path(cache), _path(model), _path(other), sort=sort_key, top=top)
    process.emit(st, ic.to_jsonable(result), ic.render_text(result))
    refusal = unusable(result, cache, model)
    if refusal is not None:
        raise refusal


@cli.command()
@flags.override_option
@flags.common
@click.option("-m", "--model", type=flags.IN_PATH, help="FP32 ONNX model.")
@click.option(
    "--cache",
    type=flags.IN_PATH,
    help="calibration.cache (trtq, TensorRT or ONNX Runtime). Default: the one calibrate writes "
    "(the config's calibrate.output, else ./calibration.cache).",
)
@click.option("-o", "--output", type=flags.OUT_PATH, help="Q/DQ model path (default MODEL.qdq.onnx).")
@flags.quantizing
@flags.data_source(
    "Data for --equalize, --bias-correction, --weight-rounding gptq and --float-layers, as for calibrate.",
    "Preprocessing preset for --data.",
)
def quantize(common, model, cache, output, quantizing, source):
    """Write an explicit Q/DQ ONNX model (TensorRT 8.6/10/11 ready) from a calibration cache."""
    from trtq.pipeline.quantize import quantize as step
    from trtq.pipeline.quantize import reconstructed_cache_path

    st = settings.apply_common(common)
    config_path = common.config_path
    cfg = settings.load_config(config_path, settings.quantize_overrides(model, output, quantizing))
    cfg = settings.apply_data_flags(cfg, source)
    out = settings.output_path(cfg, cfg.quantize.output, ".qdq.onnx")
    if cache is None:  # what `trtq calibrate` with the same config wrote
        cache = str(cfg.calibrate.output)
        if not Path(cache).is_file():
            from trtq.errors import CacheError

            raise CacheError(
                f"no --cache given, and {cache} (calibrate.output, "
                f"{'from the config' if config_path else 'its default'}) does not exist",
                "run trtq calibrate with the same config first, or pass --cache PATH",
            )
    learned = reconstructed_cache_path(out) if cfg.quantize.reconstruct else None
    settings.declare_with_cache(cfg, config_path, cache, [("output model", out), ("reconstructed cache", learned)])
    result = step(cfg, Path(cfg.model), Path(cache), out, learned)
    data = result.to_dict()
    data["output"] = str(out)
    if learned is not None and result.learned_amax:
        data["learned_cache"] = str(learned)
    process.emit(st, data, text.quantize_text(result, out, data.get("learned_cache")))


@cli.command()
@flags.common
@click.option(
    "--cache", type=flags.IN_PATH, required=True, help="calibration.cache (its .json provenance is read too)."
)
@click.option("--stats", type=flags.IN_PATH, help="Its --save-stats file (histograms, every method's range).")
@click.option(
    "--compare", "compare_json", type=flags.IN_PATH, help="trtq compare --json output (accuracy, --per-layer)."
)
@click.option(
    "--quantize", "quantize_json", type=flags.IN_PATH, help="trtq quantize --json output (layers left float)."
)
@click.option("--bench", "bench_json", type=flags.IN_PATH, help="trtq bench --json output (latency).")
@click.option(
    "-o",
    "--output",
    type=flags.OUT_PATH,
    default="report.html",
    show_default=True,
    help="HTML file to write (self-contained).",
)
def report(common, cache, stats, compare_json, quantize_json, bench_json, output):
    """Write one self-contained HTML page: histograms and ranges per tensor, sensitivity, accuracy, latency."""
    from trtq.pipeline.report import report as step

    st, cfg = settings.begin_without_data(
        common,
        inputs=[
            ("cache", cache),
            ("cache provenance", f"{cache}.json"),
            ("statistics file", stats),
            ("compare JSON", compare_json),
            ("quantize JSON", quantize_json),
            ("bench JSON", bench_json),
        ],
        outputs=[("report", output)],
    )
    data = step(
        cfg, Path(cache), _path(stats), _path(compare_json), _path(quantize_json), _path(bench_json), Path(output)
    )
    process.emit(st, dict(data, report=str(output)), text.report_text(data, output))


@cli.command()
@flags.override_option
@flags.common
@click.option("--reference", type=flags.IN_PATH, help="Reference model (.onnx, FP32). Default: model: from the config.")
@click.option("--candidate", type=flags.IN_PATH, required=True, help="Candidate (.onnx Q/DQ or .plan engine).")
@flags.DATA_SOURCE
@flags.batching
@click.option(
    "--min-agreement",
    type=flags.FLOAT,
    help="Fail (exit 1) when an output's task metric (top-1 "
    "agreement, detection F1, mask IoU, CTC sequence agreement) is below this.",
)
@click.option("--min-cosine", type=flags.FLOAT, help="Fail (exit 1) when mean cosine similarity is below this.")
@flags.per_layer
@flags.candidate_run
@flags.task
def compare(common, reference, candidate, source, batching, min_agreement, min_cosine, layers, run, task):
    """Run reference and candidate on the same batches and report how close the candidate is."""
    from trtq.pipeline.compare import compare as step

    st = settings.apply_common(common)
    cfg = settings.load_config(
        common.config_path,
        {
            "model": reference,
            "compare.min_agreement": min_agreement,
            "compare.min_cosine": min_cosine,
            "compare.per_layer": layers.per_layer,
            "compare.limit": batching.limit,
            "compare.semantics": run.semantics,
            "compare.float_rest": run.float_rest,
            **{f"compare.{key}": value for key, value in vars(task).items()},
            **settings.data_overrides(batching),
        },
    )
    cfg = settings.apply_data_flags(cfg, source)
    per_layer_mode, cache, top = layers.per_layer_mode, layers.cache, layers.top
    if not cfg.model:
        raise UsageError("no reference model given", "pass --reference MODEL.onnx or set model: in the config")
    if not cfg.data.inputs:
        raise UsageError("no data given", "pass --data DIR --preprocess PRESET, or a config with data.inputs")
    settings.declare(
        cfg,
        common.config_path,
        models=[("candidate", candidate)],  # writes nothing
        inputs=[("cache", cache), ("cache provenance", f"{cache}.json" if cache else None)],
    )
    report, rows = step(
        cfg,
        Path(cfg.model),
        Path(candidate),
        _path(cache),
        per_layer_mode=per_layer_mode if cfg.compare.per_layer else None,
        top=top,
    )
    data_out, out_text = report.to_dict(), report.render_text()
    if rows is not None:
        from trtq.compare.sensitivity import render_layer_table

        data_out["per_layer"] = [row.to_dict() for row in rows]
        out_text += "\n\n" + render_layer_table(rows, per_layer_mode)
    process.emit(st, data_out, out_text)
    failed = report.gate(cfg.compare)
    if failed:
        from trtq.errors import TrtqError

        raise TrtqError("accuracy gate failed: " + "; ".join(failed))


@cli.command()
@flags.override_option
@flags.common
@click.option(
    "-m",
    "--model",
    type=flags.IN_PATH,
    help="ONNX model: FP32 (INT8 needs --cache), or already quantized (Q/DQ: built as it is).",
)
@click.option("--cache", type=flags.IN_PATH, help="calibration.cache (INT8 from an FP32 model).")
@click.option("-o", "--output", type=flags.OUT_PATH, help="Engine path (default MODEL.plan).")
@flags.engine
@click.option(
    "--exclude",
    multiple=True,
    metavar="PATTERN",
    help="Keep nodes float (explicit mode): an op type, an exact node name, else a name regex.",
)
@click.option("--allow-stale", is_flag=True, default=None, help="Use a cache whose provenance names another model.")
@click.option(
    "--placement-from",
    type=flags.IN_PATH,
    metavar="PLAN",
    help="Quantize with the placement a build --tune-placement search kept (explicit mode; its engine or .plan.json).",
)
@flags.tuning
@flags.data_source(
    "--tune-placement: the images or .npy files candidates are scored on (the calibration data).",
    "Preprocessing preset for --data image folders.",
)
def build(common, model, cache, output, engine, exclude, allow_stale, placement_from, tuning, source):
    """Build a TensorRT engine (.plan + .plan.json) from an FP32 model and a cache, or from a Q/DQ model."""
    from trtq.pipeline.build import build as step

    st = settings.apply_common(common)
    config_path = common.config_path
    overrides = settings.build_overrides(model, output, engine, exclude, allow_stale, tuning)
    overrides["quantize.placement_from"] = placement_from
    cfg = settings.apply_data_flags(settings.load_config(config_path, overrides), source)
    out = settings.output_path(cfg, cfg.build.output, ".plan")
    engine_files = [("engine", out), ("engine metadata", f"{out}.json"), ("timing cache", cfg.build.timing_cache)]
    settings.declare_with_cache(cfg, config_path, cache, engine_files)
    if cfg.build.tune_placement:
        from trtq.pipeline.tune import tune_placement as step
    elif source.data or tuning.limit is not None:
        from trtq.pipeline.quantize import needs_data

        if not needs_data(cfg.quantize):
            log.warning(
                "--data / --limit are read by --tune-placement and by quantize's data steps (bias correction, "
                "gptq, equalize, float layers, reconstruct): this build uses neither, so they are ignored"
            )

    result = step(cfg, Path(cfg.model), _path(cache), out)
    process.emit(
        st,
        {
            "plan": str(out),
            "seconds": round(result.seconds, 3),
            "metadata": result.metadata,
            "int8_coverage": result.coverage.to_dict() if result.coverage is not None else None,
        },
        text.build_text(result, out),
    )


@cli.command()
@click.argument("plans", nargs=-1, required=True, type=flags.IN_PATH)
@flags.common
@click.option("--iterations", type=flags.INT, help="Timed iterations (default: run for --duration).")
@click.option(
    "--duration", type=flags.SECONDS, help="Time to time for, in seconds (default 3); a unit may follow: 500ms, 2s."
)
@click.option(
    "--warmup",
    type=flags.SECONDS,
    help="Warm-up time in seconds, not trtexec's ms (default 0.5); a unit may follow: 200ms, 2s.",
)
@click.option("--include-copies", is_flag=True, default=None, help="Time host->device and device->host copies too.")
@click.option("--cuda-graph", is_flag=True, default=None, help="Launch through a captured CUDA graph.")
@click.option(
    "--layers",
    "layers",
    type=flags.INT,
    default=None,
    is_flag=False,
    flag_value=25,
    metavar="[N]",
    help="Also profile each plan layer by layer and show its N slowest layers (default 25) with their "
    "precision (--json: all layers).",
)
def bench(plans, common, iterations, duration, warmup, include_copies, cuda_graph, layers):
    """Time TensorRT engines with CUDA events (several plans: ratios to the first)."""
    from trtq.pipeline.bench import bench as step

    st = settings.apply_common(common)
    if layers is not None and layers <= 0:
        raise UsageError(f"--layers must be a positive number of rows, got {layers}", "e.g. --layers 30")
    cfg = settings.load_config(
        common.config_path,
        {
            "bench.iterations": iterations,
            "bench.duration": duration,
            "bench.warmup": warmup,
            "bench.include_copies": include_copies,
            "bench.cuda_graph": cuda_graph,
        },
    )
    settings.declare(cfg, common.config_path, data=False, inputs=[("engine", p) for p in plans])  # writes nothing
    results, profiles = step(cfg, [Path(p) for p in plans], layers=layers is not None)
    from trtq.trt.bench import render_table

    if profiles is None:
        process.emit(st, [r.to_dict() for r in results], render_table(results))
        return
    from trtq.trt.layers import render_layers

    process.emit(
        st,
        [dict(r.to_dict(), layers=pr.to_dict()) for r, pr in zip(results, profiles)],
        render_table(results) + "\n\n" + render_layers(profiles, layers),
    )
