"""Statistics of zero-padded tensors, taken from the tensor they pad instead of measured.

A ``Pad`` node in constant mode with value 0 (constant pads, none on the batch axis) outputs its
input plus zeros. When both tensors are calibrated, measuring the output costs far more than its
counting: ONNX Runtime folds such a Pad into the Conv that reads it unless something else reads the
padded tensor, and the Pad run on its own, with the layout copies around it, took a third of
EfficientNet-Lite0's calibration run (docs/decisions.md D18). So the output is
not run through the collector: its max and signed extremes are the input's with 0 included, its
histogram the input's plus the padding zeros in bin 0, sampled at the rate the input was:
``ceil(P / k)`` zeros per sample, ``P`` the zeros one sample gains and ``k`` the input's per-sample
stride (1 where every element is counted; the statistics are then exactly those of measuring the
output, and so is the cache).
"""

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PadLink:
    source: str  # the tensor the Pad reads
    zeros_per_sample: int  # padding elements one sample of the output holds


def _opset(model) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _padding(node, values: Mapping[str, np.ndarray], opset: int, rank: int) -> Optional[list[int]]:
    """The node's pads as [begin_0 .. begin_r-1, end_0 .. end_r-1] when it pads with constant zeros
    known before the run; else None."""
    attrs = {a.name: a for a in node.attribute}
    mode = attrs["mode"].s.decode() if "mode" in attrs else "constant"
    if mode != "constant":
        return None
    if opset < 11:
        pads = list(attrs["pads"].ints) if "pads" in attrs else None
        value = attrs["value"].f if "value" in attrs else 0.0
    else:
        pads = values.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        pads = None if pads is None else [int(p) for p in np.asarray(pads).reshape(-1)]
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            v = values.get(node.input[2])
            if v is None or v.size != 1:
                return None
            value = float(np.asarray(v).reshape(()))
        if len(node.input) > 3 and node.input[3] and pads is not None:  # opset 18: pads of these axes
            axes = values.get(node.input[3])
            if axes is None or len(pads) != 2 * axes.size:
                return None
            full = [0] * (2 * rank)
            for i, axis in enumerate(int(a) % rank for a in np.asarray(axes).reshape(-1)):
                full[axis], full[rank + axis] = pads[i], pads[axes.size + i]
            pads = full
    if pads is None or len(pads) != 2 * rank or value != 0.0 or min(pads) < 0:
        return None
    return pads


def pad_links(model, tensors: Iterable[str], input_shapes: Mapping[str, Sequence[int]]) -> dict[str, PadLink]:
    """Calibrated outputs of zero-padding Pads whose input is calibrated too, in graph order (a Pad
    of a padded tensor after it), with the zeros a sample gains: from the shapes ONNX shape
    inference gives the input at ``input_shapes`` (the batches' shapes). A Pad whose input shape is
    not known there, or that pads the batch axis, is left out (its output is measured)."""
    from trtq.calib.collect.derive import _constants

    wanted = set(tensors)
    candidates = [
        n
        for n in model.graph.node
        if n.op_type == "Pad"
        and len(n.input) >= 1
        and n.output
        and n.input[0] in wanted
        and n.output[0] in wanted
        and n.input[0] != n.output[0]
    ]
    if not candidates:
        return {}
    from trtq.model import infer_shapes

    try:
        inferred = infer_shapes(model, input_shapes=input_shapes)
    except Exception as e:  # the outputs are measured instead
        log.debug("shape inference failed (%s): padded tensors measured", e)
        return {}
    g = inferred.graph
    dims: dict[str, list[int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    needed = {name for n in candidates for name in n.input[1:] if name}
    values, opset = _constants(model.graph, needed), _opset(model)
    links: dict[str, PadLink] = {}
    for node in candidates:
        shape = dims.get(node.input[0])
        if not shape or min(shape) <= 0:
            continue
        rank = len(shape)
        pads = _padding(node, values, opset, rank)
        if pads is None or pads[0] or pads[rank]:  # the batch axis keeps its rows
            continue
        inner = shape[1:]
        padded = [d + pads[i + 1] + pads[rank + i + 1] for i, d in enumerate(inner)]
        links[node.output[0]] = PadLink(node.input[0], math.prod(padded) - math.prod(inner))
    return links


def derive_pow2(
    links: Mapping[str, PadLink], maxima: dict, counts: dict, zeros: dict, exponents: dict, strides: dict, samples: int
) -> None:
    """One-pass statistics (trtq.calib.collect.one_pass.Pow2Histograms' dicts, updated in place) of every
    linked output from its source's: same max and range, the padding zeros added to bin 0 at the
    source's per-sample stride, which the output is then recorded with too."""
    for name, link in links.items():  # graph order: a source that is padded itself comes first
        src, k = link.source, int(strides.get(link.source, 1))
        if src in strides:
            strides[name] = k
        extra = int(samples) * -(-link.zeros_per_sample // k)
        maxima[name], exponents[name] = maxima[src], exponents[src]
        counts[name] = counts[src].copy()
        counts[name][0] += extra
        zeros[name] = zeros[src] + extra


def derive_counts(links: Mapping[str, PadLink], counts: dict, zeros: dict, samples: int) -> None:
    """Two-pass histograms over ``[0, max]`` (every element counted; the output's max is the
    source's): the source's counts plus every padding zero in bin 0. Updated in place."""
    for name, link in links.items():
        extra = int(samples) * link.zeros_per_sample
        counts[name] = np.array(counts[link.source], dtype=np.int64)
        counts[name][0] += extra
        zeros[name] = int(zeros[link.source]) + extra
