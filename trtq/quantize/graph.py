"""A read-only index over an ONNX graph: who produces and who consumes each tensor.

The quantizer makes its decisions on this index and only then rewrites the graph, so every
lookup here reflects the graph as it was handed in.
"""

from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

FLOAT = onnx.TensorProto.FLOAT
FLOAT16 = onnx.TensorProto.FLOAT16

# ops whose output holds exactly the values of their (first) input, only rearranged
DATA_MOVEMENT_OPS = frozenset({"Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})


def default_opset(model: onnx.ModelProto) -> int:
    """Version of the default ("" / "ai.onnx") domain the model imports; 1 if absent."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return 1


def subgraph_names(graph: onnx.GraphProto) -> set[str]:
    """Every name used as a node input inside the subgraphs (If/Loop/Scan bodies) of ``graph``."""
    used: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = list(attr.graphs)
            if attr.HasField("g"):
                subs.append(attr.g)
            for sub in subs:
                for inner in sub.node:
                    used.update(i for i in inner.input if i)
                used |= subgraph_names(sub)
    return used


def has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def tensor_types(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, tuple[Optional[int], ...]]]:
    """(ONNX element type, shape) of every tensor that shape inference can type or shape (best
    effort); a shape's unknown or symbolic dims are None."""
    from trtq.model import infer_shapes

    try:
        inferred = infer_shapes(model)  # large initializers typed as inputs there
    except Exception:  # inference is a help: unknown types are handled by the callers
        inferred = model
    g = inferred.graph
    types: dict[str, int] = {}
    shapes: dict[str, tuple[Optional[int], ...]] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        tt = vi.type.tensor_type
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            shapes[vi.name] = tuple(int(d.dim_value) if d.dim_value > 0 else None for d in tt.shape.dim)
    for init in g.initializer:
        types[init.name] = init.data_type
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return types, shapes


class GraphIndex:
    """Producers, consumers, constants and element types of one (main) graph."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.initializers: dict[str, onnx.TensorProto] = {i.name: i for i in graph.initializer}
        self.graph_inputs: list[str] = [i.name for i in graph.input if i.name not in self.initializers]
        self.graph_outputs: set[str] = {o.name for o in graph.output}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[tuple[int, int]]] = {}
        for idx, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self.producer[out] = idx
            for slot, name in enumerate(node.input):
                if name:
                    self.consumers.setdefault(name, []).append((idx, slot))
        self.subgraph_refs = subgraph_names(graph)
        # initializers and everything computed only from them (constant subgraphs left unfolded)
        self.static: set[str] = set(self.initializers)
        for node in self.nodes:
            inputs = [i for i in node.input if i]
            if (inputs and all(i in self.static for i in inputs)) or node.op_type == "Constant":
                self.static.update(o for o in node.output if o)
        self.types, self.shapes = tensor_types(model)
        self._arrays: dict[str, np.ndarray] = {}

    # -- tensors ---------------------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        """An initializer: its values are known here."""
        return name in self.initializers

    def is_static(self, name: str) -> bool:
        """Known before run time: an initializer or computed only from initializers."""
        return name in self.static

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self.initializers[name])
        return self._arrays[name]

    def dims(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.initializers[name].dims)

    def elem_type(self, name: str) -> Optional[int]:
        return self.types.get(name)

    def consumer_nodes(self, name: str) -> list[onnx.NodeProto]:
        return [self.nodes[i] for i, _ in self.consumers.get(name, [])]

    def fan_out(self, name: str) -> int:
        """Number of uses of a tensor: node inputs, graph outputs and subgraph references."""
        n = len(self.consumers.get(name, []))
        return n + (name in self.graph_outputs) + (name in self.subgraph_refs)

    def producer_node(self, name: str) -> Optional[onnx.NodeProto]:
        idx = self.producer.get(name)
        return None if idx is None else self.nodes[idx]

    def qdq_pair(self, name: str) -> Optional[tuple[onnx.NodeProto, onnx.NodeProto]]:
        """(QuantizeLinear, DequantizeLinear) when ``name`` is DQ(Q(x)), else None."""
        dq = self.producer_node(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        q = self.producer_node(dq.input[0])
        return (q, dq) if q is not None and q.op_type == "QuantizeLinear" else None

    def float_source(self, name: str) -> str:
        """The float tensor behind a DQ(Q(x)) pair, else ``name`` itself."""
        pair = self.qdq_pair(name)
        return pair[0].input[0] if pair else name

    def quantized_constant(self, name: str) -> Optional[onnx.NodeProto]:
        """The QuantizeLinear node when ``name`` is DQ(Q(W)) with W and its scale initializers."""
        pair = self.qdq_pair(name)
        if pair is None or not (self.is_constant(pair[0].input[0]) and self.is_constant(pair[0].input[1])):
            return None
        return pair[0]

    def source_through(self, name: str, ops: frozenset) -> list[str]:
        """``name`` followed by the tensors it was computed from through a chain of ``ops``."""
        chain = [name]
        seen = {name}
        node = self.producer_node(name)
        while node is not None and node.op_type in ops and node.input and node.input[0]:
            name = node.input[0]
            if name in seen:
                break
            chain.append(name)
            seen.add(name)
            node = self.producer_node(name)
        return chain

    # -- nodes -----------------------------------------------------------------------------
    def ancestors(self, name: str, limit: int = 10000) -> dict[int, int]:
        """Producer nodes upstream of tensor ``name``: node index -> shortest distance (1 = producer)."""
        out: dict[int, int] = {}
        frontier = [name]
        depth = 0
        seen_tensors = {name}
        while frontier and len(out) < limit:
            depth += 1
            nxt: list[str] = []
            for t in frontier:
                idx = self.producer.get(t)
                if idx is None or idx in out:
                    continue
                out[idx] = depth
                for i in self.nodes[idx].input:
                    if i and i not in seen_tensors and i not in self.initializers:
                        seen_tensors.add(i)
                        nxt.append(i)
            frontier = nxt
        return out


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def tensor_groups(index: "GraphIndex", links, members_of) -> dict:
    """Union-find over the tensors ``members_of(node)`` of every node index in ``links``: each
    tensor met -> the root of its group (tensors in the order they were first met)."""
    parent: dict = {}

    def find(t: str) -> str:
        while parent[t] != t:
            t = parent[t]
        return t

    for idx in links:
        members = members_of(index.nodes[idx])
        for t in members:
            parent.setdefault(t, t)
        for t in members[1:]:
            ra, rb = find(members[0]), find(t)
            if ra != rb:
                parent[rb] = ra
    return {t: find(t) for t in parent}
