"""Centring the input of a padded convolution exactly: a constant border map after it.

A Conv whose input carries ``y = x - c`` instead of ``x`` computes, at every output position,
``sum(W y) = sum(W x) - c * (sum of the weights that fall inside the input)``, because its padding
zeros stay zeros of ``y`` (they were zeros of ``x``, i.e. ``-c`` of ``y``). The reader's bias takes
``+ c * sum(W)`` (:mod:`trtq.quantize.centering`, as for a reader without padding); what remains is
``-c`` times the weights that fall on padding, which is zero inside and a fixed number per output
channel and border position. It depends on no data, so one constant ``[1, Cout, Hout, Wout]``
added to the Conv's output makes the centred model compute what the original did, to float
rounding:

    Conv(pad0(x)) = Conv(pad0(x - c)) + c * sum(W) - c * sum(W over padding)

It is written as ``Sub(conv, -map)`` right behind the Conv, before its activation: TensorRT 8.6.0's
builder stops on ``Add(conv, constant map)`` (an internal assertion in its graph optimizer,
``binaryExprCount``; swapping the operands, a rank-3 map or an Identity in between change nothing)
and builds the Sub. It does not fuse the Sub into the convolution, so the padded convs it follows
run FP16 there (docs/decisions.md D42): this is ``quantize.center_padded``, off by default.
"""

from typing import Optional

import numpy as np
import onnx

from trtq.quantize.edit import InitializerEditor
from trtq.quantize.graph import GraphIndex, attr

SUFFIX = "/centring_border"  # in the name of the Sub node behind a padded reader


def _geometry(index: GraphIndex, node: onnx.NodeProto, weight_shape: tuple) -> Optional[tuple]:
    """(input H, W, kernel, pads, strides, dilations) of a 2-D Conv with explicit padding whose
    input shape is known, else None."""
    if node.op_type != "Conv" or attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    shape = index.shapes.get(node.input[0])
    if shape is None or len(shape) != 4 or shape[2] is None or shape[3] is None:
        return None
    kernel = tuple(weight_shape)[2:]
    if len(kernel) != 2:
        return None
    pads = list(attr(node, "pads", None) or [0, 0, 0, 0])
    strides = list(attr(node, "strides", None) or [1, 1])
    dilations = list(attr(node, "dilations", None) or [1, 1])
    return (shape[2], shape[3]), tuple(kernel), pads, strides, dilations


def pads_input(node: onnx.NodeProto) -> bool:
    return any(attr(node, "pads", None) or [])


def border_ok(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """A padded Conv whose border map can be computed here."""
    return index.is_constant(node.input[1]) and _geometry(index, node, index.dims(node.input[1])) is not None


def _inside(size: int, k: int, pad_lo: int, pad_hi: int, stride: int, dilation: int) -> np.ndarray:
    """[out, k]: 1 where kernel tap ``k`` of output position ``out`` reads inside the input."""
    out = (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1
    pos = np.arange(out)[:, None] * stride - pad_lo + np.arange(k)[None, :] * dilation
    return ((pos >= 0) & (pos < size)).astype(np.float64)


def border_map(index: GraphIndex, node: onnx.NodeProto, w: np.ndarray, shift: float) -> np.ndarray:
    """``-shift`` times the weights that fall on padding, per output channel and position, as a
    ``[1, Cout, Hout, Wout]`` float64 array (zero where no tap reads padding)."""
    (h, wd), (kh, kw), pads, strides, dilations = _geometry(index, node, w.shape)
    rows = _inside(h, kh, pads[0], pads[2], strides[0], dilations[0])
    cols = _inside(wd, kw, pads[1], pads[3], strides[1], dilations[1])
    taps = w.astype(np.float64).sum(axis=1)  # [Cout, kh, kw]: every input channel carries the same shift
    inside = np.einsum("oij,hi,wj->ohw", taps, rows, cols)
    return (shift * (inside - taps.sum(axis=(1, 2))[:, None, None]))[None]


def add_border(ed: InitializerEditor, index: GraphIndex, reader: onnx.NodeProto, shift: float) -> onnx.NodeProto:
    """The ``Sub(-map)`` to insert right behind ``reader``; it takes over the reader's output name."""
    w = ed.array(reader.input[1])
    out = reader.output[0]
    reader.output[0] = ed.new_name(f"{out}/unbordered")
    name = ed.new(f"{reader.name}/border_map", (-border_map(index, reader, w, shift)).astype(w.dtype))
    return onnx.helper.make_node("Sub", [reader.output[0], name], [out], name=ed.new_name(f"{reader.name}{SUFFIX}"))


def add_to_border(ed: InitializerEditor, border: onnx.NodeProto, delta) -> None:
    """The border node's output += ``delta`` (its constant is subtracted)."""
    ed.add_to_bias(border, 1, -np.asarray(delta, np.float64), np.float32, "centring_border")


def _is_border(index: GraphIndex, node: onnx.NodeProto) -> bool:
    return node.op_type == "Sub" and SUFFIX in node.name and index.is_constant(node.input[1])


def border_reading(index: GraphIndex, reader: onnx.NodeProto) -> Optional[onnx.NodeProto]:
    """The border node that reads ``reader``'s output, if there is one."""
    for node in index.consumer_nodes(reader.output[0]):
        if _is_border(index, node) and node.input[0] == reader.output[0]:
            return node
    return None


def border_behind(index: GraphIndex, producer: onnx.NodeProto, tensor: str) -> Optional[onnx.NodeProto]:
    """The border node that writes ``tensor`` from ``producer``'s output, if that is what writes it."""
    node = index.producer_node(tensor)
    if node is None or node is producer or not _is_border(index, node):
        return None
    return node if node.input[0] == producer.output[0] else None


def _zero_pads(index: GraphIndex, pad: onnx.NodeProto) -> Optional[list]:
    """[top, left, bottom, right] of a constant-mode 4-D Pad of zeros on H and W only, else None."""
    mode = attr(pad, "mode", b"constant")
    if pad.op_type != "Pad" or mode not in (b"constant", "constant") or len(pad.input) < 2:
        return None
    if not index.is_constant(pad.input[1]) or (len(pad.input) > 3 and pad.input[3]):
        return None
    if (
        len(pad.input) > 2
        and pad.input[2]
        and (not index.is_constant(pad.input[2]) or np.any(index.array(pad.input[2]) != 0))
    ):
        return None
    p = [int(v) for v in index.array(pad.input[1]).reshape(-1)]
    if len(p) != 8 or any(p[i] for i in (0, 1, 4, 5)) or min(p) < 0:
        return None
    return [p[2], p[3], p[6], p[7]]


def fold_zero_pads(model: onnx.ModelProto) -> int:
    """Fold each zero Pad whose only reader is a 2-D Conv into that Conv's ``pads`` (exact: the
    Conv pads with zeros too); returns how many went."""
    index = GraphIndex(model)
    gone = set()
    for pad in index.nodes:
        p = _zero_pads(index, pad)
        readers = index.consumer_nodes(pad.output[0]) if p else []
        if len(readers) != 1 or index.fan_out(pad.output[0]) != 1 or pad.output[0] in index.graph_outputs:
            continue
        conv = readers[0]
        if conv.op_type != "Conv" or conv.input[0] != pad.output[0]:
            continue
        if attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or len(index.dims(conv.input[1])) != 4:
            continue
        old = list(attr(conv, "pads", None) or [0, 0, 0, 0])
        for a in list(conv.attribute):
            if a.name == "pads":
                conv.attribute.remove(a)
        conv.attribute.append(onnx.helper.make_attribute("pads", [o + q for o, q in zip(old, p)]))
        conv.input[0] = pad.input[0]
        gone.add(pad.name or pad.output[0])
    if gone:
        from trtq.model import set_nodes

        set_nodes(model.graph, [n for n in model.graph.node if (n.name or n.output[0]) not in gone])
    return len(gone)


__all__ = [
    "SUFFIX",
    "add_border",
    "add_to_border",
    "border_behind",
    "border_map",
    "border_ok",
    "border_reading",
    "fold_zero_pads",
    "pads_input",
]
