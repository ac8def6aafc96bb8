"""Cast the float rest of a Q/DQ model to float16, keeping Q/DQ and the graph I/O in float32.

Why Casts and not float16 scales: before opset 19, QuantizeLinear takes only float32 input and
DequantizeLinear only returns float32 (its output type is the scale's type, and the scale must be
float32). So the variant that is valid for opset 13..17 - what TensorRT 8.6 parses - and runs in
ONNX Runtime keeps every Q/DQ pair (and its scales) in float32 and puts Casts at the borders:

    fp16 producer -> Cast(fp32) -> QuantizeLinear -> DequantizeLinear -> Cast(fp16) -> Conv (fp16)

Which node runs in float16 is decided per type constraint of the op's schema: a constraint
(``T``) moves to float16 when float16 is one of its allowed types and every input bound to it is
float32. Inputs with a fixed float32 type (Resize ``scales``) stay float32. These stay float32
as a whole: QuantizeLinear/DequantizeLinear, Cast and the ops whose output type comes from an
attribute (ConstantOfShape, EyeLike, Random*), ops with subgraphs (If/Loop/Scan), ops outside the
default domain, producers of tensors that a subgraph reads, and nodes where float16 would
overflow: a float32 weight beyond +-65504, or an input/output whose calibrated amax is above
``FP16_SAFE_AMAX`` (65504 / 4, a margin for data beyond the calibration set).

Weights: a float32 initializer read only by float16 slots is converted in place (values beyond
+-65504 are clipped); one also read as float32 (a weight behind QuantizeLinear) keeps its float32
copy and float16 readers get ``<name>_fp16``. Graph inputs and outputs keep float32 and their
names: inputs get ``Cast`` nodes to float16, an output computed in float16 is renamed
``<name>_fp16`` inside and cast back to float32 under its own name. Cast nodes are named
``<tensor>_cast_fp16`` / ``<tensor>_cast_fp32`` with outputs ``<tensor>_fp16`` / ``<tensor>_fp32``.
"""

from collections.abc import Mapping
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtq.model import RANDOM_OPS, set_nodes
from trtq.quantize.graph import FLOAT, FLOAT16, GraphIndex, default_opset, has_subgraph
from trtq.quantize.rewrite import Namer, taken_names

FP16_MAX = 65504.0
# a tensor whose calibrated amax is above this keeps its producer and readers in float32: unseen
# data may exceed the calibration maximum, and float16 overflows at 65504
FP16_SAFE_AMAX = FP16_MAX / 4
_KEEP_FP32_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "Cast", "ConstantOfShape", "EyeLike", *RANDOM_OPS, "Bernoulli"}
)
_SUFFIX = {FLOAT16: "fp16", FLOAT: "fp32"}


def _formal(params, slot: int):
    if slot < len(params):
        return params[slot]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def _converted_slots(node: onnx.NodeProto, opset: int, types: dict[str, int]) -> tuple[set[int], set[int]]:
    """Input and output slots of ``node`` that move from float32 to float16."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:  # unknown op: leave it in float32
        return set(), set()
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound_in: dict[str, list[int]] = {}
    bound_out: dict[str, list[int]] = {}
    for slot, name in enumerate(node.input):
        f = _formal(schema.inputs, slot)
        if name and f is not None and f.type_str in allowed:
            bound_in.setdefault(f.type_str, []).append(slot)
    for slot, name in enumerate(node.output):
        f = _formal(schema.outputs, slot)
        if name and f is not None and f.type_str in allowed:
            bound_out.setdefault(f.type_str, []).append(slot)
    ins: set[int] = set()
    outs: set[int] = set()
    for param, slots in bound_in.items():
        if "tensor(float16)" not in allowed[param]:
            continue
        if all(types.get(node.input[s]) == FLOAT for s in slots):
            ins.update(slots)
            outs.update(bound_out.get(param, []))
    return ins, outs


def _fp16_array(tensor: onnx.TensorProto) -> np.ndarray:
    values = numpy_helper.to_array(tensor)
    return np.clip(values, -FP16_MAX, FP16_MAX).astype(np.float16)


def _overflows(index: GraphIndex, node: onnx.NodeProto, amax: Mapping[str, float]) -> bool:
    """Whether float16 would overflow at this node: a large weight or a large activation."""
    for name in node.input:
        if name in index.initializers:
            t = index.initializers[name]
            if t.data_type == FLOAT and np.abs(index.array(name)).max(initial=0) > FP16_MAX:
                return True
    return any(float(amax.get(t, 0.0)) > FP16_SAFE_AMAX for t in list(node.input) + list(node.output) if t)


def cast_float_rest(model: onnx.ModelProto, amax: Optional[Mapping[str, float]] = None) -> onnx.ModelProto:
    """Rewrite ``model`` (a private copy) in place: float16 everywhere but Q/DQ and the I/O.

    ``amax`` (calibrated ranges) keeps nodes whose activations come near the float16 limit in
    float32, as do weights beyond it (BatchNorm variances of large activations).
    """
    index = GraphIndex(model)
    graph = model.graph
    orig_type = dict(index.types)
    namer = Namer(taken_names(graph))
    conv_in, new_type = _fp16_slots(index, default_opset(model), orig_type, amax or {})
    cast_of, tail_casts = _cast_outputs_back(index, graph, new_type, orig_type, namer)
    init_fp16 = _fp16_weights(index, graph, conv_in, namer)
    set_nodes(graph, _nodes_with_casts(index, conv_in, init_fp16, new_type, orig_type, cast_of, tail_casts, namer))
    del graph.value_info[:]  # float types changed; consumers re-infer what they need
    return model


def _fp16_slots(
    index: GraphIndex, opset: int, orig_type: dict[str, int], amax: Mapping[str, float]
) -> tuple[dict[int, set[int]], dict[str, int]]:
    """Step 1, which slots move to float16: {node index: its float16 input slots}, and the tensor
    types after the move."""
    types = dict(index.types)
    pinned = {index.producer[t] for t in index.subgraph_refs if t in index.producer}
    conv_in: dict[int, set[int]] = {}
    for idx, node in enumerate(index.nodes):
        if (
            node.op_type in _KEEP_FP32_OPS
            or node.domain not in ("", "ai.onnx")
            or has_subgraph(node)
            or idx in pinned
            or _overflows(index, node, amax)
        ):
            continue
        ins, outs = _converted_slots(node, opset, orig_type)
        if ins:
            conv_in[idx] = ins
            for s in outs:
                types[node.output[s]] = FLOAT16  # new type of this tensor
    return conv_in, types


def _cast_outputs_back(
    index: GraphIndex, graph: onnx.GraphProto, new_type: dict[str, int], orig_type: dict[str, int], namer: Namer
) -> tuple[dict[tuple[str, int], str], dict[int, list[onnx.NodeProto]]]:
    """Step 2, graph outputs computed in float16: renamed inside, cast back under the original name."""
    nodes = index.nodes
    cast_of: dict[tuple[str, int], str] = {}
    tail_casts: dict[int, list[onnx.NodeProto]] = {}
    for out in [o.name for o in graph.output]:
        if new_type.get(out) != FLOAT16 or out not in index.producer:
            continue
        inner = namer(f"{out}_fp16")
        p = index.producer[out]
        nodes[p].output[list(nodes[p].output).index(out)] = inner
        for c_idx, slot in index.consumers.get(out, []):
            nodes[c_idx].input[slot] = inner
        new_type[inner] = FLOAT16
        new_type[out] = FLOAT
        orig_type[inner] = FLOAT
        cast = helper.make_node("Cast", [inner], [out], name=namer(f"{out}_cast_fp32"), to=FLOAT)
        tail_casts.setdefault(p, []).append(cast)
        cast_of[(inner, FLOAT)] = out
    return cast_of, tail_casts


def _fp16_weights(
    index: GraphIndex, graph: onnx.GraphProto, conv_in: dict[int, set[int]], namer: Namer
) -> dict[str, str]:
    """Step 3, weights read as float16: {initializer: its float16 version} (in place when every
    reader wants float16, else a copy)."""
    fp16_readers: dict[str, int] = {}
    for idx, ins in conv_in.items():
        for s in ins:
            name = index.nodes[idx].input[s]
            if name in index.initializers:
                fp16_readers[name] = fp16_readers.get(name, 0) + 1
    init_fp16: dict[str, str] = {}
    for name, count in fp16_readers.items():
        tensor = index.initializers[name]
        if tensor.data_type != FLOAT:
            continue
        if count == index.fan_out(name):  # every reader wants float16: convert in place
            tensor.CopyFrom(numpy_helper.from_array(_fp16_array(tensor), name))
            init_fp16[name] = name
        else:
            copy = namer(f"{name}_fp16")
            graph.initializer.append(numpy_helper.from_array(_fp16_array(tensor), copy))
            init_fp16[name] = copy
    return init_fp16


def _nodes_with_casts(
    index: GraphIndex,
    conv_in: dict[int, set[int]],
    init_fp16: dict[str, str],
    new_type: dict[str, int],
    orig_type: dict[str, int],
    cast_of: dict[tuple[str, int], str],
    tail_casts: dict[int, list[onnx.NodeProto]],
    namer: Namer,
) -> list[onnx.NodeProto]:
    """Step 4, the nodes with a Cast wherever a reader wants another type than the tensor has."""
    ordered: list[onnx.NodeProto] = []
    for idx, node in enumerate(index.nodes):
        ins = conv_in.get(idx, set())
        for slot, name in enumerate(node.input):
            if not name:
                continue
            if slot in ins and name in init_fp16:
                node.input[slot] = init_fp16[name]
                continue
            if name in index.initializers:
                continue
            have = new_type.get(name)
            want = FLOAT16 if slot in ins else orig_type.get(name)
            if have == want or have not in (FLOAT, FLOAT16) or want not in (FLOAT, FLOAT16):
                continue
            key = (name, want)
            if key not in cast_of:
                out = namer(f"{name}_{_SUFFIX[want]}")
                ordered.append(
                    helper.make_node("Cast", [name], [out], name=namer(f"{name}_cast_{_SUFFIX[want]}"), to=want)
                )
                cast_of[key] = out
            node.input[slot] = cast_of[key]
        ordered.append(node)
        ordered.extend(tail_casts.get(idx, []))
    return ordered
