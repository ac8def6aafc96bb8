"""``trtq calibrate``'s file-level step, the one orchestrator of a calibration.

* ONNX Runtime (the default backend): the model, the data and the options are checked before any
  batch is read (:func:`_prepare`), trtq.calib.collect.passes gathers the statistics, trtq.calib.stats
  turns them into each tensor's range, trtq.calib.range_check flags costly ranges and
  trtq.calib.provenance describes the run; the statistics (``--save-stats``), the cache and its
  provenance are written here, as one step for Ctrl-C / SIGTERM.
* ``--from-stats``: the same ranges from saved statistics (byte-identical caches).
* ``--backend tensorrt``: TensorRT's own calibrator (:mod:`trtq.trt.calibrator`), whose cache is
  written here with the same provenance.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtq.calib.collect.passes import Setup
from trtq.config import BuildOptions, to_dict
from trtq.errors import CacheError, DataError, UsageError

log = logging.getLogger(__name__)


@dataclass
class CalibrationResult:
    cache_path: Path | None
    method: str
    algorithm: str
    trt_version: str
    amax: dict[str, float]
    samples: int
    batches: int
    seconds: float
    stats_path: Path | None = None
    skipped: list = field(default_factory=list)
    zero_tensors: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    # tensors whose range costs > RATIO x mse's expected error (trtq.calib.range_check), worst first
    range_flags: list = field(default_factory=list)
    provenance: dict | None = None  # what the cache's .json holds (written or not)

    def to_dict(self) -> dict:
        return {
            "cache": str(self.cache_path) if self.cache_path else None,
            "provenance": f"{self.cache_path}.json" if self.cache_path else None,
            "stats": str(self.stats_path) if self.stats_path else None,
            "method": self.method,
            "algorithm": self.algorithm,
            "trt_version": self.trt_version,
            "tensors": len(self.amax),
            "samples": self.samples,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "samples_per_second": round(self.samples / self.seconds, 2) if self.seconds > 0 else None,
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "zero_tensors": self.zero_tensors,
            "providers": self.providers,
            "range_flags": [
                {
                    "tensor": f.tensor,
                    "error_vs_mse": round(f.ratio, 3),
                    "clipped": f.clipped,
                    "mse_clipped": f.mse_clipped,
                }
                for f in self.range_flags
            ],
        }


def calibrate(
    cfg: Any,
    ranges: Path | None = None,
    cache: Path | None = None,
    statistics: Path | None = None,
    *,
    keep_batches: Path | None = None,
    shard: tuple[int, int] | None = None,
    progress: Any = None,
    batches: Any = None,
    write: bool = True,
) -> Any:
    """``trtq calibrate``'s step: calibrate ``cfg.model`` on ``cfg.data`` with the configured backend
    and write ``cache`` and its provenance, and ``statistics`` (``--save-stats``; None: the config's
    ``calibrate.output`` / ``save_stats``); a CalibrationResult. ``shard=(I, N)``: pass 1 of shard I of
    N, or pass 2 with the merged pass-1 ``ranges``; ``keep_batches``: pass 1 of a shard writes its
    decoded batches there, pass 2 reads them back. ``progress`` is called after every batch.

    The Python API (trtq.api) passes ``batches``, a function of the model's input specs that returns
    the batch source read instead of ``cfg.data`` (trtq.data.in_memory), and ``write=False``: nothing
    is written, the result carries the provenance, and :func:`write_outputs` writes both later."""
    cfg = _writing(cfg, cache, statistics)
    cfg, selection = _tensor_selection(cfg)
    if cfg.calibrate.backend == "tensorrt":
        if batches is not None:
            raise UsageError("in-memory data calibrates with the onnxruntime backend", "drop backend=tensorrt")
        return calibrate_with_tensorrt(cfg)
    result = calibrate_with_onnxruntime(
        cfg,
        progress=progress,
        shard=shard,
        ranges=ranges,
        keep_batches=keep_batches,
        selection=selection,
        batches=batches,
        write=write,
    )
    return warn_range_flags(cfg, result)


def calibrate_from_stats(cfg: Any, statistics: Path, cache: Path | None = None) -> Any:
    """``trtq calibrate --from-stats``'s step: ``cfg.calibrate.method`` on the histograms of
    ``statistics`` (``--save-stats``, or merged shards; no model run), written to ``cache`` (None:
    the config's ``calibrate.output``) and its provenance; a CalibrationResult."""
    cfg = _writing(cfg, cache, None)
    return warn_range_flags(cfg, _ranges_from_stats(cfg, Path(statistics)))


def merge_stats(cfg: Any, shards: list[Path], merged: Path) -> Any:
    """``trtq merge-stats``'s step: the --save-stats files of the N shards of one pass, merged
    (trtq.calib.shard.merge_shards) and written to ``merged``; a MergeResult."""
    from trtq.calib.shard import MergeResult, merge_shards
    from trtq.calib.stats import save_stats

    m = merge_shards(shards)
    save_stats(Path(merged), m.maxima, m.counts, m.meta, m.zeros, m.tops)
    return MergeResult(Path(merged), m.shards, m.pass_name, m.meta["data"]["samples"], len(m.maxima))


@dataclass
class DataPreview:
    """What ``trtq calibrate --dry-run`` shows: the model's inputs, the batches and their summary."""

    specs: list
    batcher: Any
    summary: Any


def summarize_data(cfg: Any) -> DataPreview:
    """``trtq calibrate --dry-run``'s step: one pass over the batches of ``cfg.data`` for the inputs of
    ``cfg.model`` (trtq.data.summary); writes nothing."""
    from trtq.data.batcher import Batcher
    from trtq.data.summary import summarize
    from trtq.model import input_specs, load_model

    specs = input_specs(load_model(cfg.model))
    batcher = Batcher(cfg.data, specs)
    return DataPreview(specs, batcher, summarize(batcher))


def _writing(cfg: Any, cache: Path | None, statistics: Path | None) -> Any:
    """``cfg`` with the cache and statistics paths a step was given (None: the config's)."""
    import dataclasses

    opts = cfg.calibrate
    output = str(cache) if cache is not None else opts.output
    save_stats = str(statistics) if statistics is not None else opts.save_stats
    if (output, save_stats) == (opts.output, opts.save_stats):
        return cfg
    return dataclasses.replace(cfg, calibrate=dataclasses.replace(opts, output=output, save_stats=save_stats))


def warn_range_flags(cfg: Any, result: Any) -> Any:
    """Keep the range check's flags (trtq.calib.range_check) of the tensors the Q/DQ model quantizes,
    and warn naming them: those are the ranges an engine uses."""
    if not result.range_flags:
        return result
    from trtq.calib.range_check import RATIO
    from trtq.model import load_model
    from trtq.quantize import planned_activations

    if cfg.model:
        quantized = set(planned_activations(load_model(cfg.model), (cfg.quantize.placement_used(),)))
        result.range_flags = [f for f in result.range_flags if f.tensor in quantized]
        among = f"the {len(quantized)} tensors the Q/DQ model quantizes"
    else:  # statistics without their model: every tensor counts
        among = f"the {len(result.amax)} calibrated tensors"
    if result.range_flags:
        worst = "; ".join(f.describe() for f in result.range_flags[:3])
        log.warning(
            "%s ranges cost more than %gx mse's expected INT8 error on %d of %s (%s%s): such ranges have "
            "wrecked detectors and CTC models; --method mse (the default) minimises that error",
            result.method,
            RATIO,
            len(result.range_flags),
            among,
            worst,
            " ..." if len(result.range_flags) > 3 else "",
        )
    return result


# --tensors qdq: only the activations trtq quantize places Q/DQ on (an explicit build reads no other);
# --tensors all: every tensor
QDQ_TENSORS = "qdq"
ALL_TENSORS = "all"


def _tensor_selection(cfg: Any) -> tuple[Any, str | None]:
    """``calibrate.tensors`` resolved: ``all`` (every tensor), ``qdq``, a list of names; empty is
    every tensor, except for a cache written for TensorRT >= 11, which has no implicit INT8 and so
    reads only the Q/DQ set."""
    import dataclasses

    requested = list(cfg.calibrate.tensors)
    if requested == [ALL_TENSORS]:
        return dataclasses.replace(cfg, calibrate=dataclasses.replace(cfg.calibrate, tensors=())), None
    if QDQ_TENSORS in requested or ALL_TENSORS in requested:
        if len(requested) != 1:
            raise UsageError(
                f"--tensors {QDQ_TENSORS} / {ALL_TENSORS} stands alone",
                f"pass --tensors {QDQ_TENSORS}, --tensors {ALL_TENSORS}, or a list of names",
            )
        return _qdq_tensors(cfg), QDQ_TENSORS
    if not requested and cfg.calibrate.backend == "onnxruntime":
        major = _major(cfg)
        if major >= 11:
            log.info(
                "TensorRT %d has no implicit INT8 calibration: only the activations trtq quantize places "
                "Q/DQ on are calibrated (--tensors all for every tensor)",
                major,
            )
            return _qdq_tensors(cfg), QDQ_TENSORS
    return cfg, None


def _major(cfg: Any) -> int:
    from trtq.calib.cache import parse_trt_version, resolve_trt_version

    return parse_trt_version(resolve_trt_version(cfg.calibrate.trt_version))[0]


def _qdq_tensors(cfg: Any) -> Any:
    """``cfg`` with ``calibrate.tensors`` = the activations quantize's placement reads."""
    import dataclasses

    from trtq.errors import ModelError
    from trtq.model import load_model
    from trtq.quantize import planned_activations

    if cfg.calibrate.backend == "tensorrt":
        raise UsageError(
            f"--tensors {QDQ_TENSORS} is for the onnxruntime backend",
            "TensorRT's calibrator ranges every tensor: drop --tensors or --backend tensorrt",
        )
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    tensors = planned_activations(load_model(cfg.model))
    if not tensors:
        raise ModelError(
            f"{Path(cfg.model).name}: trtq quantize would place no Q/DQ pair on an activation",
            "calibrate every tensor (drop --tensors qdq)",
        )
    log.info("--tensors qdq: %d activations that quantize places Q/DQ on", len(tensors))
    return dataclasses.replace(cfg, calibrate=dataclasses.replace(cfg.calibrate, tensors=tuple(tensors)))


def calibrate_with_tensorrt(cfg: Any) -> Any:
    """``--backend tensorrt``: TensorRT's MinMax or EntropyCalibration2 calibrator over the data."""
    from trtq.calib import methods
    from trtq.calib.cache import resolve_trt_version
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    method = methods.METHODS.get(cfg.calibrate.method)
    if not method.tensorrt:
        computed = " or ".join(m.name for m in methods.METHODS.rows() if m.tensorrt)
        raise UsageError(
            f"--backend tensorrt supports --method {computed}, not {cfg.calibrate.method}",
            "TensorRT has MinMax and EntropyCalibration2 calibrators only",
        )
    t0 = time.perf_counter()
    specs = input_specs(load_model(cfg.model))
    batcher = Batcher(cfg.data, specs)
    algorithm = method.algorithm
    out = Path(cfg.calibrate.output)
    table = calibrate_file_with_tensorrt(Path(cfg.model), batcher, algorithm, out, options=cfg.build)
    return CalibrationResult(
        cache_path=out,
        method=cfg.calibrate.method,
        algorithm=table.algorithm,
        trt_version=table.trt_version or resolve_trt_version(None),
        amax=dict(table.amax),
        samples=batcher.num_samples,
        batches=batcher.num_batches,
        seconds=time.perf_counter() - t0,
    )


def calibrate_file_with_tensorrt(
    model_path: Path, batcher: Any, algorithm: str, output_cache: Path, options: BuildOptions | None = None
) -> Any:
    """Calibrate with TensorRT's own calibrator; write its cache (+ provenance); return the table.

    ``algorithm``: ``EntropyCalibration2`` / ``MinMaxCalibration`` (or ``entropy`` / ``max``);
    ``options``: the throw-away calibration build's settings (see ``run_tensorrt_calibration``).
    """
    from trtq.calib.cache import read_cache, write_provenance
    from trtq.calib.methods import tensorrt_method
    from trtq.calib.provenance import calibration_provenance, data_entry, model_entry
    from trtq.fileio import atomic_path
    from trtq.interrupt import held_for_outputs
    from trtq.model import input_specs, load_model
    from trtq.trt.calibrator import run_tensorrt_calibration

    model_path, output_cache = Path(model_path), Path(output_cache)
    specs = input_specs(load_model(model_path))
    run = run_tensorrt_calibration(model_path, batcher, algorithm, options)
    with held_for_outputs(), atomic_path(output_cache) as tmp:  # cache and provenance as one step (signals)
        tmp.write_bytes(run.cache)
        table = read_cache(tmp)  # refuse to publish anything trtq cannot read back
        method = {"name": tensorrt_method(run.algorithm), "backend": "tensorrt"}
        write_provenance(
            output_cache,
            calibration_provenance(
                model_entry(model_path, specs),
                data_entry(batcher, run.samples),
                method,
                run.algorithm,
                run.trt_version,
                table.amax,
                seconds=round(run.seconds, 3),
            ),
        )
    log.info("TensorRT calibration: %d batches, %d tensors, %.1f s", run.batches, len(table.amax), run.seconds)
    return table


def calibrate_with_onnxruntime(
    cfg: Any,
    progress: Any = None,
    shard: tuple[int, int] | None = None,
    ranges: Path | None = None,
    keep_batches: Path | None = None,
    selection: str | None = None,
    batches: Any = None,
    write: bool = True,
) -> CalibrationResult:
    """Calibrate ``cfg.model`` on ``cfg.data`` with ``cfg.calibrate`` and write the cache.

    ``selection``: how ``calibrate.tensors`` was chosen, for the provenance (``"qdq"``: the
    activations trtq quantize places Q/DQ on; implicit builds refuse such a cache).
    ``shard=(I, N)``: only shard I of N of the samples (trtq.calib.shard); writes the statistics
    file (``--save-stats``, required) and no cache: pass 1 (maxima) alone, or with ``ranges`` (a
    merged pass-1 file) pass 2 alone, histograms over those ranges. ``keep_batches``: pass 1 writes
    the shard's decoded batches there and pass 2 reads them back (trtq.calib.collect.kept_batches).
    ``batches`` and ``write``: as for :func:`calibrate`.
    """
    from trtq.calib.collect.passes import collect
    from trtq.calib.methods import compute_all, finalize_amax
    from trtq.calib.range_check import check_ranges

    run, trt_version, algorithm = _prepare(cfg, shard, ranges, keep_batches, batches)
    opts, tensors = run.opts, run.tensors
    st = collect(run, progress, keep_batches)
    started = time.perf_counter()
    maxima, counts, zeros, tops = st.maxima, st.counts, st.zeros, st.tops
    if run.shard_pass == "ranges":  # a pass-1 shard: maxima only, histograms come in pass 2
        import numpy as np

        counts = {n: np.zeros(opts.num_bins, dtype=np.int64) for n in tensors}
        zeros = {n: 0 for n in tensors}
    # a shard saves statistics, not ranges: its amax is only the max (no method runs)
    raw_amax = maxima if run.shard_pass else compute_all(opts.method, maxima, counts, opts.percentile, zeros, tops)
    amax, zero = finalize_amax({name: float(raw_amax[name]) for name in tensors})
    flags = [] if run.shard_pass else check_ranges(opts.method, raw_amax, maxima, counts, zeros, tops)
    seconds = st.seconds + time.perf_counter() - started

    data_options = to_dict(cfg.data) if batches is None else in_memory_options(run.batcher)
    provenance = build_provenance(
        cfg, run.model_path, run.specs, run.batcher, st.samples, trt_version, algorithm, amax, data_options
    )
    # which tensors: all, a --tensors list, or "qdq" (what quantize reads)
    provenance["collection"] = dict(st.collection, tensors=selection or ("listed" if opts.tensors else "all"))
    out = Path(opts.output)
    stats_path = Path(opts.save_stats) if opts.save_stats else None
    if write:
        _write_run(run, algorithm, trt_version, out, stats_path, provenance, amax, (maxima, counts, zeros, tops), shard)
    return CalibrationResult(
        cache_path=out if run.shard_pass is None and write else None,
        method=opts.method,
        algorithm=algorithm,
        trt_version=trt_version,
        amax=amax,
        samples=st.samples,
        batches=st.batches,
        seconds=seconds,
        stats_path=stats_path,
        skipped=list(getattr(run.batcher, "skipped", [])),
        zero_tensors=zero,
        providers=st.providers,
        range_flags=flags,
        provenance=provenance,
    )


def in_memory_options(batcher: Any) -> dict:
    """The provenance's ``data.options`` for in-memory batches (the CLI records the config's data
    section there)."""
    from trtq.data.in_memory import SOURCE

    return {"source": SOURCE, "batch_size": batcher.batch_size, "last_batch": "pad"}


def refuse_quantized(model, model_path: Path) -> None:
    """A model with Q/DQ (or other quantized) nodes carries its ranges already: calibrating it would
    measure the fake-quantized tensors, and quantizing it again is refused anyway."""
    from trtq.model import is_quantized

    if is_quantized(model):
        from trtq.errors import ModelError

        raise ModelError(
            f"{model_path.name} is already quantized (it has Q/DQ nodes): its ranges are in the model",
            f"build it as it is (trtq build --model {model_path.name}), or calibrate the FP32 model",
        )


def _prepare(
    cfg: Any, shard: tuple[int, int] | None, ranges: Path | None, keep_batches: Path | None, batches: Any = None
) -> tuple[Setup, str, str]:
    """Model, data and options checked, before any batch is read. ``batches``: the in-memory source's
    maker (see :func:`calibrate`), fed as it is (a fixed batch of 1 is not widened)."""
    from trtq.calib import methods
    from trtq.calib.cache import resolve_trt_version
    from trtq.data.batcher import Batcher

    opts = cfg.calibrate.resolved()
    model_path, model, specs, tensors, budget, slice_at = _checked_model(cfg, opts)
    feed_model, feed_specs, data, feed_mode = model, specs, cfg.data, None
    if shard is None and ranges is None and batches is None:  # a fixed batch of 1: in batches where identical
        from trtq.calib.collect.batch_one import widen_if_identical

        feed_model, feed_specs, data, feed_mode = widen_if_identical(
            model, specs, cfg.data, tensors, opts.providers, budget, slice_at
        )
    method = methods.METHODS.get(opts.method)
    trt_version, algorithm = resolve_trt_version(opts.trt_version), method.algorithm
    run = Setup(
        opts,
        model_path,
        feed_model,
        specs,
        Batcher(data, feed_specs) if batches is None else batches(feed_specs),
        tensors,
        need_hist=method.histogram or opts.save_stats is not None,
        budget=budget,
        feed_mode=feed_mode,
        slice_at=slice_at,
    )
    from trtq.calib.collect.one_pass import is_pow2

    # a method without histograms takes the one pass too (its histograms feed the range check),
    # except for shards and --save-stats, whose files keep the fixed-edge histograms a two-pass
    # method can be computed from
    plain = shard is None and ranges is None and opts.save_stats is None
    run.one_pass = method.one_pass and (method.histogram or plain) and is_pow2(int(opts.num_bins))
    run.need_hist = run.need_hist or run.one_pass
    from trtq.calib.collect.padded import pad_links

    run.padded = pad_links(run.model, tensors, run.batcher.shapes)
    if run.padded:
        log.info("%d zero-padded tensor(s) take their statistics from the tensor they pad (not run)", len(run.padded))
    _prepare_shard(run, shard, ranges, keep_batches)
    return run, trt_version, algorithm


def _checked_model(cfg: Any, opts: Any) -> tuple:
    """(model path, model, its input specs, the tensors to calibrate, the memory budget, the slice
    size): the model and the options checked before any work."""
    from trtq.calib.collect.budget import resolve_budget, slice_target
    from trtq.calib.collect.exposed import check_providers, select_tensors
    from trtq.model import input_specs, load_model

    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    budget = resolve_budget(opts.max_memory)  # a bad --max-memory fails before any work
    if int(opts.hist_elements) < 0:
        raise UsageError(
            f"--hist-elements {opts.hist_elements} is negative",
            "pass a count of elements per sample, or 0 to histogram every element",
        )
    model_path = Path(cfg.model)
    check_providers(opts.providers)  # before any work: a typo must not fall back to CPU silently
    model = load_model(model_path)
    specs = input_specs(model)
    if not any(s.is_float for s in specs):
        raise DataError(f"model {model_path} has no float input to calibrate", "pass an FP32 model")
    refuse_quantized(model, model_path)
    tensors = select_tensors(model, opts.tensors)
    from trtq.calib.stats import check_num_bins

    check_num_bins(opts.num_bins, len(tensors))
    return model_path, model, specs, tensors, budget, slice_target(opts.max_memory, budget)


def _prepare_shard(run: Setup, shard: tuple[int, int] | None, ranges: Path | None, keep_batches: Path | None) -> None:
    """A shard's run: its samples alone, pass 1 or (with the merged ``ranges``) pass 2."""
    from trtq.calib import methods

    opts = run.opts
    if shard is not None or ranges is not None:
        from trtq.calib.shard import prepare_shard

        run.shard_pass, run.given = prepare_shard(
            run.batcher, shard, ranges, opts, run.model_path, run.tensors, run.one_pass
        )
        run.need_hist = run.shard_pass != "ranges"
        if keep_batches is not None and run.one_pass:
            two = " or ".join(m.name for m in methods.METHODS.rows() if not (m.one_pass and m.histogram))
            raise UsageError(
                f"--keep-batches is for the two passes of a shard of --method {two}; --method {opts.method} takes one",
                "drop --keep-batches",
            )
    elif keep_batches is not None:
        raise UsageError("--keep-batches is for the two passes of a shard", "pass --shard I/N with it")


def _write_run(
    run: Setup,
    algorithm: str,
    trt_version: str,
    out: Path,
    stats_path: Path | None,
    provenance: dict,
    amax: dict[str, float],
    statistics: tuple[Any, Any, Any, Any],
    shard: tuple[int, int] | None,
) -> None:
    """Statistics (``--save-stats``), cache and provenance, as one step for Ctrl-C / SIGTERM."""
    from trtq.calib.stats import save_stats
    from trtq.interrupt import held_for_outputs

    maxima, counts, zeros, tops = statistics
    tensors = run.tensors
    with held_for_outputs():
        if stats_path is not None:
            meta = {k: v for k, v in provenance.items() if k not in ("amax", "method", "algorithm")}
            meta["tensors"] = tensors
            from trtq.calib.shard import statistics_key

            meta["statistics"] = statistics_key(run.opts.num_bins, run.one_pass, run.opts.hist_elements)
            if run.shard_pass is not None:
                from trtq.calib.shard import ranges_sha256

                meta["shard"] = {
                    "index": shard[0],
                    "count": shard[1],
                    "pass": run.shard_pass,
                    "ranges_sha256": ranges_sha256(run.given) if run.given is not None else None,
                }
            save_stats(
                stats_path,
                {n: maxima[n] for n in tensors},
                {n: counts[n] for n in tensors},
                meta,
                {n: zeros[n] for n in tensors},
                None if tops is None else {n: tops[n] for n in tensors},
            )
        if run.shard_pass is None:
            write_outputs(out, algorithm, trt_version, amax, provenance)


def write_outputs(out: Path, algorithm: str, trt_version: str, amax: dict[str, float], provenance: dict) -> None:
    from trtq.calib.cache import CalibrationTable, write_cache, write_provenance

    table = CalibrationTable(trt_version=trt_version, algorithm=algorithm, amax=amax, source_format="tensorrt")
    from trtq.interrupt import held_for_outputs

    # one step for Ctrl-C / SIGTERM (held_for_outputs); provenance first all the same: if the process
    # dies between the two writes, the JSON no longer matches the old cache and is ignored by the
    # freshness check (see trtq.calib.freshness)
    with held_for_outputs():
        write_provenance(out, provenance)
        write_cache(out, table, trt_version)


def build_provenance(cfg, model_path, specs, batcher, samples, trt_version, algorithm, amax, data_options) -> dict:
    from trtq.calib.provenance import calibration_provenance, data_entry, model_entry

    opts = cfg.calibrate.resolved()
    return calibration_provenance(
        model_entry(model_path, specs),
        data_entry(batcher, samples, data_options),
        {"name": opts.method, "percentile": opts.percentile, "num_bins": opts.num_bins},
        algorithm,
        trt_version,
        amax,
    )


def _method_fits_stats(cfg: Any, opts: Any, stats: Any, meta: dict, stats_path: Path) -> Any:
    """The method's registry row, once the statistics are known to be whole (merged), of this
    model, of these bins and of edges the method can use; CacheError / UsageError otherwise."""
    from trtq.calib import methods
    from trtq.calib.shard import shard_meta

    shard = shard_meta(meta, Path(stats_path))
    if shard is not None and shard.get("index") is not None and shard["count"] > 1:
        raise CacheError(
            f"{stats_path} is shard {shard['index']}/{shard['count']} only",
            "merge all shards first: trtq merge-stats part-*.npz -o merged.npz",
        )
    method = methods.METHODS.get(opts.method)
    if shard is not None and shard.get("pass") == "ranges" and method.histogram:
        raise CacheError(
            f"{stats_path} holds pass-1 ranges only; --method {opts.method} needs histograms",
            "run pass 2 (trtq calibrate --shard I/N --ranges this.npz --save-stats ...) and merge it, "
            "or use --method " + " / ".join(m.name for m in methods.METHODS.rows() if not m.histogram),
        )
    model_meta = meta.get("model") or {}
    if cfg.model:
        from trtq.model import model_sha256

        actual = model_sha256(cfg.model)  # its external-data files included
        if model_meta.get("sha256") and model_meta["sha256"] != actual:
            raise CacheError(
                f"{stats_path} holds statistics of a different model than {cfg.model}",
                "re-run trtq calibrate --save-stats for this model",
            )
    if opts.num_bins != stats.num_bins and opts.num_bins != 2048:
        raise UsageError(
            f"--num-bins {opts.num_bins} differs from the saved histograms ({stats.num_bins} bins)",
            "omit it: saved statistics keep their bin count",
        )
    if stats.edges == "pow2" and not method.one_pass:
        one_pass = [m.name for m in methods.METHODS.rows() if m.one_pass]
        raise CacheError(
            f"{stats_path} holds one-pass histograms (power-of-two ranges, from --method "
            f"{' or '.join(n for n in one_pass if methods.METHODS.get(n).histogram)}); {opts.method} "
            "searches over [0, max]",
            f"re-run trtq calibrate --method {opts.method} --save-stats, or use --method " + " / ".join(one_pass),
        )
    return method


def _ranges_from_stats(cfg: Any, stats_path: Path) -> CalibrationResult:
    """Apply ``cfg.calibrate.method`` to histograms saved by ``--save-stats`` (no model run)."""
    from trtq.calib import methods
    from trtq.calib.cache import resolve_trt_version
    from trtq.calib.range_check import check_ranges
    from trtq.calib.stats import load_stats

    t0 = time.perf_counter()
    opts = cfg.calibrate.resolved()
    stats = load_stats(Path(stats_path))
    meta = dict(stats.meta)
    method = _method_fits_stats(cfg, opts, stats, meta, stats_path)
    tensors = list(meta.get("tensors") or list(stats.maxima))
    raw = methods.compute_all(opts.method, stats.maxima, stats.counts, opts.percentile, stats.zeros, stats.tops)
    amax, zero = methods.finalize_amax({n: float(raw[n]) for n in tensors})
    flags = check_ranges(
        opts.method,
        {n: raw[n] for n in tensors},
        {n: stats.maxima[n] for n in tensors},
        stats.counts,
        stats.zeros,
        stats.tops,
    )
    trt_version = resolve_trt_version(opts.trt_version)
    algorithm = method.algorithm
    from trtq.calib.provenance import restamped_provenance

    method = {"name": opts.method, "percentile": opts.percentile, "num_bins": stats.num_bins}
    provenance = restamped_provenance(meta, method, algorithm, trt_version, amax, stats_path)
    out = Path(opts.output)
    write_outputs(out, algorithm, trt_version, amax, provenance)
    data = meta.get("data") or {}
    return CalibrationResult(
        cache_path=out,
        method=opts.method,
        algorithm=algorithm,
        trt_version=trt_version,
        amax=amax,
        samples=int(data.get("samples") or 0),
        batches=0,
        seconds=time.perf_counter() - t0,
        zero_tensors=zero,
        range_flags=flags,
    )
