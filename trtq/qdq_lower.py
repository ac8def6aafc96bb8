"""What stops TensorRT from parsing a Q/DQ export (ModelOpt, QAT), and its exact lowering.

:func:`plan_lowering` looks at a model for the installed TensorRT's limits (the caller passes them:
:func:`trtq.trt.compat.onnx_limits`) and returns every finding with the node it concerns, and a
lowered copy. Each finding is either fixed exactly in the copy or refused (``fix`` empty):

1. FP16 Q/DQ (a QuantizeLinear / DequantizeLinear with a float16 or bfloat16 scale, as ModelOpt's
   FP16 graphs have) where TensorRT takes float32 scales only (8.x): every float16 / bfloat16
   initializer, Constant, value_info and cast target becomes float32. Exact for what the file
   stores: every FP16 and BF16 value is an FP32 value; the lowered graph then computes in FP32
   what the original computed in FP16 (its outputs are those of the FP32 twin of the graph, which
   is what TensorRT builds from it: --fp16 lets its float layers run in FP16 again). Graph inputs
   and outputs keep their types: a Cast is put behind an FP16 input and before an FP16 output.
2. A zero scale (TensorRT: "Scale coefficients must all be positive"): where every weight of the
   channel with the zero scale is zero (ModelOpt writes zero scales for all-zero depthwise
   channels), any positive scale gives the same dequantized zeros; trtq uses the largest scale of
   the same tensor (1.0 when all are zero), so the channel's combined scale stays within the
   range of its neighbours'. A zero scale on a channel with a non-zero weight, on an activation
   (whose values are not known), or a negative or non-finite scale is refused.
3. An inf or NaN in a layer's parameters (a Conv / ConvTranspose / Gemm weight or bias, a
   normalization's scale, bias, mean or variance), as an FP16 export writes where a value passed
   65504 (ModelOpt's PP-OCRv4 det: a BatchNormalization variance): refused, no exact value is
   known; TensorRT 8.6 failed building such a file with a CUDA illegal memory access. An inf
   elsewhere (an attention mask) is left alone, and so is a weight behind Q/DQ: a
   DequantizeLinear reads integers, and QuantizeLinear saturates an inf to the last level.
4. An opset newer than the parser reads (17 for TensorRT 8.6): :func:`trtq.opset_lower.lower_opset`
   rewrites exactly or refuses, node by node. Where no operator changed after the parser's opset,
   only the opset import differs: the finding does not block a build without ``--fix-qdq`` (the
   parser reads such a graph as an older one; its own errors still name the opset), and
   ``--fix-qdq`` lowers the import.

``trtq build`` stops on any finding with one line naming the node; with ``--fix-qdq`` it builds
the lowered copy when nothing was refused, after :func:`trtq.model_check.check_produced_model`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtq.opset_lower import default_opset, describe, lower_opset
from trtq.qdq_info import constant_tensors

QDQ = ("QuantizeLinear", "DequantizeLinear")
_NARROW = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


@dataclass
class Finding:
    node: str  # "QuantizeLinear 'name'", or "" for the model as a whole
    problem: str  # what the target TensorRT cannot take
    fix: str = ""  # what the lowering did about it; empty: refused (not exact)
    blocking: bool = True  # False: the parser may well take it as it is (an opset import only)

    def line(self) -> str:
        return f"{self.node}: {self.problem}" if self.node else self.problem


@dataclass
class Lowering:
    model: onnx.ModelProto  # the lowered copy: usable only when nothing was refused
    findings: list[Finding] = field(default_factory=list)

    @property
    def refused(self) -> list[Finding]:
        return [f for f in self.findings if not f.fix]

    @property
    def fixes(self) -> list[str]:
        return [f.fix for f in self.findings if f.fix]


# ------------------------------------------------------------------------------------------------
# 1. FP16 / BF16 -> FP32
# ------------------------------------------------------------------------------------------------


def _narrow_scales(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    consts = constant_tensors(graph)
    return [
        n
        for n in graph.node
        if n.op_type in QDQ and len(n.input) > 1 and n.input[1] in consts and consts[n.input[1]].data_type in _NARROW
    ]


def _widen_tensor(t: onnx.TensorProto) -> int:
    if t.data_type not in _NARROW:
        return 0
    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    return 1


def _widen_graph(graph: onnx.GraphProto) -> int:
    """Every FP16 / BF16 constant, value_info and type attribute of ``graph`` (and its subgraphs)
    made FP32, in place; how many were changed. Graph inputs and outputs are left to the caller."""
    count = sum(_widen_tensor(t) for t in graph.initializer)
    for v in graph.value_info:
        if v.type.tensor_type.elem_type in _NARROW:
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            count += 1
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                count += _widen_tensor(a.t)
            elif a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i in _NARROW:
                a.i = onnx.TensorProto.FLOAT
                count += 1
            elif a.type == onnx.AttributeProto.GRAPH:
                count += _widen_graph(a.g)
                count += _widen_io(a.g, keep=False)
    return count


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name == old:
                n.input[i] = new


def _widen_io(graph: onnx.GraphProto, keep: bool = True) -> int:
    """FP16 graph inputs and outputs: with ``keep`` a Cast to FP32 behind each input and a Cast
    back before each output (the interface stays); without (subgraphs), their types change."""
    count, front, back = 0, [], []
    for v in graph.input:
        if v.type.tensor_type.elem_type in _NARROW:
            count += 1
            if not keep:
                v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                continue
            wide = f"{v.name}__fp32"
            _rename_uses(graph, v.name, wide)
            front.append(helper.make_node("Cast", [v.name], [wide], name=f"{v.name}__widen", to=onnx.TensorProto.FLOAT))
    for v in graph.output:
        t = v.type.tensor_type.elem_type
        if t in _NARROW:
            count += 1
            if not keep:
                v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                continue
            wide = f"{v.name}__fp32"
            for n in graph.node:
                for i, o in enumerate(n.output):
                    if o == v.name:
                        n.output[i] = wide
            _rename_uses(graph, v.name, wide)
            back.append(helper.make_node("Cast", [wide], [v.name], name=f"{v.name}__narrow", to=t))
    if front or back:
        nodes = front + list(graph.node) + back
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _fp16_findings(model: onnx.ModelProto) -> list[Finding]:
    narrow = _narrow_scales(model.graph)
    if not narrow:
        return []
    kind = onnx.TensorProto.DataType.Name(constant_tensors(model.graph)[narrow[0].input[1]].data_type).lower()
    changed = _widen_graph(model.graph) + _widen_io(model.graph)
    more = f" (and {len(narrow) - 1} more Q/DQ nodes)" if len(narrow) > 1 else ""
    return [
        Finding(
            describe(narrow[0]),
            f"has a {kind} scale{more}; this TensorRT takes float32 Q/DQ scales",
            f"FP16 -> FP32: {changed} tensors and type attributes widened (exact: every FP16 value is an FP32 value)",
        )
    ]


# ------------------------------------------------------------------------------------------------
# 2. zero scales on all-zero weight channels
# ------------------------------------------------------------------------------------------------


def _weights_behind(node: onnx.NodeProto, consts: dict, producers: dict) -> np.ndarray | None:
    """The constant weights a Q/DQ node (de)quantizes: its constant input, or for a DequantizeLinear
    behind a QuantizeLinear of a constant, that constant; None for an activation."""
    src = node.input[0]
    if src in consts:
        return numpy_helper.to_array(consts[src])
    q = producers.get(src)
    if node.op_type == "DequantizeLinear" and q is not None and q.op_type == "QuantizeLinear" and q.input[0] in consts:
        return numpy_helper.to_array(consts[q.input[0]])
    return None


def _nonzero_channel(node: onnx.NodeProto, weights: np.ndarray, zero: np.ndarray) -> int | None:
    """The first channel with a zero scale whose weights are not all zero (-1: a per-tensor scale
    of non-zero weights), else None."""
    if zero.size == 1:
        return -1 if np.any(weights != 0) else None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    rows = np.moveaxis(weights, axis % weights.ndim, 0).reshape(weights.shape[axis], -1)
    bad = np.flatnonzero(zero.reshape(-1) & np.any(rows != 0, axis=1))
    return int(bad[0]) if bad.size else None


def _zero_scale_finding(name: str, scale: onnx.TensorProto, users: list, consts: dict, producers: dict) -> Finding:
    s = numpy_helper.to_array(scale)
    first = describe(users[0])
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        return Finding(first, f"has a negative or non-finite scale ('{name}'): no exact positive scale exists")
    zero = s == 0
    what = f"has a zero scale on {int(zero.sum())} of {s.size} channels" if s.size > 1 else "has a zero scale"
    problem = f"{what} ('{name}'); TensorRT needs positive scales"
    for node in users:
        weights = _weights_behind(node, consts, producers)
        if weights is None:
            return Finding(describe(node), f"{what} on an activation: no positive scale gives the same values")
        channel = _nonzero_channel(node, weights, zero)
        if channel is not None:
            where = "its weights" if channel < 0 else f"channel {channel}, whose weights"
            return Finding(describe(node), f"{what}: {where} are not all zero, so no positive scale is exact")
    positive = s[s > 0]
    value = float(positive.max()) if positive.size else 1.0
    fixed = np.where(zero, np.asarray(value, s.dtype), s).astype(s.dtype)
    scale.CopyFrom(numpy_helper.from_array(fixed, scale.name))
    return Finding(first, problem, f"zero scales of all-zero weight channels of '{name}' set to {value:g} (same zeros)")


def _zero_scale_findings(model: onnx.ModelProto) -> list[Finding]:
    graph = model.graph
    consts = constant_tensors(graph)
    producers = {o: n for n in graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in graph.node:
        if n.op_type in QDQ and len(n.input) > 1 and n.input[1] in consts:
            users.setdefault(n.input[1], []).append(n)
    out = []
    for name, nodes in users.items():
        s = numpy_helper.to_array(consts[name])
        if s.size and np.all(np.isfinite(s)) and np.all(s > 0):
            continue
        out.append(_zero_scale_finding(name, consts[name], nodes, consts, producers))
    return out


# ------------------------------------------------------------------------------------------------
# 3. inf / NaN parameters
# ------------------------------------------------------------------------------------------------

# op type -> the input slots that hold the layer's parameters
PARAMETER_SLOTS = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (1, 2),
    "BatchNormalization": (1, 2, 3, 4),
    "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "GroupNormalization": (1, 2),
}


def _nonfinite_findings(model: onnx.ModelProto) -> list[Finding]:
    graph = model.graph
    consts = constant_tensors(graph)
    producers = {o: n for n in graph.node for o in n.output}
    out, seen = [], set()
    for node in graph.node:
        for slot in PARAMETER_SLOTS.get(node.op_type, ()):
            name = node.input[slot] if slot < len(node.input) else ""
            source = name
            while source and source not in consts and source in producers:  # through a Cast / Identity
                feeder = producers[source]
                if feeder.op_type not in ("Cast", "Identity") or not feeder.input:
                    break
                source = feeder.input[0]
            if not source or source not in consts or source in seen:
                continue
            values = numpy_helper.to_array(consts[source])
            if values.dtype.kind != "f" or np.all(np.isfinite(values)):
                continue
            seen.add(source)
            bad = int((~np.isfinite(values)).sum())
            kind = "inf" if not np.isnan(values).any() else "inf or NaN"
            where = f"'{name}'" if source == name else f"'{name}' (from '{source}')"
            out.append(
                Finding(
                    describe(node),
                    f"input {slot} {where} holds {bad} of {values.size} values {kind} (an FP16 export writes "
                    "inf where a value passed 65504); no exact value is known, and TensorRT 8.6 failed building "
                    "such a file",
                )
            )
    return out


# ------------------------------------------------------------------------------------------------
# the whole lowering
# ------------------------------------------------------------------------------------------------


def _opset_findings(model: onnx.ModelProto, max_opset: int | None, label: str) -> list[Finding]:
    source = default_opset(model)
    if max_opset is None or source <= max_opset:
        return []
    rewritten, refused = lower_opset(model, max_opset)
    problem = f"opset {source}: TensorRT {label} parses up to opset {max_opset}"
    if refused:
        return [Finding(node, f"{problem}, and {why}") for node, why in refused]
    if not rewritten:  # every operator reads as it did at the parser's opset: only the import changes
        fix = f"opset {source} -> {max_opset} (no operator in it changed since opset {max_opset})"
        return [Finding("", problem, fix, blocking=False)]
    return [Finding(rewritten[0], problem, f"opset {source} -> {max_opset} ({len(rewritten)} node(s) rewritten)")]


def plan_lowering(model: onnx.ModelProto, max_opset: int | None, float16_qdq: bool, label: str) -> Lowering:
    """Findings for a TensorRT that parses up to ``max_opset`` (None: no limit known) and takes
    FP16 Q/DQ scales or not (``label`` names it in the messages), and the lowered copy; ``model``
    itself is not changed."""
    lowered = copy.deepcopy(model)
    findings = [] if float16_qdq else _fp16_findings(lowered)
    findings += _zero_scale_findings(lowered)
    findings += _nonfinite_findings(lowered)
    findings += _opset_findings(lowered, max_opset, label)
    return Lowering(lowered, findings)


__all__ = ["Finding", "Lowering", "plan_lowering"]
