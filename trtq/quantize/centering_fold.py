"""The engine form of centred activations: the activation and its shift folded into the producer.

:func:`~trtq.quantize.centering.apply_centrings` writes each centring as ``producer -> Relu/Clip ->
Add(-c) -> [reshape, pooling ...] -> QuantizeLinear``. TensorRT 8.6 cannot fuse the Add into the
convolution (slower engines: docs/decisions.md D12), and the other float form, a Clip with a negative lower bound
feeding QuantizeLinear, it computes wrongly. This pass turns the Q/DQ model into a form with
neither, computing the same INT8 levels:

- ``fold``: the ops between the Add and the QuantizeLinear all commute with a clamp (reshaping, max
  pooling), usually none. The centred tensor spans ``[-128 s, 127 s]`` (``s`` its scale), exactly the
  quantizer's clamp, so ``Q(clip(y, lo, hi) - c) = Q(y - c)`` for every ``y`` once ``Q(lo - c)`` is
  -128 and ``Q(hi - c)`` is 127 (checked here with the model's own float32 numbers). The activation
  and the Add go; the producer's bias takes ``-c``. TensorRT then sees Conv -> QuantizeLinear.
- ``move``: an averaging op (GlobalAveragePool, AveragePool, ReduceMean) lies in between, so the clamp must stay
  before it: the activation stays and the Add moves behind the last op, onto the (pooled) tensor
  the QuantizeLinear reads, where it is smallest.
- ``kept``: anything else (a reader that is not a QuantizeLinear, a scale the check refuses): the
  Add form stays.
"""

from typing import Optional

import numpy as np
import onnx

from trtq.model import set_nodes
from trtq.quantize.centering import LOWEST, RESHAPING_OPS, _activation_bounds
from trtq.quantize.centering_border import add_to_border, border_behind
from trtq.quantize.edit import InitializerEditor
from trtq.quantize.graph import GraphIndex, attr
from trtq.quantize.rules import QMAX

# ops between the shift and the quantizer through which a clamp may move unchanged
CLAMP_COMMUTING = frozenset({*RESHAPING_OPS, "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"})


def _quantized(x: float, scale: np.ndarray) -> int:
    return int(np.clip(np.rint(np.float32(x) / scale), LOWEST, QMAX))


def _path(index: GraphIndex, start: str, end: str) -> Optional[list[onnx.NodeProto]]:
    """The nodes from tensor ``start`` to tensor ``end``, each the only reader of its input."""
    nodes, tensor = [], start
    while tensor != end:
        readers = index.consumer_nodes(tensor)
        if len(readers) != 1 or index.fan_out(tensor) != 1 or len(nodes) > 16:
            return None
        nodes.append(readers[0])
        tensor = readers[0].output[0]
    return nodes


def _scales(index: GraphIndex, tensor: str) -> Optional[list[np.ndarray]]:
    """The scalar scales of the QuantizeLinear nodes that are ``tensor``'s only readers, else None."""
    readers = index.consumer_nodes(tensor)
    if not readers or tensor in index.graph_outputs or any(n.op_type != "QuantizeLinear" for n in readers):
        return None
    scales = []
    for q in readers:
        if not index.is_constant(q.input[1]) or index.array(q.input[1]).size != 1:
            return None
        if len(q.input) > 2 and q.input[2] and np.any(index.array(q.input[2]) != 0):
            return None
        scales.append(index.array(q.input[1]).astype(np.float32).reshape(()))
    return scales


def _clamp_is_the_activation(index: GraphIndex, act: onnx.NodeProto, shift: float, scales) -> bool:
    bounds = _activation_bounds(index, act)
    if bounds is None:
        return False
    lo, hi = bounds
    low = np.float32(lo) + np.float32(-shift)
    high = np.float32(hi) + np.float32(-shift) if np.isfinite(hi) else np.float32(np.inf)
    return all(_quantized(low, s) == LOWEST and _quantized(high, s) == QMAX for s in scales)


def _out_channels(index: GraphIndex, node: onnx.NodeProto) -> int:
    """Output channels of a Conv/Gemm producer, from its weight initializer (behind its Q/DQ pair)."""
    dims = index.dims(index.float_source(node.input[1]))
    if node.op_type == "Gemm":
        return dims[0] if attr(node, "transB", 0) else dims[1]
    return dims[0]


def _fold(ed: InitializerEditor, index: GraphIndex, act, add, producer, shift: float) -> None:
    """producer -> act -> add  ==>  producer(bias - shift), writing the Add's output. A border node
    (:mod:`~trtq.quantize.centering_border`) as the producer takes the shift on its map."""
    per_unit = 1.0 / float(attr(producer, "beta", 1.0)) if producer.op_type == "Gemm" else 1.0
    if producer.op_type == "Sub":  # a border node (the one producer that is not a Conv/Gemm/BN)
        add_to_border(ed, producer, -shift)
        producer.output[0] = add.output[0]
        return
    if producer.op_type == "BatchNormalization" or (len(producer.input) > 2 and producer.input[2]):
        delta = np.float64(-shift * per_unit)
    else:
        delta = np.full(_out_channels(index, producer), -shift * per_unit)
    ed.add_to_bias(producer, 2, delta, np.float32, "centring_bias")
    producer.output[0] = add.output[0]


def _move(ed: InitializerEditor, add, path: list) -> None:
    """act -> add -> path -> T  ==>  act -> path -> add -> T."""
    path[0].input[0] = add.input[0]
    tensor = path[-1].output[0]
    path[-1].output[0] = ed.new_name(f"{tensor}/unshifted")
    add.input[0] = path[-1].output[0]
    add.output[0] = tensor


def fold_centrings(model: onnx.ModelProto, centrings) -> dict[str, str]:
    """Rewrite ``model`` (the Q/DQ model of a centred float model) in place into the engine form;
    returns ``{centred tensor: "fold" | "move" | "kept"}``."""
    index = GraphIndex(model)
    ed = InitializerEditor(model)
    by_name = {n.name: n for n in model.graph.node}
    forms, gone, moved = {}, set(), {}
    for c in centrings:
        act = by_name.get(c.activation)
        add = next(iter(index.consumer_nodes(act.output[0])), None) if act is not None else None
        producer = by_name.get(c.producer)
        if producer is not None and act is not None:
            producer = border_behind(index, producer, act.input[0]) or producer
        path = _path(index, add.output[0], c.tensor) if add is not None and add.op_type == "Add" else None
        scales = _scales(index, c.tensor)
        if (
            path is None
            or scales is None
            or producer is None
            or index.fan_out(act.output[0]) != 1
            or index.fan_out(producer.output[0]) != 1
        ):
            forms[c.tensor] = "kept"
        elif all(n.op_type in CLAMP_COMMUTING for n in path) and _clamp_is_the_activation(index, act, c.shift, scales):
            _fold(ed, index, act, add, producer, c.shift)
            gone.update((act.name, add.name))
            forms[c.tensor] = "fold"
        elif path:
            _move(ed, add, path)
            moved[path[-1].name] = add
            forms[c.tensor] = "move"
        else:
            forms[c.tensor] = "kept"
    gone.update(a.name for a in moved.values())
    nodes = []
    for node in model.graph.node:
        if node.name in gone:
            continue
        nodes.append(node)
        if node.name in moved:
            add = onnx.NodeProto()
            add.CopyFrom(moved[node.name])
            nodes.append(add)
    set_nodes(model.graph, nodes)
    used = {i for n in model.graph.node for i in n.input}
    ed.drop_unused({i for i in ed.inits if i not in used})
    return forms


__all__ = ["CLAMP_COMMUTING", "fold_centrings"]
