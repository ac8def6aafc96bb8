"""Centred activations: one-sided activations shifted so symmetric INT8 uses both halves.

TensorRT quantizes activations symmetrically (zero point 0), so a ReLU/ReLU6 output in ``[0, a]``
only ever uses levels 0..127: half the INT8 range is wasted and the step is ``a / 127``. When the
activation sits between a layer with a bias and quantized layers that read it linearly, the graph
can be rewritten, exactly in float, to carry ``x - c`` instead, with the step ``s = a / 255`` and
``c = 128 s``: the range ``[0, a]`` becomes ``[-128 s, 127 s]``, every INT8 level of the quantizer
(which clamps to [-128, 127], in ONNX and in TensorRT alike), and 0 lands on level -128 exactly.

Two forms of the same function:

- the float form, for the data steps (gptq, bias correction) and the Q/DQ rewrite
  (:func:`apply_centrings`): an ``Add(-c)`` follows the activation, which keeps its bounds; pooling
  and reshaping ops in between commute with the shift (``GlobalAveragePool(x - c) =
  GlobalAveragePool(x) - c``); every reader (a Conv without implicit padding, or a Gemm on its first
  input) gets ``+ c * sum(W)`` per output channel on its bias;
- the engine form, made from the Q/DQ model by :func:`trtq.quantize.centering_fold.fold_centrings`:
  the quantizer's clamp is the activation, so the activation and the Add go and the producer's bias
  takes ``-c``; TensorRT sees a plain Conv -> QuantizeLinear, which it fuses as it fuses any layer.

Readers that pad (a Pad node or a Conv's ``pads``) are centred only with ``center_padded``: their
zeros stand for ``c`` after the shift. :mod:`trtq.quantize.centering_border` then puts a constant
border map behind each such Conv (exact, but TensorRT 8.6 runs those convs FP16: docs/decisions.md
D42). An explicit ``Pad(-c)`` was exact on TensorRT 8.6.0 too, and slower still (D12). The other
forms tried there: the producer's bias and the clip bounds moved by ``-c`` (a Clip with a negative
lower bound before QuantizeLinear: computed wrongly), the Add left in the engine (exact, slower: not
fused into the convolution).

Only activations whose lower bound is 0 are shifted (then 0 lands on a level; with another bound,
e.g. HardSwish's -0.375, every zero would share one rounding error, a bias nothing corrects).

Nothing here depends on data; :func:`find_centrings` only reads the graph and the plan's amax.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import onnx

from trtq.model import set_nodes
from trtq.quantize.centering_border import add_border, add_to_border, border_map, border_ok, border_reading, pads_input
from trtq.quantize.edit import InitializerEditor
from trtq.quantize.graph import GraphIndex, attr
from trtq.quantize.rules import QMAX
from trtq.quantize.scales import activation_scale

MIN_GAIN = 1.25  # centre only where the INT8 step shrinks at least this much
LEVELS = 255.0  # steps between INT8's lowest and highest level (-128 .. 127)
LOWEST = -128  # the level 0 (the activation's lower bound) lands on
BIAS_OPS = ("Conv", "Gemm", "BatchNormalization")  # producers whose additive bias absorbs -c


@dataclass(frozen=True)
class Centring:
    tensor: str  # the quantized tensor (the activation's output, or a pooled / reshaped form of it)
    shift: float  # c = 128 s: the tensor now carries x - c
    amax: float  # its new amax, 127 s: [lo, min(amax, hi)] spread over all 255 INT8 steps
    activation: str  # node names, for the report and the rewrite
    producer: str
    readers: tuple

    def describe(self) -> str:
        return f"{self.tensor} (-{self.shift:g}, amax {self.amax:g})"


def _constant(index: GraphIndex, name: str) -> Optional[float]:
    if not name or not index.is_constant(name):
        return None
    arr = index.array(name)
    return float(arr.reshape(-1)[0]) if arr.size == 1 else None


def _activation_bounds(index: GraphIndex, node: onnx.NodeProto):
    """(lo, hi) of a Relu or a Clip with constant bounds (hi may be inf), else None."""
    if node.op_type == "Relu":
        return 0.0, math.inf
    if node.op_type != "Clip" or len(node.input) < 2:
        return None
    lo = _constant(index, node.input[1])
    hi = _constant(index, node.input[2]) if len(node.input) > 2 and node.input[2] else math.inf
    if lo is None or hi is None or not math.isfinite(lo):
        return None
    return lo, hi


def _only_use(index: GraphIndex, tensor: str) -> Optional[onnx.NodeProto]:
    if index.fan_out(tensor) != 1 or tensor in index.graph_outputs:
        return None
    uses = index.consumers.get(tensor, [])
    return index.nodes[uses[0][0]] if len(uses) == 1 else None


def _adjustable_bias(index: GraphIndex, node: onnx.NodeProto, slot: int) -> bool:
    """The node's bias input is absent or an initializer only this node reads."""
    name = node.input[slot] if len(node.input) > slot else ""
    return not name or (index.is_constant(name) and index.fan_out(name) == 1)


def _producer_ok(index: GraphIndex, node: Optional[onnx.NodeProto]) -> bool:
    if node is None or node.op_type not in BIAS_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Conv":
        return index.is_constant(node.input[1]) and _adjustable_bias(index, node, 2)
    if node.op_type == "Gemm":
        return attr(node, "beta", 1.0) != 0 and index.is_constant(node.input[1]) and _adjustable_bias(index, node, 2)
    return len(node.input) > 2 and index.is_constant(node.input[2]) and index.fan_out(node.input[2]) == 1


def _reader_ok(index: GraphIndex, node: onnx.NodeProto, slot: int, padded: bool = False) -> bool:
    """A linear reader whose output can take ``+ c * sum(W)``: a Conv without implicit padding (or,
    with ``padded``, one whose border map :mod:`~trtq.quantize.centering_border` computes) or a Gemm
    (transA 0), on its data input, with a constant weight and an adjustable bias."""
    if slot != 0 or node.domain not in ("", "ai.onnx") or len(node.input) < 2 or not index.is_constant(node.input[1]):
        return False
    if node.op_type == "Conv":
        if padded and pads_input(node):
            return border_ok(index, node) and _adjustable_bias(index, node, 2)
        pads = attr(node, "pads", None) or []
        return (
            not any(pads)
            and attr(node, "auto_pad", b"NOTSET") in (b"NOTSET", b"VALID", "NOTSET", "VALID")
            and _adjustable_bias(index, node, 2)
        )
    if node.op_type == "Gemm":
        return not attr(node, "transA", 0) and attr(node, "beta", 1.0) != 0 and _adjustable_bias(index, node, 2)
    return False


# ops that only move values around: f(x - c) = f(x) - c and f(clip(x)) = clip(f(x))
RESHAPING_OPS = frozenset({"Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})
# ops with f(x - c) = f(x) - c for a scalar c, the activation's output may reach the quantized
# tensor through (each read by nothing else); not Pad (see the module docstring)
COMMUTING_OPS = frozenset(
    {
        *RESHAPING_OPS,
        "GlobalAveragePool",
        "GlobalMaxPool",
        "MaxPool",
        "AveragePool",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
    }
)


def _commutes(node: onnx.NodeProto) -> bool:
    if node.op_type not in COMMUTING_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "AveragePool":  # padded zeros that count in the average do not move with x
        return not attr(node, "count_include_pad", 0) or not any(attr(node, "pads", None) or [])
    return True


def _through_commuting(index: GraphIndex, tensor: str) -> Optional[onnx.NodeProto]:
    """The Relu/Clip behind ``tensor`` through commuting ops, or None when there is none or
    something else reads an intermediate tensor."""
    node = index.producer_node(tensor)
    for _ in range(16):
        if node is None:
            return None
        if node.op_type in ("Relu", "Clip"):
            return node
        if not _commutes(node) or _only_use(index, node.input[0]) is None:
            return None
        node = index.producer_node(node.input[0])
    return None


def find_centrings(
    index: GraphIndex, tensors: dict[str, float], quantized_input: Callable[[int, int], bool], padded: bool = False
) -> list[Centring]:
    """The centrings possible for the quantized activation ``tensors`` (name -> amax) of the float
    graph ``index``; ``quantized_input(node index, slot)`` says whether that input gets Q/DQ;
    ``padded``: padded Conv readers too, each with a border map."""
    out = []
    for tensor, amax in tensors.items():
        read_elsewhere = index.fan_out(tensor) != len(index.consumers.get(tensor, []))
        if not amax > 0 or read_elsewhere or tensor in index.graph_outputs:
            continue
        node = _through_commuting(index, tensor)
        if node is None:
            continue
        bounds = _activation_bounds(index, node)
        if bounds is None or _only_use(index, node.input[0]) is None:
            continue
        producer = index.producer_node(node.input[0])
        if not _producer_ok(index, producer):
            continue
        readers = index.consumers.get(tensor, [])
        if not readers or not all(
            _reader_ok(index, index.nodes[i], s, padded) and quantized_input(i, s) for i, s in readers
        ):
            continue
        lo, hi = bounds
        if lo != 0.0:
            # only then does 0 (ReLU's zeros) land on the shifted grid, at -128; elsewhere every
            # zero would carry the same rounding error, a bias nothing corrects
            continue
        top = min(float(amax), hi)
        new_amax = top * QMAX / LEVELS
        if not new_amax > 0 or float(amax) / new_amax < MIN_GAIN:
            continue
        shift = -LOWEST * float(activation_scale(new_amax))  # exactly 128 steps of the float32 scale
        out.append(
            Centring(tensor, shift, new_amax, node.name, producer.name, tuple(index.nodes[i].name for i, _ in readers))
        )
    return out


# -- the rewrite ---------------------------------------------------------------------------------


def _bias_per_shift(node: onnx.NodeProto, w: np.ndarray) -> np.ndarray:
    """What the bias of a reader applying ``w`` must gain per unit of input shift, per output
    channel: sum(W) for a Conv ([Cout, ...]); alpha / beta x the column sums of op(B) for a Gemm."""
    w = w.astype(np.float64)
    if node.op_type == "Conv":
        return w.reshape(w.shape[0], -1).sum(axis=1)
    b = w.T if attr(node, "transB", 0) else w
    return float(attr(node, "alpha", 1.0)) / float(attr(node, "beta", 1.0)) * b.sum(axis=0)


def settle_on_levels(qdq: onnx.ModelProto, centrings: list[Centring], readers: Optional[set] = None) -> None:
    """Move each reader's ``+ c * sum(W)`` to ``+ c * sum(Wq)`` (nearest INT8 levels) in the Q/DQ
    model, in place (only for the reader node names in ``readers`` when given). The reader then
    errs by ``(Wq - W) x`` exactly as without centring, instead of ``(Wq - W)(x - c)``: for ReLU
    outputs, mostly below ``c``, that keeps the mean error small when no gptq rounding chose the
    levels for the shifted inputs (measured on EfficientNet-Lite0: docs/decisions.md D4)."""
    from trtq.quantize.bias import rounded_weight

    index = GraphIndex(qdq)
    ed = InitializerEditor(qdq)
    by_name = {n.name: n for n in index.nodes}
    for c in centrings:
        for name in c.readers:
            if readers is not None and name not in readers:
                continue
            reader = by_name[name]
            pair = rounded_weight(index, reader.input[1], {})
            if pair is None or len(reader.input) < 3 or not reader.input[2]:
                continue
            w, wq = pair
            ed.add_to_bias(
                reader,
                2,
                c.shift * (_bias_per_shift(reader, wq) - _bias_per_shift(reader, w)),
                np.float32,
                "centring_bias",
            )
            border = border_reading(index, reader)
            if border is not None:  # the map moves with the compensation: -c times Wq on padding
                add_to_border(
                    ed, border, border_map(index, reader, wq, c.shift) - border_map(index, reader, w, c.shift)
                )


def _subtraction(ed: InitializerEditor, act: onnx.NodeProto, shift: float) -> onnx.NodeProto:
    """``Add(act_output, -shift)`` to insert right after ``act``: it takes over the activation's
    output name (so the plan's tensor names stay), the activation writes ``<name>/uncentred``."""
    out = act.output[0]
    act.output[0] = ed.new_name(f"{act.name}/uncentred")
    shift_name = ed.new(f"{act.name}/centring_shift", np.array(-shift, np.float32))
    return onnx.helper.make_node("Add", [act.output[0], shift_name], [out], name=ed.new_name(f"{act.name}/centring"))


def _insert_after(model: onnx.ModelProto, after: dict[str, onnx.NodeProto]) -> None:
    """Put each node of ``after`` (keyed by a node name) right behind that node."""
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.name in after:
            nodes.append(after[node.name])
    set_nodes(model.graph, nodes)


def apply_centrings(model: onnx.ModelProto, centrings: list[Centring], index: Optional[GraphIndex] = None) -> None:
    """Rewrite the float ``model`` in place so each centring's tensor carries ``x - shift``; the
    model computes the same function (up to float rounding). ``index``: the caller's
    :class:`GraphIndex` of ``model`` as it is now (the border maps read its shapes), else one is built.

    The shift is an explicit ``Add(-shift)`` right after the activation (producer and clip bounds
    stay) and every reader's bias gains ``shift * sum(W)``. This is the float form the data steps
    observe; :func:`trtq.quantize.centering_fold.fold_centrings` turns the Q/DQ model into the form
    engines run.
    """
    ed = InitializerEditor(model)
    if index is None:
        index = GraphIndex(model)  # the shapes the border maps need, read before anything moves
    subtractions: dict[str, onnx.NodeProto] = {}
    for c in centrings:
        act = ed.nodes[c.activation]
        shift = np.float64(c.shift)
        subtractions[act.name] = _subtraction(ed, act, float(shift))
        for name in c.readers:
            reader = ed.nodes[name]
            w = ed.array(reader.input[1])
            ed.add_to_bias(reader, 2, shift * _bias_per_shift(reader, w), w.dtype, "centring_bias")
            if reader.op_type == "Conv" and pads_input(reader):
                subtractions[reader.name] = add_border(ed, index, reader, float(shift))
    _insert_after(model, subtractions)


__all__ = ["MIN_GAIN", "Centring", "apply_centrings", "find_centrings", "settle_on_levels"]
