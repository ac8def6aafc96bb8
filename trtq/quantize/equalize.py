"""Channel equalization: a Conv input's channels brought to similar ranges, exactly in float.

INT8 activations have one scale per tensor. When the channels of a Conv's input span very
different ranges (PP-OCRv4 rec: median channel 0.16, widest 2.5 before one depthwise Conv), the
narrow channels get a handful of levels. Where every op from the last weighted layer to the Conv
acts on each channel alone and commutes with a positive per-channel factor, the graph can carry
``x / s`` instead of ``x`` (``s`` one factor per channel) with the Conv's weights multiplied by
``s`` on their input channels: the same function in float.

- The factors fold into the ops that make ``x``: a Conv's or BatchNormalization's output channels
  (weights and bias), the constant of a Mul, the constant of an Add / Sub on the way (then the
  other input carries ``/ s`` too); Relu, LeakyRelu and pooling pass it through. Every tensor on
  that chain has this one reader, so nothing else sees the scaled values.
- Depthwise Convs (one input channel per group): each weight channel is quantized on its own scale
  (per-channel INT8), so multiplying it by ``s`` costs nothing and ``s = range / widest range``
  makes every channel as wide as the widest.
- Other Convs: a weight column scaled by ``s`` shares its output channel's INT8 scale with the
  other columns, so the ranges are balanced between activation and weight, ``s ~ sqrt(range /
  weight range)`` (the cross-layer equalization rule of Nagel et al., 2019).
- ``s`` is at least :data:`FLOOR` of the widest factor (a dead channel is not blown up 1e6x) and 1
  where a channel or its weights are all zero.

The ranges are measured on the data (absolute max per channel); every scaled tensor the amax table
names then gets a new amax, by the cache's own method over the equalized model's values
(:func:`equalize_model`).
"""

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx

from trtq.quantize.edit import InitializerEditor
from trtq.quantize.graph import FLOAT, GraphIndex, attr

log = logging.getLogger(__name__)

FLOOR = 2.0**-10  # the smallest factor, relative to the largest
# f(x / s) = f(x) / s for a positive per-channel s
PASS_THROUGH = frozenset(
    {"Identity", "Relu", "LeakyRelu", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
)
LINEAR_CONSTANT = frozenset({"Add", "Sub"})  # (x op c) / s = x / s op c / s: fold, and go on upstream


@dataclass(frozen=True)
class Equalization:
    tensor: str  # the Conv input that carries x / s
    conv: str  # the Conv reading it (its weights take * s)
    depthwise: bool
    scaled: tuple[str, ...]  # tensor and every tensor upstream that carries / s too
    folds: tuple[tuple[str, int], ...]  # (node, input slot) whose constant takes / s; slot -1: a layer's outputs


def find_equalizations(index: GraphIndex) -> list[Equalization]:
    """Every Conv input that can be equalized, in graph order."""
    out = []
    for node in index.nodes:
        if node.op_type != "Conv" or len(node.input) < 2 or not _float_constant(index, node.input[1]):
            continue
        if len(index.dims(node.input[1])) != 4:  # 2-D convolutions: N, C, H, W on the whole chain
            continue
        chain = _chain(index, node.input[0])
        if chain is None:
            continue
        scaled, folds = chain
        group = int(attr(node, "group", 1))
        out.append(
            Equalization(
                node.input[0], node.name, index.dims(node.input[1])[1] == 1 and group > 1, tuple(scaled), tuple(folds)
            )
        )
    return out


def _float_constant(index: GraphIndex, name: str) -> bool:
    return index.is_constant(name) and index.initializers[name].data_type == FLOAT


def _chain(index: GraphIndex, tensor: str) -> Optional[tuple[list[str], list[tuple[str, int]]]]:
    """(scaled tensors, folds) from ``tensor`` up to the op that absorbs the factors, or None."""
    scaled, folds = [tensor], []
    name = tensor
    while len(scaled) < 16:
        node = index.producer_node(name)
        if node is None or index.fan_out(name) != 1 or index.elem_type(name) not in (None, FLOAT):
            return None
        op = node.op_type
        if op == "Conv":
            ok = _float_constant(index, node.input[1]) and (
                len(node.input) < 3 or not node.input[2] or _float_constant(index, node.input[2])
            )
            return (scaled, folds + [(node.name, -1)]) if ok else None
        if op == "BatchNormalization":
            ok = len(node.output) == 1 and all(_float_constant(index, node.input[k]) for k in (1, 2))
            return (scaled, folds + [(node.name, -1)]) if ok else None
        if op == "Mul" or op in LINEAR_CONSTANT:
            slot = _channel_constant(index, node)
            if slot is None:
                return None
            folds.append((node.name, slot))
            if op == "Mul":
                return scaled, folds
            name = node.input[1 - slot]
        elif op in PASS_THROUGH:
            name = node.input[0]
        else:
            return None
        scaled.append(name)
    return None


def _channel_constant(index: GraphIndex, node: onnx.NodeProto) -> Optional[int]:
    """The slot of ``node``'s constant operand when it is a scalar or one value per channel of an
    N, C, H, W tensor (shape [C, 1, 1] or [1, C, 1, 1]) and the other operand is not constant,
    else None."""
    if len(node.input) != 2:
        return None
    for slot in (0, 1):
        name, other = node.input[slot], node.input[1 - slot]
        if not _float_constant(index, name) or index.is_static(other):
            continue
        dims = index.dims(name)
        if math.prod(dims) == 1 or _per_channel_dims(dims):
            return slot
    return None


def _per_channel_dims(dims: Sequence[int]) -> bool:
    """[C, 1, 1] or [1, C, 1, 1]: one value per channel of an N, C, H, W tensor."""
    return tuple(dims[-2:]) == (1, 1) and (len(dims) == 3 or (len(dims) == 4 and dims[0] == 1))


def channel_factors(ranges: np.ndarray, weight: np.ndarray, depthwise: bool) -> np.ndarray:
    """One factor per input channel of a Conv with ``weight`` whose input channels span ``ranges``
    (absolute max each): ``range / widest range`` for a depthwise Conv, ``sqrt(range / weight
    column range)`` otherwise; normalised to a largest factor of 1, at least :data:`FLOOR`, 1 where
    the channel or its weights are all zero."""
    ranges = np.asarray(ranges, np.float64)
    spread = np.ones_like(ranges) if depthwise else _column_ranges(weight, len(ranges))
    valid = (ranges > 0) & (spread > 0) & np.isfinite(ranges)
    s = np.ones_like(ranges)
    if not valid.any():
        return s
    raw = ranges[valid] if depthwise else np.sqrt(ranges[valid] / spread[valid])
    s[valid] = np.maximum(raw / raw.max(), FLOOR)
    return s


def _column_ranges(weight: np.ndarray, channels: int) -> np.ndarray:
    """Absolute max of the weights each input channel meets (grouped Convs: in its group)."""
    per_group = weight.shape[1]
    groups = channels // per_group
    w = np.abs(weight.astype(np.float64)).reshape(groups, weight.shape[0] // groups, per_group, -1)
    return w.max(axis=(1, 3)).reshape(channels)


def apply_equalization(edit: InitializerEditor, eq: Equalization, s: np.ndarray) -> None:
    """Rewrite the model ``edit`` edits (in place) to carry ``eq.tensor / s``; new initializers,
    never shared ones."""
    inv = 1.0 / s
    for node_name, slot in eq.folds:
        node = edit.nodes[node_name]
        if slot >= 0:
            _scale_input(edit, node, slot, _broadcast(inv, len(edit.array(node.input[slot]).shape)))
        elif node.op_type == "Conv":
            _scale_input(edit, node, 1, inv.reshape((-1,) + (1,) * (len(edit.array(node.input[1]).shape) - 1)))
            if len(node.input) > 2 and node.input[2]:
                _scale_input(edit, node, 2, inv)
        else:  # BatchNormalization: y = scale * x_hat + B
            _scale_input(edit, node, 1, inv)
            _scale_input(edit, node, 2, inv)
    conv = edit.nodes[eq.conv]
    w = edit.array(conv.input[1])
    per_group = w.shape[1]
    groups = len(s) // per_group
    factor = s.reshape(groups, 1, per_group, *([1] * (w.ndim - 2)))
    scaled = (w.astype(np.float64).reshape(groups, w.shape[0] // groups, *w.shape[1:]) * factor).reshape(w.shape)
    old = conv.input[1]
    conv.input[1] = edit.new(f"{old}/equalized", scaled.astype(w.dtype))
    edit.drop_unused([old])


def _broadcast(values: np.ndarray, rank: int) -> np.ndarray:
    """Per-channel values shaped to multiply a scalar or per-channel constant of ``rank`` dims that
    meets an N, C, H, W tensor: [C, 1, 1] for a [C, 1, 1] constant, else [1, C, 1, 1]."""
    return values.reshape(-1, 1, 1) if rank == 3 else values.reshape(1, -1, 1, 1)


def _scale_input(edit: InitializerEditor, node: onnx.NodeProto, slot: int, factor: np.ndarray) -> None:
    old = node.input[slot]
    arr = edit.array(old)
    node.input[slot] = edit.new(f"{old}/equalized", (arr.astype(np.float64) * factor).astype(arr.dtype))
    edit.drop_unused([old])


@dataclass(frozen=True)
class Remeasure:
    """How the equalized tensors get their new amax: the calibration method of the cache."""

    method: str = "mse"
    percentile: float = 99.99
    num_bins: int = 2048


def equalize_model(
    model: onnx.ModelProto, amax: Mapping[str, float], batches, how: Remeasure, providers: Sequence[str] = ()
) -> tuple[onnx.ModelProto, dict[str, float], list[str]]:
    """(equalized copy of ``model``, amax with the scaled tensors re-measured, notes).

    Three passes of ONNX Runtime over ``batches``: per-channel ranges on the model, then the
    absolute max and the histogram (``how``) of every scaled tensor ``amax`` names on the equalized
    model. The copy is :func:`~trtq.quantize.prepare.prepare_model`'s, so the notes start with its."""
    from trtq.calib.collect.accumulators import AbsMaxAccumulator, HistogramAccumulator
    from trtq.calib.collect.exposed import observe
    from trtq.calib.methods import METHODS, compute_amax
    from trtq.quantize.prepare import prepare_model

    prepared, notes = prepare_model(model)
    found = find_equalizations(GraphIndex(prepared))
    ranges = _ChannelRanges([eq.tensor for eq in found])  # the factors read the Conv inputs' ranges only
    if found:
        observe(prepared, [ranges], batches, providers, "equalize: channel ranges")
    edit = InitializerEditor(prepared)
    done = []
    for eq in found:
        s = channel_factors(ranges.values[eq.tensor], edit.array(edit.nodes[eq.conv].input[1]), eq.depthwise)
        if np.all(s == 1.0):
            continue
        apply_equalization(edit, eq, s)
        done.append(eq)
    remeasured = sorted(t for eq in done for t in eq.scaled if t in amax)
    new = {}
    if remeasured:
        maxima = AbsMaxAccumulator()
        observe(prepared, [_Feed(remeasured, maxima.update_batch)], batches, providers, "equalize: re-measuring max")
        top = maxima.maxima
        if not METHODS.get(how.method).histogram:
            new = {t: float(compute_amax(how.method, None, top[t], how.percentile)) for t in remeasured}
        else:
            hist = HistogramAccumulator(top, how.num_bins)
            observe(prepared, [_Feed(remeasured, hist.update_batch)], batches, providers, "equalize: histograms")
            counts, zeros = hist.counts, hist.zeros
            new = {t: float(compute_amax(how.method, counts[t], top[t], how.percentile, zeros[t])) for t in remeasured}
    depthwise = sum(eq.depthwise for eq in done)
    if not found:
        notes.append(
            "equalized channels of 0 Conv inputs: none is made by ops that can take per-channel "
            "factors (a Conv, BatchNorm or constant Mul, through Add / Sub constants, Relu or pooling)"
        )
    else:
        notes.append(
            f"equalized channels of {len(done)} Conv inputs ({depthwise} depthwise, "
            f"{len(done) - depthwise} other) of {len(found)} found; amax of {len(new)} scaled tensors "
            f"re-measured ({how.method}) on {ranges.samples} samples"
        )
    return prepared, {**amax, **new}, notes


class _ChannelRanges:
    """An observer (:func:`trtq.calib.collect.exposed.observe`): absolute max per channel (axis 1)."""

    def __init__(self, tensors: Sequence[str]):
        self.tensors = list(tensors)
        self.values: dict[str, np.ndarray] = {}
        self.samples = 0

    def add(self, values: Mapping[str, np.ndarray]) -> None:
        from trtq.calib.collect.accumulators import nonfinite_error

        if self.tensors:
            self.samples += len(values[self.tensors[0]])
        for name in self.tensors:
            a = values[name]
            m = np.abs(a).max(axis=tuple(i for i in range(a.ndim) if i != 1)).astype(np.float64)
            if not np.isfinite(m).all():
                raise nonfinite_error(name)
            old = self.values.get(name)
            self.values[name] = m if old is None else np.maximum(old, m)


class _Feed:
    """An observer handing each batch of ``tensors`` to ``update``."""

    def __init__(self, tensors: Sequence[str], update):
        self.tensors, self.update = list(tensors), update

    def add(self, values: Mapping[str, np.ndarray]) -> None:
        self.update({t: values[t] for t in self.tensors})


__all__ = [
    "FLOOR",
    "Equalization",
    "Remeasure",
    "apply_equalization",
    "channel_factors",
    "equalize_model",
    "find_equalizations",
]
