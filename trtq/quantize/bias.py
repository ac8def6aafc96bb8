"""Bias correction: cancel the mean shift that INT8 weight rounding adds to each Conv/Gemm output.

With ``Wq`` the weights as TensorRT will see them (``round(W / s) * s`` per channel), a layer's
output moves on average by ``(Wq - W) @ E[x]``. Subtracting that from the float bias (TensorRT keeps
bias in float in explicit quantization) removes it. ``E[x]`` is the per-channel mean of the layer's
input activation over calibration samples, measured on the FP32 model. Padding is ignored (border
pixels see zeros), so the correction is exact for 1x1 convolutions and close for larger kernels.

Measured on EfficientNet-Lite0 (depthwise convolutions are the usual victims): docs/decisions.md D22.
"""

from collections.abc import Collection, Mapping
from typing import Optional

import numpy as np
import onnx

from trtq.quantize.edit import InitializerEditor
from trtq.quantize.graph import GraphIndex, attr


def rounded_weight(
    index: GraphIndex, tensor: str, rounded: Mapping[str, np.ndarray]
) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(W, Wq) when ``tensor`` is DQ(Q(W)) of an int8 float initializer, else None. ``Wq`` is
    ``rounded[W's name]`` when given (levels chosen by :mod:`~trtq.quantize.rounding`)."""
    q = index.quantized_constant(tensor)
    if q is None:
        return None
    w = index.array(q.input[0]).astype(np.float64)
    if q.input[0] in rounded:
        return w, np.asarray(rounded[q.input[0]], dtype=np.float64)
    s = index.array(q.input[1]).astype(np.float64)
    if s.ndim == 1 and w.ndim > 1:
        axis = attr(q, "axis", 1) % w.ndim
        shape = [1] * w.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    return w, np.clip(np.round(w / s), -127, 127) * s


Target = tuple[onnx.NodeProto, str, np.ndarray]  # (node, float input activation, weight error Wq - W)


def _targets(index: GraphIndex, rounded: Mapping[str, np.ndarray]) -> list[Target]:
    """Every correctable Conv/Gemm of the Q/DQ model ``index`` describes."""
    out = []
    for node in index.nodes:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 2:
            continue
        pair = rounded_weight(index, node.input[1], rounded)
        if pair is None:
            continue
        bias = node.input[2] if len(node.input) > 2 else ""
        if bias and (not index.is_constant(bias) or index.fan_out(bias) > 1):
            continue  # bias computed or shared: leave it alone
        if node.op_type == "Gemm" and (
            attr(node, "transA", 0) or attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0
        ):
            continue
        w, wq = pair
        out.append((node, index.float_source(node.input[0]), wq - w))
    return out


def _shift(node, error: np.ndarray, mean: np.ndarray) -> Optional[np.ndarray]:
    """Mean output shift per output channel caused by ``error``, or None if shapes disagree."""
    if node.op_type == "Gemm":
        d = error.T if attr(node, "transB", 0) else error  # [K, N]
        return mean @ d if d.shape[0] == mean.shape[0] else None
    d = error.reshape(error.shape[0], error.shape[1], -1).sum(axis=2)  # [Cout, Cin/group]
    group = attr(node, "group", 1)
    cout, per_group = d.shape
    if cout % group or per_group * group != mean.shape[0]:
        return None
    mu = mean.reshape(group, per_group)[np.arange(cout) // (cout // group)]  # [Cout, Cin/group]
    return (d * mu).sum(axis=1)


def correct_biases(
    qdq: onnx.ModelProto, means: dict[str, np.ndarray], rounded: Optional[Mapping[str, np.ndarray]] = None
) -> list[str]:
    """Subtract each layer's mean shift from its bias (in place); returns the corrected node names.

    ``means``: per-channel mean of each layer's float input (axis 1 for Conv, last for Gemm).
    """
    return _apply(qdq, _targets(GraphIndex(qdq), rounded or {}), means)


def _apply(qdq: onnx.ModelProto, targets: list[Target], means: dict[str, np.ndarray]) -> list[str]:
    ed = InitializerEditor(qdq)
    done = []
    for node, source, error in targets:
        mean = means.get(source)
        if mean is None:
            continue
        shift = _shift(node, error, np.asarray(mean, dtype=np.float64))
        if shift is None:
            continue
        if len(node.input) > 2 and node.input[2] and ed.array(node.input[2]).shape != shift.shape:
            continue
        ed.add_to_bias(node, 2, -shift, np.float32, "corrected_bias")
        done.append(node.name or node.output[0])
    return done


class ChannelMeans:
    """Running per-channel means (float64) of ``tensors``: axis 1 of tensors with 3+ dims (NCHW),
    the last axis of 2-D ones. An observer for :func:`trtq.calib.collect.exposed.observe`."""

    def __init__(self, tensors: list[str]):
        self.tensors = list(tensors)
        self._sums: dict[str, np.ndarray] = {}
        self._counts: dict[str, int] = {}

    def add(self, values: Mapping[str, np.ndarray]) -> None:
        for name in self.tensors:
            if name not in values:
                continue
            v = np.asarray(values[name])
            if v.ndim < 2:
                continue
            axes = tuple(i for i in range(v.ndim) if i != (1 if v.ndim > 2 else v.ndim - 1))
            s = v.sum(axis=axes, dtype=np.float64)
            self._sums[name] = self._sums[name] + s if name in self._sums else s
            self._counts[name] = self._counts.get(name, 0) + v.size // s.size

    def result(self) -> dict[str, np.ndarray]:
        return {name: self._sums[name] / self._counts[name] for name in self._sums}


def correction_sources(qdq: onnx.ModelProto, available: Collection[str]) -> list[str]:
    """The float input activations (among ``available``, the FP32 model's tensors) whose means the
    correctable layers of ``qdq`` need."""
    return sorted({src for _, src, _ in _targets(GraphIndex(qdq), {}) if src in available})
