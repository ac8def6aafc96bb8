"""``trtq build --tune-placement``: build the candidate Q/DQ placements, time them on the GPU, score
them on the data, and keep the fastest whose task metric stays within a tolerance of the default's.

The search, greedy and bounded by ``build.tune_builds`` TensorRT builds (each candidate one build,
one at a time: concurrent builds disturb the builder's tactic timing):

1. the configured placement (the *default*, whose metric the tolerance is measured from), then
   the other placements of :data:`PLACEMENTS`;
2. on a model with attention cores and ``quantize.attention: float``, the best placement with them
   in INT8 (:meth:`Tuner.attention_int8`, docs/decisions.md D34); on TensorRT 8 the MatMuls that
   read the Softmax output stay float in it (:func:`attention_kept_float`);
3. the guided candidate (:mod:`trtq.pipeline.tune_guided`, ``build.tune_guided``, TensorRT <= 10):
   TensorRT's implicit INT8 engine from the same cache is built (one of the builds), and the
   quantized nodes it ran from float input are left float on top of the best engine;
4. from the best engine so far, the layers TensorRT ran in float between INT8 layers (the
   coverage report's fallbacks) map back to the quantized ONNX nodes their names carry
   (:func:`trtq.trt.coverage.layer_nodes`); those nodes are left float (their Q/DQ pairs gone, so
   no INT8<->float conversion around a layer TensorRT runs in float anyway): all of them in one
   candidate, then, when that one is not kept, one fallback layer's nodes at a time;
5. the float reference (:mod:`trtq.pipeline.tune_float`, ``build.tune_float``): the model without
   Q/DQ built in FP16 and timed beside the kept engine, reported (or written, ``keep``) when faster.
   It is one build beyond ``build.tune_builds``.

Every candidate is built with one timing cache (the user's ``--timing-cache`` or a temporary one),
so layers the candidates share get the same tactics, until TensorRT refuses it (8.6 refuses a cache
with Myelin entries another network wrote; the rest then build without). Each is timed side by side
with the best engine so far (alternating, :data:`TIME_ROUNDS` rounds, median of the round
medians) and compared with the FP32 model on the data (:func:`trtq.pipeline.compare.compare`: the
task metric, the least over the outputs that have one; the output SQNR when no output has a task),
and its slowest layers are recorded. A candidate replaces the best
when it is at least :data:`MIN_GAIN` faster and its metric is no more than the tolerance below the
default's. The kept engine is the one that was timed and scored: its bytes become ``output`` with
the search in its metadata (``tuning``). Candidates whose Q/DQ model equals one built before are
not built again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from trtq.config import BuildOptions
from trtq.errors import TrtqError, UsageError
from trtq.pipeline.tune_candidates import (
    MIN_GAIN,
    SQNR,
    Candidate,
    acceptable,
    engine_score,
    faster,
    rounded,
    time_side_by_side,
)

log = logging.getLogger(__name__)

PLACEMENTS = ("standard", "shared")  # fused lost to both on every model of the engine table (D28)


def check_tuning(cfg: Any, cache_path: Path | None) -> None:
    """Refuse what --tune-placement cannot tune, before anything is read (exit 2)."""
    from trtq.pipeline.placement_from import refuse_with_search

    b = cfg.build
    refuse_with_search(cfg.quantize)
    if b.precision != "int8" or b.mode != "explicit":
        raise UsageError(
            f"--tune-placement places Q/DQ nodes: it builds explicit INT8 only (this build is "
            f"{b.precision if b.precision != 'int8' else 'implicit INT8'})",
            "drop --tune-placement, or build --precision int8 --mode explicit",
        )
    if cache_path is None:
        raise UsageError(
            "--tune-placement quantizes the FP32 model with a calibration cache: pass --cache",
            "trtq calibrate writes one; a Q/DQ model's placement is already fixed",
        )
    if not cfg.data.inputs:
        raise UsageError(
            "--tune-placement scores every candidate engine against the FP32 model on data: none given",
            "pass --data DIR --preprocess PRESET (the calibration images), or a config with data.inputs",
        )
    if b.tune_float == "keep" and b.require_int8:
        raise UsageError(
            "--tune-float keep may write an FP16 engine, and --require-int8 fails any engine that is not INT8",
            "drop one of them (--tune-float report only says when FP16 is faster)",
        )
    if b.tune_builds < 2:
        raise UsageError(f"--tune-builds must be at least 2, got {b.tune_builds}", "e.g. --tune-builds 8")
    if not 0.0 <= b.tune_tolerance < 1.0:
        raise UsageError(
            f"--tune-tolerance is the task metric a candidate may lose, a fraction: got {b.tune_tolerance}",
            "e.g. --tune-tolerance 0.005",
        )
    limit = cfg.compare.limit
    if limit is not None and int(limit) <= 0:
        raise UsageError(f"--limit must be a positive number of samples, got {limit}", "e.g. --limit 256")
    if b.tune_sqnr_drop_db < 0:
        raise UsageError(f"build.tune_sqnr_drop_db must be >= 0, got {b.tune_sqnr_drop_db}", "e.g. 1.0")


def check_scoring_data(cfg: Any, model: Any) -> None:
    """The data every candidate is scored on, checked against the model before the first build
    (names, batch size, shapes, sample counts: a DataError, exit 3), not after it."""
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs

    Batcher(cfg.data, input_specs(model))


def has_attention(model: Any) -> bool:
    """Whether ``model`` has an attention core (a MatMul of two activations feeding or fed by a
    Softmax, :func:`trtq.quantize.rules.attention_matmuls`)."""
    from trtq.quantize.rules import attention_matmuls

    return model is not None and bool(attention_matmuls(model))


def attention_kept_float(model: Any) -> tuple[str, ...]:
    """The attention MatMuls the attention candidate leaves float for the installed TensorRT: on
    TensorRT 8 those that read the Softmax output, which 8.6.0 computed wrongly in INT8 while the
    score MatMuls alone were right (docs/decisions.md D34); none elsewhere."""
    from trtq.quantize.rules import attention_matmuls
    from trtq.trt import compat

    version = compat.installed_version()
    if not compat.int8_attention_is_unsafe_for(str(version) if version else None):
        return ()
    return tuple(attention_matmuls(model, values_only=True))


def fallback_groups(best: Candidate) -> list[tuple[str, ...]]:
    """Per fallback layer of ``best``'s engine (slowest first), the quantized nodes its name
    carries that ``best`` does not leave float already; layers naming none are skipped."""
    from trtq.trt.coverage import layer_nodes

    if best.coverage is None:
        return []
    quantized = set(best.quantized) - set(best.left_float)
    layers = sorted(best.coverage.fallbacks, key=lambda name: -float(best.layer_times.get(name, 0.0)))
    groups: list[tuple[str, ...]] = []
    for name in layers:
        nodes = tuple(n for n in layer_nodes(name, quantized) if not any(n in g for g in groups))
        if nodes:
            groups.append(nodes)
    return groups


class Tuner:
    """One --tune-placement search (module doc): candidates built into a temporary folder."""

    def __init__(self, cfg: Any, inputs: Any, options: BuildOptions, folder: Path, timer=None):
        from trtq.fileio import declare_outputs

        self.cfg, self.inputs, self.folder = cfg, inputs, folder
        self.timer = timer or time_side_by_side  # plans -> median ms each, timed side by side
        timing = options.timing_cache or str(folder / "timing.cache")
        self.options = dataclasses.replace(options, timing_cache=timing, require_int8=False)
        declare_outputs([timing])
        self.digests: dict[str, Candidate] = {}
        self.tried: list[Candidate] = []
        self.builds = 0
        self.metric_name = ""
        self.samples = 0
        self.reference: Candidate | None = None  # the FP16 engine without Q/DQ (trtq.pipeline.tune_float)
        self.reference_int8_ms: float | None = None  # the kept INT8 engine's time beside it
        self.implicit: Any = None  # TensorRT's implicit engine (trtq.pipeline.tune_guided.ImplicitEngine)

    def attention_of(self, c: Candidate) -> str:
        """The ``quantize.attention`` candidate ``c`` is built with ("" in it: the configured one)."""
        return c.attention or self.inputs.quantize_options.attention

    def evaluate(self, c: Candidate) -> bool:
        """Build, profile and score ``c``; False when it was not built (a duplicate, a failure)."""
        from trtq.fileio import declare_outputs
        from trtq.pipeline.build import build_network, network_for
        from trtq.trt.coverage import int8_coverage, layer_kind

        self.tried.append(c)
        qopts = dataclasses.replace(
            self.inputs.quantize_options,
            placement=c.placement,
            exclude=tuple(self.inputs.quantize_options.exclude) + c.left_float,
            attention=self.attention_of(c),
        )
        network = network_for(self.inputs, qopts)
        digest = hashlib.sha256(network.model.SerializeToString()).hexdigest()
        if digest in self.digests:
            c.verdict = f"same Q/DQ model as {self.digests[digest].label}: not built again"
            log.info("tune: %s: %s", c.label, c.verdict)
            return False
        self.digests[digest] = c
        c.quantized = network.quantized
        c.plan = self.folder / f"candidate-{len(self.tried)}.plan"
        declare_outputs([c.plan, f"{c.plan}.json"])
        self.builds += 1
        t0 = time.perf_counter()
        try:
            built = build_network(self.inputs, network, c.plan, self.options)
        except TrtqError as e:
            c.verdict, c.plan = f"build failed: {e.message}", None
            log.warning("tune: %s: %s", c.label, c.verdict)
            return False
        c.build_seconds = time.perf_counter() - t0
        times, inspected = built.layers()
        c.coverage, c.layer_times = int8_coverage(inspected, times), times
        c.layer_kinds = {str(x["Name"]): layer_kind(x) for x in inspected if isinstance(x, dict) and "Name" in x}
        self._check_timing_cache(built.metadata)
        name, c.metric, self.samples = engine_score(self.cfg, self.inputs.model_path, c.plan)
        self.metric_name = self.metric_name or name
        return True

    def _check_timing_cache(self, metadata: dict) -> None:
        """Build the rest without the timing cache once TensorRT refused it (``metadata``: the
        candidate's plan metadata): TensorRT 8.6 refuses a cache with Myelin entries written for
        another network ("Myelin error from unknown graph"), which every other candidate is."""
        timing = metadata.get("timing_cache") or {}
        if timing.get("problem") and self.options.timing_cache:
            log.info(
                "tune: TensorRT refused the timing cache (%s): the other candidates build without one",
                timing["problem"],
            )
            self.options = dataclasses.replace(self.options, timing_cache=None)

    @property
    def tolerance(self) -> float:
        """The metric a kept candidate may lose: in dB of SQNR when that is the metric."""
        o = self.options
        return o.tune_sqnr_drop_db if self.metric_name == SQNR else o.tune_tolerance

    def within_tolerance(self, c: Candidate, default: Candidate) -> bool:
        return acceptable(float(c.metric), float(default.metric), self.tolerance)

    def challenge(self, best: Candidate, c: Candidate, default: Candidate) -> Candidate:
        """``c`` (built) against ``best``, timed side by side: the one that stays best."""
        best.median_ms, c.median_ms = self.timer([best.plan, c.plan])
        ok = self.within_tolerance(c, default)
        quick = faster(c.median_ms, best.median_ms)
        c.verdict = (
            "kept"
            if ok and quick
            else ("metric below the tolerance" if not ok else f"not {MIN_GAIN:.0%} faster than {best.label}")
        )
        log.info(
            "tune: %s: %.3f ms (best %.3f ms), %s %.4f: %s",
            c.label,
            c.median_ms,
            best.median_ms,
            self.metric_name,
            c.metric,
            c.verdict,
        )
        if ok and quick:
            best.verdict = best.verdict if best.verdict == "default" else f"replaced by {c.label}"
            return c
        return best

    def room(self, waiting: int) -> bool:
        """Whether another build fits ``build.tune_builds`` (``waiting``: candidates left to try)."""
        if self.builds < self.options.tune_builds:
            return True
        log.info("tune: --tune-builds %d reached: %d candidate(s) not tried", self.options.tune_builds, waiting)
        return False

    def attention_int8(self, best: Candidate, default: Candidate) -> Candidate:
        """``best`` with its attention cores quantized, when the model has some and the configured
        ``quantize.attention`` keeps them float (D34: opt-in until engines of it are measured; a
        candidate is built, timed and scored like any other, so a slower or worse one is dropped)."""
        if self.inputs.quantize_options.attention != "float" or not has_attention(self.inputs.model):
            return best
        if not self.room(1):
            return best
        c = Candidate(best.placement, best.left_float + attention_kept_float(self.inputs.model), attention="int8")
        if self.evaluate(c):
            return self.challenge(best, c, default)
        return best

    def guided(self, best: Candidate, default: Candidate) -> Candidate:
        """The guided candidate against ``best`` (tune_guided.py); it needs two builds."""
        if not self.options.tune_guided:
            return best
        if self.builds + 2 > self.options.tune_builds:
            log.info("tune: --tune-builds %d leaves no room for the guided candidate", self.options.tune_builds)
            return best
        from trtq.pipeline.tune_guided import guided_candidate

        c = guided_candidate(self, best)
        if c is not None and self.evaluate(c):
            return self.challenge(best, c, default)
        return best

    def run(self) -> tuple[Candidate, Candidate]:
        """(the default candidate, the kept one)."""
        from trtq.compare.tasks import moves_per_sample

        placement = self.inputs.quantize_options.placement_used()
        default = Candidate(placement)
        if not self.evaluate(default):
            raise TrtqError(
                f"--tune-placement: the default placement does not build ({default.verdict})",
                "run trtq build -v without --tune-placement for TensorRT's messages",
            )
        default.verdict = "default"
        log.info("tune: default %s: %s %.4f", default.label, self.metric_name, default.metric)
        if moves_per_sample(self.metric_name) and self.samples and self.tolerance < 1.0 / self.samples:
            log.warning(
                "tune: on %d samples the %s moves in steps of %.4f, more than --tune-tolerance %g: only "
                "candidates that change no sample's verdict can be kept (give more data or a larger tolerance)",
                self.samples,
                self.metric_name,
                1.0 / self.samples,
                self.tolerance,
            )
        best = default
        # centring's engine form takes the standard pairs only (check_centering_options)
        centred = self.inputs.quantize_options.center_activations
        others = [p for p in PLACEMENTS if p != placement and (p == "standard" or not centred)]
        for i, other in enumerate(others):
            if not self.room(len(others) - i):
                break
            c = Candidate(other)
            if self.evaluate(c):
                best = self.challenge(best, c, default)
        best = self.attention_int8(best, default)
        best = self.guided(best, default)
        groups = fallback_groups(best)
        if len(groups) > 1 and self.room(len(groups) + 1):  # every fallback's nodes float at once
            every = best.left_float + tuple(n for g in groups for n in g)
            c = Candidate(best.placement, every, attention=best.attention)
            if self.evaluate(c) and self.challenge(best, c, default) is c:
                best, groups = c, []
        for i, nodes in enumerate(groups):
            if not self.room(len(groups) - i):
                break
            c = Candidate(best.placement, best.left_float + nodes, attention=best.attention)
            if self.evaluate(c):
                best = self.challenge(best, c, default)
        if best.median_ms is None:  # nothing challenged it: time it once for the record
            best.median_ms = self.timer([best.plan])[0]
        return default, best

    def record(self, default: Candidate, best: Candidate, written: Candidate | None = None) -> dict[str, Any]:
        """The search for the plan metadata (``written``: the engine written, when not ``best``)."""
        from trtq.pipeline.tune_float import PRECISION, reference_record

        float_kept = written is not None and written is not best
        return {
            "chosen": (
                {"precision": PRECISION, "placement": None, "left_float": []}
                if float_kept
                else {
                    "precision": "int8",
                    "placement": best.placement,
                    "left_float": list(best.left_float),
                    "attention": self.attention_of(best),
                }
            ),
            "metric": self.metric_name,
            "tolerance": self.tolerance,
            "default_metric": rounded(default.metric, 5),
            "min_gain": MIN_GAIN,
            "builds": self.builds,
            "max_builds": self.options.tune_builds,
            "samples": self.samples,
            "candidates": [c.record() for c in self.tried],
            "implicit": self.implicit.record() if self.implicit is not None else None,
            "float_reference": reference_record(self),
        }


def tune_placement(cfg: Any, model_path: Path, cache_path: Path, output: Path) -> Any:
    """``trtq build --tune-placement``: the kept candidate's engine at ``output`` (module doc); a
    BuildResult whose metadata carries the search (``tuning``) and whose coverage is the engine's."""
    from trtq.pipeline.build import checked_build_inputs, checked_coverage
    from trtq.pipeline.tune_float import weigh_float_reference
    from trtq.trt.build import BuildResult, write_plan
    from trtq.trt.metadata import read_metadata

    check_tuning(cfg, cache_path)
    t0 = time.perf_counter()
    inputs = checked_build_inputs(Path(model_path), Path(output), cfg.build, Path(cache_path), cfg.quantize, cfg.data)
    check_scoring_data(cfg, inputs.model)
    folder = Path(tempfile.mkdtemp(prefix="trtq-tune-"))
    try:
        tuner = Tuner(cfg, inputs, cfg.build, folder)
        default, best = tuner.run()
        written = weigh_float_reference(tuner, best, default)
        meta = dict(read_metadata(written.plan) or {})
        meta["tuning"] = tuner.record(default, best, written)
        meta["build_seconds"] = round(time.perf_counter() - t0, 3)
        if not cfg.build.timing_cache:  # the search's own timing cache went with its folder
            meta["timing_cache"] = None
        write_plan(Path(output), written.plan.read_bytes(), meta)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log.info(
        "tune: kept %s: %.3f ms, %s %.4f (default %s: %s %.4f) after %d build(s)",
        best.label,
        best.median_ms,
        tuner.metric_name,
        best.metric,
        default.label,
        tuner.metric_name,
        default.metric,
        tuner.builds,
    )
    if written is not best:
        log.info(
            "tune: wrote the FP16 engine without Q/DQ: %.3f ms against %.3f ms",
            written.median_ms,
            tuner.reference_int8_ms,
        )
    result = BuildResult(plan_path=Path(output), metadata=meta, seconds=time.perf_counter() - t0)
    if written is best:
        result.coverage = checked_coverage(Path(output), cfg.build.require_int8)
    return result
