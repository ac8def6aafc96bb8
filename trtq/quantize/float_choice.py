"""Layers the user chose to leave float, and what they feed: for TensorRT 8, whose engines came out
wrong when a float grouped/depthwise Conv fed an INT8 layer (measured on 8.6.0; see
trtq.trt.compat.float_grouped_conv_is_unsafe). ``build`` on TensorRT 8 leaves those consumers float
too; ``quantize`` (no TensorRT version known) names them in a warning."""
from typing import Any, List, Sequence

from trtq.quantize.graph import GraphIndex

FLOAT_CHOICES = ("excluded by", "float_layers")  # left_float reasons the user chose
# what can sit between a conv and the next layer's input: activations (Mul: x * sigmoid(x)), Pad, Q/DQ
_PASS_THROUGH = frozenset({"Relu", "Clip", "LeakyRelu", "PRelu", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh",
                           "Elu", "Selu", "Softplus", "Mul", "Pad", "Identity", "BatchNormalization",
                           "QuantizeLinear", "DequantizeLinear"})


def float_grouped_convs(result: Any) -> List[str]:
    """Grouped/depthwise Convs of a QuantizeResult the user chose to leave float."""
    chosen = {name for name, why in result.left_float if why.startswith(FLOAT_CHOICES)}
    return [n.name for n in result.model.graph.node
            if n.name in chosen and n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)]


def quantized_consumers(result: Any, names: Sequence[str]) -> List[str]:
    """Quantized compute nodes fed by the outputs of ``names`` through activations, Pad and Q/DQ."""
    index = GraphIndex(result.model)
    quantized = set(result.quantized)
    wanted = set(names)
    found: List[str] = []
    stack = [o for n in index.nodes if n.name in wanted for o in n.output]
    seen = set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in index.consumer_nodes(tensor):
            if node.name in quantized:
                if node.name not in found:
                    found.append(node.name)
            elif node.op_type in _PASS_THROUGH:
                stack.extend(node.output)
    return found
