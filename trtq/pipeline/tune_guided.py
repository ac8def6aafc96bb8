"""``build --tune-placement``'s guided candidate (``build.tune_guided``): TensorRT's own implicit
INT8 engine, built from the same calibration cache, shows which layers it chose to run in float;
the candidate leaves float the quantized nodes of those layers.

An implicit engine picks INT8 or FP16 per layer by timing both. A Q/DQ network has no such
choice: a node with Q/DQ on its inputs runs INT8, or falls back to float with conversions around
it. So the implicit engine's choices are the best prior for which nodes to leave float, on the
TensorRT and GPU at hand (docs/decisions.md D33 has the measurements). A quantized node is left
float when the implicit layer that carries it (:func:`trtq.trt.coverage.layer_nodes`) reads a
float input and no layer that carries it reads INT8.

Implicit INT8 exists up to TensorRT 10 (calibrators were removed in 11): elsewhere the candidate is
skipped with a log line, as it is for a cache calibrated with ``--tensors qdq`` (an implicit engine
would run every tensor it has no range for in float). The implicit build counts as one of
``build.tune_builds``; it is timed beside the best engine so far and recorded
(``tuning.implicit``), never written.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from trtq.errors import TrtqError
from trtq.pipeline.tune_candidates import Candidate, rounded

log = logging.getLogger(__name__)


def float_chosen_nodes(layers: Sequence[Any], quantized: Collection[str]) -> tuple[str, ...]:
    """The nodes of ``quantized`` that an implicit engine's inspector ``layers`` ran from float
    input (module doc), in the engine's layer order. Reformat layers say nothing: skipped."""
    from trtq.trt.coverage import FLOATS, datatype, is_reformat, layer_nodes

    float_input: dict[str, None] = {}
    int8_input: set[str] = set()
    for layer in layers:
        if not isinstance(layer, dict) or is_reformat(layer):
            continue
        nodes = layer_nodes(str(layer.get("Name", "")), quantized)
        inputs = {datatype(e) for e in layer.get("Inputs") or []}
        if "int8" in inputs:
            int8_input.update(nodes)
        elif inputs & FLOATS:
            float_input.update(dict.fromkeys(nodes))
    return tuple(n for n in float_input if n not in int8_input)


@dataclasses.dataclass
class ImplicitEngine:
    """TensorRT's implicit INT8 engine of the search (never written)."""

    plan: Any = None
    median_ms: float | None = None  # timed beside the best engine so far
    best_ms: float | None = None  # that engine's time in the same rounds
    build_seconds: float = 0.0
    float_nodes: tuple[str, ...] = ()  # quantized nodes it ran from float input
    verdict: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "median_ms": rounded(self.median_ms, 4),
            "best_ms": rounded(self.best_ms, 4),
            "build_seconds": round(self.build_seconds, 1),
            "float_nodes": len(self.float_nodes),
            "verdict": self.verdict,
        }


def build_implicit(tuner: Any, best: Candidate) -> ImplicitEngine:
    """Build, profile and time the implicit engine beside ``best`` (``plan`` None and the reason in
    ``verdict`` where it cannot be built)."""
    from trtq.fileio import declare_outputs
    from trtq.pipeline.build import Network, build_network, qdq_only_cache
    from trtq.trt import compat

    out = ImplicitEngine()
    if qdq_only_cache(tuner.inputs.cache_path):  # TensorRT would run every unranged tensor float
        out.verdict = "not built: the cache has ranges for the Q/DQ tensors only (calibrate --tensors qdq)"
        return out
    trt = tuner.inputs.trt
    if not compat.has_implicit_int8(trt):
        out.verdict = f"not built: TensorRT {compat.version_of(trt)} has no implicit INT8"
        return out
    recipe = compat.plan_build(trt, "int8", "implicit", tuner.options.fp16)
    options = dataclasses.replace(tuner.options, mode="implicit", timing_cache=None)
    plan = tuner.folder / "implicit.plan"
    declare_outputs([plan, f"{plan}.json"])
    t0 = time.perf_counter()
    try:
        built = build_network(
            dataclasses.replace(tuner.inputs, recipe=recipe), Network(tuner.inputs.model, {}), plan, options
        )
    except TrtqError as e:
        out.verdict = f"build failed: {e.message}"
        return out
    out.plan, out.build_seconds = plan, time.perf_counter() - t0
    _, inspected = built.layers()
    out.float_nodes = float_chosen_nodes(inspected, set(best.quantized) - set(best.left_float))
    out.best_ms, out.median_ms = tuner.timer([best.plan, plan])
    return out


def guided_candidate(tuner: Any, best: Candidate) -> Candidate | None:
    """The candidate that leaves float, on top of ``best``, what the implicit engine ran in float
    (None: no implicit engine, or it ran every quantized node from INT8). Sets ``tuner.implicit``."""
    implicit = build_implicit(tuner, best)
    tuner.implicit = implicit
    if implicit.plan is None:
        log.info("tune: guided candidate skipped: implicit engine %s", implicit.verdict)
        return None
    tuner.builds += 1
    if not implicit.float_nodes:
        implicit.verdict = "ran every quantized node from INT8: no guided candidate"
        return None
    implicit.verdict = f"ran {len(implicit.float_nodes)} quantized node(s) from float input"
    log.info(
        "tune: TensorRT's implicit engine: %.3f ms (best %.3f ms); %s",
        implicit.median_ms,
        implicit.best_ms,
        implicit.verdict,
    )
    return Candidate(
        best.placement, best.left_float + implicit.float_nodes, source="implicit", attention=best.attention
    )


__all__ = ["ImplicitEngine", "build_implicit", "float_chosen_nodes", "guided_candidate"]
