"""Fold a Conv's constant affine epilogue (Mul / Add / Sub by per-channel constants) into its
weights and bias before Q/DQ placement (``quantize.fold_affine``, on by default).

Paddle's MobileOne / PP-LCNet blocks (PP-OCRv4 det and rec) write a learnable scale and shift as
``Conv -> Mul(s) -> Add(t)`` with scalar constants; other exporters leave a bias ``Add`` or a
LayerScale ``Mul`` behind a Conv. TensorRT fuses such a chain into a float convolution, but in an
explicit (Q/DQ) network its INT8 depthwise kernels do not take it: the depthwise convs of PP-OCRv4
det ran in float until the chain was folded (docs/decisions.md D30 has the measurement).

``y = s * (W * x + b) + t`` is ``(s W) * x + (s b + t)`` for a per-output-channel ``s`` and ``t``,
so the fold is exact up to float32 rounding of the products. The Conv takes the output name of the
last node folded, so every tensor that remains keeps its name and meaning and a calibration cache
of the original model still applies; the tensors between the Conv and that node disappear.

The same holds for a ConvTranspose, whose weight holds the output channels on its second axis,
and behind it for an inference BatchNormalization (``s = scale / sqrt(var + eps)``, ``t = B - mean
* s``): PP-OCRv4 det's head writes ``ConvTranspose -> Add(bias) -> BatchNormalization -> Relu``,
which TensorRT 8.6 ran as an int8->fp32 deconvolution, a float Scale layer and a Quantize layer of
its own until the chain was folded (docs/decisions.md D37). A Conv's BatchNormalization is left to
TensorRT, which fuses it into the convolution, INT8 output included.

Not folded: a chain whose tensors have other readers or are graph outputs, constants that do not
broadcast per output channel, a Mul by 0 or a non-finite constant (the channel would lose its
weights), Div (``1 / c`` is not exact), a BatchNormalization in training mode or with a computed
statistic, grouped ConvTranspose. A weight shared with another reader is copied, not changed.
"""

from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from trtq.quantize.graph import FLOAT, attr, subgraph_names
from trtq.quantize.rewrite import Namer, taken_names

FOLDABLE = ("Mul", "Add", "Sub", "BatchNormalization")
CONVS = ("Conv", "ConvTranspose")


def fold_affine(model: onnx.ModelProto, notes: Optional[list] = None) -> int:
    """Fold the constant affine chains after each Conv of ``model`` (changed in place, a private
    copy); the number of Mul/Add/Sub nodes folded. A note goes to ``notes`` when any were."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                readers[name] = readers.get(name, 0) + 1
    for name in subgraph_names(graph):  # read inside an If/Loop body: never folded away
        readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    producer = {out: node for node in graph.node for out in node.output if out}
    nodes = list(graph.node)
    by_input: dict[str, int] = {}  # tensor -> position of its first reader
    for pos, node in enumerate(nodes):
        for name in node.input:
            by_input.setdefault(name, pos)
    namer = Namer(taken_names(graph))
    dropped: set[int] = set()  # positions of the folded nodes
    folded, convs = 0, 0
    for conv in nodes:
        chain = _chain(conv, nodes, inits, readers, outputs, by_input, producer)
        if not chain:
            continue
        _rewrite(graph, conv, [(nodes[pos], op, values) for pos, op, values in chain], inits, readers, namer)
        dropped.update(pos for pos, _, _ in chain)
        folded += len(chain)
        convs += 1
    if not folded:
        return 0
    kept = [n for pos, n in enumerate(nodes) if pos not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unread(graph)
    if notes is not None:
        notes.append(
            f"folded {folded} constant Mul/Add/Sub/BatchNormalization into {convs} Conv weights and biases "
            "(exact; lets TensorRT fuse a Conv with the Quantize after it; quantize.fold_affine)"
        )
    return folded


def _chain(conv, nodes, inits, readers, outputs, by_input, producer) -> list:
    """[(position, op, per-channel values)] of the affine nodes after ``conv`` that can fold into it."""
    if conv.op_type not in CONVS or conv.domain not in ("", "ai.onnx") or len(conv.output) != 1:
        return []
    if len(conv.input) < 2 or conv.input[1] not in inits or inits[conv.input[1]].data_type != FLOAT:
        return []
    if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits:
        return []
    weight = inits[conv.input[1]]
    if conv.op_type == "ConvTranspose" and int(attr(conv, "group", 1)) != 1:
        return []
    channels, rank = weight.dims[_out_axis(conv)], len(weight.dims)
    chain, tensor = [], conv.output[0]
    while readers.get(tensor, 0) == 1 and tensor not in outputs:
        pos = by_input.get(tensor)
        node = nodes[pos] if pos is not None else None
        if node is None or node.op_type not in FOLDABLE or node.domain not in ("", "ai.onnx"):
            break
        if node.op_type == "BatchNormalization":
            if conv.op_type != "ConvTranspose":
                break  # TensorRT fuses a Conv's BatchNormalization itself, INT8 output included
            values = _batch_norm(node, inits, producer, channels, rank)
            if values is None or node.input[0] != tensor:
                break
            chain.append((pos, node.op_type, values))
            tensor = node.output[0]
            continue
        if len(node.input) != 2:
            break
        if node.op_type == "Sub" and node.input[0] != tensor:
            break  # c - y flips the sign of y: foldable, but rare; left as it is
        other = node.input[1] if node.input[0] == tensor else node.input[0]
        if other == tensor:
            break
        values = _per_channel(other, inits, producer, channels, rank)
        if values is None or (node.op_type == "Mul" and not np.all(values != 0)):
            break
        chain.append((pos, node.op_type, values))
        tensor = node.output[0]
    return chain


def _out_axis(conv) -> int:
    """The weight axis of the output channels: 0 for Conv ``[M, C/g, ...]``, 1 for ConvTranspose
    ``[C, M/g, ...]`` (group 1 only)."""
    return 1 if conv.op_type == "ConvTranspose" else 0


def _batch_norm(node, inits, producer, channels: int, rank: int) -> Optional[tuple]:
    """(scale, shift) per channel of an inference BatchNormalization with constant statistics, or
    None (training mode, more than one output, a computed or non-finite input, var + eps <= 0)."""
    if len(node.input) != 5 or len([o for o in node.output if o]) != 1:
        return None
    if attr(node, "training_mode", 0):
        return None
    eps = float(attr(node, "epsilon", 1e-5))
    stats = []
    for name in node.input[1:]:
        if name not in inits or name in producer or inits[name].data_type != FLOAT:
            return None
        value = numpy_helper.to_array(inits[name]).astype(np.float64).reshape(-1)
        if value.shape != (channels,) or not np.all(np.isfinite(value)):
            return None
        stats.append(value)
    gamma, beta, mean, var = stats
    if rank < 3 or not np.all(var + eps > 0):
        return None
    scale = gamma / np.sqrt(var + eps)
    if not np.all(scale != 0):
        return None
    return scale, beta - mean * scale


def _per_channel(name: str, inits, producer, channels: int, rank: int) -> Optional[np.ndarray]:
    """The constant ``name`` as one float64 value per output channel, or None when it is not a
    float32 initializer that broadcasts along the channels of an ``[N, C, ...]`` output of ``rank``."""
    if name not in inits or name in producer or inits[name].data_type != FLOAT:
        return None
    value = numpy_helper.to_array(inits[name]).astype(np.float64)
    if value.ndim > rank or not np.all(np.isfinite(value)):
        return None
    shape = (1,) * (rank - value.ndim) + value.shape  # right-aligned as ONNX broadcasting does
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).copy() if value.size else None


def _rewrite(graph, conv, chain, inits, readers, namer) -> None:
    weight = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
    axis = _out_axis(conv)
    has_bias = len(conv.input) > 2 and bool(conv.input[2])
    bias = numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if has_bias else np.zeros(weight.shape[axis])
    along = tuple(-1 if i == axis else 1 for i in range(weight.ndim))  # a per-output-channel shape
    for _, op, values in chain:
        if op == "BatchNormalization":
            scale, shift = values
            weight = weight * scale.reshape(along)
            bias = bias * scale + shift
        elif op == "Mul":
            weight = weight * values.reshape(along)
            bias = bias * values
        elif op == "Add":
            bias = bias + values
        else:  # Sub with the constant second
            bias = bias - values
    w_name = namer(conv.input[1] + "_folded")
    b_name = namer((conv.input[2] if has_bias else conv.name or conv.output[0]) + "_folded_bias")
    graph.initializer.extend(
        [
            numpy_helper.from_array(weight.astype(np.float32), w_name),
            numpy_helper.from_array(bias.astype(np.float32), b_name),
        ]
    )
    for name in conv.input[1:3]:
        if name:
            readers[name] -= 1
    x = conv.input[0]
    del conv.input[:]
    conv.input.extend([x, w_name, b_name])
    conv.output[0] = chain[-1][0].output[0]


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove the initializers nothing reads any more and the value_info of vanished tensors."""
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    read |= subgraph_names(graph)
    kept = [i for i in graph.initializer if i.name in read]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
    present = read | {out for node in graph.node for out in node.output}
    infos = [v for v in graph.value_info if v.name in present]
    if len(infos) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(infos)
