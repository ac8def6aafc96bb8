"""Weight rounding that minimises each layer's output error instead of each weight's own error.

Rounding every INT8 weight to its nearest level is optimal for the weight, not for what the layer
computes. A layer's output error on an input ``x`` is ``(Wq - W) x``; over the calibration data its
mean square is ``d H d^T`` per output channel, ``d`` the row of ``Wq - W`` and ``H = E[x x^T]`` the
second moment of the layer's input patches. When ``H`` has a dominant direction (a large common
level in the input, as after ReLU6), nearest rounding can leave a large error along it: filters
whose taps nearly cancel (edge detectors with a large gain after BatchNorm folding) then pass a
slice of the input's level through (on EfficientNet-Lite0 one depthwise convolution alone does most
of the damage: docs/decisions.md D22).

The solver keeps each channel's scale (the one the plan wrote: ``max|W| / 127``, raised for a
near-dead channel whose bias would not fit int32) and only chooses, per weight, the integer level:

1. GPTQ (Frantar et al., 2022): levels chosen column by column, each column's rounding error
   spread onto the columns not yet rounded through the Cholesky factor of ``H^-1``;
2. coordinate descent on ``d H d^T``: one level up or down where that lowers the error, until no
   step does (or a sweep limit);
3. per channel, the better of that and nearest rounding (so no channel gets worse on the data).

Every level stays in [-127, 127]. ``H`` comes from the FP32 model on calibration samples (inputs of
every target layer in one ONNX Runtime pass). Layers with fewer input samples than weights per
channel keep nearest rounding (``H`` would be singular and the choice would fit the samples).
"""

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx

from trtq import progress
from trtq.quantize.graph import GraphIndex, attr

QMAX = 127
# input patches per layer and sample that go into H (strided positions above that): per sample, so
# that H does not depend on how the samples are batched (4096 a batch of 8, as before)
ROWS_PER_SAMPLE = 512
DAMPING = 0.01  # GPTQ's damping: this fraction of H's mean diagonal added to its diagonal
SWEEPS = 4  # coordinate-descent sweeps at most


@dataclass
class Target:
    """One layer whose weight is DQ(Q(W)) with constant W and scale, in canonical form."""

    node: onnx.NodeProto
    source: str  # float input activation (behind its Q/DQ)
    weight: str  # initializer name of W (the QuantizeLinear input)
    kind: str  # "conv", "gemm" or "matmul"
    groups: int
    canon: np.ndarray  # W as [groups, rows, D] float64
    scale: np.ndarray  # [groups, rows] float64
    layout: tuple  # how to go back to W's own layout

    @property
    def depth(self) -> int:
        return self.canon.shape[2]


def _weight_pair(index: GraphIndex, tensor: str):
    """(QuantizeLinear node, W, scale) when ``tensor`` is DQ(Q(W)) of constants, else None."""
    q = index.quantized_constant(tensor)
    if q is None:
        return None
    if len(q.input) > 2 and q.input[2] and np.any(index.array(q.input[2]) != 0):
        return None  # asymmetric weights: not what trtq writes
    return q, index.array(q.input[0]).astype(np.float64), index.array(q.input[1]).astype(np.float64)


def _row_scale(q: onnx.NodeProto, w: np.ndarray, s: np.ndarray, axis: int) -> Optional[np.ndarray]:
    """Scale per output row (W's ``axis``), or None when the scale runs along another axis."""
    if s.size == 1:
        return np.full(w.shape[axis], float(s.reshape(-1)[0]))
    if s.ndim == 1 and attr(q, "axis", 1) % w.ndim == axis and s.shape[0] == w.shape[axis]:
        return s
    return None


def _target(index: GraphIndex, node: onnx.NodeProto) -> Optional[Target]:
    if len(node.input) < 2:
        return None
    pair = _weight_pair(index, node.input[1])
    if pair is None:
        return None
    q, w, s = pair
    source = index.float_source(node.input[0])
    if node.op_type == "Conv":
        if w.ndim != 4:
            return None  # 2-D convolutions only
        group = int(attr(node, "group", 1))
        rows = _row_scale(q, w, s, 0)
        cout = w.shape[0]
        if rows is None or cout % group:
            return None
        canon = w.reshape(group, cout // group, -1)
        return Target(node, source, q.input[0], "conv", group, canon, rows.reshape(group, -1), ("conv", w.shape))
    if node.op_type == "Gemm":
        if attr(node, "transA", 0) or w.ndim != 2:
            return None
        trans_b = int(attr(node, "transB", 0))
        out_axis = 0 if trans_b else 1
        rows = _row_scale(q, w, s, out_axis)
        if rows is None:
            return None
        canon = (w if trans_b else w.T)[None]
        return Target(node, source, q.input[0], "gemm", 1, canon, rows[None], ("gemm", trans_b))
    if node.op_type == "MatMul":
        if w.ndim != 2:
            return None
        rows = _row_scale(q, w, s, 1)
        if rows is None:
            return None
        return Target(node, source, q.input[0], "matmul", 1, w.T[None], rows[None], ("gemm", 0))
    return None


def find_targets(index: GraphIndex) -> list[Target]:
    """Conv/Gemm/MatMul nodes of a Q/DQ model whose weights the solver can round."""
    out = []
    seen = set()
    for node in index.nodes:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        t = _target(index, node)
        if t is not None and t.weight not in seen and index.fan_out(t.weight) == 1:
            seen.add(t.weight)
            out.append(t)
    return out


def to_layout(target: Target, canon: np.ndarray) -> np.ndarray:
    """``canon`` ([groups, rows, D]) back in the weight's own layout."""
    kind = target.layout[0]
    if kind == "conv":
        return canon.reshape(target.layout[1])
    trans_b = target.layout[1]
    return canon[0] if trans_b else canon[0].T


# ------------------------------------------------------------------------------------------------
# input second moments
# ------------------------------------------------------------------------------------------------


def _conv_pads(
    node: onnx.NodeProto,
    spatial: tuple[int, int],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
) -> list[int]:
    auto = attr(node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for i in range(2):
            out = math.ceil(spatial[i] / strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            pads[i], pads[i + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
        return pads
    if auto == "VALID":
        return [0, 0, 0, 0]
    return list(attr(node, "pads", [0, 0, 0, 0]))


def conv_gram(
    x: np.ndarray, node: onnx.NodeProto, group: int, kernel: tuple[int, int], max_rows: Optional[int] = None
) -> tuple[np.ndarray, int]:
    """``sum p p^T`` over the input patches ``p`` a 2-D Conv multiplies with its weight, per group
    ([group, D, D] float64, D = C/group*kh*kw, ordered like the weight), and the number of patches.
    Above ``max_rows`` output positions per batch (default :data:`ROWS_PER_SAMPLE` per sample),
    strided positions (both spatial axes) are used."""
    n, c, h, w = x.shape
    max_rows = ROWS_PER_SAMPLE * n if max_rows is None else max_rows
    strides = tuple(attr(node, "strides", [1, 1]))
    dil = tuple(attr(node, "dilations", [1, 1]))
    pads = _conv_pads(node, (h, w), kernel, strides, dil)
    if any(pads):
        x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out_h = (x.shape[2] - (kernel[0] - 1) * dil[0] - 1) // strides[0] + 1
    out_w = (x.shape[3] - (kernel[1] - 1) * dil[1] - 1) // strides[1] + 1
    if out_h < 1 or out_w < 1:
        return np.zeros((group, 0, 0)), 0
    step = max(1, math.ceil(math.sqrt(n * out_h * out_w / max_rows)))
    rows_h, rows_w = -(-out_h // step), -(-out_w // step)
    per, taps = c // group, kernel[0] * kernel[1]
    # one strided slice of the input per kernel tap, written straight into the matmul's layout
    # [group, taps, per, N, rows_h, rows_w] (one copy, not a second transposing one)
    a = np.empty((group, taps, per, n, rows_h, rows_w), dtype=np.float32)
    for ky in range(kernel[0]):
        for kx in range(kernel[1]):
            y0, x0 = ky * dil[0], kx * dil[1]
            tap = x[
                :,
                :,
                y0 : y0 + (out_h - 1) * strides[0] + 1 : strides[0] * step,
                x0 : x0 + (out_w - 1) * strides[1] + 1 : strides[1] * step,
            ]
            a[:, ky * kernel[1] + kx] = tap.reshape(n, group, per, rows_h, rows_w).transpose(1, 2, 0, 3, 4)
    rows = n * rows_h * rows_w
    # [group, taps * per, rows] in (tap, channel) order; the weight's order is (channel, tap)
    a = a.reshape(group, taps * per, rows)
    gram = np.matmul(a, a.transpose(0, 2, 1)).astype(np.float64)
    order = (np.arange(taps)[None, :] * per + np.arange(per)[:, None]).reshape(-1)  # (channel, tap) -> index
    return gram[:, order][:, :, order], rows


def _gram(target: Target, x: np.ndarray) -> tuple[np.ndarray, int]:
    """``sum x x^T`` over the input rows the target multiplies ([groups, D, D]) and the row count."""
    if target.kind == "conv":
        return conv_gram(x, target.node, target.groups, tuple(target.layout[1][2:]))
    rows = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    cap = ROWS_PER_SAMPLE * (x.shape[0] if x.ndim > 2 else len(rows))
    if len(rows) > cap:
        rows = rows[:: math.ceil(len(rows) / cap)]
    return (rows.T @ rows).astype(np.float64)[None], len(rows)


class SecondMoments:
    """Running ``sum x x^T`` and row count per target (float64)."""

    def __init__(self, targets: list[Target]):
        self.targets = targets
        self.tensors = sorted({t.source for t in targets})  # what :func:`trtq.calib.collect.exposed.observe` exposes
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: dict[str, np.ndarray]) -> None:
        for t in self.targets:
            x = values.get(t.source)
            if x is None:
                continue
            h, rows = _gram(t, np.asarray(x))
            if h.shape != (t.groups, t.depth, t.depth):
                continue
            key = t.weight
            self.sums[key] = self.sums[key] + h if key in self.sums else h
            self.counts[key] = self.counts.get(key, 0) + rows

    def moment(self, target: Target) -> Optional[np.ndarray]:
        n = self.counts.get(target.weight, 0)
        return self.sums[target.weight] / n if n else None


# ------------------------------------------------------------------------------------------------
# the solver
# ------------------------------------------------------------------------------------------------


def _error(delta: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Per-row ``d H d^T`` for delta [G, R, D] and H [G, D, D]."""
    return (np.matmul(delta, h) * delta).sum(axis=2)


def _gptq(w: np.ndarray, s: np.ndarray, h: np.ndarray) -> np.ndarray:
    g, _, d = w.shape
    diag = np.diagonal(h, axis1=1, axis2=2)
    dead = diag <= 0
    damped = h.copy()
    idx = np.arange(d)
    damped[:, idx, idx] += DAMPING * np.maximum(diag.mean(axis=1, keepdims=True), 1e-12) + dead
    try:
        u = np.linalg.cholesky(np.linalg.inv(damped)).transpose(0, 2, 1)  # upper: H^-1 = U^T U
    except np.linalg.LinAlgError:
        return np.clip(np.round(w / s[..., None]), -QMAX, QMAX)
    work = w.copy()
    levels = np.empty_like(w)
    for j in range(d):
        col = work[:, :, j]
        q = np.clip(np.round(col / s), -QMAX, QMAX)
        levels[:, :, j] = q
        err = (col - q * s) / u[:, j, j][:, None]
        work[:, :, j + 1 :] -= err[:, :, None] * u[:, None, j, j + 1 :]
    return levels


def _descend(levels: np.ndarray, w: np.ndarray, s: np.ndarray, h: np.ndarray, sweeps: int) -> np.ndarray:
    """Single-level moves that lower ``d H d^T``, column by column, until none does."""
    levels = levels.copy()
    delta = levels * s[..., None] - w
    dh = np.matmul(delta, h)  # [G, R, D]: (d H) per row, kept up to date
    d = w.shape[2]
    for _ in range(sweeps):
        moved = False
        for j in range(d):
            hjj = h[:, j, j][:, None]
            for step in (1.0, -1.0):
                change = s * step
                gain = 2.0 * change * dh[:, :, j] + change * change * hjj
                ok = (gain < -1e-9 * hjj * s * s) & (np.abs(levels[:, :, j] + step) <= QMAX)
                gi, ri = np.nonzero(ok)
                if len(gi):
                    moved = True
                    by = change[gi, ri]
                    levels[gi, ri, j] += step
                    delta[gi, ri, j] += by
                    dh[gi, ri] += by[:, None] * h[gi, j, :]
        if not moved:
            break
    return levels


def solve(
    w: np.ndarray, s: np.ndarray, h: np.ndarray, sweeps: int = SWEEPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Integer levels for W [G, R, D] with row scales s [G, R] under H [G, D, D].

    Returns (levels, error of nearest rounding, error of the result), errors per row as ``d H d^T``.
    """
    s = np.where(s > 0, s, 1.0)
    nearest = np.clip(np.round(w / s[..., None]), -QMAX, QMAX)
    levels = _descend(_gptq(w, s, h), w, s, h, sweeps)
    e_near = _error(nearest * s[..., None] - w, h)
    e_new = _error(levels * s[..., None] - w, h)
    worse = e_new >= e_near
    levels[worse] = nearest[worse]
    return levels, e_near, np.where(worse, e_near, e_new)


@dataclass
class RoundingReport:
    layers: int  # layers whose levels were optimised
    skipped: list[tuple[str, str]]  # (node, reason)
    error_ratio: float  # sum of output errors after / with nearest rounding, all layers


def rounding_targets(qdq: onnx.ModelProto, available: Collection[str]) -> list[Target]:
    """The targets of ``qdq`` whose float input is among ``available`` (the FP32 model's tensors)."""
    return [t for t in find_targets(GraphIndex(qdq)) if t.source in available]


def round_weights(moments: SecondMoments) -> tuple[dict[str, np.ndarray], RoundingReport]:
    """Rounded weights (W's initializer name -> float array of exact levels x scale) for every
    target of ``moments``, once it has seen the data (see :func:`trtq.calib.collect.exposed.observe`).

    Nothing is written: :func:`apply_rounding` puts the arrays into the model.
    """
    out: dict[str, np.ndarray] = {}
    skipped: list[tuple[str, str]] = []
    before = after = 0.0
    with progress.task("gptq rounding: solving layers", len(moments.targets)) as shown:
        for t in moments.targets:
            h = moments.moment(t)
            name = t.node.name or t.node.output[0]
            if h is None:
                skipped.append((name, "no input samples"))
            elif moments.counts[t.weight] < 2 * t.depth:
                skipped.append((name, f"{moments.counts[t.weight]} input samples for {t.depth} weights per channel"))
            else:
                levels, e_near, e_new = solve(t.canon, t.scale, h)
                before += float(e_near.sum())
                after += float(e_new.sum())
                out[t.weight] = to_layout(t, levels * t.scale[..., None]).astype(np.float32)
            shown.advance(note=name)
    return out, RoundingReport(len(out), skipped, after / before if before > 0 else 1.0)


def apply_rounding(qdq: onnx.ModelProto, rounded: dict[str, np.ndarray]) -> None:
    """Replace the weight initializers named in ``rounded`` (in place)."""
    from onnx import numpy_helper

    for init in qdq.graph.initializer:
        if init.name in rounded:
            dtype = numpy_helper.to_array(init).dtype
            init.CopyFrom(numpy_helper.from_array(rounded[init.name].astype(dtype), init.name))
