"""ONNX operators as torch functions, for the reconstruction's own ONNX -> torch converter.

Each entry of :data:`OPS` takes ``(node, opset)`` and returns ``fn(*inputs) -> output or tuple``,
with the node's attributes read once; inputs are torch tensors (``None`` for an omitted optional
input). The semantics are ONNX's (opset >= 13: :func:`trtq.quantize.prepare.prepare_model` upgrades
older models), checked op by op against ONNX Runtime in tests/quantize/test_reconstruct_ops.py.
Shape arithmetic (Shape, Gather, Concat of int64 tensors ...) runs on torch tensors as well.
QuantizeLinear / DequantizeLinear are not here: the converter turns each pair into a quantizer.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import onnx

from trtq.errors import ModelError
from trtq.quantize.graph import attr

Fn = Callable[..., Any]
# what a model the converter cannot run takes instead
UNSUPPORTED_HINT = "drop --reconstruct for this model (--weight-rounding gptq --bias-correction need no converter)"


def _torch():
    import torch

    return torch


def _F():
    import torch.nn.functional as F

    return F


def _ints(t) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------------------------
# element-wise
# ------------------------------------------------------------------------------------------------


def _unary(name: str) -> Callable[[onnx.NodeProto, int], Fn]:
    def make(node: onnx.NodeProto, opset: int) -> Fn:
        torch = _torch()
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
            "Softplus": _F().softplus,
        }[name]
        return fn

    return make


def _binary(name: str) -> Callable[[onnx.NodeProto, int], Fn]:
    def make(node: onnx.NodeProto, opset: int) -> Fn:
        torch = _torch()
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
    torch = _torch()
    if b.numel() == 1 and b.is_floating_point():
        e = float(b.reshape(-1)[0])
        if e == 2.0:
            return a * a
        if e == 0.5:
            return torch.sqrt(a)
    return torch.pow(a, b.to(a.dtype) if a.is_floating_point() else b)


def _variadic(name: str) -> Callable[[onnx.NodeProto, int], Fn]:
    def make(node: onnx.NodeProto, opset: int) -> Fn:
        torch = _torch()
        pair = {"Sum": torch.add, "Max": torch.maximum, "Min": torch.minimum}[name]

        def fold(*xs):
            out = xs[0]
            for x in xs[1:]:
                out = pair(out, x)
            return out

        return fold

    return make


def _clip(node, opset, constants=None):
    torch = _torch()
    bounds = [constants.get(n) if constants is not None and n else None for n in list(node.input[1:3])]
    if len(node.input) == 3 and all(b is not None and b.size == 1 for b in bounds):
        lo, hi = (float(b.reshape(-1)[0]) for b in bounds)
        if lo < hi:  # ReLU6 and the like: one fused kernel each way
            return lambda x, *_: _F().hardtanh(x, lo, hi) if x.is_floating_point() else torch.clamp(x, lo, hi)

    def clip(x, lo=None, hi=None):
        if lo is None and hi is None:
            return x
        return torch.clamp(x, None if lo is None else lo.to(x.dtype), None if hi is None else hi.to(x.dtype))

    return clip


def _leaky_relu(node, opset):
    alpha = float(attr(node, "alpha", 0.01))
    return lambda x: _F().leaky_relu(x, alpha)


def _hard_sigmoid(node, opset):
    alpha, beta = float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    return lambda x: _torch().clamp(x * alpha + beta, 0.0, 1.0)


def _hard_swish(node, opset):
    return lambda x: x * _torch().clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


def _gelu(node, opset):
    approximate = _text(attr(node, "approximate", "none"))
    return lambda x: _F().gelu(x, approximate="tanh" if approximate == "tanh" else "none")


def _where(node, opset):
    return lambda c, a, b: _torch().where(c.bool(), a, b)


def _cast(node, opset):
    dtype = torch_dtype(int(attr(node, "to")))
    return lambda x: x.to(dtype)


def torch_dtype(onnx_type: int):
    torch = _torch()
    table = {
        onnx.TensorProto.FLOAT: torch.float32,
        onnx.TensorProto.DOUBLE: torch.float64,
        onnx.TensorProto.FLOAT16: torch.float16,
        onnx.TensorProto.INT64: torch.int64,
        onnx.TensorProto.INT32: torch.int32,
        onnx.TensorProto.INT8: torch.int8,
        onnx.TensorProto.UINT8: torch.uint8,
        onnx.TensorProto.BOOL: torch.bool,
    }
    if onnx_type not in table:
        raise ModelError(
            f"reconstruct: tensor type {onnx.TensorProto.DataType.Name(onnx_type)} is not supported", UNSUPPORTED_HINT
        )
    return table[onnx_type]


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
    auto = _text(attr(node, "auto_pad", "NOTSET"))
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
    F = _F()
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
    F = _F()
    group = int(attr(node, "group", 1))
    if _text(attr(node, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or attr(node, "output_shape") is not None:
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
    F = _F()
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
            x = _F().pad(x, _torch_pad(pads), value=-math.inf)
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
            x = _F().pad(x, _torch_pad(pads))
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
        k = scale / _torch().sqrt(var + eps)
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
        y = (x - mean) / _torch().sqrt(var + eps) * scale
        return y + bias if bias is not None else y

    return ln


def _instance_norm(node, opset):
    eps = float(attr(node, "epsilon", 1e-5))

    def norm(x, scale, bias):
        dims = tuple(range(2, x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
        shape = [1, -1] + [1] * (x.dim() - 2)
        return (x - mean) / _torch().sqrt(var + eps) * scale.reshape(shape) + bias.reshape(shape)

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
    return lambda a, b: _torch().matmul(a, b)


def _softmax(kind: str):
    def make(node, opset):
        axis = int(attr(node, "axis", -1 if opset >= 13 else 1))
        if opset < 13:

            def coerced(x):
                shape = x.shape
                flat = x.reshape(int(math.prod(shape[: axis % x.dim()])), -1)
                out = _F().softmax(flat, 1) if kind == "softmax" else _F().log_softmax(flat, 1)
                return out.reshape(shape)

            return coerced
        return (lambda x: _F().softmax(x, axis)) if kind == "softmax" else (lambda x: _F().log_softmax(x, axis))

    return make


# ------------------------------------------------------------------------------------------------
# shapes and data movement
# ------------------------------------------------------------------------------------------------


def _reshape(node, opset):
    allowzero = int(attr(node, "allowzero", 0))

    def reshape(x, shape):
        dims = _ints(shape)
        if not allowzero:
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return x.reshape(dims)

    return reshape


def _flatten(node, opset):
    axis = int(attr(node, "axis", 1))

    def flatten(x):
        a = axis % x.dim() if x.dim() else 0
        return x.reshape(int(math.prod(x.shape[:a])), -1)

    return flatten


def _transpose(node, opset):
    perm = attr(node, "perm")

    def transpose(x):
        return x.permute(*(perm if perm is not None else reversed(range(x.dim()))))

    return transpose


def _concat(node, opset):
    axis = int(attr(node, "axis"))

    def concat(*xs):
        xs = [x for x in xs if x is not None and (x.dim() != 1 or x.shape[0] != 0)] or list(xs[:1])
        dtype = xs[0].dtype
        return _torch().cat([x.to(dtype) for x in xs], axis)

    return concat


def _axes_arg(node, opset: int, since: int, axes):
    if opset >= since:
        return None if axes is None else _ints(axes)
    value = attr(node, "axes")
    return None if value is None else list(value)


def _squeeze(node, opset):
    def squeeze(x, axes=None):
        dims = _axes_arg(node, opset, 13, axes)
        if dims is None:
            dims = [i for i, d in enumerate(x.shape) if d == 1]
        out = x
        for d in sorted((d % x.dim() for d in dims), reverse=True):
            out = out.squeeze(d)
        return out

    return squeeze


def _unsqueeze(node, opset):
    def unsqueeze(x, axes=None):
        dims = _axes_arg(node, opset, 13, axes)
        rank = x.dim() + len(dims)
        out = x
        for d in sorted(d % rank for d in dims):
            out = out.unsqueeze(d)
        return out

    return unsqueeze


def _shape(node, opset):
    start, end = attr(node, "start", 0), attr(node, "end")

    def shape(x):
        dims = list(x.shape)[start:end]
        return _torch().tensor(dims, dtype=_torch().int64, device=x.device)

    return shape


def _size(node, opset):
    return lambda x: _torch().tensor(x.numel(), dtype=_torch().int64, device=x.device)


def _gather(node, opset):
    axis = int(attr(node, "axis", 0))

    def gather(x, index):
        a = axis % x.dim()
        idx = index.long()
        idx = _torch().where(idx < 0, idx + x.shape[a], idx)
        out = _torch().index_select(x, a, idx.reshape(-1))
        return out.reshape(list(x.shape[:a]) + list(index.shape) + list(x.shape[a + 1 :]))

    return gather


def _slice(node, opset):
    def slice_(x, starts, ends, axes=None, steps=None):
        s, e = _ints(starts), _ints(ends)
        a = _ints(axes) if axes is not None else list(range(len(s)))
        st = _ints(steps) if steps is not None else [1] * len(s)
        index = [slice(None)] * x.dim()
        flips = []
        for start, end, axis, step in zip(s, e, a, st):
            axis %= x.dim()
            size = x.shape[axis]
            if step > 0:
                index[axis] = slice(*slice(start, end, step).indices(size))
            else:  # torch slices have no negative step: take the forward range, flip it
                lo, hi, _ = slice(start, end, step).indices(size)
                picked = list(range(lo, hi, step))
                index[axis] = slice(picked[-1], picked[0] + 1, -step) if picked else slice(0, 0)
                flips.append(axis)
        out = x[tuple(index)]
        return out.flip(flips) if flips else out

    return slice_


def _split(node, opset):
    axis = int(attr(node, "axis", 0))
    count = len(node.output)

    def split(x, sizes=None):
        parts = _ints(sizes) if sizes is not None else attr(node, "split")
        if parts is None:
            size = x.shape[axis]
            chunk = -(-size // count)
            parts = [min(chunk, size - i * chunk) for i in range(count)]
        return tuple(_torch().split(x, list(parts), axis))

    return split


def _pad(node, opset):
    mode = _text(attr(node, "mode", "constant"))

    def pad(x, pads, value=None, axes=None):
        p = _ints(pads)
        n = len(p) // 2
        dims = _ints(axes) if axes is not None else list(range(x.dim()))
        full = [0] * (2 * x.dim())
        for i, d in enumerate(dims):
            d %= x.dim()
            full[d], full[d + x.dim()] = p[i], p[i + n]
        torch_pads: list[int] = []
        for axis in reversed(range(x.dim())):
            torch_pads += [full[axis], full[axis + x.dim()]]
        while len(torch_pads) > 2 and torch_pads[-1] == 0 and torch_pads[-2] == 0:
            torch_pads = torch_pads[:-2]
        if mode == "constant":
            v = float(value.reshape(-1)[0]) if value is not None and value.numel() else 0.0
            return _F().pad(x, torch_pads, value=v)
        if any(v < 0 for v in torch_pads):
            raise ModelError(f"reconstruct: Pad {node.name} crops in {mode} mode: not supported", UNSUPPORTED_HINT)
        return _F().pad(x, torch_pads, mode={"reflect": "reflect", "edge": "replicate"}[mode])

    return pad


def _expand(node, opset):
    def expand(x, shape):
        dims = _ints(shape)
        rank = max(len(dims), x.dim())
        dims = [1] * (rank - len(dims)) + dims
        xs = [1] * (rank - x.dim()) + list(x.shape)
        target = [max(a, b) if 1 in (a, b) else a for a, b in zip(xs, dims)]
        return x.reshape(xs).expand(target)

    return expand


def _tile(node, opset):
    return lambda x, repeats: x.repeat(*_ints(repeats))


def _constant_of_shape(node, opset):
    value = attr(node, "value")

    def make(shape):
        torch = _torch()
        from onnx import numpy_helper

        fill = numpy_helper.to_array(value) if value is not None else None
        dtype = torch_dtype(value.data_type) if value is not None else torch.float32
        v = fill.reshape(-1)[0].item() if fill is not None else 0.0
        return torch.full(_ints(shape), v, dtype=dtype, device=shape.device)

    return make


def _range(node, opset):
    def range_(start, limit, delta):
        return _torch().arange(start.item(), limit.item(), delta.item(), dtype=start.dtype, device=start.device)

    return range_


def _reduce(kind: str):
    def make(node, opset):
        keep = bool(attr(node, "keepdims", 1))
        noop = bool(attr(node, "noop_with_empty_axes", 0))
        since = 13 if kind == "sum" else 18

        def reduce(x, axes=None):
            dims = _axes_arg(node, opset, since, axes)
            if not dims:
                if noop:
                    return x
                dims = list(range(x.dim()))
            dims = [d % x.dim() for d in dims]
            torch = _torch()
            if kind == "mean":
                return x.mean(dim=dims, keepdim=keep)
            if kind == "sum":
                return x.sum(dim=dims, keepdim=keep)
            if kind == "max":
                return torch.amax(x, dim=dims, keepdim=keep)
            if kind == "min":
                return torch.amin(x, dim=dims, keepdim=keep)
            if kind == "l2":
                return torch.sqrt((x * x).sum(dim=dims, keepdim=keep))
            return (x * x).sum(dim=dims, keepdim=keep)  # sumsquare

        return reduce

    return make


def _arg(kind: str):
    def make(node, opset):
        axis = int(attr(node, "axis", 0))
        keep = bool(attr(node, "keepdims", 1))
        if attr(node, "select_last_index", 0):
            raise ModelError(f"reconstruct: {node.op_type} select_last_index is not supported", UNSUPPORTED_HINT)
        torch = _torch()
        fn = torch.argmax if kind == "max" else torch.argmin
        return lambda x: fn(x, dim=axis, keepdim=keep)

    return make


def _depth_to_space(node, opset):
    block = int(attr(node, "blocksize"))
    mode = _text(attr(node, "mode", "DCR"))

    def d2s(x):
        n, c, h, w = x.shape
        if mode == "DCR":
            y = x.reshape(n, block, block, c // block**2, h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // block**2, block, block, h, w).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // block**2, h * block, w * block)

    return d2s


def _resize(node, opset):
    mode = _text(attr(node, "mode", "nearest"))
    transform = _text(attr(node, "coordinate_transformation_mode", "half_pixel"))
    nearest = _text(attr(node, "nearest_mode", "round_prefer_floor"))

    def resize(x, roi=None, scales=None, sizes=None):
        F = _F()
        if sizes is not None and sizes.numel():
            size, factors = _ints(sizes)[2:], None
        else:
            given = [float(v) for v in scales.reshape(-1).tolist()]
            if given[:2] != [1.0, 1.0]:
                raise ModelError(f"reconstruct: Resize {node.name} scales batch or channels", UNSUPPORTED_HINT)
            size, factors = None, given[2:]
        how = dict(size=size, scale_factor=factors, recompute_scale_factor=False if factors else None)
        if mode == "nearest" and transform == "asymmetric" and nearest == "floor":
            return F.interpolate(x, mode="nearest", **how)
        if mode == "linear" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners") and x.dim() == 4:
            return F.interpolate(x, mode="bilinear", align_corners=transform == "align_corners", **how)
        raise ModelError(
            f"reconstruct: Resize {node.name} ({mode}, {transform}, {nearest}) is not supported", UNSUPPORTED_HINT
        )

    return resize


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
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Concat": _concat,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Shape": _shape,
    "Size": _size,
    "Gather": _gather,
    "Slice": _slice,
    "Split": _split,
    "Pad": _pad,
    "Expand": _expand,
    "Tile": _tile,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "ReduceMean": _reduce("mean"),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
    "ReduceL2": _reduce("l2"),
    "ReduceSumSquare": _reduce("sumsquare"),
    "ArgMax": _arg("max"),
    "ArgMin": _arg("min"),
    "DepthToSpace": _depth_to_space,
    "Resize": _resize,
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
