"""Where Q/DQ goes: the placement table and the patterns that keep a node float.

The rules follow TensorRT's explicit-quantization guidance and NVIDIA ModelOpt's defaults
(see shared/design/tensorrt-notes.md, section 4). TensorRT runs a layer in INT8 when its inputs
come from DequantizeLinear; it then fuses BatchNorm, activations, a bias and a residual Add into
that layer. So Q/DQ goes on the *inputs* of the layers that do the arithmetic, never on their
outputs, and never inside the float chains TensorRT fuses on its own.

PLACEMENT (op type -> inputs that get Q/DQ)

=============  ===========  ===================================================================
op             inputs       weight (a constant input)
=============  ===========  ===================================================================
Conv           X, W         per output channel, axis 0 (depthwise too); W must be constant
ConvTranspose  X, W         per output channel, axis 1 (group 1; grouped: per tensor);
                            W must be constant
Gemm           A, B         B constant: per channel, axis 0 if transB else 1;
                            B an activation: per tensor
MatMul         A, B         B constant [K, N]: per channel, axis 1; other constant ranks: per
                            tensor; both activations: both per tensor
Add            skip input   residual Add only (see below); the Conv branch stays unquantized
=============  ===========  ===================================================================

Activations are per tensor: scale = amax / 127, zero point int8 0. Weights: scale_c =
max|W_c| / 127 (an all-zero channel gets ``ZERO_SCALE``; a near-dead channel is raised until its
bias fits int32 at input x weight scale, ``plan.INT32_BIAS_LIMIT``). Biases (Conv/Gemm C input,
bias Adds) stay float: TensorRT folds them into the INT8 kernel.

Residual Add: an Add with two computed inputs where one comes from a quantized Conv through
nothing but BatchNormalization / Relu / Identity / a bias Add (each feeding only the next) is the
tail of a residual block. Q/DQ goes on the other (skip) input only, so TensorRT fuses
Conv + Add (+ ReLU) into one INT8 kernel. If both inputs come from such Convs (a downsampling
block), the branch with the longer path back to the common ancestor is the fused main branch and
the shorter one (the shortcut) gets Q/DQ. If the skip input is computed from the fused Conv itself
the Add is not a residual (ConvNeXt-style) and gets nothing.

``placement: fused`` (``fused.py``) extends this table: residual Adds found through activation
epilogues, Concat inputs, and pairs above data-movement ops, so TensorRT keeps those groups INT8.

Commuting ops: pooling, Reshape, Transpose, Flatten, Squeeze/Unsqueeze, Identity and Concat get no
Q/DQ of their own; TensorRT moves Q/DQ across them. A quantized input that reaches its consumer
through data-movement ops takes the amax of the first tensor along that chain the cache names.

Concat: the quantized tensors among a Concat's inputs and its output share one scale (the largest
amax among them). TensorRT then writes the inputs straight into the output buffer instead of
re-quantizing each one (ModelOpt's "concat elimination").

Kept float (reported in ``left_float`` with the reason):

- graph outputs are never quantized; Softmax, LayerNormalization (and its decomposed form
  ReduceMean -> Sub -> Pow -> ReduceMean -> Add -> Sqrt -> Div), GELU (Gelu op, or the Erf / Tanh
  chains) and Sigmoid/HardSwish-style activations are not in the table, so they never get Q/DQ;
- attention cores: a MatMul whose output reaches a Softmax (Q x K^T) and a MatMul that takes a
  Softmax output (scores x V), through Reshape/Transpose/Mul/Div/Add/Where/Cast/Dropout (by
  default; ``quantize.attention: int8`` quantizes them, :func:`attention_reason`);
- GEMMs with K or N below ``MIN_GEMM_DIM`` (TensorRT's INT8 Tensor Core kernels are slower than
  float there; ModelOpt skips them too) and Convs whose channel counts INT8 kernels do not serve
  well (ModelOpt's INT8 rule: fewer than 16 in or out channels is kept float unless a plain conv
  has a multiple of 8 and a square kernel, and is the first layer or has 16+ on the other side,
  or a grouped conv has a multiple of 8 outputs and kernels of 3 or more);
- Conv/ConvTranspose whose weight is computed at run time, inputs that are not float32, and
  inputs the calibration cache does not cover.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import onnx

from trtq.quantize.graph import DATA_MOVEMENT_OPS, GraphIndex, attr

QMAX = 127.0  # symmetric int8: scale = amax / 127
ZERO_SCALE = 1e-7  # scale for an all-zero weight channel or a tensor whose amax is 0 (never 0)
MIN_GEMM_DIM = 16
MIN_CONV_CHANNELS = 16


def _conv_axis(node: onnx.NodeProto, rank: int) -> Optional[int]:
    return 0


def _conv_transpose_axis(node: onnx.NodeProto, rank: int) -> Optional[int]:
    # W is [C_in, C_out / group, k...]: axis 1 is the output channel only without groups
    return 1 if int(attr(node, "group", 1)) == 1 else None


def _gemm_axis(node: onnx.NodeProto, rank: int) -> Optional[int]:
    return 0 if int(attr(node, "transB", 0)) else 1


def _matmul_axis(node: onnx.NodeProto, rank: int) -> Optional[int]:
    return 1 if rank == 2 else None


@dataclass(frozen=True)
class OpRule:
    """Inputs of one op type that get Q/DQ, and how a constant weight among them is scaled."""

    inputs: tuple[int, ...]  # input slots that get Q/DQ
    weight_slot: Optional[int]  # the slot that is per-channel when it is a constant
    channel_axis: Callable[[onnx.NodeProto, int], Optional[int]]  # (node, weight rank) -> axis
    constant_weight_required: bool  # a computed weight keeps the node float


PLACEMENT: dict[str, OpRule] = {
    "Conv": OpRule((0, 1), 1, _conv_axis, True),
    "ConvTranspose": OpRule((0, 1), 1, _conv_transpose_axis, True),
    "Gemm": OpRule((0, 1), 1, _gemm_axis, False),
    "MatMul": OpRule((0, 1), 1, _matmul_axis, False),
}

RESIDUAL_OP = "Add"
BACKBONE_OPS = frozenset({"Conv"})  # ops TensorRT fuses a following residual Add into
BACKBONE_CHAIN_OPS = frozenset({"BatchNormalization", "Relu", "Identity"})  # fused between them
CONCAT_OP = "Concat"

# between an attention MatMul and its Softmax
_ATTENTION_LINKS = frozenset(
    {
        "Reshape",
        "Flatten",
        "Transpose",
        "Identity",
        "Cast",
        "Dropout",
        "Squeeze",
        "Unsqueeze",
        "Mul",
        "Div",
        "Add",
        "Where",
    }
)
_ATTENTION_DEPTH = 4
MAX_INT8_ATTENTION_KEYS = 512  # longer attention stays float under quantize.attention int8


# ------------------------------------------------------------------------------------------------
# patterns that keep a node float
# ------------------------------------------------------------------------------------------------


SCORES_ROLE = "attention scores"  # how attention_core's role of a Q x K^T MatMul begins


def attention_core(index: GraphIndex, node: onnx.NodeProto) -> Optional[tuple[str, onnx.NodeProto]]:
    """(its role, the Softmax) when a MatMul is part of an attention core, else None."""
    if node.op_type != "MatMul" or any(index.is_static(i) for i in node.input):
        return None  # attention MatMuls multiply two activations
    # scores x V: an input comes from a Softmax
    for name in node.input:
        for src in index.source_through(name, _ATTENTION_LINKS - {"Mul", "Div", "Add", "Where"}):
            prod = index.producer_node(src)
            if prod is not None and prod.op_type == "Softmax":
                return f"attention (Softmax output {prod.name} x V)", prod
    # Q x K^T: the output reaches a Softmax
    frontier = [node.output[0]]
    for _ in range(_ATTENTION_DEPTH):
        nxt = []
        for t in frontier:
            for consumer in index.consumer_nodes(t):
                if consumer.op_type == "Softmax":
                    return f"{SCORES_ROLE} (feeds Softmax {consumer.name})", consumer
                if consumer.op_type in _ATTENTION_LINKS:
                    nxt.extend(o for o in consumer.output if o)
        frontier = nxt
    return None


def attention_matmuls(model: onnx.ModelProto, values_only: bool = False) -> list[str]:
    """The MatMuls of ``model`` that are part of an attention core (:func:`attention_core`), in
    graph order; ``values_only``: only those that read the Softmax output (Softmax x V). A model
    without a Softmax has none (and gets no shape inference)."""
    if not any(n.op_type == "Softmax" for n in model.graph.node):
        return []
    index = GraphIndex(model)
    found = []
    for node in index.nodes:
        core = attention_core(index, node) if node.op_type == "MatMul" else None
        if core is not None and not (values_only and core[0].startswith(SCORES_ROLE)):
            found.append(node.name)
    return found


def attention_keys(index: GraphIndex, softmax: onnx.NodeProto) -> Optional[int]:
    """How many keys an attention's Softmax normalises over (its axis' length), None when shape
    inference does not know it."""
    shape = index.shapes.get(softmax.input[0]) if softmax.input else None
    if not shape:
        return None
    axis = int(attr(softmax, "axis", -1))
    return shape[axis] if -len(shape) <= axis < len(shape) else None


def attention_reason(index: GraphIndex, node: onnx.NodeProto, attention: str = "float") -> Optional[str]:
    """Why an attention MatMul is kept float, or None. ``attention`` (``quantize.attention``):
    ``float`` keeps every attention core float; ``int8`` quantizes both inputs of both MatMuls
    (the Softmax output among them) unless the Softmax spans more than :data:`MAX_INT8_ATTENTION_KEYS`
    keys, where TensorRT's INT8 attention kernels stop (ModelOpt's INT8 rule). The length is read from
    shape inference; where it cannot tell (PP-OCRv4 rec's Reshapes of computed shapes) the MatMuls
    are quantized."""
    core = attention_core(index, node)
    if core is None:
        return None
    role, softmax = core
    if attention == "float":
        return f"{role} kept float"
    keys = attention_keys(index, softmax)
    if keys is not None and keys > MAX_INT8_ATTENTION_KEYS:
        return f"{role} over {keys} keys kept float: TensorRT's INT8 attention takes at most {MAX_INT8_ATTENTION_KEYS}"
    return None


def _kernel(node: onnx.NodeProto, wdims: tuple[int, ...]) -> tuple[int, ...]:
    k = attr(node, "kernel_shape")
    return tuple(int(x) for x in k) if k else tuple(wdims[2:])


def _is_first_layer(index: GraphIndex, tensor: str) -> bool:
    return any(t in index.graph_inputs for t in index.source_through(tensor, DATA_MOVEMENT_OPS))


def size_reason(index: GraphIndex, node: onnx.NodeProto) -> Optional[str]:
    """Why a GEMM/Conv is too small for INT8 kernels to pay off, or None (static weights only)."""
    op = node.op_type
    if len(node.input) < 2 or not index.is_constant(node.input[1]):
        return None
    wdims = index.dims(node.input[1])
    if op in ("MatMul", "Gemm"):
        if op == "MatMul":
            if len(wdims) < 2:
                return f"GEMV (weight {list(wdims)}) kept float: too small for INT8 kernels"
            k, n = wdims[-2], wdims[-1]
        else:
            if len(wdims) != 2:
                return None
            n, k = (wdims[0], wdims[1]) if int(attr(node, "transB", 0)) else (wdims[1], wdims[0])
        if k < MIN_GEMM_DIM or n < MIN_GEMM_DIM:
            return f"GEMM K={k} N={n} below {MIN_GEMM_DIM}: too small for INT8 kernels"
        return None
    if op == "Conv" and len(wdims) >= 3:
        out_c, in_c = wdims[0], wdims[1]
        if out_c >= MIN_CONV_CHANNELS and in_c >= MIN_CONV_CHANNELS:
            return None
        group = int(attr(node, "group", 1))
        kernel = _kernel(node, wdims)
        if group == 1:
            if (
                (out_c % 8 == 0 or in_c % 8 == 0)
                and (_is_first_layer(index, node.input[0]) or max(out_c, in_c) >= MIN_CONV_CHANNELS)
                and len(set(kernel)) <= 1
            ):
                return None
        elif out_c % 8 == 0 and all(k >= 3 for k in kernel):
            return None
        return (
            f"Conv with {in_c * group} in / {out_c} out channels (group {group}, kernel {list(kernel)}):"
            " too few channels for INT8 kernels"
        )
    return None


# ------------------------------------------------------------------------------------------------
# residual Add
# ------------------------------------------------------------------------------------------------


def is_bias_add(index: GraphIndex, node: onnx.NodeProto) -> bool:
    return node.op_type == "Add" and len(node.input) == 2 and any(index.is_static(i) for i in node.input)


def fused_backbone(index: GraphIndex, tensor: str) -> Optional[int]:
    """Index of the Conv that ``tensor`` comes straight out of (through BN/ReLU/bias), or None.

    Every tensor on the way, ``tensor`` included, must feed only the next step: a Conv whose
    output is also used elsewhere cannot absorb the Add.
    """
    if index.fan_out(tensor) != 1:
        return None
    node = index.producer_node(tensor)
    while node is not None:
        if node.op_type in BACKBONE_OPS:
            return index.producer[node.output[0]]
        if node.op_type not in BACKBONE_CHAIN_OPS and not is_bias_add(index, node):
            return None
        src = next((i for i in node.input if i and not index.is_static(i)), None)
        if src is None or index.fan_out(src) != 1:  # a fused chain feeds nothing else
            return None
        node = index.producer_node(src)
    return None


def residual_skip_input(
    index: GraphIndex,
    node: onnx.NodeProto,
    quantized: dict[int, bool],
    backbone: Callable[[GraphIndex, str], Optional[int]] = fused_backbone,
) -> Optional[int]:
    """The input slot of a residual Add that should get Q/DQ, or None if it is not one.

    ``quantized`` maps node index -> whether that node gets Q/DQ (the fused Conv must);
    ``backbone`` finds the Conv an input comes out of (``fused.epilogue_backbone`` crosses activations).
    """
    if node.op_type != RESIDUAL_OP or len(node.input) != 2:
        return None
    a, b = node.input
    if not a or not b or index.is_static(a) or index.is_static(b):
        return None
    backbones = [backbone(index, t) for t in (a, b)]
    fusable = [bb is not None and quantized.get(bb, False) for bb in backbones]
    if fusable[0] and fusable[1]:
        if backbones[0] == backbones[1]:
            return None
        da, db = _distances_to_common_ancestor(index, a, b)
        return 1 if da >= db else 0  # the longer branch is the fused main branch
    for main, skip in ((0, 1), (1, 0)):
        if fusable[main]:
            skip_tensor = node.input[skip]
            if backbones[main] in index.ancestors(skip_tensor):
                return None  # the skip branch starts at the fused Conv itself: not a residual
            return skip
    return None


def _distances_to_common_ancestor(index: GraphIndex, a: str, b: str) -> tuple[int, int]:
    """Path lengths from the producers of ``a`` and ``b`` to their nearest common ancestor."""
    up_a = index.ancestors(a)
    up_b = index.ancestors(b)
    common = [n for n in up_a if n in up_b]
    if not common:
        return (len(up_a), len(up_b))  # independent branches: the longer one is the main branch
    best = min(common, key=lambda n: (up_a[n] + up_b[n], -n))
    return up_a[best], up_b[best]
