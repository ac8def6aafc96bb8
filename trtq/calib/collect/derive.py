"""Ranges that follow exactly from another tensor's range, so the max pass need not measure them.

``Relu`` and ``Clip`` with constant bounds are monotone and exact in floating point: the smallest
and largest values of ``clip(x)`` are ``clip(min x)`` and ``clip(max x)``. So when the input of such
a node is calibrated too, the node's ``max|y|`` comes from the input's extremes without ONNX Runtime
writing ``y`` out or numpy reading it (in ReLU6 networks that is every other tensor).
"""

import math
from collections.abc import Iterable, Mapping
from typing import Optional

import numpy as np

# output tensor -> (input tensor, lower bound, upper bound)
Links = dict[str, tuple[str, float, float]]


def _constants(graph, only: Optional[set] = None) -> dict[str, np.ndarray]:
    """Initializers and Constant outputs as arrays (``only``: just these names, not every weight)."""
    from onnx import numpy_helper

    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer if only is None or i.name in only}
    for node in graph.node:
        if node.op_type == "Constant" and node.output and (only is None or node.output[0] in only):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _scalar(values: Mapping[str, np.ndarray], name: str) -> Optional[float]:
    v = values.get(name)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


def _bounds(node, values) -> Optional[tuple[float, float]]:
    if node.op_type == "Relu":
        return 0.0, math.inf
    if node.op_type != "Clip":
        return None
    lo, hi = -math.inf, math.inf
    attrs = {a.name: a.f for a in node.attribute}
    if "min" in attrs or "max" in attrs:  # opset < 11
        lo, hi = attrs.get("min", lo), attrs.get("max", hi)
    if len(node.input) > 1 and node.input[1]:
        lo = _scalar(values, node.input[1])
    if len(node.input) > 2 and node.input[2]:
        hi = _scalar(values, node.input[2])
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi) or lo > hi:
        return None  # bound computed at run time, or odd: measure the tensor instead
    return lo, hi


def monotone_links(model, tensors: Iterable[str]) -> Links:
    """Calibrated outputs of Relu / constant-bound Clip nodes whose input is calibrated too."""
    wanted = set(tensors)
    bounds_from = {name for n in model.graph.node if n.op_type == "Clip" for name in n.input[1:] if name}
    values = _constants(model.graph, bounds_from)
    links: Links = {}
    for node in model.graph.node:
        if not node.input or not node.output or node.input[0] not in wanted or node.output[0] not in wanted:
            continue
        bounds = _bounds(node, values)
        if bounds is not None:
            links[node.output[0]] = (node.input[0], bounds[0], bounds[1])
    return links


def derive_extremes(
    extremes: Mapping[str, tuple[float, float]], links: Links, padded: Optional[Mapping[str, str]] = None
) -> dict[str, tuple[float, float]]:
    """``(min, max)`` of every linked output from its input's, and of every zero-padded output
    (``padded``: output -> input, trtq.calib.collect.padded) from its input's with 0 included; chains such
    as Relu -> Pad -> Clip resolve in any order."""
    out = dict(extremes)
    pending = dict(links)
    pending.update({name: (src, None, None) for name, src in (padded or {}).items()})
    while pending:
        progressed = False
        for name, (src, lo, hi) in list(pending.items()):
            if src in out:
                a, b = out[src]
                if lo is None:  # zeros added
                    out[name] = (min(a, 0.0), max(b, 0.0))
                else:
                    out[name] = (min(max(a, lo), hi), min(max(b, lo), hi))
                del pending[name]
                progressed = True
        if not progressed:
            missing = ", ".join(sorted(pending)[:3])
            raise ValueError(f"no range for the inputs of: {missing}")
    return out


def abs_max(extremes: tuple[float, float]) -> float:
    lo, hi = extremes
    return max(abs(lo), abs(hi))
