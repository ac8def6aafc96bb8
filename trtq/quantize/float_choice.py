"""Layers the user chose to leave float, and what they feed: for TensorRT 8, whose engines came out
wrong when a float grouped/depthwise Conv fed an INT8 layer (measured on 8.6.0; see
trtq.trt.compat.float_grouped_conv_is_unsafe). ``build`` on TensorRT 8 leaves those consumers float
too (``quantize_model(float_grouped_consumers=True)``), and so does ``quantize`` with a cache
written for TensorRT 8; with another cache it names them in a warning. A Q/DQ model made elsewhere
is checked with :func:`float_grouped_convs_in_qdq_model` before TensorRT 8 builds it."""

from collections.abc import Collection, Sequence

from trtq.quantize.graph import GraphIndex, attr

FLOAT_CHOICES = ("excluded by", "float_layers")  # left_float reasons the user chose
# what can sit between a conv and the next layer's input: activations (Mul: x * sigmoid(x)), Pad, Q/DQ
_PASS_THROUGH = frozenset(
    {
        "Relu",
        "Clip",
        "LeakyRelu",
        "PRelu",
        "HardSwish",
        "HardSigmoid",
        "Sigmoid",
        "Tanh",
        "Elu",
        "Selu",
        "Softplus",
        "Mul",
        "Pad",
        "Identity",
        "BatchNormalization",
        "QuantizeLinear",
        "DequantizeLinear",
    }
)


WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # the ops whose constant weights INT8 builds quantize
GROUPED_CONSUMER_REASON = "fed by a float grouped conv (TensorRT 8 builds that pair wrongly)"


def float_grouped_convs(index: GraphIndex, left_float: Sequence[tuple[str, str]]) -> list[str]:
    """Grouped/depthwise Convs among ``left_float`` (node, reason) that the user chose to leave float."""
    chosen = {name for name, why in left_float if why.startswith(FLOAT_CHOICES)}
    return [n.name for n in index.nodes if n.name in chosen and n.op_type == "Conv" and int(attr(n, "group", 1)) > 1]


def _reached(index: GraphIndex, names: Sequence[str], quantized: Collection[str]):
    """The nodes the outputs of ``names`` reach through activations, Pad and Q/DQ that are not
    walked through: quantized ones, and any op outside that set (a node may come twice)."""
    wanted = set(names)
    stack = [o for n in index.nodes if n.name in wanted for o in n.output]
    seen = set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in index.consumer_nodes(tensor):
            if node.name not in quantized and node.op_type in _PASS_THROUGH:
                stack.extend(node.output)
            else:
                yield node


def quantized_consumers(index: GraphIndex, names: Sequence[str], quantized: Collection[str]) -> list[str]:
    """Nodes in ``quantized`` fed by the outputs of ``names`` through activations, Pad and Q/DQ."""
    quantized = set(quantized)
    found = [node.name for node in _reached(index, names, quantized) if node.name in quantized]
    return list(dict.fromkeys(found))


def unresolved_readers(index: GraphIndex, names: Sequence[str], quantized: Collection[str]) -> list[str]:
    """The grouped Convs of ``names`` whose outputs reach, through activations, Pad and Q/DQ, a
    quantized node or one that is not a float weighted layer (an Add, a Concat, a Reshape...: its
    INT8 side cannot be told here). A float grouped Conv whose readers are all float
    weighted layers is the pair TensorRT 8.6.0 built right (docs/decisions.md D5)."""
    quantized = set(quantized)
    return [
        name
        for name in names
        if any(n.name in quantized or n.op_type not in WEIGHTED_OPS for n in _reached(index, [name], quantized))
    ]


def grouped_conv_consumers(
    index: GraphIndex, left_float: Sequence[tuple[str, str]], quantized: Collection[str]
) -> tuple[list[str], list[str]]:
    """(float grouped Convs the user chose, the quantized nodes they feed)."""
    risky = float_grouped_convs(index, left_float)
    return risky, (quantized_consumers(index, risky, quantized) if risky else [])


def float_grouped_convs_in_qdq_model(model) -> tuple[list[str], list[str]]:
    """In a model that already has Q/DQ nodes: (grouped Convs whose weights are float, the INT8
    layers (weights behind a DequantizeLinear) their outputs feed)."""
    index = GraphIndex(model)

    def weight_from_dq(node) -> bool:
        if len(node.input) < 2:
            return False
        producer = index.producer_node(node.input[1])
        return producer is not None and producer.op_type == "DequantizeLinear"

    quantized = {n.name for n in index.nodes if n.op_type in WEIGHTED_OPS and weight_from_dq(n)}
    risky = [
        n.name for n in index.nodes if n.op_type == "Conv" and int(attr(n, "group", 1)) > 1 and n.name not in quantized
    ]
    return risky, (quantized_consumers(index, risky, quantized) if risky else [])
