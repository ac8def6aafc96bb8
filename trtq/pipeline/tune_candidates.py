"""The candidates of a ``build --tune-placement`` search: one engine each (a placement, the
nodes it leaves float, or a float reference), how it is scored against the FP32 model
(:func:`engine_score`), timed beside another (:func:`time_side_by_side`) and accepted
(:func:`acceptable`, :func:`faster`). The search is :mod:`trtq.pipeline.tune`; its references
(:mod:`trtq.pipeline.tune_float`, :mod:`trtq.pipeline.tune_guided`) use the same pieces."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from trtq.config import BenchOptions
from trtq.trt.coverage import slowest_layers

MIN_GAIN = 0.01  # a candidate replaces the best engine only when this much faster, side by side
TIME_ROUNDS = 3
ROUND = BenchOptions(duration=0.5, warmup=0.2)
SQNR = "output SQNR (dB)"
SLOWEST = 8  # slowest layers recorded per candidate


@dataclasses.dataclass
class Candidate:
    placement: str
    left_float: tuple[str, ...] = ()
    plan: Path | None = None
    median_ms: float | None = None
    metric: float | None = None
    coverage: Any = None
    layer_times: dict = dataclasses.field(default_factory=dict)
    layer_kinds: dict = dataclasses.field(default_factory=dict)  # layer name -> int8 / conversion / float ...
    quantized: tuple[str, ...] = ()
    verdict: str = ""
    build_seconds: float = 0.0
    source: str = ""  # "implicit": the nodes left float are those TensorRT's implicit engine ran in float
    attention: str = ""  # quantize.attention for this candidate ("": the configured one)

    @property
    def label(self) -> str:
        return candidate_label(self.placement, self.left_float, self.attention)

    def record(self) -> dict[str, Any]:
        cov = self.coverage
        return {
            "placement": self.placement,
            "left_float": list(self.left_float),
            "median_ms": rounded(self.median_ms, 4),
            "metric": rounded(self.metric, 5),
            "int8_time_share": rounded(getattr(cov, "time_share", None), 4),
            "fallbacks": len(cov.fallbacks) if cov is not None else None,
            "conversions": len(cov.conversions) if cov is not None else None,
            "build_seconds": round(self.build_seconds, 1),
            "verdict": self.verdict,
            "source": self.source or None,
            "attention": self.attention or None,
            "slowest_layers": self.slowest(),
        }

    def slowest(self, n: int = SLOWEST) -> list[list]:
        """[name, mean profiled ms, kind] of the engine's ``n`` slowest layers (what to look at next)."""
        return slowest_layers(self.layer_times, self.layer_kinds, n)


def candidate_label(placement: str, left_float, attention: str | None = None) -> str:
    """How reports name a candidate: its placement, how many nodes it leaves float and, when the
    candidate sets it, its attention setting."""
    label = placement + (f" + attention {attention}" if attention else "")
    return label + (f" + {len(left_float)} node(s) float" if left_float else "")


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), digits)


def engine_score(cfg: Any, model_path: Path, plan: Path) -> tuple[str, float, int]:
    """(metric name, value, samples) of the engine ``plan`` against the FP32 model on ``cfg.data``:
    the least task metric over the outputs that have one, else the least output SQNR in dB."""
    from trtq.compare.accuracy import gated_values
    from trtq.pipeline.compare import compare

    report, _ = compare(cfg, model_path, plan)
    gated = gated_values(report.outputs)
    if gated:
        values = [float("-inf") if v is None or math.isnan(v) else float(v) for _, _, v in gated]
        names = sorted({name for _, name, _ in gated})
        return (names[0] if len(names) == 1 else "least task metric"), min(values), report.samples
    sqnr = [float("-inf") if o.sqnr_db is None or math.isnan(o.sqnr_db) else float(o.sqnr_db) for o in report.outputs]
    return SQNR, min(sqnr) if sqnr else float("-inf"), report.samples


def time_side_by_side(plans: list[Path], rounds: int = TIME_ROUNDS) -> list[float]:
    """Median ms of each plan, timed in alternation (``rounds`` rounds of :data:`ROUND`), the
    median of its round medians: a clock or thermal drift hits every plan alike."""
    from trtq.trt.bench import bench_plan

    medians: list[list[float]] = [[] for _ in plans]
    for _ in range(rounds):
        for i, plan in enumerate(plans):
            medians[i].append(bench_plan(plan, ROUND).median_ms)
    return [statistics.median(m) for m in medians]


def acceptable(candidate: float, default: float, tolerance: float) -> bool:
    """Whether a candidate's metric is within ``tolerance`` of the default engine's (NaN: no)."""
    return not math.isnan(candidate) and candidate >= default - tolerance - 1e-12


def faster(candidate_ms: float, best_ms: float, gain: float = MIN_GAIN) -> bool:
    return candidate_ms <= best_ms * (1.0 - gain)
