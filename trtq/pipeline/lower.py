"""``trtq build``'s check that TensorRT can parse the model, and ``--fix-qdq``'s exact lowering.

ModelOpt and QAT exports often carry what TensorRT 8.6 cannot parse (opset 19, FP16 Q/DQ scales,
zero scales on all-zero weight channels) and its parser then fails with a message that names no
cause. :func:`tensorrt_parseable` finds those before TensorRT sees the model
(:func:`trtq.qdq_lower.plan_lowering` for the installed TensorRT's limits, from
:func:`trtq.trt.compat.onnx_limits`): without ``fix_qdq`` the first finding is a ModelError (exit
3) naming the node; with it the lowered copy is checked like every model trtq hands TensorRT
(:func:`trtq.model_check.check_produced_model`) and used instead, or the first thing that cannot
be lowered exactly is the error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trtq.errors import ModelError
from trtq.trt import compat

log = logging.getLogger(__name__)


def _more(findings: list) -> str:
    return f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""


def tensorrt_parseable(model: Any, model_path: Path, fix_qdq: bool, data_options: Any) -> tuple[Any, list[str]]:
    """(the model TensorRT should parse, what --fix-qdq changed); ``model`` when nothing needs it.
    Without TensorRT installed only ``fix_qdq`` lowers (for 8.6); the check waits for TensorRT."""
    from trtq.qdq_lower import plan_lowering

    version = compat.installed_version()
    if version is None and not fix_qdq:
        return model, []
    max_opset, fp16_qdq, label = compat.onnx_limits(version)
    lowering = plan_lowering(model, max_opset, fp16_qdq, label)
    blocking = [f for f in lowering.findings if f.blocking]
    if not lowering.findings or not (fix_qdq or blocking):
        return model, []
    refused = lowering.refused
    if not fix_qdq:
        first = blocking[0]
        hint = (
            f"re-export it for TensorRT {label}: {refused[0].line()} has no exact lowering"
            if refused
            else "pass --fix-qdq to lower it exactly (FP32 scales and tensors, positive scales on all-zero "
            "weight channels, the opset the parser reads)"
        )
        raise ModelError(
            f"{model_path.name}: TensorRT {label} cannot parse it as it is: {first.line()}{_more(blocking)}",
            hint,
        )
    if refused:
        raise ModelError(
            f"--fix-qdq cannot lower {model_path.name} exactly: {refused[0].line()}{_more(refused)}",
            f"re-export it for TensorRT {label} (opset <= {max_opset or 'any'}, FP32 Q/DQ scales, positive scales, "
            "parameters kept in FP32 where FP16 overflows)",
        )
    from trtq.model_check import check_produced_model
    from trtq.pipeline.quantize import check_batch

    check_produced_model(
        lowering.model, f"the lowered {model_path.name}", check_batch(lowering.model, data_options), model
    )
    for fix in lowering.fixes:
        log.info("--fix-qdq: %s", fix)
    return lowering.model, lowering.fixes
