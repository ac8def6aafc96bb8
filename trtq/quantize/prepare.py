"""Bring an FP32 model into the one shape the placement rules expect.

Exporters disagree on small things that matter to a quantizer. :func:`prepare_model` returns a
normalised copy (the caller's model is never touched):

1. default-domain opset below 13 is upgraded to 13 with ``onnx.version_converter`` (per-channel
   Q/DQ needs the ``axis`` attribute of opset 13); 13 and above is kept as it is;
2. nodes are put in topological order if they are not (stable: ties keep the file's order);
3. main-graph ``Constant`` nodes become initializers of the same name (Paddle exports keep every
   weight in a ``Constant``);
4. initializers also listed as graph inputs are removed from the inputs: they are weights, and
   a weight that callers could override cannot be quantized ahead of time;
5. nodes whose inputs are all initializers are evaluated into initializers named like their
   outputs: data-movement ops (Paddle's ``Constant -> Identity -> Conv`` weights and
   ``Constant -> Reshape -> Add`` biases) in numpy, any other deterministic op (``ConstantOfShape``,
   arithmetic and shape computations on weights) with ONNX's reference implementation;
6. nodes without a name get ``<op_type>_<position>``, and repeated names get ``__<n>`` appended, so
   that every node can be named in reports, ``--exclude`` and ``only_nodes``;
7. a ``ReduceMean`` over the two spatial axes of a 4-D tensor becomes ``GlobalAveragePool``
   (:mod:`trtq.quantize.spatial_mean`: TensorRT runs the pooling in INT8, the reduction not).

Tensor names are never changed, so a calibration cache made on the original model still applies.
"""

import heapq
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtq.errors import ModelError
from trtq.model import RANDOM_OPS, set_nodes
from trtq.quantize.graph import attr, default_opset, subgraph_names
from trtq.quantize.spatial_mean import spatial_means_to_pools

MIN_QDQ_OPSET = 13  # QuantizeLinear/DequantizeLinear with per-axis scales


def prepare_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Normalised copy of ``model`` and notes (one line each) about what was changed."""
    notes: list[str] = []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out = _upgrade_opset(out, notes)
    _toposort(out.graph, notes)
    _constants_to_initializers(out.graph, notes)
    _drop_weight_inputs(out.graph, notes)
    _fold_constants(out.graph, notes, default_opset(out))
    _name_nodes(out.graph, notes)
    spatial_means_to_pools(out, notes)
    return out, notes


def _upgrade_opset(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    opset = default_opset(model)
    if opset >= MIN_QDQ_OPSET:
        return model
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, MIN_QDQ_OPSET)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(
            f"cannot upgrade the model from opset {opset} to {MIN_QDQ_OPSET} for per-channel Q/DQ ({reason})",
            f"re-export the model with opset {MIN_QDQ_OPSET} or later (torch.onnx.export(..., opset_version=17))",
        ) from None
    if converted.ir_version < 7:  # opset 13 needs IR version 7
        converted.ir_version = 7
    notes.append(f"upgraded default-domain opset {opset} -> {MIN_QDQ_OPSET}")
    return converted


def _toposort(graph: onnx.GraphProto, notes: list[str]) -> None:
    nodes = list(graph.node)
    available: set[str] = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    produced = {o for n in nodes for o in n.output if o}
    waiting: dict[str, list[int]] = {}
    missing = []
    for idx, node in enumerate(nodes):
        deps = {i for i in node.input if i in produced and i not in available}
        missing.append(len(deps))
        for d in deps:
            waiting.setdefault(d, []).append(idx)
    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        idx = heapq.heappop(ready)
        order.append(idx)
        for o in nodes[idx].output:
            for j in waiting.pop(o, []):
                missing[j] -= 1
                if missing[j] == 0:
                    heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ModelError(
            "the model graph has a cycle or a node input nobody produces",
            "check the model with onnx.checker.check_model and re-export it",
        )
    if order != sorted(order):
        set_nodes(graph, [nodes[i] for i in order])
        notes.append("sorted nodes into topological order")


def _constant_value(node: onnx.NodeProto):
    """The value of a Constant node as a TensorProto, or None for forms we leave alone."""
    for a in node.attribute:
        if a.name == "value":
            return a.t
        if a.name == "value_float":
            return numpy_helper.from_array(np.array(a.f, dtype=np.float32))
        if a.name == "value_floats":
            return numpy_helper.from_array(np.array(list(a.floats), dtype=np.float32))
        if a.name == "value_int":
            return numpy_helper.from_array(np.array(a.i, dtype=np.int64))
        if a.name == "value_ints":
            return numpy_helper.from_array(np.array(list(a.ints), dtype=np.int64))
    return None  # sparse_value, value_string(s): rare, and never a weight


def _constants_to_initializers(graph: onnx.GraphProto, notes: list[str]) -> None:
    keep = []
    converted = 0
    existing = {i.name for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            value = _constant_value(node)
            name = node.output[0]
            if value is not None and name not in existing:
                tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
                tensor.name = name
                graph.initializer.append(tensor)
                existing.add(name)
                converted += 1
                continue
        keep.append(node)
    if converted:
        set_nodes(graph, keep)
        notes.append(f"turned {converted} Constant nodes into initializers")


def _reshape(node, data, shape):
    shape = [int(d) for d in shape]
    if not int(attr(node, "allowzero", 0)):
        shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return data.reshape(shape)


def _axes(node, inputs):
    axes = inputs[1] if len(inputs) > 1 else attr(node, "axes")
    return None if axes is None else [int(a) for a in np.asarray(axes).ravel()]


def _unsqueeze(node, *inputs):
    data, axes = inputs[0], _axes(node, inputs)
    rank = data.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        data = np.expand_dims(data, a)
    return data


def _squeeze(node, *inputs):
    axes = _axes(node, inputs)
    return np.squeeze(inputs[0], axis=None if axes is None else tuple(axes))


def _flatten(node, data):
    axis = int(attr(node, "axis", 1)) % (data.ndim + 1) if data.ndim else 0
    lead = int(np.prod(data.shape[:axis])) if axis else 1
    return data.reshape(lead, -1)


def _cast(node, data):
    return data.astype(helper.tensor_dtype_to_np_dtype(int(attr(node, "to"))))


# data-movement ops on constants that exporters leave in the graph (Paddle reshapes every bias)
_FOLDABLE = {
    "Identity": lambda node, x: x,
    "Reshape": _reshape,
    "Transpose": lambda node, x: np.transpose(x, attr(node, "perm")),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Flatten": _flatten,
    "Cast": _cast,
}
_NUMERIC = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}


# never evaluated ahead of time: random or stateful ops, and the quantization ops themselves
_NOT_FOLDED = {*RANDOM_OPS, "Bernoulli", "Dropout", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
_MAX_FOLDED_ELEMENTS = 1 << 26  # a weight is far smaller; a larger constant stays a run-time computation


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _evaluate(node: onnx.NodeProto, arrays: list[np.ndarray], opset: int) -> Optional[list[np.ndarray]]:
    """The outputs of one node on constant inputs, or None when it is not ours to evaluate.

    Data-movement ops use the small numpy forms above; every other deterministic default-domain op
    (ConstantOfShape, Mul/Add/Concat on weights, Shape/Gather/Range arithmetic, ...) goes through
    ONNX's reference implementation, which follows the spec of the model's opset."""
    fn = _FOLDABLE.get(node.op_type)
    if fn is not None:
        if len(node.output) != 1:
            return None
        return [fn(node, *arrays)]
    if node.op_type in _NOT_FOLDED or _has_subgraph(node):
        return None
    if (
        node.op_type == "ConstantOfShape"
        and arrays
        and int(np.prod(arrays[0], dtype=np.float64)) > _MAX_FOLDED_ELEMENTS
    ):
        return None
    from onnx.reference import ReferenceEvaluator

    names = [i for i in node.input if i]
    results = ReferenceEvaluator(node, opsets={"": opset}).run(None, dict(zip(names, arrays)))
    return [np.asarray(r) for r in results]


def _fold_constants(graph: onnx.GraphProto, notes: list[str], opset: int) -> None:
    """Evaluate nodes whose inputs are all initializers (in one ordered pass, so chains fold).

    Weights that an exporter computes in the graph (Paddle's ``Constant -> Reshape`` biases, model
    zoo graphs that build a weight from ``ConstantOfShape`` and arithmetic) become initializers,
    which the placement rules can quantize."""
    inits = {i.name: i for i in graph.initializer}
    protected = {o.name for o in graph.output} | subgraph_names(graph)
    uses: dict[str, int] = {}
    for node in graph.node:
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
    keep = []
    moved = computed = 0
    for node in graph.node:
        inputs = [i for i in node.input if i]
        outputs = list(node.output)
        if (
            node.domain not in ("", "ai.onnx")
            or not inputs
            or not outputs
            or any(not o or o in protected or o in inits for o in outputs)
            or not all(i in inits and inits[i].data_type in _NUMERIC for i in inputs)
            or (node.op_type == "Cast" and int(attr(node, "to", 0)) not in _NUMERIC)
        ):
            keep.append(node)
            continue
        try:
            values = _evaluate(node, [numpy_helper.to_array(inits[i]) for i in inputs], opset)
        except Exception:  # odd attributes or shapes, an op the reference lacks: leave it to the runtime
            values = None
        if (
            values is None
            or len(values) != len(outputs)
            or any(v.dtype.kind not in "biuf" or v.size > _MAX_FOLDED_ELEMENTS for v in values)
        ):
            keep.append(node)
            continue
        for name, value in zip(outputs, values):
            tensor = numpy_helper.from_array(np.asarray(value, order="C"), name)
            graph.initializer.append(tensor)
            inits[name] = tensor
        for i in inputs:
            uses[i] -= 1
            if uses[i] == 0 and i not in protected:  # that node was its last user
                graph.initializer.remove(inits.pop(i))
        if node.op_type in _FOLDABLE:
            moved += 1
        else:
            computed += 1
    if moved or computed:
        set_nodes(graph, keep)
    if moved:
        notes.append(f"folded {moved} data-movement {'node' if moved == 1 else 'nodes'} on constants into initializers")
    if computed:
        nodes = "node" if computed == 1 else "nodes"
        notes.append(f"computed {computed} {nodes} on constants ahead of time (ConstantOfShape, arithmetic on weights)")


def _drop_weight_inputs(graph: onnx.GraphProto, notes: list[str]) -> None:
    inits = {i.name for i in graph.initializer}
    weights = [vi for vi in graph.input if vi.name in inits]
    if not weights:
        return
    keep = [vi for vi in graph.input if vi.name not in inits]
    del graph.input[:]
    graph.input.extend(keep)
    notes.append(f"removed {len(weights)} initializers from the graph inputs (treated as weights)")


def _name_nodes(graph: onnx.GraphProto, notes: list[str]) -> None:
    taken = {n.name for n in graph.node if n.name}
    seen: set[str] = set()
    renamed = 0
    for idx, node in enumerate(graph.node):
        name = node.name
        if name and name not in seen:
            seen.add(name)
            continue
        base = name if name else f"{node.op_type}_{idx}"
        candidate = base
        n = 1
        while candidate in seen or candidate in taken:
            n += 1
            candidate = f"{base}__{n}"
        node.name = candidate
        seen.add(candidate)
        taken.add(candidate)
        renamed += 1
    if renamed:
        notes.append(f"named {renamed} unnamed or duplicate nodes (<op>_<position>, <name>__<n>)")
