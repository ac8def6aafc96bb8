"""Lower an ONNX model's default-domain opset to an older one, exactly or not at all.

Each node's operator is looked up in ONNX's own schema history: an operator whose definition did
not change between the target opset and the model's is kept as it is. One that changed is kept only
where every change is one trtq knows to be exact for the node as written, and then rewritten to the
older form; anything else is refused, naming the node and the change:

- type-only changes (new element types: float8, int4, bf16, strings; the nodes here use none, the
  model's element types are checked separately): Cast, Constant, Identity, Reshape, Shape, ... ;
- opset 18, Reduce* (but ReduceSum, which took ``axes`` as an input since 13): a constant ``axes``
  input becomes the attribute; ``noop_with_empty_axes=1`` without axes has no older form (refused);
- opset 18, Split ``num_outputs``: equal parts are the old default; unequal ones (the last part
  smaller) become a ``split`` input where the split dimension is known, else refused;
- opset 18/19, Pad: an ``axes`` input or the ``wrap`` mode are refused;
- opset 18/19, Resize: ``antialias=0``, ``keep_aspect_ratio_policy=stretch`` and no ``axes`` are
  the old behaviour and are dropped; other values and ``half_pixel_symmetric`` are refused;
- opset 19, AveragePool ``dilations`` of all ones are dropped, others refused;
- opset 19/21, QuantizeLinear / DequantizeLinear: ``saturate=1`` (the default; ONNX applies it to
  float8 only) is dropped and ``saturate=0`` refused; ``block_size`` (blocked quantization) is
  refused; ``output_dtype`` INT8 with an int8 zero point is dropped, any other refused;
- opset 19/21, Cast / CastLike ``saturate``: dropped unless the cast is to a float8 type (refused).

Operators that do not exist in the target opset (Gelu, GroupNormalization, DeformConv, ...) and
changes in opsets after 22 are refused. Subgraphs (If / Loop / Scan) are lowered the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

NEWEST_KNOWN = 22  # changes after this opset are refused: their exactness has not been reviewed
_TYPE_ONLY = {
    19: {"Cast", "CastLike", "Constant", "Equal", "Identity", "If", "Loop", "Reshape", "Scan", "Shape", "Size"},
    20: {"ConstantOfShape", "IsInf", "IsNaN", "ReduceMax", "ReduceMin"},
    21: {
        "Cast",
        "CastLike",
        "Constant",
        "ConstantOfShape",
        "Flatten",
        "Identity",
        "If",
        "Loop",
        "Pad",
        "QLinearMatMul",
        "Reshape",
        "Scan",
        "Shape",
        "Size",
        "Squeeze",
        "Transpose",
        "Unsqueeze",
    },
}
_REDUCE = {
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
}
_FLOAT8 = {17, 18, 19, 20}  # TensorProto.FLOAT8E4M3FN .. FLOAT8E5M2FNUZ
NEWEST_17_TYPE = 16  # TensorProto.BFLOAT16: element types above it came with IR 9 and later


class Refused(Exception):
    """A change with no exact older form; the message says why (the caller names the node)."""


def describe(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name or (node.output[0] if node.output else '?')}'"


def default_opset(model: onnx.ModelProto) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _since(op: str, opset: int) -> int | None:
    try:
        return int(onnx.defs.get_schema(op, opset, "").since_version)
    except Exception:  # onnx raises SchemaError (its class differs between versions) for no schema
        return None


def changes_between(op: str, old: int, new: int) -> list[int]:
    """The opsets in (old, new] in which ``op`` got a new definition."""
    out, v = [], _since(op, new)
    while v is not None and v > old:
        out.append(v)
        v = _since(op, v - 1)
    return sorted(out)


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _drop(node: onnx.NodeProto, name: str) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)


class _Graph:
    """What the rewrites need of one graph: its constants, the known tensor shapes."""

    def __init__(self, graph: onnx.GraphProto, shapes: dict[str, list]):
        self.graph = graph
        self.shapes = shapes
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for n in graph.node:
            value = _attr(n, "value") if n.op_type == "Constant" else None
            if value is not None and value.type == onnx.AttributeProto.TENSOR:
                self.consts[n.output[0]] = numpy_helper.to_array(value.t)

    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.consts:
            raise Refused(f"its {what} is computed, not a constant")
        return self.consts[name]

    def add(self, name: str, array: np.ndarray) -> str:
        base, i = name, 0
        while name in self.consts:
            i += 1
            name = f"{base}_{i}"
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        self.consts[name] = array
        return name


def _reduce_18(node: onnx.NodeProto, g: _Graph) -> None:
    noop = _attr(node, "noop_with_empty_axes")
    axes = g.const(node.input[1], "axes input") if len(node.input) > 1 and node.input[1] else None
    if (axes is None or axes.size == 0) and noop is not None and noop.i == 1:
        raise Refused("noop_with_empty_axes=1 without axes has no opset-17 form")
    _drop(node, "noop_with_empty_axes")
    if axes is not None:
        del node.input[1:]
        if axes.size:
            node.attribute.append(helper.make_attribute("axes", [int(a) for a in axes.reshape(-1)]))


def _split_18(node: onnx.NodeProto, g: _Graph) -> None:
    parts = _attr(node, "num_outputs")
    if parts is None:
        return
    _drop(node, "num_outputs")
    if len(node.input) > 1 and node.input[1]:
        return
    shape = g.shapes.get(node.input[0])
    axis = _attr(node, "axis").i if _attr(node, "axis") is not None else 0
    dim = shape[axis] if shape and -len(shape) <= axis < len(shape) else None
    n = int(parts.i)
    if not isinstance(dim, int) or dim <= 0:
        raise Refused("num_outputs on a dimension of unknown size")
    if dim % n:
        chunk = -(-dim // n)
        sizes = np.array([chunk] * (n - 1) + [dim - chunk * (n - 1)], np.int64)
        del node.input[1:]
        node.input.append(g.add(f"{node.output[0]}_split", sizes))


def _pad(node: onnx.NodeProto, g: _Graph) -> None:
    if len(node.input) > 3 and node.input[3]:
        raise Refused("an axes input, which opset 17 lacks")
    mode = _attr(node, "mode")
    if mode is not None and mode.s == b"wrap":
        raise Refused("mode 'wrap', which opset 17 lacks")


def _resize(node: onnx.NodeProto, g: _Graph) -> None:
    for name, old in (("antialias", 0), ("keep_aspect_ratio_policy", b"stretch")):
        a = _attr(node, name)
        if a is not None and (a.i if name == "antialias" else a.s) != old:
            raise Refused(f"{name} other than {old if isinstance(old, int) else old.decode()}, which opset 17 lacks")
        _drop(node, name)
    if _attr(node, "axes") is not None:
        raise Refused("axes, which opset 17 lacks")
    mode = _attr(node, "coordinate_transformation_mode")
    if mode is not None and mode.s == b"half_pixel_symmetric":
        raise Refused("coordinate_transformation_mode 'half_pixel_symmetric', which opset 17 lacks")


def _average_pool_19(node: onnx.NodeProto, g: _Graph) -> None:
    d = _attr(node, "dilations")
    if d is not None and any(int(x) != 1 for x in d.ints):
        raise Refused("dilations other than 1, which opset 17 lacks")
    _drop(node, "dilations")


def _qdq(node: onnx.NodeProto, g: _Graph) -> None:
    sat = _attr(node, "saturate")
    if sat is not None and sat.i == 0:
        raise Refused("saturate=0; opset 17 always saturates")
    _drop(node, "saturate")
    block = _attr(node, "block_size")
    if block is not None and block.i != 0:
        raise Refused(f"block_size {block.i} (blocked quantization), which opset 17 cannot express")
    _drop(node, "block_size")
    out = _attr(node, "output_dtype")
    if out is not None and out.i != 0:
        zp_type = _zero_point_type(node, g)
        if out.i != onnx.TensorProto.INT8 or zp_type != onnx.TensorProto.INT8:
            raise Refused("output_dtype without an int8 zero point, which opset 17 cannot express")
    _drop(node, "output_dtype")


def _zero_point_type(node: onnx.NodeProto, g: _Graph) -> int | None:
    if len(node.input) < 3 or not node.input[2] or node.input[2] not in g.consts:
        return None
    return int(helper.np_dtype_to_tensor_dtype(g.consts[node.input[2]].dtype))


def _cast(node: onnx.NodeProto, g: _Graph) -> None:
    to = _attr(node, "to")
    if to is not None and to.i in _FLOAT8:
        raise Refused("a cast to float8, which opset 17 lacks")
    _drop(node, "saturate")


_RULES: dict[tuple[str, int], Callable[[onnx.NodeProto, _Graph], None]] = {
    **{(op, 18): _reduce_18 for op in _REDUCE},
    ("Split", 18): _split_18,
    ("Pad", 18): _pad,
    ("Pad", 19): _pad,
    ("Resize", 18): _resize,
    ("Resize", 19): _resize,
    ("AveragePool", 19): _average_pool_19,
    ("QuantizeLinear", 19): _qdq,
    ("DequantizeLinear", 19): _qdq,
    ("QuantizeLinear", 21): _qdq,
    ("DequantizeLinear", 21): _qdq,
    ("Cast", 19): _cast,
    ("CastLike", 19): _cast,
}


def _shapes(model: onnx.ModelProto) -> dict[str, list]:
    """Tensor name -> dims (int, or None where unknown) as ONNX shape inference gives them."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shapes only help Split; without them an unequal split is refused
        inferred = model
    g = inferred.graph
    out: dict[str, list] = {}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
    return out


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH] + [
        g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs
    ]


def _lower_node(node: onnx.NodeProto, g: _Graph, old: int, new: int) -> str | None:
    """Rewrite ``node`` to opset ``old`` in place; its description when it was changed."""
    if _since(node.op_type, old) is None:
        raise Refused(f"{node.op_type} does not exist in opset {old}")
    changed = False
    for version in changes_between(node.op_type, old, new):
        if version > NEWEST_KNOWN:
            raise Refused(f"{node.op_type} changed in opset {version}, which trtq's lowering does not know")
        if version == 22 or node.op_type in _TYPE_ONLY.get(version, ()):
            continue
        rule = _RULES.get((node.op_type, version))
        if rule is None:
            raise Refused(f"{node.op_type} changed in opset {version} and trtq knows no exact opset-{old} form")
        before = node.SerializeToString()
        rule(node, g)
        changed = changed or node.SerializeToString() != before
    return describe(node) if changed else None


def _lower_graph(graph: onnx.GraphProto, shapes: dict[str, list], old: int, new: int) -> tuple[list, list]:
    g = _Graph(graph, shapes)
    rewritten, refused = [], []
    for node in list(graph.node):
        try:
            done = _lower_node(node, g, old, new) if node.domain in ("", "ai.onnx") else None
            if done:
                rewritten.append(done)
        except Refused as e:
            refused.append((describe(node), str(e)))
        for sub in _subgraphs(node):
            r, f = _lower_graph(sub, shapes, old, new)
            rewritten += r
            refused += f
    return rewritten, refused


def _newer_types(model: onnx.ModelProto) -> list[tuple[str, str]]:
    g = model.graph
    named = [(t.name, t.data_type) for t in g.initializer] + [
        (v.name, v.type.tensor_type.elem_type) for v in list(g.input) + list(g.output) + list(g.value_info)
    ]
    return [
        (f"tensor '{name}'", f"its type {onnx.TensorProto.DataType.Name(t)} is newer than opset 17")
        for name, t in named
        if t > NEWEST_17_TYPE
    ]


def lower_opset(model: onnx.ModelProto, target: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Rewrite ``model`` (in place) to default-domain opset ``target``: (the nodes rewritten, the
    refusals: (node, why)). The opset import and IR version change only without refusals;
    a model at or below ``target`` is left as it is."""
    source = default_opset(model)
    if source <= target:
        return [], []
    rewritten, refused = _lower_graph(model.graph, _shapes(model), target, source)
    refused = _newer_types(model) + refused
    if not refused:
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = target
        model.ir_version = min(int(model.ir_version), 8)  # IR 8 is opset 17's
    return rewritten, refused


__all__ = ["NEWEST_KNOWN", "Refused", "changes_between", "default_opset", "describe", "lower_opset"]
