"""``placement: fused``: Q/DQ where TensorRT can keep a whole group of layers in INT8.

The standard placement (``rules.py``) quantizes the inputs of the layers that do arithmetic.
TensorRT then runs those layers in INT8, but every tensor between them that no Q/DQ names stays
float: a Conv whose output goes through SiLU into a Split, a residual Add or a Concat is written
in float and re-quantized by the next layer (an int8->fp32 layer plus an fp32->int8 reformat).
This pass adds, on top of the standard plan and with the standard scales:

1. Residual Adds behind an activation epilogue: the walk from an Add input back to its Conv may
   cross SiLU (``x * Sigmoid(x)``), HardSwish, HardSigmoid, GELU, LeakyRelu, Clip, Tanh, ... as
   well as BatchNorm / ReLU / a bias. TensorRT fuses an Add into a Conv only before the
   activation, so where the chain crossed one (or the skip input is a Split/Slice output) both
   Add inputs get Q/DQ and the Add runs INT8 on its own; a plain Conv(+BN)(+ReLU) chain keeps the
   standard skip-only pair (Conv + Add fusion).
2. Concat whose output is quantized downstream: every input gets Q/DQ, so the Concat is a copy
   of INT8 buffers.
3. Data movement (Split, Slice, MaxPool, nearest Resize, Transpose, Reshape, Flatten, Squeeze,
   Unsqueeze, Identity) between a quantized tensor and its producer, whose output it alone reads
   (or whose output and its own are inputs of one Concat, as in SPPF): that output gets a pair
   too. ``DQ -> op -> Q`` at one scale is exact for these ops on the INT8 grid; TensorRT runs the
   op in INT8 and fuses the first Q into the producer.
Scales: a group (Concat members, both ends of a moved data-movement op) shares one scale, the
largest amax among the tensors the standard plan quantizes in it (their readers keep the scale
they had, and the group is clipped where the standard placement's Q after it clips), else among
all. So steps 2 and 3 compute what the standard placement computes; step 1 adds a rounding of the
Add's main input and output.

Nothing here changes a node the standard plan keeps float: every node this pass touches goes
through the same gate (``--exclude``, float_layers, TensorRT 8's grouped-conv consumers).
"""

from typing import Callable, Optional

import onnx

from trtq.quantize import rules
from trtq.quantize.graph import DATA_MOVEMENT_OPS, FLOAT, GraphIndex, attr, tensor_groups

PLACEMENTS = ("standard", "fused", "shared")

# unary activations TensorRT runs as a Conv epilogue (but not before a fused residual Add)
EPILOGUE_OPS = frozenset(
    {
        "HardSwish",
        "HardSigmoid",
        "Gelu",
        "LeakyRelu",
        "Clip",
        "Sigmoid",
        "Tanh",
        "Elu",
        "Selu",
        "Softplus",
        "Mish",
    }
)
_GATES = ("Sigmoid", "HardSigmoid")  # x * gate(x): SiLU / Swish, HardSwish written out
# single-input ops whose outputs hold values of their input, so Q/DQ commutes with them
MOVEMENT_OPS = DATA_MOVEMENT_OPS | frozenset({"Split", "Slice", "MaxPool", "Resize"})
_SPLITS = frozenset({"Split", "Slice"})

Decisions = dict  # node index -> [(slot, (tensor, axis))], as plan.make_plan builds it
Gate = Callable[[onnx.NodeProto], Optional[str]]
Activation = Callable[[str], Optional[tuple]]


def _default(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _not_float(index: GraphIndex, tensor: str) -> Optional[str]:
    t = index.elem_type(tensor)
    return None if t in (None, FLOAT) else f"input {tensor} is not FLOAT"


def _swish_input(index: GraphIndex, node: onnx.NodeProto) -> Optional[str]:
    """``x`` when ``node`` is ``Mul(x, gate(x))`` with gate Sigmoid/HardSigmoid read only here."""
    if node.op_type != "Mul" or len(node.input) != 2:
        return None
    for x, g in (node.input, reversed(node.input)):
        gate = index.producer_node(g)
        if gate is not None and gate.op_type in _GATES and gate.input[0] == x and index.fan_out(g) == 1:
            return x if index.fan_out(x) == 2 else None
    return None


def epilogue_backbone(index: GraphIndex, tensor: str) -> Optional[tuple[int, bool]]:
    """(index of the Conv ``tensor`` comes out of, whether an activation epilogue lies between),
    or None; like ``rules.fused_backbone`` but the walk also crosses activations."""
    if index.fan_out(tensor) != 1:
        return None
    node, crossed = index.producer_node(tensor), False
    while node is not None:
        if node.op_type in rules.BACKBONE_OPS:
            return index.producer[node.output[0]], crossed
        src = _swish_input(index, node)
        if src is not None:
            crossed = True
        elif node.op_type in EPILOGUE_OPS:
            src, crossed = node.input[0], True
        elif node.op_type in rules.BACKBONE_CHAIN_OPS or rules.is_bias_add(index, node):
            src = next((i for i in node.input if i and not index.is_static(i)), None)
            if src is None or index.fan_out(src) != 1:
                return None
        else:
            return None
        node = index.producer_node(src)
    return None


def _from_split(index: GraphIndex, tensor: str) -> bool:
    chain = index.source_through(tensor, DATA_MOVEMENT_OPS)
    producer = index.producer_node(chain[-1])
    return producer is not None and producer.op_type in _SPLITS


def residual_decisions(index: GraphIndex, plan, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """Residual Adds: the standard skip input, and the main input too behind an activation."""
    quantized_nodes = {i: True for i in decisions}

    def backbone(i: GraphIndex, t: str) -> Optional[int]:
        found = epilogue_backbone(i, t)
        return None if found is None else found[0]

    for idx, node in enumerate(index.nodes):
        if node.op_type != rules.RESIDUAL_OP or not _default(node):
            continue
        skip = rules.residual_skip_input(index, node, quantized_nodes, backbone)
        if skip is None:
            continue
        main = 1 - skip
        crossed = epilogue_backbone(index, node.input[main])
        both = (crossed is not None and crossed[1]) or _from_split(index, node.input[skip])
        slots = (0, 1) if both else (skip,)
        reason = gate(node) or next((_not_float(index, node.input[s]) for s in slots), None)
        keys = [] if reason else [(s, activation(node.input[s])) for s in slots]
        if not reason and any(k is None for _, k in keys):
            reason = "no amax in the cache for the residual inputs"
        if reason:
            plan.left_float.append((node.name, reason))
            continue
        decisions[idx] = keys


def _quantized_downstream(index: GraphIndex, decisions: Decisions) -> set[str]:
    """Tensors a planned pair reads, and those they are rearranged from (data movement)."""
    keyed = {key[0] for slots in decisions.values() for _, key in slots}
    return {t for k in keyed for t in index.source_through(k, DATA_MOVEMENT_OPS)}


def concat_decisions(index: GraphIndex, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """Every input of a Concat whose output is quantized downstream gets Q/DQ."""
    downstream = _quantized_downstream(index, decisions)
    for idx, node in enumerate(index.nodes):
        if node.op_type != rules.CONCAT_OP or not _default(node) or idx in decisions:
            continue
        if node.output[0] not in downstream or gate(node):
            continue
        inputs = list(node.input)
        if not inputs or any(not t or index.is_static(t) or _not_float(index, t) for t in inputs):
            continue
        keys = [(slot, activation(t)) for slot, t in enumerate(inputs)]
        if all(k is not None for _, k in keys):
            decisions[idx] = keys


def _movable(node: onnx.NodeProto) -> bool:
    if node.op_type not in MOVEMENT_OPS or not _default(node) or not node.input or not node.input[0]:
        return False
    if node.op_type == "MaxPool":
        return len([o for o in node.output if o]) == 1  # no Indices output
    if node.op_type == "Resize":
        return attr(node, "mode", b"nearest") in (b"nearest", "nearest")
    return True


def _one_concat(index: GraphIndex, a: str, b: str) -> bool:
    """Both tensors are inputs of one Concat (SPPF's MaxPool chain): they share its scale anyway."""
    return any(n.op_type == rules.CONCAT_OP and b in n.input for n in index.consumer_nodes(a))


def movement_decisions(index: GraphIndex, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """A pair on the input of each data-movement op between a quantized tensor and its producer."""
    todo = [key[0] for slots in decisions.values() for _, key in slots if key[1] is None]
    seen: set[str] = set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        idx = index.producer.get(tensor)
        node = None if idx is None else index.nodes[idx]
        if node is None or idx in decisions or not _movable(node) or gate(node):
            continue
        src = node.input[0]
        if index.is_static(src) or index.elem_type(src) != FLOAT:
            continue
        if index.fan_out(src) != 1 and not _one_concat(index, src, tensor):
            continue  # a tensor read elsewhere keeps its own scale (no chain of groups)
        key = activation(src)
        if key is not None:
            decisions[idx] = [(0, key)]
            todo.append(src)


def add_fused(index: GraphIndex, plan, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """Steps 1-3 of the module docstring, in place on ``decisions`` (after the table's step)."""
    residual_decisions(index, plan, decisions, gate, activation)
    size = -1
    while size != len(decisions):  # a moved pair can make a Concat output quantized downstream
        size = len(decisions)
        concat_decisions(index, decisions, gate, activation)
        movement_decisions(index, decisions, gate, activation)


def drop_conflicting_groups(index: GraphIndex, decisions: Decisions, standard: set, amax) -> None:
    """Undo this pass's Concat / data-movement pairs in every group that would join tensors the
    standard plan quantizes at different scales (shufflenet's chained channel shuffles): a shared
    scale there would change what their Conv readers see. ``standard``: the tensors the standard
    plan quantizes; ``amax``: tensor -> amax of every planned activation."""
    concats = [i for i, n in enumerate(index.nodes) if n.op_type == rules.CONCAT_OP]
    std_root = tensor_groups(index, concats, lambda n: [t for t in list(n.input) + list(n.output) if t in standard])
    std_amax: dict[str, float] = {}
    for t, root in std_root.items():
        std_amax[root] = max(std_amax.get(root, 0.0), amax[t])
    keyed = {key[0] for slots in decisions.values() for _, key in slots}
    links = [i for i in decisions if index.nodes[i].op_type in MOVEMENT_OPS or i in concats]
    root = tensor_groups(index, links, lambda n: [t for t in list(n.input) + list(n.output) if t in keyed])
    scales: dict[str, set] = {}
    for t, r in root.items():
        if t in standard:
            scales.setdefault(r, set()).add(std_amax[std_root[t]] if t in std_root else amax[t])
    bad = {r for r, values in scales.items() if len(values) > 1}
    for idx in links:
        node = index.nodes[idx]
        if any(root.get(t) in bad for t in list(node.input) + list(node.output)):
            del decisions[idx]
