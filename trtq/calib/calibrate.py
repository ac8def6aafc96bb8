"""``trtq calibrate``: data -> FP32 activations -> statistics -> amax -> calibration.cache (+ .json).

Two streaming passes over the data when the method needs a histogram: pass 1 finds max|x| per
tensor, pass 2 histograms every tensor over the fixed edges ``linspace(0, max, bins + 1)``. Fixed
edges make the histograms exactly additive, so the result does not depend on batch size, order or
sharding. Memory holds one batch of activations plus the histograms (bins x tensors x 8 bytes).
"""
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from trtq import interrupt
from trtq.config import TrtqConfig, to_dict
from trtq.errors import CacheError, DataError, UsageError
from trtq.fileio import sha256_file

log = logging.getLogger(__name__)

# smallest amax written: a tensor that was exactly zero on every sample still needs scale > 0
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
    amax: Dict[str, float]
    samples: int
    batches: int
    seconds: float
    stats_path: Optional[Path] = None
    skipped: List = field(default_factory=list)
    zero_tensors: List[str] = field(default_factory=list)
    providers: List[str] = field(default_factory=list)

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
        }


ProgressFn = Callable[[Progress], None]


def resolve_trt_version(requested: Optional[str]) -> str:
    from trtq.calib.cache import DEFAULT_TRT_VERSION, installed_trt_version, parse_trt_version

    version = requested or installed_trt_version() or DEFAULT_TRT_VERSION
    parse_trt_version(version)  # raises ConfigError on garbage
    return version


def _finalize_amax(amax: Dict[str, float]) -> Tuple[Dict[str, float], List[str]]:
    zero = [name for name, a in amax.items() if not a > 0]
    return {name: (a if a > 0 else MIN_AMAX) for name, a in amax.items()}, zero


def _write_outputs(out: Path, algorithm: str, trt_version: str, amax: Dict[str, float], provenance: dict) -> None:
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


def run_calibration(
    cfg: TrtqConfig, progress: Optional[ProgressFn] = None, write: bool = True,
    shard: Optional[Tuple[int, int]] = None, ranges: Optional[Path] = None, keep_batches: Optional[Path] = None,
) -> CalibrationResult:
    """Calibrate ``cfg.model`` on ``cfg.data`` with ``cfg.calibrate`` and write the cache.

    ``shard=(I, N)``: only shard I of N of the samples (trtq.calib.shard); writes the statistics
    file (``--save-stats``, required) and no cache: pass 1 (maxima) alone, or with ``ranges`` (a
    merged pass-1 file) pass 2 alone, histograms over those ranges. ``keep_batches``: pass 1 writes
    the shard's decoded batches there and pass 2 reads them back (trtq.calib.batchfile).
    """
    from trtq.calib.cache import ALGORITHM_FOR_METHOD
    from trtq.calib.collect import OrtCollector, check_providers, select_tensors
    from trtq.calib.derive import abs_max, derive_extremes, monotone_links
    from trtq.calib.kernels import numba_enabled
    from trtq.calib.replay import ReplayedBatches
    from trtq.calib.replay import _decodes_images as replay_worthwhile  # .npy inputs are memory-mapped
    from trtq.calib.stats import AbsMaxAccumulator, HistogramAccumulator, compute_all, save_stats
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    opts = cfg.calibrate.resolved()
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    model_path = Path(cfg.model)
    check_providers(opts.providers)  # before any work: a typo must not fall back to CPU silently
    model = load_model(model_path)
    specs = input_specs(model)
    if not any(s.is_float for s in specs):
        raise DataError(f"model {model_path} has no float input to calibrate", "pass an FP32 model")
    refuse_quantized(model, model_path)
    trt_version = resolve_trt_version(opts.trt_version)
    algorithm = ALGORITHM_FOR_METHOD[opts.method]
    batcher = Batcher(cfg.data, specs)
    tensors = select_tensors(model, opts.tensors)
    need_hist = opts.method != "max" or opts.save_stats is not None
    shard_pass = given = None
    if shard is not None or ranges is not None:
        from trtq.calib.shard import prepare_shard

        shard_pass, given = prepare_shard(batcher, shard, ranges, opts, model_path, tensors)
        need_hist = shard_pass == "histogram"
    elif keep_batches is not None:
        raise UsageError("--keep-batches is for the two passes of a shard", "pass --shard I/N with it")
    # Relu/Clip outputs whose range follows from their input's are not exposed by ONNX Runtime in
    # the max pass (trtq.calib.derive)
    links = monotone_links(model, tensors)
    measured = [t for t in tensors if t not in links]
    collector = OrtCollector(model, measured if given is None else tensors, opts.providers)
    if need_hist:  # load numba and the kernel while pass 1 runs (its first use is in pass 2)
        threading.Thread(target=numba_enabled, name="trtq-numba-warmup", daemon=True).start()
    stages = 2 if need_hist and given is None else 1

    started = time.perf_counter()
    samples = 0
    batches = 0

    def stream(stage: str, index: int, update, source):
        nonlocal samples, batches
        t0 = time.perf_counter()
        done_batches = done_samples = 0
        for batch in source:
            interrupt.check()
            update(collector.run(batch.arrays, batch.valid))
            done_batches += 1
            done_samples += batch.valid
            if progress is not None:
                progress(Progress(stage, index, stages, done_batches, batcher.num_batches, done_samples,
                                  time.perf_counter() - t0))
        samples, batches = done_samples, done_batches

    with ReplayedBatches(batcher, enabled=need_hist and given is None) as replay:
        if given is None:
            maxima_acc = AbsMaxAccumulator()
            source = replay.first()
            if keep_batches is not None and write and replay_worthwhile(batcher):
                from trtq.calib.batchfile import write_through

                source = write_through(source, Path(keep_batches), batcher)
            stream("max", 1, maxima_acc.update_batch, source)
            if samples == 0:
                raise DataError("no samples were usable for calibration", "check the data folder and --skip-bad report")
            derived = derive_extremes(maxima_acc.extremes, links)
            maxima_acc.add_derived({name: abs_max(derived[name]) for name in links})
            maxima = maxima_acc.maxima
        else:
            maxima = given  # pass 2 of a shard: the merged ranges of pass 1
        counts = zeros = None
        if need_hist:
            if not numba_enabled():
                log.info("histograms on the numpy fallback; pip install numba makes this pass ~2x faster")
            hist = HistogramAccumulator(maxima, num_bins=opts.num_bins)
            # pass 2 needs every tensor: a session that exposes them all (the first one is freed
            # first, so the peak holds one set of activations)
            if given is None:
                collector = None
                collector = OrtCollector(model, tensors, opts.providers)
            if given is None:
                source = replay.second()
            else:
                source = None
                if keep_batches is not None:
                    from trtq.calib.batchfile import open_batches

                    source = open_batches(Path(keep_batches), batcher)
                source = batcher if source is None else source
            stream("histogram", stages, hist.update_batch, source)
            if samples == 0:
                raise DataError("no samples were usable for calibration", "check the data folder and --skip-bad report")
            counts = hist.counts
            zeros = hist.zeros
            if hist.exceeded:
                log.warning(
                    "%d tensor(s) had values above their first-pass max in the second pass (data not "
                    "deterministic?): %s; they were counted in the last bin",
                    len(hist.exceeded), ", ".join(sorted(hist.exceeded)[:5]))
    if shard_pass == "ranges":  # a pass-1 shard: maxima only, histograms come in pass 2
        import numpy as np

        counts = {n: np.zeros(opts.num_bins, dtype=np.int64) for n in tensors}
        zeros = {n: 0 for n in tensors}
    raw_amax = compute_all("max" if shard_pass else opts.method, maxima, counts, opts.percentile, zeros)
    amax, zero = _finalize_amax({name: float(raw_amax[name]) for name in tensors})
    seconds = time.perf_counter() - started

    provenance = build_provenance(cfg, model_path, specs, batcher, samples, trt_version, algorithm, amax)
    out = Path(opts.output)
    stats_path = Path(opts.save_stats) if opts.save_stats else None
    if write:
        from trtq.interrupt import held_for_outputs

        with held_for_outputs():  # statistics, cache and provenance as one step for Ctrl-C / SIGTERM
            if stats_path is not None:
                meta = {k: v for k, v in provenance.items() if k not in ("amax", "method", "algorithm")}
                meta["tensors"] = tensors
                if shard_pass is not None:
                    from trtq.calib.shard import ranges_sha256

                    meta["shard"] = {"index": shard[0], "count": shard[1], "pass": shard_pass,
                                     "ranges_sha256": ranges_sha256(given) if given is not None else None}
                save_stats(stats_path, {n: maxima[n] for n in tensors}, {n: counts[n] for n in tensors}, meta,
                           {n: zeros[n] for n in tensors})
            if shard_pass is None:
                _write_outputs(out, algorithm, trt_version, amax, provenance)
    return CalibrationResult(
        cache_path=out if write and shard_pass is None else None, method=opts.method, algorithm=algorithm, trt_version=trt_version,
        amax=amax, samples=samples, batches=batches, seconds=seconds, stats_path=stats_path,
        skipped=list(getattr(batcher, "skipped", [])), zero_tensors=zero, providers=list(collector.providers),
    )


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
    shard = meta.get("shard") if isinstance(meta.get("shard"), dict) else None
    if shard is not None and shard.get("index") is not None and int(shard.get("count", 1)) > 1:
        raise CacheError(f"{stats_path} is shard {shard['index']}/{shard['count']} only",
                         "merge all shards first: trtq merge-stats part-*.npz -o merged.npz")
    if shard is not None and shard.get("pass") == "ranges" and opts.method != "max":
        raise CacheError(f"{stats_path} holds pass-1 ranges only; --method {opts.method} needs histograms",
                         "run pass 2 (trtq calibrate --shard I/N --ranges this.npz --save-stats ...) and merge it, "
                         "or use --method max")
    model_meta = meta.get("model") or {}
    if cfg.model:
        actual = sha256_file(cfg.model)
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
    tensors = list(meta.get("tensors") or list(stats.maxima))
    raw = compute_all(opts.method, stats.maxima, stats.counts, opts.percentile, stats.zeros)
    amax, zero = _finalize_amax({n: float(raw[n]) for n in tensors})
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
        zero_tensors=zero,
    )
