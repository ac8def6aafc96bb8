"""The ONNX Runtime passes of a calibration: data -> FP32 activations -> statistics.

mse, percentile and max take one streaming pass: histograms over power-of-two ranges that grow by
exact bin merges (trtq.calib.collect.one_pass), each sample's elements subsampled by a fixed stride
past ``hist_elements``, the max over every element. entropy (TensorRT's EntropyCalibration2) and
``max`` with ``--save-stats`` or a shard take two: pass 1 finds max|x| per tensor, pass 2
histograms every element over the fixed edges ``linspace(0, max, bins + 1)``. Either way the
histograms are exactly additive, so the result does not depend on batch size, order or sharding.
Memory holds one batch of activations plus the histograms (bins x tensors x 8 bytes).

:func:`collect` runs the passes a :class:`Setup` (made by trtq.pipeline.calibrate, which checks
the model, the data and the options first) asks for and returns the :class:`Statistics`; the
ranges are computed from them by trtq.calib.stats, and pipeline.calibrate writes the files.
"""

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from trtq import interrupt
from trtq.errors import DataError, UsageError

log = logging.getLogger(__name__)


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


ProgressFn = Callable[[Progress], None]


@dataclass
class Setup:
    """What a calibration run works on, checked before any batch is read."""

    opts: Any
    model_path: Path
    model: Any
    specs: list[Any]
    batcher: Any
    tensors: list[str]
    need_hist: bool
    budget: int  # bytes one batch of collected activations may take (--max-memory, resolved once)
    slice_at: Optional[int] = None  # bytes above which a batch runs in slices of rows (budget.slice_target)
    shard_pass: Optional[str] = None  # a shard's "ranges" (pass 1) or "histogram" (pass 2)
    given: Optional[dict[str, float]] = None  # pass 2 of a shard: the merged ranges of pass 1
    tensor_groups: int = 1  # ONNX Runtime calls per batch (--max-memory)
    rows_per_call: Optional[int] = None  # rows of a batch per call when --max-memory slices batches
    feed_mode: Optional[str] = None  # a fixed-batch-1 model: "batched" or "per-sample" (trtq.calib.collect.batch_one)
    one_pass: bool = False  # mse / percentile: power-of-two histograms in one pass (trtq.calib.collect.one_pass)
    subsampled: int = 0  # tensors histogrammed on a stride (one-pass runs)
    collect_mode: str = "outputs"  # "in-graph" (trtq.calib.collect.ingraph) or "outputs" (trtq.calib.collect.exposed)
    leading: set = field(default_factory=set)  # one pass: tensors whose leading dim is the batch (subsampled)
    padded: dict = field(default_factory=dict)  # zero-padded outputs taken from their input (trtq.calib.collect.padded)

    @property
    def counted(self) -> list[str]:
        """The tensors the collector runs: all but the zero-padded outputs."""
        return [t for t in self.tensors if t not in self.padded]


_NUMPY_FALLBACK = (
    "histograms on the numpy fallback; reinstalling trtq where a C compiler is found makes this pass faster"
)


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
                self.progress(
                    Progress(
                        stage,
                        index,
                        self.stages,
                        done_batches,
                        self.batcher.num_batches,
                        done_samples,
                        time.perf_counter() - t0,
                    )
                )
        self.samples, self.batches = done_samples, done_batches
        if self.samples == 0:
            raise DataError("no samples were usable for calibration", "check the data folder and --skip-bad report")


@dataclass
class Statistics:
    """What the passes measured, per tensor, and how."""

    maxima: dict[str, float]
    counts: Any  # name -> int64 counts; None after a max pass alone
    zeros: Any  # name -> exact zeros; None after a max pass alone
    tops: Any  # one pass: name -> the histogram's upper edge (a power of two); else None
    samples: int
    batches: int
    providers: list[str]
    collection: dict  # how the statistics were gathered (the provenance's "collection", less "tensors")
    seconds: float  # the passes, from the first batch on


def collect(run: Setup, progress: Optional[ProgressFn] = None, keep_batches: Optional[Path] = None) -> Statistics:
    """Run the passes ``run`` needs over its batches. ``keep_batches``: pass 1 of a shard writes its
    decoded batches there, pass 2 reads them back (trtq.calib.collect.kept_batches)."""
    from trtq.calib.collect.derive import monotone_links
    from trtq.calib.collect.kernels import warm_up

    # Relu/Clip outputs whose range follows from their input's are not exposed by ONNX Runtime in
    # the max pass (trtq.calib.collect.derive)
    links = monotone_links(run.model, run.tensors)
    measured = [t for t in run.counted if t not in links]
    if run.need_hist:  # load the kernels while the session starts
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
        maxima, counts, zeros = _passes(run, stream, links, keep_batches, keep_batches)
    return Statistics(
        maxima,
        counts,
        zeros,
        tops,
        stream.samples,
        stream.batches,
        list(stream.collector.providers),
        _collection(run),
        time.perf_counter() - started,
    )


def _collection(run: Setup) -> dict:
    """How the statistics were gathered, for the provenance (the tensor selection is the caller's)."""
    collection = {
        "mode": run.collect_mode,
        "tensor_groups": run.tensor_groups,
        "rows_per_call": run.rows_per_call,
        "fixed_batch_1": run.feed_mode,
        # zero-padded outputs whose statistics came from their inputs
        "padded_from_input": len(run.padded),
    }
    if run.one_pass:
        collection["histograms"] = {
            "edges": "pow2",
            "hist_elements": run.opts.hist_elements,
            "subsampled_tensors": run.subsampled,
        }
    if run.need_hist:
        from trtq.calib.collect.kernels import implementation

        collection["kernels"] = implementation()  # same results on each; for timings
    return collection


def _collector(run: Setup, tensors: list[str]) -> Any:
    """ONNX Runtime over ``tensors``, in groups when one batch of them exceeds --max-memory."""
    from trtq.calib.collect.budgeted import GroupedCollector

    collector = GroupedCollector(
        run.model, tensors, run.opts.providers, run.budget, dict(run.batcher.shapes), slice_at=run.slice_at
    )
    run.tensor_groups = max(run.tensor_groups, len(collector.groups))
    if collector.rows_per_call < collector.batch:
        run.rows_per_call = min(run.rows_per_call or collector.batch, collector.rows_per_call)
    return collector


def _passes(
    run: Setup, stream: _Stream, links: Any, write_batches: Optional[Path], read_batches: Optional[Path]
) -> tuple[dict[str, float], Any, Any]:
    """Pass 1 (maxima; skipped in pass 2 of a shard) and pass 2 (histograms, when needed):
    (maxima, counts or None, zeros or None)."""
    from trtq.calib.collect.accumulators import AbsMaxAccumulator
    from trtq.calib.collect.derive import abs_max, derive_extremes
    from trtq.calib.collect.replay import ReplayedBatches
    from trtq.calib.collect.replay import _decodes_images as replay_worthwhile  # .npy inputs are memory-mapped

    with ReplayedBatches(run.batcher, enabled=run.need_hist and run.given is None) as replay:
        if run.given is None:
            maxima_acc = AbsMaxAccumulator()
            source = replay.first()
            if write_batches is not None and replay_worthwhile(run.batcher):
                from trtq.calib.collect.kept_batches import write_through

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


def _pow2_histograms(run: Setup) -> Any:
    """The one pass's histograms (trtq.calib.collect.one_pass), empty."""
    from trtq.calib.collect.batch_leading import batch_leading, one_sample_calls
    from trtq.calib.collect.one_pass import Pow2Histograms

    opts = run.opts
    run.leading = batch_leading(run.model, run.tensors) if opts.hist_elements else set()
    return Pow2Histograms(run.tensors, opts.num_bins, opts.hist_elements, run.leading, one_sample_calls(run.model))


def _any_collector(run: Setup, tensors: list[str]) -> Any:
    """The in-graph collector where it runs, else the outputs collector (``--collect``)."""
    return _ingraph_collector(run, tensors) or _collector(run, tensors)


def _ingraph_collector(run: Setup, tensors: list[str]) -> Any:
    """The in-graph collector (trtq.calib.collect.ingraph) over ``tensors`` when ``--collect`` allows it
    and it runs here; else None (the outputs collector)."""
    from trtq.errors import ModelError

    opts = run.opts
    if opts.collect == "outputs":
        return None
    from trtq.calib.collect import ingraph
    from trtq.calib.collect.batch_leading import one_sample_calls
    from trtq.calib.collect.budgeted import batch_dim_free

    why = ingraph.unavailable(opts.providers)
    if why is None:
        try:
            collector = ingraph.InGraphCollector(
                run.model,
                tensors,
                opts.num_bins,
                opts.providers,
                free_batch=batch_dim_free(run.model, dict(run.batcher.shapes)),
                hist_elements=opts.hist_elements if run.one_pass else 0,
                leading=run.leading,
                one_sample=run.one_pass and one_sample_calls(run.model),
            )
            run.collect_mode = "in-graph"
            return collector
        except ModelError as e:
            why = e.message
    if opts.collect == "in-graph":
        raise UsageError(f"--collect in-graph cannot run here: {why}", "pass --collect outputs (or auto)")
    log.info("statistics from exposed outputs: %s", why)
    return None


def _one_pass(run: Setup, stream: _Stream, hist: Any) -> tuple[Any, Any, Any, Any]:
    """mse / percentile: power-of-two histograms in one pass; (maxima, counts, zeros, tops)."""
    from trtq.calib.collect.kernels import pow2_kernel

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
        from trtq.calib.collect.padded import derive_pow2

        derive_pow2(run.padded, hist.maxima, hist.counts, hist.zeros, hist.exponents, hist.strides, stream.samples)
    run.subsampled = len(hist.strides)
    if opts.hist_elements:
        log.info(
            "%d of %d tensors histogrammed on a stride (at most %d elements per sample); %d whole",
            len(hist.strides),
            len(run.tensors),
            opts.hist_elements,
            len(run.tensors) - len(hist.strides),
        )
    return hist.maxima, hist.counts, hist.zeros, hist.tops


def _histogram_pass(
    run: Setup, stream: _Stream, maxima: dict[str, float], replay: Any, read_batches: Optional[Path]
) -> tuple[Any, Any]:
    """Pass 2: histograms over the fixed edges of ``maxima``; (counts, zeros)."""
    from trtq.calib.collect.accumulators import HistogramAccumulator
    from trtq.calib.collect.kernels import two_pass_kernel

    if two_pass_kernel() is None:
        log.info(_NUMPY_FALLBACK)
    hist = HistogramAccumulator(maxima, num_bins=run.opts.num_bins)
    # pass 2 runs in pass 1's session: collect() gave it every counted tensor when there are two
    if run.given is None:
        source = replay.second()
    else:
        source = None
        if read_batches is not None:
            from trtq.calib.collect.kept_batches import open_batches

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
            len(hist.exceeded),
            ", ".join(sorted(hist.exceeded)[:5]),
        )
    counts, zeros = hist.counts, hist.zeros  # copies
    if run.padded:
        from trtq.calib.collect.padded import derive_counts

        derive_counts(run.padded, counts, zeros, stream.samples)
    return counts, zeros


def _nothing(_part: Any) -> None:
    """The per-batch update of an in-graph pass: ONNX Runtime's nodes did it."""
