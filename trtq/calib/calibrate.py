"""``trtq calibrate``: data -> FP32 activations -> statistics -> amax -> calibration.cache (+ .json).

mse, percentile and max take one streaming pass: histograms over power-of-two ranges that grow by
exact bin merges (trtq.calib.pow2), each sample's elements subsampled by a fixed stride past
``hist_elements``, the max over every element (max's histograms feed the range check,
trtq.calib.range_check). entropy (TensorRT's EntropyCalibration2) and ``max`` with ``--save-stats``
or a shard take two:
pass 1 finds max|x| per tensor, pass 2 histograms every element over the fixed edges
``linspace(0, max, bins + 1)``. Either way the histograms are exactly additive, so the result does
not depend on batch size, order or sharding. Memory holds one batch of activations plus the
histograms (bins x tensors x 8 bytes).
"""
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from trtq import interrupt
from trtq.config import TrtqConfig, to_dict
from trtq.errors import CacheError, DataError, UsageError

log = logging.getLogger(__name__)

# smallest amax written: a tensor that was (all but) zero on every sample still needs scale > 0
MIN_AMAX = 1e-8


@dataclass
class Progress:
    """Handed to the progress callback after every batch."""

    stage: str  # "max" or "histogram"
    stage_index: int  # 1-based
    stages: int
    batches_done: int
    batches: int
    samples_done: int
    elapsed: float  # seconds since the stage started


@dataclass
class CalibrationResult:
    cache_path: Optional[Path]
    method: str
    algorithm: str
    trt_version: str
    amax: dict[str, float]
    samples: int
    batches: int
    seconds: float
    stats_path: Optional[Path] = None
    skipped: list = field(default_factory=list)
    zero_tensors: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    # tensors whose range costs > RATIO x mse's expected error (trtq.calib.range_check), worst first
    range_flags: list = field(default_factory=list)

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
            "range_flags": [{"tensor": f.tensor, "error_vs_mse": round(f.ratio, 3), "clipped": f.clipped,
                             "mse_clipped": f.mse_clipped} for f in self.range_flags],
        }


ProgressFn = Callable[[Progress], None]


def resolve_trt_version(requested: Optional[str]) -> str:
    from trtq.calib.cache import DEFAULT_TRT_VERSION, installed_trt_version, parse_trt_version

    version = requested or installed_trt_version() or DEFAULT_TRT_VERSION
    parse_trt_version(version)  # raises ConfigError on garbage
    return version


def _finalize_amax(amax: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """amax floored at :data:`MIN_AMAX` (a tensor that was zero, or all but zero, on every sample:
    an untrained BatchNorm's 1e-10 activations would otherwise refuse the whole cache), and the
    names floored."""
    floored = [name for name, a in amax.items() if not a >= MIN_AMAX]
    return {name: (a if a >= MIN_AMAX else MIN_AMAX) for name, a in amax.items()}, floored


def _write_outputs(out: Path, algorithm: str, trt_version: str, amax: dict[str, float], provenance: dict) -> None:
    from trtq.calib.cache import CalibrationTable, write_cache, write_provenance

    table = CalibrationTable(trt_version=trt_version, algorithm=algorithm, amax=amax, source_format="tensorrt")
    from trtq.interrupt import held_for_outputs

    # one step for Ctrl-C / SIGTERM (held_for_outputs); provenance first all the same: if the process
    # dies between the two writes, the JSON no longer matches the old cache and is ignored by the
    # freshness check (see trtq.calib.freshness)
    with held_for_outputs():
        write_provenance(out, provenance)
        write_cache(out, table, trt_version)


def refuse_quantized(model, model_path: Path) -> None:
    """A model with Q/DQ (or other quantized) nodes carries its ranges already: calibrating it would
    measure the fake-quantized tensors, and quantizing it again is refused anyway."""
    from trtq.model import is_quantized

    if is_quantized(model):
        from trtq.errors import ModelError

        raise ModelError(f"{model_path.name} is already quantized (it has Q/DQ nodes): its ranges are in the model",
                         f"build it as it is (trtq build --model {model_path.name}), or calibrate the FP32 model")


@dataclass
class _Setup:
    """What a calibration run works on, checked before any batch is read."""

    opts: Any
    model_path: Path
    model: Any
    specs: list[Any]
    trt_version: str
    algorithm: str
    batcher: Any
    tensors: list[str]
    need_hist: bool
    budget: int  # bytes one batch of collected activations may take (--max-memory, resolved once)
    slice_at: Optional[int] = None  # bytes above which a batch runs in slices of rows (budget.slice_target)
    shard_pass: Optional[str] = None  # a shard's "ranges" (pass 1) or "histogram" (pass 2)
    given: Optional[dict[str, float]] = None  # pass 2 of a shard: the merged ranges of pass 1
    tensor_groups: int = 1  # ONNX Runtime calls per batch (--max-memory)
    rows_per_call: Optional[int] = None  # rows of a batch per call when --max-memory slices batches
    feed_mode: Optional[str] = None  # a fixed-batch-1 model: "batched" or "per-sample" (trtq.calib.widen)
    one_pass: bool = False  # mse / percentile: power-of-two histograms in one pass (trtq.calib.pow2)
    subsampled: int = 0  # tensors histogrammed on a stride (one-pass runs)
    collect_mode: str = "outputs"  # "in-graph" (trtq.calib.ingraph) or "outputs" (trtq.calib.collect)
    leading: set = field(default_factory=set)  # one pass: tensors whose leading dim is the batch (subsampled)
    padded: dict = field(default_factory=dict)  # zero-padded outputs taken from their input (trtq.calib.padded)

    @property
    def counted(self) -> list[str]:
        """The tensors the collector runs: all but the zero-padded outputs."""
        return [t for t in self.tensors if t not in self.padded]


_NUMPY_FALLBACK = ("histograms on the numpy fallback; reinstalling trtq where a C compiler is found (or pip "
                   "install numba) makes this pass faster")


class _Stream:
    """Runs the collector over one pass's batches, reporting progress; counts the last pass."""

    def __init__(self, collector: Any, batcher: Any, progress: Optional[ProgressFn], stages: int):
        self.collector, self.batcher, self.progress, self.stages = collector, batcher, progress, stages
        self.samples = self.batches = 0

    def run(self, stage: str, index: int, update: Callable, source: Any) -> None:
        t0 = time.perf_counter()
        done_batches = done_samples = 0
        for batch in source:
            interrupt.check()
            for part in self.collector.run_groups(batch.arrays, batch.valid):
                update(part)
                del part  # before the next group runs
            done_batches += 1
            done_samples += batch.valid
            if self.progress is not None:
                self.progress(Progress(stage, index, self.stages, done_batches, self.batcher.num_batches,
                                       done_samples, time.perf_counter() - t0))
        self.samples, self.batches = done_samples, done_batches
        if self.samples == 0:
            raise DataError("no samples were usable for calibration", "check the data folder and --skip-bad report")


def run_calibration(
    cfg: TrtqConfig, progress: Optional[ProgressFn] = None, write: bool = True,
    shard: Optional[tuple[int, int]] = None, ranges: Optional[Path] = None, keep_batches: Optional[Path] = None,
    selection: Optional[str] = None,
) -> CalibrationResult:
    """Calibrate ``cfg.model`` on ``cfg.data`` with ``cfg.calibrate`` and write the cache.

    ``selection``: how ``calibrate.tensors`` was chosen, for the provenance (``"qdq"``: the
    activations trtq quantize places Q/DQ on; implicit builds refuse such a cache).
    ``shard=(I, N)``: only shard I of N of the samples (trtq.calib.shard); writes the statistics
    file (``--save-stats``, required) and no cache: pass 1 (maxima) alone, or with ``ranges`` (a
    merged pass-1 file) pass 2 alone, histograms over those ranges. ``keep_batches``: pass 1 writes
    the shard's decoded batches there and pass 2 reads them back (trtq.calib.batchfile).
    """
    from trtq.calib.derive import monotone_links
    from trtq.calib.kernels import warm_up
    from trtq.calib.stats import compute_all

    run = _prepare(cfg, shard, ranges, keep_batches)
    opts, tensors = run.opts, run.tensors
    # Relu/Clip outputs whose range follows from their input's are not exposed by ONNX Runtime in
    # the max pass (trtq.calib.derive)
    links = monotone_links(run.model, tensors)
    measured = [t for t in run.counted if t not in links]
    if run.need_hist:  # load the kernels (numba: its compiled code, ~0.25 s) while the session starts
        threading.Thread(target=warm_up, args=(run.one_pass,), name="trtq-kernel-warmup", daemon=True).start()
    # one session for both passes when there are two (every counted tensor: pass 1 reads the
    # measured ones); the max-only pass runs only the measured ones
    two_passes = run.need_hist and run.given is None and not run.one_pass
    session_tensors = measured if run.given is None and not run.need_hist else run.counted
    hist = _pow2_histograms(run) if run.one_pass else None
    stream = _Stream(_any_collector(run, session_tensors), run.batcher, progress, 2 if two_passes else 1)
    started = time.perf_counter()
    tops = None
    if run.one_pass:
        maxima, counts, zeros, tops = _one_pass(run, stream, hist)
    else:
        maxima, counts, zeros = _passes(run, stream, links, keep_batches if write else None, keep_batches)
    if run.shard_pass == "ranges":  # a pass-1 shard: maxima only, histograms come in pass 2
        import numpy as np

        counts = {n: np.zeros(opts.num_bins, dtype=np.int64) for n in tensors}
        zeros = {n: 0 for n in tensors}
    raw_amax = compute_all("max" if run.shard_pass else opts.method, maxima, counts, opts.percentile, zeros,
                           None if run.shard_pass else tops)
    amax, zero = _finalize_amax({name: float(raw_amax[name]) for name in tensors})
    flags = [] if run.shard_pass else check_ranges(opts.method, raw_amax, maxima, counts, zeros, tops)
    seconds = time.perf_counter() - started

    provenance = build_provenance(cfg, run.model_path, run.specs, run.batcher, stream.samples, run.trt_version,
                                  run.algorithm, amax)
    provenance["collection"] = {"mode": run.collect_mode,
                                "tensor_groups": run.tensor_groups, "rows_per_call": run.rows_per_call,
                                "fixed_batch_1": run.feed_mode,
                                # which tensors: all, a --tensors list, or "qdq" (what quantize reads)
                                "tensors": selection or ("listed" if opts.tensors else "all"),
                                # zero-padded outputs whose statistics came from their inputs
                                "padded_from_input": len(run.padded)}
    if run.one_pass:
        provenance["collection"]["histograms"] = {"edges": "pow2", "hist_elements": opts.hist_elements,
                                                  "subsampled_tensors": run.subsampled}
    if run.need_hist:
        from trtq.calib.kernels import implementation

        provenance["collection"]["kernels"] = implementation()  # same results on each; for timings
    out = Path(opts.output)
    stats_path = Path(opts.save_stats) if opts.save_stats else None
    if write:
        _write_run(run, out, stats_path, provenance, amax, (maxima, counts, zeros, tops), shard)
    return CalibrationResult(
        cache_path=out if write and run.shard_pass is None else None, method=opts.method, algorithm=run.algorithm,
        trt_version=run.trt_version, amax=amax, samples=stream.samples, batches=stream.batches, seconds=seconds,
        stats_path=stats_path, skipped=list(getattr(run.batcher, "skipped", [])), zero_tensors=zero,
        providers=list(stream.collector.providers), range_flags=flags,
    )


def check_ranges(method: str, amax: dict, maxima: dict, counts: Any, zeros: Any, tops: Any) -> list:
    """:func:`trtq.calib.range_check.range_flags` of ``method``'s ranges against mse's on the same
    histograms (none for mse itself, or without histograms)."""
    if method == "mse" or counts is None:
        return []
    from trtq.calib.range_check import range_flags
    from trtq.calib.stats import compute_all

    mse = compute_all("mse", maxima, counts, 99.99, zeros, tops)
    return range_flags(amax, mse, maxima, counts, tops)


def _collector(run: _Setup, tensors: list[str]) -> Any:
    """ONNX Runtime over ``tensors``, in groups when one batch of them exceeds --max-memory."""
    from trtq.calib.groups import GroupedCollector

    collector = GroupedCollector(run.model, tensors, run.opts.providers, run.budget, dict(run.batcher.shapes),
                                 slice_at=run.slice_at)
    run.tensor_groups = max(run.tensor_groups, len(collector.groups))
    if collector.rows_per_call < collector.batch:
        run.rows_per_call = min(run.rows_per_call or collector.batch, collector.rows_per_call)
    return collector


def _prepare(cfg: TrtqConfig, shard: Optional[tuple[int, int]], ranges: Optional[Path],
             keep_batches: Optional[Path]) -> _Setup:
    """Model, data and options checked, before any batch is read."""
    from trtq.calib.budget import resolve_budget, slice_target
    from trtq.calib.cache import ALGORITHM_FOR_METHOD
    from trtq.calib.collect import check_providers, select_tensors
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    opts = cfg.calibrate.resolved()
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    budget = resolve_budget(opts.max_memory)  # a bad --max-memory fails before any work
    if int(opts.hist_elements) < 0:
        raise UsageError(f"--hist-elements {opts.hist_elements} is negative",
                         "pass a count of elements per sample, or 0 to histogram every element")
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
    slice_at = slice_target(opts.max_memory, budget)
    feed_model, feed_specs, data, feed_mode = model, specs, cfg.data, None
    if shard is None and ranges is None:  # a fixed batch of 1: fed in batches where that is identical
        from trtq.calib.widen import widen_if_identical

        feed_model, feed_specs, data, feed_mode = widen_if_identical(
            model, specs, cfg.data, tensors, opts.providers, budget, slice_at)
    run = _Setup(opts, model_path, feed_model, specs, resolve_trt_version(opts.trt_version),
                 ALGORITHM_FOR_METHOD[opts.method], Batcher(data, feed_specs), tensors,
                 need_hist=opts.method != "max" or opts.save_stats is not None, budget=budget, feed_mode=feed_mode,
                 slice_at=slice_at)
    from trtq.calib.pow2 import is_pow2

    # max takes the one pass too (its histograms feed the range check), except for shards and
    # --save-stats, whose files keep the fixed-edge histograms entropy can be computed from
    one_pass_max = opts.method == "max" and shard is None and ranges is None and opts.save_stats is None
    run.one_pass = (opts.method in ("mse", "percentile") or one_pass_max) and is_pow2(int(opts.num_bins))
    run.need_hist = run.need_hist or run.one_pass
    from trtq.calib.padded import pad_links

    run.padded = pad_links(run.model, tensors, run.batcher.shapes)
    if run.padded:
        log.info("%d zero-padded tensor(s) take their statistics from the tensor they pad (not run)",
                 len(run.padded))
    if shard is not None or ranges is not None:
        from trtq.calib.shard import prepare_shard

        run.shard_pass, run.given = prepare_shard(run.batcher, shard, ranges, opts, model_path, run.tensors,
                                                  run.one_pass)
        run.need_hist = run.shard_pass != "ranges"
        if keep_batches is not None and run.one_pass:
            raise UsageError(f"--keep-batches is for the two passes of an entropy or max shard; --method "
                             f"{opts.method} takes one", "drop --keep-batches")
    elif keep_batches is not None:
        raise UsageError("--keep-batches is for the two passes of a shard", "pass --shard I/N with it")
    return run


def _passes(run: _Setup, stream: _Stream, links: Any, write_batches: Optional[Path],
            read_batches: Optional[Path]) -> tuple[dict[str, float], Any, Any]:
    """Pass 1 (maxima; skipped in pass 2 of a shard) and pass 2 (histograms, when needed):
    (maxima, counts or None, zeros or None)."""
    from trtq.calib.derive import abs_max, derive_extremes
    from trtq.calib.replay import ReplayedBatches
    from trtq.calib.replay import _decodes_images as replay_worthwhile  # .npy inputs are memory-mapped
    from trtq.calib.stats import AbsMaxAccumulator

    with ReplayedBatches(run.batcher, enabled=run.need_hist and run.given is None) as replay:
        if run.given is None:
            maxima_acc = AbsMaxAccumulator()
            source = replay.first()
            if write_batches is not None and replay_worthwhile(run.batcher):
                from trtq.calib.batchfile import write_through

                source = write_through(source, Path(write_batches), run.batcher)
            skip = set(links) | set(run.padded)  # derived below, exactly; the session may expose links

            def update(arrays: dict) -> None:
                maxima_acc.update_batch({n: a for n, a in arrays.items() if n not in skip})

            if run.collect_mode == "in-graph":  # ONNX Runtime's nodes take the extremes as it runs
                stream.collector.start_extremes()
                stream.run("max", 1, _nothing, source)
                stream.collector.fill_extremes(maxima_acc, skip)
            else:
                stream.run("max", 1, update, source)
            padded = {name: link.source for name, link in run.padded.items()}
            derived = derive_extremes(maxima_acc.extremes, links, padded)
            maxima_acc.add_derived({name: abs_max(derived[name]) for name in [*links, *padded]})
            maxima = maxima_acc.maxima
        else:
            maxima = run.given  # pass 2 of a shard: the merged ranges of pass 1
        if not run.need_hist:
            return maxima, None, None
        return (maxima, *_histogram_pass(run, stream, maxima, replay, read_batches))


def _pow2_histograms(run: _Setup) -> Any:
    """The one pass's histograms (trtq.calib.pow2), empty."""
    from trtq.calib.batchdim import batch_leading, one_sample_calls
    from trtq.calib.pow2 import Pow2Histograms

    opts = run.opts
    run.leading = batch_leading(run.model, run.tensors) if opts.hist_elements else set()
    return Pow2Histograms(run.tensors, opts.num_bins, opts.hist_elements, run.leading, one_sample_calls(run.model))


def _any_collector(run: _Setup, tensors: list[str]) -> Any:
    """The in-graph collector where it runs, else the outputs collector (``--collect``)."""
    return _ingraph_collector(run, tensors) or _collector(run, tensors)


def _ingraph_collector(run: _Setup, tensors: list[str]) -> Any:
    """The in-graph collector (trtq.calib.ingraph) over ``tensors`` when ``--collect`` allows it
    and it runs here; else None (the outputs collector)."""
    from trtq.errors import ModelError

    opts = run.opts
    if opts.collect == "outputs":
        return None
    from trtq.calib import ingraph
    from trtq.calib.batchdim import one_sample_calls
    from trtq.calib.groups import batch_dim_free

    why = ingraph.unavailable(opts.providers)
    if why is None:
        try:
            collector = ingraph.InGraphCollector(
                run.model, tensors, opts.num_bins, opts.providers,
                free_batch=batch_dim_free(run.model, dict(run.batcher.shapes)),
                hist_elements=opts.hist_elements if run.one_pass else 0, leading=run.leading,
                one_sample=run.one_pass and one_sample_calls(run.model))
            run.collect_mode = "in-graph"
            return collector
        except ModelError as e:
            why = e.message
    if opts.collect == "in-graph":
        raise UsageError(f"--collect in-graph cannot run here: {why}", "pass --collect outputs (or auto)")
    log.info("statistics from exposed outputs: %s", why)
    return None


def _one_pass(run: _Setup, stream: _Stream, hist: Any) -> tuple[Any, Any, Any, Any]:
    """mse / percentile: power-of-two histograms in one pass; (maxima, counts, zeros, tops)."""
    from trtq.calib.kernels import pow2_kernel

    opts = run.opts
    if run.collect_mode == "in-graph":  # ONNX Runtime folds each batch in as it runs
        stream.run("histogram", 1, _nothing, run.batcher)
        stream.collector.fill_pow2(hist)
        stream.collector.close()
    else:
        if pow2_kernel() is None:
            log.info(_NUMPY_FALLBACK)
        stream.run("histogram", 1, hist.update_batch, run.batcher)
    if run.padded:
        from trtq.calib.padded import derive_pow2

        derive_pow2(run.padded, hist.maxima, hist.counts, hist.zeros, hist.exponents, hist.strides, stream.samples)
    run.subsampled = len(hist.strides)
    if opts.hist_elements:
        log.info("%d of %d tensors histogrammed on a stride (at most %d elements per sample); %d whole",
                 len(hist.strides), len(run.tensors), opts.hist_elements, len(run.tensors) - len(hist.strides))
    return hist.maxima, hist.counts, hist.zeros, hist.tops


def _histogram_pass(run: _Setup, stream: _Stream, maxima: dict[str, float], replay: Any,
                    read_batches: Optional[Path]) -> tuple[Any, Any]:
    """Pass 2: histograms over the fixed edges of ``maxima``; (counts, zeros)."""
    from trtq.calib.kernels import two_pass_kernel
    from trtq.calib.stats import HistogramAccumulator

    if two_pass_kernel() is None:
        log.info(_NUMPY_FALLBACK)
    hist = HistogramAccumulator(maxima, num_bins=run.opts.num_bins)
    # pass 2 runs in pass 1's session: run_calibration gave it every counted tensor when there are two
    if run.given is None:
        source = replay.second()
    else:
        source = None
        if read_batches is not None:
            from trtq.calib.batchfile import open_batches

            source = open_batches(Path(read_batches), run.batcher)
        source = run.batcher if source is None else source
    if run.collect_mode == "in-graph":
        stream.collector.start_histograms(hist.maxima)
        stream.run("histogram", stream.stages, _nothing, source)
        stream.collector.fill_histograms(hist)
        stream.collector.close()
    else:
        stream.run("histogram", stream.stages, hist.update_batch, source)
    if hist.exceeded:
        log.warning(
            "%d tensor(s) had values above their first-pass max in the second pass (data not "
            "deterministic?): %s; they were counted in the last bin",
            len(hist.exceeded), ", ".join(sorted(hist.exceeded)[:5]))
    counts, zeros = hist.counts, hist.zeros  # copies
    if run.padded:
        from trtq.calib.padded import derive_counts

        derive_counts(run.padded, counts, zeros, stream.samples)
    return counts, zeros


def _nothing(_part: Any) -> None:
    """The per-batch update of an in-graph pass: ONNX Runtime's nodes did it."""


def _write_run(run: _Setup, out: Path, stats_path: Optional[Path], provenance: dict, amax: dict[str, float],
               statistics: tuple[Any, Any, Any], shard: Optional[tuple[int, int]]) -> None:
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

                meta["shard"] = {"index": shard[0], "count": shard[1], "pass": run.shard_pass,
                                 "ranges_sha256": ranges_sha256(run.given) if run.given is not None else None}
            save_stats(stats_path, {n: maxima[n] for n in tensors}, {n: counts[n] for n in tensors}, meta,
                       {n: zeros[n] for n in tensors}, None if tops is None else {n: tops[n] for n in tensors})
        if run.shard_pass is None:
            _write_outputs(out, run.algorithm, run.trt_version, amax, provenance)


def build_provenance(cfg, model_path, specs, batcher, samples, trt_version, algorithm, amax) -> dict:
    from trtq.calib.provenance import calibration_provenance, data_entry, model_entry

    opts = cfg.calibrate.resolved()
    return calibration_provenance(
        model_entry(model_path, specs), data_entry(batcher, samples, to_dict(cfg.data)),
        {"name": opts.method, "percentile": opts.percentile, "num_bins": opts.num_bins},
        algorithm, trt_version, amax,
    )


def calibrate_from_stats(cfg: TrtqConfig, stats_path: Path) -> CalibrationResult:
    """Apply ``cfg.calibrate.method`` to histograms saved by ``--save-stats`` (no model run)."""
    from trtq.calib.cache import ALGORITHM_FOR_METHOD
    from trtq.calib.stats import compute_all, load_stats

    t0 = time.perf_counter()
    opts = cfg.calibrate.resolved()
    stats = load_stats(Path(stats_path))
    meta = dict(stats.meta)
    from trtq.calib.shard import shard_meta

    shard = shard_meta(meta, Path(stats_path))
    if shard is not None and shard.get("index") is not None and shard["count"] > 1:
        raise CacheError(f"{stats_path} is shard {shard['index']}/{shard['count']} only",
                         "merge all shards first: trtq merge-stats part-*.npz -o merged.npz")
    if shard is not None and shard.get("pass") == "ranges" and opts.method != "max":
        raise CacheError(f"{stats_path} holds pass-1 ranges only; --method {opts.method} needs histograms",
                         "run pass 2 (trtq calibrate --shard I/N --ranges this.npz --save-stats ...) and merge it, "
                         "or use --method max")
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
    if stats.edges == "pow2" and opts.method == "entropy":
        raise CacheError(f"{stats_path} holds one-pass histograms (power-of-two ranges, from --method mse or "
                         "percentile); entropy is TensorRT's search over [0, max]",
                         "re-run trtq calibrate --method entropy --save-stats, or use --method mse / percentile / max")
    tensors = list(meta.get("tensors") or list(stats.maxima))
    raw = compute_all(opts.method, stats.maxima, stats.counts, opts.percentile, stats.zeros, stats.tops)
    amax, zero = _finalize_amax({n: float(raw[n]) for n in tensors})
    flags = check_ranges(opts.method, {n: raw[n] for n in tensors}, {n: stats.maxima[n] for n in tensors},
                         stats.counts, stats.zeros, stats.tops)
    trt_version = resolve_trt_version(opts.trt_version)
    algorithm = ALGORITHM_FOR_METHOD[opts.method]
    from trtq.calib.provenance import restamped_provenance

    method = {"name": opts.method, "percentile": opts.percentile, "num_bins": stats.num_bins}
    provenance = restamped_provenance(meta, method, algorithm, trt_version, amax, stats_path)
    out = Path(opts.output)
    _write_outputs(out, algorithm, trt_version, amax, provenance)
    data = meta.get("data") or {}
    return CalibrationResult(
        cache_path=out, method=opts.method, algorithm=algorithm, trt_version=trt_version, amax=amax,
        samples=int(data.get("samples") or 0), batches=0, seconds=time.perf_counter() - t0,
        zero_tensors=zero, range_flags=flags,
    )
