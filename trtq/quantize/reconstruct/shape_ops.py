"""ONNX shape and data-movement operators (and reductions, Resize) as torch functions, for the
converter of :mod:`~trtq.quantize.reconstruct.ops` (same conventions: ``make(node, opset) -> fn``)."""

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
    ints,
    text,
    torch_dtype,
    torch_module,
)

# ------------------------------------------------------------------------------------------------
# shapes and data movement
# ------------------------------------------------------------------------------------------------


def _reshape(node, opset):
    allowzero = int(attr(node, "allowzero", 0))

    def reshape(x, shape):
        dims = ints(shape)
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
        return torch_module().cat([x.to(dtype) for x in xs], axis)

    return concat


def _axes_arg(node, opset: int, since: int, axes):
    if opset >= since:
        return None if axes is None else ints(axes)
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
        return torch_module().tensor(dims, dtype=torch_module().int64, device=x.device)

    return shape


def _size(node, opset):
    return lambda x: torch_module().tensor(x.numel(), dtype=torch_module().int64, device=x.device)


def _gather(node, opset):
    axis = int(attr(node, "axis", 0))

    def gather(x, index):
        a = axis % x.dim()
        idx = index.long()
        idx = torch_module().where(idx < 0, idx + x.shape[a], idx)
        out = torch_module().index_select(x, a, idx.reshape(-1))
        return out.reshape(list(x.shape[:a]) + list(index.shape) + list(x.shape[a + 1 :]))

    return gather


def _slice(node, opset):
    def slice_(x, starts, ends, axes=None, steps=None):
        s, e = ints(starts), ints(ends)
        a = ints(axes) if axes is not None else list(range(len(s)))
        st = ints(steps) if steps is not None else [1] * len(s)
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
        parts = ints(sizes) if sizes is not None else attr(node, "split")
        if parts is None:
            size = x.shape[axis]
            chunk = -(-size // count)
            parts = [min(chunk, size - i * chunk) for i in range(count)]
        return tuple(torch_module().split(x, list(parts), axis))

    return split


def _pad(node, opset):
    mode = text(attr(node, "mode", "constant"))

    def pad(x, pads, value=None, axes=None):
        p = ints(pads)
        n = len(p) // 2
        dims = ints(axes) if axes is not None else list(range(x.dim()))
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
            return functional().pad(x, torch_pads, value=v)
        if any(v < 0 for v in torch_pads):
            raise ModelError(f"reconstruct: Pad {node.name} crops in {mode} mode: not supported", UNSUPPORTED_HINT)
        return functional().pad(x, torch_pads, mode={"reflect": "reflect", "edge": "replicate"}[mode])

    return pad


def _expand(node, opset):
    def expand(x, shape):
        dims = ints(shape)
        rank = max(len(dims), x.dim())
        dims = [1] * (rank - len(dims)) + dims
        xs = [1] * (rank - x.dim()) + list(x.shape)
        target = [max(a, b) if 1 in (a, b) else a for a, b in zip(xs, dims)]
        return x.reshape(xs).expand(target)

    return expand


def _tile(node, opset):
    return lambda x, repeats: x.repeat(*ints(repeats))


def _constant_of_shape(node, opset):
    value = attr(node, "value")

    def make(shape):
        torch = torch_module()
        from onnx import numpy_helper

        fill = numpy_helper.to_array(value) if value is not None else None
        dtype = torch_dtype(value.data_type) if value is not None else torch.float32
        v = fill.reshape(-1)[0].item() if fill is not None else 0.0
        return torch.full(ints(shape), v, dtype=dtype, device=shape.device)

    return make


def _range(node, opset):
    def range_(start, limit, delta):
        return torch_module().arange(start.item(), limit.item(), delta.item(), dtype=start.dtype, device=start.device)

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
            torch = torch_module()
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
        torch = torch_module()
        fn = torch.argmax if kind == "max" else torch.argmin
        return lambda x: fn(x, dim=axis, keepdim=keep)

    return make


def _depth_to_space(node, opset):
    block = int(attr(node, "blocksize"))
    mode = text(attr(node, "mode", "DCR"))

    def d2s(x):
        n, c, h, w = x.shape
        if mode == "DCR":
            y = x.reshape(n, block, block, c // block**2, h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // block**2, block, block, h, w).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // block**2, h * block, w * block)

    return d2s


def _resize(node, opset):
    mode = text(attr(node, "mode", "nearest"))
    transform = text(attr(node, "coordinate_transformation_mode", "half_pixel"))
    nearest = text(attr(node, "nearest_mode", "round_prefer_floor"))

    def resize(x, roi=None, scales=None, sizes=None):
        F = functional()
        if sizes is not None and sizes.numel():
            size, factors = ints(sizes)[2:], None
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


SHAPE_OPS: dict[str, Callable[[onnx.NodeProto, int], Fn]] = {
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
