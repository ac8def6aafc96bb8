"""``build --tune-placement``'s float reference (``build.tune_float``): the model built without
Q/DQ nodes, in FP16, timed side by side with the INT8 engine the search kept and scored on the
same data, so a user learns when INT8 does not pay on their model and TensorRT.

Why: a search among Q/DQ placements compares INT8 engines with each other only, and on some
models TensorRT runs every INT8 engine slower than FP16 (docs/decisions.md D32).

- ``report`` (default): the reference is built, timed and scored; when it is at least
  :data:`~trtq.pipeline.tune_candidates.MIN_GAIN` faster than the kept INT8 engine a warning says so and names
  the FP16 build. The INT8 engine is written.
- ``keep``: the reference is written instead when it is that much faster and its task metric is
  within the tolerance of the default placement's (it is FP16, so it nearly always is).
- ``off``: no reference build.

The reference is one build beyond ``--tune-builds``. TensorRT <= 10 builds the FP32 model with the
FP16 flag; TensorRT 11 has none, so the reference is the FP32 model with its float tensors cast to
FP16 (:func:`trtq.quantize.fp16.cast_float_rest`, the calibrated ranges keeping near-overflow
nodes in FP32), built strongly typed (:func:`trtq.trt.compat.float_reference_recipe`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from trtq.errors import TrtqError
from trtq.pipeline.tune_candidates import Candidate, engine_score, faster, rounded

log = logging.getLogger(__name__)

PRECISION = "fp16"


def build_reference(tuner: Any) -> Candidate:
    """The float reference engine in ``tuner``'s folder, built and scored (``plan`` None and the
    reason in ``verdict`` when TensorRT could not build it)."""
    import onnx

    from trtq.fileio import declare_outputs
    from trtq.pipeline.build import Network, build_network
    from trtq.trt import compat

    inputs = tuner.inputs
    recipe, cast = compat.float_reference_recipe(inputs.trt)
    model = inputs.model
    if cast:
        from trtq.quantize.fp16 import cast_float_rest

        model = onnx.ModelProto()
        model.CopyFrom(inputs.model)
        model = cast_float_rest(model, inputs.table.amax if inputs.table is not None else None)
    ref = Candidate(PRECISION)
    ref.plan = tuner.folder / "float-reference.plan"
    declare_outputs([ref.plan, f"{ref.plan}.json"])
    # no calibration cache, and not the search's timing cache (a float network's tactics are its own)
    options = dataclasses.replace(tuner.options, precision=PRECISION, timing_cache=None)
    float_inputs = dataclasses.replace(inputs, recipe=recipe, table=None, cache_path=None)
    t0 = time.perf_counter()
    try:
        build_network(float_inputs, Network(model, {}), ref.plan, options)
    except TrtqError as e:
        ref.verdict, ref.plan = f"build failed: {e.message}", None
        return ref
    ref.build_seconds = time.perf_counter() - t0
    _, ref.metric, _ = engine_score(tuner.cfg, inputs.model_path, ref.plan)
    return ref


def weigh_float_reference(tuner: Any, best: Candidate, default: Candidate) -> Candidate:
    """The engine to write: ``best`` (the kept INT8 candidate), or with ``build.tune_float: keep``
    the float reference when it is faster within the tolerance. ``tuner.reference`` is set to
    the reference (None with ``off``) and ``tuner.reference_int8_ms`` to ``best``'s time beside it."""
    mode = tuner.options.tune_float
    tuner.reference = None
    if mode == "off":
        return best
    ref = build_reference(tuner)
    tuner.reference = ref
    if ref.plan is None:
        log.warning(
            "tune: the %s reference engine did not build (%s): INT8 is not weighed against it", PRECISION, ref.verdict
        )
        return best
    int8_ms, ref.median_ms = tuner.timer([best.plan, ref.plan])
    tuner.reference_int8_ms = int8_ms
    ref.verdict, action = float_verdict(ref.median_ms, int8_ms, tuner.within_tolerance(ref, default), mode)
    log.info(
        "tune: %s reference: %.3f ms (INT8 %.3f ms), %s %.4f: %s",
        PRECISION,
        ref.median_ms,
        int8_ms,
        tuner.metric_name,
        ref.metric,
        ref.verdict,
    )
    if action == "keep":
        return ref
    if action == "report":
        from trtq.trt import compat

        log.warning(
            "tune: INT8 does not pay for this model on TensorRT %s: the FP16 engine without Q/DQ ran %.3f ms, "
            "the fastest INT8 placement %.3f ms (%s %.4f vs %.4f); build --precision fp16, or add "
            "--tune-float keep to write the faster engine",
            compat.version_of(tuner.inputs.trt),
            ref.median_ms,
            int8_ms,
            tuner.metric_name,
            ref.metric,
            best.metric,
        )
    return best


def float_verdict(float_ms: float, int8_ms: float, within_tolerance: bool, mode: str) -> tuple[str, str]:
    """(the reference's verdict, what follows: ``keep`` it instead of the INT8 engine, ``report``
    that it is faster, or ``none``). It counts as faster when :data:`~trtq.pipeline.tune_candidates.MIN_GAIN`
    faster side by side, and only with its metric within the tolerance."""
    if not faster(float_ms, int8_ms):
        return f"slower than the kept INT8 engine ({float_ms / int8_ms:.2f}x its time)", "none"
    if not within_tolerance:
        return "faster than the kept INT8 engine, metric below the tolerance", "none"
    if mode == "keep":
        return "kept: faster than the kept INT8 engine", "keep"
    return "faster than the kept INT8 engine: reported (--tune-float keep writes it)", "report"


def reference_record(tuner: Any) -> dict[str, Any] | None:
    """The float reference in the plan metadata's ``tuning`` (None: not built, ``off``)."""
    ref = tuner.reference
    if ref is None:
        return None
    record = ref.record()
    return {
        "precision": PRECISION,
        "median_ms": record["median_ms"],
        "int8_median_ms": rounded(tuner.reference_int8_ms, 4) if ref.median_ms is not None else None,
        "metric": record["metric"],
        "build_seconds": record["build_seconds"],
        "verdict": ref.verdict,
    }


__all__ = ["PRECISION", "build_reference", "float_verdict", "reference_record", "weigh_float_reference"]
