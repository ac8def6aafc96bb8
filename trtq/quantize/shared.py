"""``placement: shared``: one Q/DQ pair per quantized tensor, read by every reader TensorRT can run
in INT8, and TensorRT's own Q/DQ propagation does the rest.

The standard placement (``rules.py``) gives the pair to the Conv/Gemm/MatMul that needs it; the
tensor's other readers (the Concat of a C2f block, the residual Add, the MaxPool of SPPF) read the
float tensor, so TensorRT computes the producing layer twice over: an INT8 output for the Conv and
a float one (int8->fp32 conversion) for the rest, and quantizes again behind them. The fused
placement (``fused.py``) writes the INT8 groups out explicitly, a pair on every Concat input and
around every data-movement op at one shared scale; TensorRT 8.6 then clones the Dequantize of
every Concat input and copies the INT8 buffers (measured: 42% of YOLOv8n's time in INT8).

This placement quantizes what the standard one does and, the way ModelOpt's ONNX PTQ does it
(one pair per tensor, not one per reader), adds:

1. the residual Adds of ``fused.residual_decisions`` (both inputs where the main input crossed an
   activation epilogue, which stops TensorRT fusing the Add into the Conv);
2. the input of each pooling op (MaxPool, AveragePool, GlobalAveragePool) and nearest / linear
   Resize (an upsample of a Conv's output) whose output reaches a quantized input: TensorRT runs
   them in INT8 on a quantized input and moves the Dequantize behind them;
3. every reader of a quantized tensor in ``SHARED_READERS`` (Concat, Add, pooling, Resize and the
   data-movement ops) reads the pair's Dequantize output too, so the producer writes INT8 once;
4. a gate ``Mul(x, Sigmoid|HardSigmoid(g))`` (squeeze-excite, with ``g`` not ``x``) whose ``x`` is
   quantized: the Mul reads the pair of ``x`` and the gate gets a pair of its own (docs/decisions.md
   D36). Otherwise the Mul reads ``x`` float, so its producer writes it twice (INT8 for the pool,
   float for the Mul) and TensorRT quantizes and dequantizes it again on its own; with both inputs
   INT8 the gate's Mul and the Adds behind it run as one INT8 pointwise layer.

No scale is added or changed: the tensors around a Concat share the largest amax as in the standard
placement; TensorRT moves the Quantize that follows a Concat in front of its inputs and fuses it
into their producers. Every node this pass touches goes through the same gate (``--exclude``,
float layers, TensorRT 8's grouped-conv consumers) as the standard plan's nodes.
"""

from typing import Optional

import onnx

from trtq.quantize import fused
from trtq.quantize.fused import Activation, Decisions, Gate
from trtq.quantize.graph import DATA_MOVEMENT_OPS, FLOAT, GraphIndex, attr

POOLING_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool"})
SHARED_READERS = frozenset({"Concat", "Add", "Resize", "Split", "Slice"}) | POOLING_OPS | DATA_MOVEMENT_OPS


def _computed_float(index: GraphIndex, tensor: str) -> bool:
    return bool(tensor) and not index.is_static(tensor) and index.elem_type(tensor) in (None, FLOAT)


def _int8_input_op(node: onnx.NodeProto) -> bool:
    """Pooling without an Indices output, and Resize in the modes TensorRT runs in INT8."""
    if node.domain not in ("", "ai.onnx") or not node.input or not node.input[0]:
        return False
    if node.op_type in POOLING_OPS:
        return len([o for o in node.output if o]) == 1
    if node.op_type == "Resize":
        return attr(node, "mode", b"nearest") in (b"nearest", "nearest", b"linear", "linear")
    return False


def _downstream(index: GraphIndex, start: str, limit: int = 8):
    """Indices of the nodes that read ``start`` and, up to ``limit`` steps on, their outputs."""
    seen, frontier = set(), [start]
    for _ in range(limit):
        nxt = []
        for tensor in frontier:
            for idx, _ in index.consumers.get(tensor, []):
                if idx not in seen:
                    seen.add(idx)
                    yield idx
                    nxt.extend(o for o in index.nodes[idx].output if o)
        frontier = nxt


def input_decisions(index: GraphIndex, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """Step 2: a pair on the input of each pooling op and Resize whose output reaches a quantized
    input within a few nodes (through Concat, data movement, a squeeze-excite's pooling), so it can
    run INT8 in and out. Elsewhere the pair would only add a rounding the standard placement does
    not make (a pool that feeds float layers only, or sits among layers all excluded)."""
    quantized = {idx for idx, slots in decisions.items() if slots}  # nodes with a quantized input
    for idx, node in enumerate(index.nodes):
        if idx in decisions or not _int8_input_op(node) or gate(node):
            continue
        if not _computed_float(index, node.input[0]):
            continue
        if not any(i in quantized for i in _downstream(index, node.output[0])):
            continue
        key = activation(node.input[0])
        if key is not None:
            decisions[idx] = [(0, key)]
            quantized.add(idx)


def _activation_keys(index: GraphIndex, decisions: Decisions) -> dict:
    """Quantized activation -> its pair key (per-tensor, computed), over all the decisions so far."""
    keys = {}
    for slots in decisions.values():
        for _, key in slots:
            if key[1] is None and not index.is_constant(key[0]):
                keys.setdefault(key[0], key)
    return keys


def reader_decisions(index: GraphIndex, decisions: Decisions, gate: Gate) -> None:
    """Step 3: every shared reader of a quantized activation reads its pair's Dequantize output."""
    keys = _activation_keys(index, decisions)
    for tensor, key in keys.items():
        for node in index.consumer_nodes(tensor):
            if node.op_type not in SHARED_READERS or node.domain not in ("", "ai.onnx") or gate(node):
                continue
            if node.op_type == "Add" and any(index.is_static(t) for t in node.input if t):
                continue  # a bias Add: the Conv before it keeps it in its epilogue
            idx = index.producer[node.output[0]]
            slots = decisions.setdefault(idx, [])
            taken = {slot for slot, _ in slots}
            for slot, name in enumerate(node.input):
                if name == tensor and slot not in taken and (node.op_type != "Resize" or slot == 0):
                    slots.append((slot, key))


GATE_OPS = frozenset({"Sigmoid", "HardSigmoid"})


def _gate_slot(index: GraphIndex, node: onnx.NodeProto, tensor: str) -> Optional[int]:
    """The slot of the gate when ``node`` is ``Mul(tensor, gate(g))`` with a Sigmoid / HardSigmoid
    gate of another tensor than ``tensor`` (SiLU and HardSwish, ``x * gate(x)``, are not gates)."""
    if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    if list(node.input).count(tensor) != 1:
        return None
    slot = 1 - list(node.input).index(tensor)
    producer = index.producer_node(node.input[slot])
    if producer is None or producer.op_type not in GATE_OPS or producer.input[0] == tensor:
        return None
    return slot if _computed_float(index, node.input[slot]) else None


def gate_decisions(index: GraphIndex, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """Step 4: the gate Mul of a quantized tensor reads its pair, and the gate gets one too."""
    keys = _activation_keys(index, decisions)
    for tensor, key in keys.items():
        for node in index.consumer_nodes(tensor):
            slot = _gate_slot(index, node, tensor)
            if slot is None or gate(node):
                continue
            idx = index.producer[node.output[0]]
            if idx in decisions:
                continue
            gate_key = activation(node.input[slot])
            decisions[idx] = [(1 - slot, key)] + ([(slot, gate_key)] if gate_key is not None else [])


def add_shared(index: GraphIndex, plan, decisions: Decisions, gate: Gate, activation: Activation) -> None:
    """Steps 1-4 of the module docstring, in place on ``decisions`` (after the table's step)."""
    fused.residual_decisions(index, plan, decisions, gate, activation)
    input_decisions(index, decisions, gate, activation)
    reader_decisions(index, decisions, gate)
    gate_decisions(index, decisions, gate, activation)
