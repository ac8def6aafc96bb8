"""What an already quantized (Q/DQ) ONNX model carries, and whether TensorRT can build it as is.

Q/DQ models come from trtq quantize, from ONNX Runtime's ``quantize_static`` (QDQ format) and from
quantization-aware training exports (pytorch-quantization, ModelOpt). TensorRT reads the
QuantizeLinear/DequantizeLinear pairs as they are and needs them symmetric: INT8 with zero point 0
(activations per tensor, weights per tensor or per output channel). :func:`read_qdq` lists the
pairs; :func:`check_for_tensorrt` refuses what TensorRT would build wrongly or not at all, with
the fix, before any TensorRT call:

- an ONNX Runtime QOperator model (QLinearConv, MatMulInteger, ...): TensorRT parses QDQ only;
- a non-zero zero point (ONNX Runtime's default asymmetric uint8 activations): TensorRT has no
  zero point, it would drop the offset;
- a QuantizeLinear without a zero point, or with a uint8 one: ONNX says that quantizes to uint8
  (0..255), TensorRT to int8 (-128..127): negative values would be computed differently.

ONNX Runtime also stores biases as int32 constants behind a DequantizeLinear; TensorRT keeps biases
in float and its parser takes no int32 DequantizeLinear, so :func:`fold_constant_dequantize` turns
those into the float constants they compute (exact: ``bias_int32 * scale``).

Scales may sit in initializers or Constant nodes (QAT exports write both).
"""

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from trtq.errors import ModelError
from trtq.model import set_nodes

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
OTHER_QUANTIZED_OPS = (
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "QLinearAdd",
    "QLinearMul",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearConcat",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QGemm",
)


@dataclass
class QdqInfo:
    """The quantization a Q/DQ model carries (main graph)."""

    activations: dict[str, float] = field(default_factory=dict)  # tensor -> amax (127 * scale), per-tensor Q
    weights: int = 0  # QuantizeLinear nodes on constants
    per_channel: int = 0  # of those, with a 1-D scale
    quantize_nodes: int = 0
    dequantize_nodes: int = 0
    other_ops: list[str] = field(default_factory=list)  # QOperator ops found (op types)
    problems: list[str] = field(default_factory=list)  # why TensorRT cannot build it as is

    @property
    def is_qdq(self) -> bool:
        return bool(self.quantize_nodes or self.dequantize_nodes)

    def summary(self) -> dict[str, int]:
        return {
            "quantize_nodes": self.quantize_nodes,
            "dequantize_nodes": self.dequantize_nodes,
            "activations": len(self.activations),
            "weights": self.weights,
            "per_channel_weights": self.per_channel,
        }


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The TensorProtos of ``graph``'s initializers and Constant node ``value`` outputs, by name
    (the protos themselves: a caller may rewrite them in place)."""
    tensors = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    tensors[node.output[0]] = a.t
    return tensors


class _Constants:
    """Values of initializers and Constant node outputs, by name."""

    def __init__(self, graph: onnx.GraphProto):
        self._tensors = constant_tensors(graph)
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str) -> Optional[np.ndarray]:
        if name not in self._tensors:
            return None
        if name not in self._cache:
            self._cache[name] = numpy_helper.to_array(self._tensors[name])
        return self._cache[name]

    def elem_type(self, name: str) -> Optional[int]:
        t = self._tensors.get(name)
        return None if t is None else int(t.data_type)


def _describe(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name or node.output[0]}'"


def read_qdq(model: onnx.ModelProto) -> QdqInfo:
    """The Q/DQ pairs of ``model`` and what would stop TensorRT from building them."""
    graph = model.graph
    consts = _Constants(graph)
    produced_by_dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    info = QdqInfo()
    for node in graph.node:
        if node.op_type in OTHER_QUANTIZED_OPS and node.op_type not in info.other_ops:
            info.other_ops.append(node.op_type)
        if node.op_type not in QDQ_OPS:
            continue
        if node.op_type == "DequantizeLinear":
            info.dequantize_nodes += 1
        else:
            info.quantize_nodes += 1
        _check_zero_point(node, consts, info)
        if len(node.input) < 2:
            continue
        scale = consts.get(node.input[1])
        if node.op_type == "DequantizeLinear":
            if consts.elem_type(node.input[0]) == onnx.TensorProto.INT8 and scale is not None:  # stored quantized
                info.weights += 1
                info.per_channel += int(scale.size > 1)
            continue
        if scale is None:
            info.problems.append(f"{_describe(node)} takes its scale from a computed tensor; TensorRT needs a constant")
            continue
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            info.problems.append(f"{_describe(node)} has a scale that is not a positive finite number")
            continue
        if node.input[0] in consts or node.input[0] in produced_by_dq:
            info.weights += 1
            info.per_channel += int(scale.size > 1)
        elif scale.size == 1:
            info.activations[node.input[0]] = float(scale.reshape(-1)[0]) * 127.0
        else:
            info.problems.append(
                f"{_describe(node)} quantizes an activation per channel; TensorRT takes one scale per activation tensor"
            )
    if info.other_ops:
        info.problems.insert(
            0,
            "it uses ONNX Runtime's QOperator format (" + ", ".join(info.other_ops) + "), which TensorRT does not read",
        )
    return info


def _check_zero_point(node: onnx.NodeProto, consts: _Constants, info: QdqInfo) -> None:
    if len(node.input) < 3 or not node.input[2]:
        if node.op_type == "QuantizeLinear":
            info.problems.append(
                f"{_describe(node)} has no zero point, so it quantizes to uint8 in ONNX "
                "(0..255) where TensorRT uses int8"
            )
        return
    zp = consts.get(node.input[2])
    if node.op_type == "DequantizeLinear" and _int32_constant(node, consts):
        return  # a quantized bias: folded to float before the build
    if zp is None:
        info.problems.append(f"{_describe(node)} takes its zero point from a computed tensor")
        return
    if consts.elem_type(node.input[2]) != onnx.TensorProto.INT8:
        info.problems.append(f"{_describe(node)} has a {zp.dtype} zero point; TensorRT quantizes to int8")
    elif np.any(zp != 0):
        info.problems.append(
            f"{_describe(node)} has a non-zero zero point (asymmetric); TensorRT's INT8 is symmetric (zero point 0)"
        )


def _int32_constant(node: onnx.NodeProto, consts: "_Constants") -> bool:
    return node.input[0] in consts and consts.elem_type(node.input[0]) == onnx.TensorProto.INT32


def fold_constant_dequantize(model: onnx.ModelProto) -> int:
    """Replace each DequantizeLinear of an int32 constant (a quantized bias) by the float32
    initializer it computes; in place, returns how many. The values are exactly what ONNX
    Runtime computes for the node: ``(x - zero_point) * scale``."""
    graph = model.graph
    consts = _Constants(graph)
    kept, folded = [], 0
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and _int32_constant(node, consts) and node.input[1] in consts:
            x = consts.get(node.input[0]).astype(np.float64)
            zp = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            scale = consts.get(node.input[1]).astype(np.float64)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if scale.size > 1:  # per axis: broadcast along ``axis``
                shape = [1] * x.ndim
                shape[axis] = scale.size
                scale = scale.reshape(shape)
                zp = zp.reshape(shape) if zp is not None else None
            value = (x - (zp.astype(np.float64) if zp is not None else 0.0)) * scale
            graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
            folded += 1
            continue
        kept.append(node)
    if folded:
        set_nodes(graph, kept)
    return folded


def check_for_tensorrt(info: QdqInfo, label: str) -> None:
    """ModelError naming the first problem (and how many more) when TensorRT cannot build the model as is."""
    if not info.problems:
        return
    more = f" (+{len(info.problems) - 1} more)" if len(info.problems) > 1 else ""
    raise ModelError(
        f"{label} cannot be built by TensorRT as it is: {info.problems[0]}{more}",
        "quantize the FP32 model with trtq quantize (or re-export it with symmetric int8 Q/DQ: ONNX Runtime "
        "quantize_static(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, "
        "weight_type=QuantType.QInt8, extra_options={'ActivationSymmetric': True})",
    )
