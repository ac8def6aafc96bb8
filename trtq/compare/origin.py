"""What the reference graph says about each of its outputs, before any batch runs.

Task inference must not guess a layout from a shape alone: ``[N, 64, 64, 3]`` is three class maps
in NHWC or 64 maps of 64 x 3 pixels. :func:`output_origins` reads the graph for evidence:

* ``op`` / ``axis``: the node that makes the output and its ``axis`` attribute;
* ``batch_axis``: the output axis that carries the inputs' named batch dim after ONNX shape
  inference (None when the batch is fixed or the dims are not named);
* ``class_axis``: the axis that holds channels or classes, traced back from the output through
  ops that keep it where it is (activations, arithmetic with constants, Resize, Pad, Slice) and
  ops that move it (Transpose), to an op that defines it: a Softmax / LogSoftmax over an axis, or
  an op that ONNX defines on NCHW data (Conv, ConvTranspose, pooling, BatchNormalization, ...:
  axis 1). None when the trail ends anywhere else: the layout is then unknown, not assumed;
* ``source``: the first op behind the output that is not a reshape, cast or selection (through
  bias Adds): what computed the values (a Gemm's class scores, a LayerNormalization's features).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# ops that keep the channel / class axis where it is
_SAME_AXIS = {
    "Relu",
    "Sigmoid",
    "Tanh",
    "Clip",
    "LeakyRelu",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "Cast",
    "Exp",
    "Log",
    "Neg",
    "Abs",
    "Sqrt",
    "Erf",
    "Dropout",
    "Elu",
    "Selu",
    "Celu",
    "Softplus",
    "Softsign",
    "Mish",
    "Gelu",
    "Round",
    "Floor",
    "Ceil",
    "Reciprocal",
    "Sign",
    "ThresholdedRelu",
    "Resize",
    "Upsample",
    "Pad",
    "Slice",
    "PRelu",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Concat",
}
# ops ONNX defines on [N, C, ...] data: the channel axis is 1
_NCHW = {
    "Conv",
    "ConvTranspose",
    "BatchNormalization",
    "InstanceNormalization",
    "MaxPool",
    "AveragePool",
    "LpPool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GlobalLpPool",
    "LRN",
    "DepthToSpace",
    "SpaceToDepth",
    "MaxUnpool",
    "MaxRoiPool",
    "RoiAlign",
    "GroupNormalization",
    "DeformConv",
}
_CLASS_OPS = ("Softmax", "LogSoftmax", "Hardmax")
# passed over when looking for what computed an output's values
_PLUMBING = {
    "Identity",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Cast",
    "Dropout",
    "Gather",
    "Slice",
    "Transpose",
    "Expand",
}
# what makes feature vectors (embeddings), not class scores: normalisations (Div: x / norm, or a
# LayerNormalization exported as arithmetic). Pooling is not here: SqueezeNet's class scores are a
# GlobalAveragePool of its last conv.
FEATURE_OPS = {
    "LayerNormalization",
    "LpNormalization",
    "ReduceL2",
    "BatchNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "Div",
}
_BY_CONSTANT = ("Add", "Sub", "Mul", "Div")
_MAX_STEPS = 64


@dataclass(frozen=True)
class OutputOrigin:
    op: str | None = None
    axis: int | None = None
    batch_axis: int | None = None
    class_axis: int | None = None
    class_evidence: str = ""  # how class_axis was found, e.g. "Transpose [0, 2, 3, 1] of a Conv output"
    source: str | None = None  # the op that computed the values (see the module doc)
    rank: int | None = None

    def __iter__(self):  # (op, axis), as the producers of earlier versions
        return iter((self.op, self.axis))


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class _Graph:
    def __init__(self, model: Any) -> None:
        self.makers = {o: n for n in model.graph.node for o in n.output if o}
        self.constants = {i.name for i in model.graph.initializer}
        self.constants |= {n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output}
        self.ranks: dict[str, int] = {}
        self.symbols: dict[str, list[str | None]] = {}
        self.batch_symbol: str | None = None
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self._infer(model)

    def _infer(self, model: Any) -> None:
        from trtq.model import infer_shapes

        try:
            inferred = infer_shapes(model)
        except Exception:  # a graph shape inference cannot read: no ranks or symbols, nothing guessed
            inferred = model
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                self.ranks[vi.name] = len(tt.shape.dim)
                self.symbols[vi.name] = [
                    d.dim_param if d.HasField("dim_param") and d.dim_param else None for d in tt.shape.dim
                ]
        inits = self.constants
        firsts = {(self.symbols.get(vi.name) or [None])[0] for vi in model.graph.input if vi.name not in inits}
        if len(firsts) == 1:
            self.batch_symbol = next(iter(firsts))

    def rank(self, tensor: str) -> int | None:
        return self.ranks.get(tensor)

    def batch_axis(self, tensor: str) -> int | None:
        dims = self.symbols.get(tensor)
        if not dims or self.batch_symbol is None:
            return None
        hits = [i for i, d in enumerate(dims) if d == self.batch_symbol]
        return hits[0] if len(hits) == 1 else None

    def dynamic_inputs(self, node: Any) -> list[str]:
        return [i for i in node.input if i and i not in self.constants]

    def class_axis(self, tensor: str, steps: int = 0) -> tuple[int | None, str]:
        node = self.makers.get(tensor)
        if node is None or steps > _MAX_STEPS:
            return None, ""
        op = node.op_type
        rank = self.rank(tensor)
        if op in _CLASS_OPS:
            axis = int(_attr(node, "axis", -1 if self.opset >= 13 else 1))  # the default moved in opset 13
            if rank is not None:
                axis %= rank
            return axis, f"{op} over axis {axis}"
        if op in _NCHW:
            return 1, f"{op} output (channels on axis 1)"
        if op == "Transpose":
            inner, how = self.class_axis(node.input[0], steps + 1)
            perm = _attr(node, "perm")
            if inner is None or perm is None or inner not in perm:
                return None, ""
            return list(perm).index(inner), f"Transpose {list(perm)} of a {how}"
        if op in _SAME_AXIS:
            for name in self.dynamic_inputs(node)[:1] if op == "PRelu" else self.dynamic_inputs(node):
                if rank is not None and self.rank(name) not in (None, rank):
                    continue  # a broadcast operand of another rank says nothing about this axis
                axis, how = self.class_axis(name, steps + 1)
                if axis is not None:
                    return axis, how
        return None, ""

    def source(self, tensor: str) -> str | None:
        for _ in range(_MAX_STEPS):
            node = self.makers.get(tensor)
            if node is None:
                return None
            dynamic = self.dynamic_inputs(node)
            # data movement, or a bias / scale by a constant: look behind it
            behind = (node.op_type in _PLUMBING and dynamic) or (node.op_type in _BY_CONSTANT and len(dynamic) == 1)
            if not behind:
                return node.op_type
            tensor = dynamic[0]
        return None


def output_origins(model: Any) -> dict[str, OutputOrigin]:
    """Graph output name -> :class:`OutputOrigin` (see the module doc)."""
    graph = _Graph(model)
    found = {}
    for o in model.graph.output:
        node = graph.makers.get(o.name)
        if node is None:
            continue
        axis = _attr(node, "axis")
        class_axis, how = graph.class_axis(o.name)
        found[o.name] = OutputOrigin(
            op=node.op_type,
            axis=None if axis is None else int(axis),
            batch_axis=graph.batch_axis(o.name),
            class_axis=class_axis,
            class_evidence=how,
            source=graph.source(o.name),
            rank=graph.rank(o.name),
        )
    return found
