"""Insert the planned QuantizeLinear/DequantizeLinear pairs into the graph.

Names are derived from the quantized tensor, so they are stable across runs:

- ``<t>_scale`` (float32, scalar or [C]) and ``<t>_zero_point`` (int8 zeros, same shape),
- ``<t>_QuantizeLinear`` -> ``<t>_QuantizeLinear_Output``,
- ``<t>_DequantizeLinear`` -> ``<t>_DequantizeLinear_Output``, which the quantized consumers read.

One pair per (tensor, scale): every quantized consumer of a tensor reads the same DequantizeLinear
output. A tensor that needs a second variant (the same weight per-channel on two different axes)
gets ``<t>_axis<k>`` / ``<t>_per_tensor`` as its base. A name already used in the model gets
``_<n>`` appended. A pair for a computed tensor sits right after its producer; a pair for a graph
input or a weight sits right before its first quantized consumer. A Conv/ConvTranspose whose weight
now comes from DequantizeLinear gets an explicit ``kernel_shape`` (TensorRT 8.6 needs it).
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtq.model import set_nodes
from trtq.quantize.plan import PairKey, Plan


def taken_names(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        names.add(node.name)
        names.update(node.input)
        names.update(node.output)
    names.update(i.name for i in graph.initializer)
    names.update(v.name for v in graph.input)
    names.update(v.name for v in graph.output)
    names.discard("")
    return names


class Namer:
    """Hands out names not yet used in the graph: ``want``, else ``want_1``, ``want_2``..."""

    def __init__(self, taken: set[str]):
        self.taken = taken

    def __call__(self, want: str) -> str:
        name, n = want, 0
        while name in self.taken:
            n += 1
            name = f"{want}_{n}"
        self.taken.add(name)
        return name


def insert_qdq(model: onnx.ModelProto, plan: Plan) -> onnx.ModelProto:
    """Rewrite ``model`` (already a private copy) in place with the pairs of ``plan``."""
    graph = model.graph
    namer = Namer(taken_names(graph))
    nodes: list[onnx.NodeProto] = list(graph.node)

    bases: dict[PairKey, str] = {}
    variants_seen: set[str] = set()
    for key in plan.pairs:
        tensor, axis = key
        if tensor not in variants_seen:
            bases[key] = tensor
            variants_seen.add(tensor)
        else:
            bases[key] = f"{tensor}_axis{axis}" if axis is not None else f"{tensor}_per_tensor"

    dq_output: dict[PairKey, str] = {}
    pair_nodes: dict[PairKey, list[onnx.NodeProto]] = {}
    for key, pair in plan.pairs.items():
        base = bases[key]
        scale_name = namer(f"{base}_scale")
        zp_name = namer(f"{base}_zero_point")
        graph.initializer.append(numpy_helper.from_array(pair.scale.astype(np.float32), scale_name))
        graph.initializer.append(numpy_helper.from_array(np.zeros(pair.scale.shape, dtype=np.int8), zp_name))
        q_out = namer(f"{base}_QuantizeLinear_Output")
        dq_out = namer(f"{base}_DequantizeLinear_Output")
        extra = {"axis": int(pair.axis)} if pair.axis is not None else {}
        q = helper.make_node(
            "QuantizeLinear", [pair.tensor, scale_name, zp_name], [q_out], name=namer(f"{base}_QuantizeLinear"), **extra
        )
        dq = helper.make_node(
            "DequantizeLinear", [q_out, scale_name, zp_name], [dq_out], name=namer(f"{base}_DequantizeLinear"), **extra
        )
        pair_nodes[key] = [q, dq]
        dq_output[key] = dq_out

    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    after: dict[int, list[PairKey]] = {}
    before: dict[int, list[PairKey]] = {}
    first_use: dict[PairKey, int] = {}
    for idx, _slot, key in plan.uses:
        first_use[key] = min(idx, first_use.get(key, idx))
    for key in plan.pairs:
        src = producer.get(key[0])
        if src is not None:
            after.setdefault(src, []).append(key)
        else:
            before.setdefault(first_use[key], []).append(key)

    dims = {i.name: list(i.dims) for i in graph.initializer}
    for idx, slot, key in plan.uses:
        nodes[idx].input[slot] = dq_output[key]
        _add_kernel_shape(nodes[idx], slot, dims.get(key[0]))

    ordered: list[onnx.NodeProto] = []
    for idx, node in enumerate(nodes):
        for key in before.get(idx, []):
            ordered.extend(pair_nodes[key])
        ordered.append(node)
        for key in after.get(idx, []):
            ordered.extend(pair_nodes[key])
    set_nodes(graph, ordered)
    return model


def _add_kernel_shape(node: onnx.NodeProto, slot: int, weight_dims) -> None:
    """Give a Conv/ConvTranspose whose weight now comes from DequantizeLinear its ``kernel_shape``.

    The attribute is optional in ONNX (inferred from the weight), but TensorRT 8.6's parser cannot
    infer it once the weight is the output of a DequantizeLinear instead of an initializer.
    """
    if node.op_type not in ("Conv", "ConvTranspose") or slot != 1 or not weight_dims or len(weight_dims) < 3:
        return
    if any(a.name == "kernel_shape" for a in node.attribute):
        return
    node.attribute.append(helper.make_attribute("kernel_shape", [int(d) for d in weight_dims[2:]]))
