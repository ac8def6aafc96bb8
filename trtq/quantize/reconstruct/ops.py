"""ONNX operators as torch functions, for the reconstruction's own ONNX -> torch converter.

Each entry of :data:`OPS` takes ``(node, opset)`` and returns ``fn(*inputs) -> output or tuple``,
with the node's attributes read once; inputs are torch tensors (``None`` for an omitted optional
input). The semantics are ONNX's (opset >= 13: :func:`trtq.quantize.prepare.prepare_model` upgrades
older models), checked op by op against ONNX Runtime in tests/quantize/test_reconstruct_ops.py.
Shape arithmetic (Shape, Gather, Concat of int64 tensors ...) runs on torch tensors as well
(:mod:`~trtq.quantize.reconstruct.shape_ops`; shared helpers in :mod:`~trtq.quantize.reconstruct.op_base`).
QuantizeLinear / DequantizeLinear are not here: the converter turns each pair into a quantizer.
"""

from __future__ import annotations

import math
from typing import Callable

import onnx

from trtq.errors import ModelError
from trtq.quantize.graph import attr
from trtq.quantize.reconstruct.op_base import (
    UNSUPPORTED_HINT,
    Fn,
    functional,
    text,
    torch_dtype,
    torch_module,
)
from trtq.quantize.reconstruct.shape_ops import SHAPE_OPS

# ------------------------------------------------------------------------------------------------
# element-wise
# ------------------------------------------------------------------------------------------------


def _unary(name: str) -> Callable[[onnx.NodeProto, int], Fn]:
    def make(node: onnx.NodeProto, opset: int) -> Fn:
        torch = torch_module()
        fn = {
            "Relu": torch.relu,
            "Sigmoid": torch.sigmoid,
            "Tanh": torch.tanh,
            "Erf": torch.erf,
            "Exp": torch.exp,
            "Log": torch.log,
            "Sqrt": torch.sqrt,
            "Neg": torch.neg,
            "Abs": torch.abs,
            "Reciprocal": torch.reciprocal,
            "Floor": torch.floor,
            "Ceil": torch.ceil,
            "Identity": lambda x: x,
            "Not": torch.logical_not,
            "Sin": torch.sin,
            "Cos": torch.cos,
            "Softplus": functional().softplus,
        }[name]
        return fn

    return make


def _binary(name: str) -> Callable[[onnx.NodeProto, int], Fn]:
    def make(node: onnx.NodeProto, opset: int) -> Fn:
        torch = torch_module()
        if name == "Div":

            def div(a, b):
                if not a.is_floating_point() and not b.is_floating_point():
                    return torch.div(a, b, rounding_mode="trunc")
                return a / b

            return div
        return {
            "Add": torch.add,
            "Sub": torch.sub,
            "Mul": torch.mul,
            "Pow": _pow,
            "Equal": torch.eq,
            "Less": torch.lt,
            "Greater": torch.gt,
            "LessOrEqual": torch.le,
            "GreaterOrEqual": torch.ge,
            "And": torch.logical_and,
            "Or": torch.logical_or,
            "Max": torch.maximum,
            "Min": torch.minimum,
        }[name]

    return make


def _pow(a, b):
    torch = torch_module()
    if b.numel() == 1 and b.is_floating_point():
        e = float(b.reshape(-1)[0])
        if e == 2.0:
            return a * a
        if e == 0.5:
            return torch.sqrt(a)
    return torch.pow(a, b.to(a.dtype) if a.is_floating_point() else b)


def _variadic(name: str) -> Callable[[onnx.NodeProto, int], Fn]:
    def make(node: onnx.NodeProto, opset: int) -> Fn:
        torch = torch_module()
        pair = {"Sum": torch.add, "Max": torch.maximum, "Min": torch.minimum}[name]

        def fold(*xs):
            out = xs[0]
            for x in xs[1:]:
                out = pair(out, x)
            return out

        return fold

    return make


def _clip(node, opset, constants=None):
    torch = torch_module()
    bounds = [constants.get(n) if constants is not None and n else None for n in list(node.input[1:3])]
    if len(node.input) == 3 and all(b is not None and b.size == 1 for b in bounds):
        lo, hi = (float(b.reshape(-1)[0]) for b in bounds)
        if lo < hi:  # ReLU6 and the like: one fused kernel each way
            return lambda x, *_: functional().hardtanh(x, lo, hi) if x.is_floating_point() else torch.clamp(x, lo, hi)

    def clip(x, lo=None, hi=None):
        if lo is None and hi is None:
            return x
        return torch.clamp(x, None if lo is None else lo.to(x.dtype), None if hi is None else hi.to(x.dtype))

    return clip


def _leaky_relu(node, opset):
    alpha = float(attr(node, "alpha", 0.01))
    return lambda x: functional().leaky_relu(x, alpha)


def _hard_sigmoid(node, opset):
    alpha, beta = float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    return lambda x: torch_module().clamp(x * alpha + beta, 0.0, 1.0)


def _hard_swish(node, opset):
    return lambda x: x * torch_module().clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


def _gelu(node, opset):
    approximate = text(attr(node, "approximate", "none"))
    return lambda x: functional().gelu(x, approximate="tanh" if approximate == "tanh" else "none")


def _where(node, opset):
    return lambda c, a, b: torch_module().where(c.bool(), a, b)


def _cast(node, opset):
    dtype = torch_dtype(int(attr(node, "to")))
    return lambda x: x.to(dtype)


# ------------------------------------------------------------------------------------------------
# convolution, pooling, normalization
# ------------------------------------------------------------------------------------------------


def _same_pads(auto: str, spatial, kernel, strides, dilations) -> list[int]:
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def _window(node, x, kernel):
    """(strides, dilations, pads as begins + ends) of a conv / pool node for input ``x``."""
    n = len(kernel)
    strides = list(attr(node, "strides", [1] * n))
    dilations = list(attr(node, "dilations", [1] * n))
    auto = text(attr(node, "auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto, x.shape[2:], kernel, strides, dilations)
    elif auto == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(attr(node, "pads", [0] * (2 * n)))
    return strides, dilations, pads


def _torch_pad(pads: list[int]) -> list[int]:
    """ONNX pads (begins of every axis, then ends) of the spatial axes -> F.pad's order (last axis first)."""
    n = len(pads) // 2
    out: list[int] = []
    for axis in reversed(range(n)):
        out += [pads[axis], pads[axis + n]]
    return out


def _symmetric(pads: list[int]):
    n = len(pads) // 2
    return pads[:n] == pads[n:]


def _conv(node, opset):
    F = functional()
    group = int(attr(node, "group", 1))

    def conv(x, w, b=None):
        kernel = list(w.shape[2:])
        strides, dilations, pads = _window(node, x, kernel)
        n = len(kernel)
        if not _symmetric(pads):
            x = F.pad(x, _torch_pad(pads))
            pads = [0] * (2 * n)
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(n)
        if fn is None:
            raise ModelError(f"reconstruct: {n}-D Conv ({node.name}) is not supported", UNSUPPORTED_HINT)
        return fn(x, w, b, strides, pads[:n], dilations, group)

    return conv


def _conv_transpose(node, opset):
    F = functional()
    group = int(attr(node, "group", 1))
    if text(attr(node, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or attr(node, "output_shape") is not None:
        raise ModelError(
            f"reconstruct: ConvTranspose {node.name} with auto_pad/output_shape is not supported", UNSUPPORTED_HINT
        )

    def conv_t(x, w, b=None):
        n = w.dim() - 2
        strides = list(attr(node, "strides", [1] * n))
        dilations = list(attr(node, "dilations", [1] * n))
        pads = list(attr(node, "pads", [0] * (2 * n)))
        out_pad = list(attr(node, "output_padding", [0] * n))
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
        if not _symmetric(pads):
            y = fn(x, w, b, strides, 0, out_pad, group, dilations)
            index = [slice(None), slice(None)] + [slice(pads[i], y.shape[2 + i] - pads[i + n]) for i in range(n)]
            return y[tuple(index)]
        return fn(x, w, b, strides, pads[:n], out_pad, group, dilations)

    return conv_t


def _pool_fn(kind: str, n: int):
    F = functional()
    table = {
        "max": {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d},
        "avg": {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d},
    }[kind]
    return table[n]


def _max_pool(node, opset):
    kernel = list(attr(node, "kernel_shape"))
    ceil = bool(attr(node, "ceil_mode", 0))
    if len(node.output) > 1 and node.output[1]:
        raise ModelError(f"reconstruct: MaxPool {node.name} with indices is not supported", UNSUPPORTED_HINT)

    def pool(x):
        strides, dilations, pads = _window(node, x, kernel)
        n = len(kernel)
        if not _symmetric(pads) or any(p * 2 > k for p, k in zip(pads[:n], kernel)):
            x = functional().pad(x, _torch_pad(pads), value=-math.inf)
            pads = [0] * (2 * n)
        return _pool_fn("max", n)(x, kernel, strides, pads[:n], dilations, ceil_mode=ceil)

    return pool


def _avg_pool(node, opset):
    kernel = list(attr(node, "kernel_shape"))
    ceil = bool(attr(node, "ceil_mode", 0))
    include = bool(attr(node, "count_include_pad", 0))

    def pool(x):
        strides, _, pads = _window(node, x, kernel)
        n = len(kernel)
        if not _symmetric(pads) or any(p * 2 > k for p, k in zip(pads[:n], kernel)):
            if not include and any(pads):
                raise ModelError(
                    f"reconstruct: AveragePool {node.name} with asymmetric pads excluded from the count "
                    "is not supported",
                    UNSUPPORTED_HINT,
                )
            x = functional().pad(x, _torch_pad(pads))
            pads = [0] * (2 * n)
        return _pool_fn("avg", n)(x, kernel, strides, pads[:n], ceil_mode=ceil, count_include_pad=include)

    return pool


def _global_pool(kind: str):
    def make(node, opset):
        def pool(x):
            dims = tuple(range(2, x.dim()))
            return x.mean(dim=dims, keepdim=True) if kind == "avg" else x.amax(dim=dims, keepdim=True)

        return pool

    return make


def _batch_norm(node, opset):
    eps = float(attr(node, "epsilon", 1e-5))
    if len(node.output) > 1 and any(node.output[1:]):
        raise ModelError(
            f"reconstruct: BatchNormalization {node.name} in training mode is not supported", UNSUPPORTED_HINT
        )

    def bn(x, scale, bias, mean, var):
        shape = [1, -1] + [1] * (x.dim() - 2)
        k = scale / torch_module().sqrt(var + eps)
        return x * k.reshape(shape) + (bias - mean * k).reshape(shape)

    return bn


def _layer_norm(node, opset):
    axis = int(attr(node, "axis", -1))
    eps = float(attr(node, "epsilon", 1e-5))
    if len(node.output) > 1 and any(node.output[1:]):
        raise ModelError(
            f"reconstruct: LayerNormalization {node.name} with mean/inv-std outputs is not supported", UNSUPPORTED_HINT
        )

    def ln(x, scale, bias=None):
        start = axis % x.dim()
        dims = tuple(range(start, x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
        y = (x - mean) / torch_module().sqrt(var + eps) * scale
        return y + bias if bias is not None else y

    return ln


def _instance_norm(node, opset):
    eps = float(attr(node, "epsilon", 1e-5))

    def norm(x, scale, bias):
        dims = tuple(range(2, x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
        shape = [1, -1] + [1] * (x.dim() - 2)
        return (x - mean) / torch_module().sqrt(var + eps) * scale.reshape(shape) + bias.reshape(shape)

    return norm


# ------------------------------------------------------------------------------------------------
# matrix products
# ------------------------------------------------------------------------------------------------


def _gemm(node, opset):
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    ta, tb = int(attr(node, "transA", 0)), int(attr(node, "transB", 0))

    def gemm(a, b, c=None):
        a = a.t() if ta else a
        b = b.t() if tb else b
        y = a @ b
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + (c * beta if beta != 1.0 else c)
        return y

    return gemm


def _matmul(node, opset):
    return lambda a, b: torch_module().matmul(a, b)


def _softmax(kind: str):
    def make(node, opset):
        axis = int(attr(node, "axis", -1 if opset >= 13 else 1))
        if opset < 13:

            def coerced(x):
                shape = x.shape
                flat = x.reshape(int(math.prod(shape[: axis % x.dim()])), -1)
                out = functional().softmax(flat, 1) if kind == "softmax" else functional().log_softmax(flat, 1)
                return out.reshape(shape)

            return coerced
        return (
            (lambda x: functional().softmax(x, axis))
            if kind == "softmax"
            else (lambda x: functional().log_softmax(x, axis))
        )

    return make


OPS: dict[str, Callable[[onnx.NodeProto, int], Fn]] = {
    **{
        name: _unary(name)
        for name in (
            "Relu",
            "Sigmoid",
            "Tanh",
            "Erf",
            "Exp",
            "Log",
            "Sqrt",
            "Neg",
            "Abs",
            "Reciprocal",
            "Floor",
            "Ceil",
            "Identity",
            "Not",
            "Sin",
            "Cos",
            "Softplus",
        )
    },
    **{
        name: _binary(name)
        for name in (
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Equal",
            "Less",
            "Greater",
            "LessOrEqual",
            "GreaterOrEqual",
            "And",
            "Or",
        )
    },
    "Sum": _variadic("Sum"),
    "Max": _variadic("Max"),
    "Min": _variadic("Min"),
    "Clip": _clip,
    "LeakyRelu": _leaky_relu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Gelu": _gelu,
    "Where": _where,
    "Cast": _cast,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _max_pool,
    "AveragePool": _avg_pool,
    "GlobalAveragePool": _global_pool("avg"),
    "GlobalMaxPool": _global_pool("max"),
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _layer_norm,
    "InstanceNormalization": _instance_norm,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Softmax": _softmax("softmax"),
    "LogSoftmax": _softmax("log"),
    **SHAPE_OPS,
}


def convert_node(node: onnx.NodeProto, opset: int, constants=None) -> Fn:
    """The torch function of one ONNX node (ModelError naming the node when the op is not supported).
    ``constants``: name -> numpy array of the model's constants (lets Clip take its bounds as numbers)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
        op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        raise ModelError(
            f"reconstruct: operator {op} ({node.name}) is not supported by the ONNX -> torch converter",
            UNSUPPORTED_HINT,
        )
    if node.op_type == "Clip":
        return _clip(node, opset, constants)
    return OPS[node.op_type](node, opset)
