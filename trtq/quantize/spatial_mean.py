"""Write a spatial ``ReduceMean`` as the ``GlobalAveragePool`` it is (a step of ``prepare_model``).

torch's dynamo exporter writes ``x.mean((2, 3), keepdim=True)`` and
``adaptive_avg_pool2d(x, 1)`` as ``ReduceMean(axes=[-1, -2])``; the TorchScript exporter writes the
same model with ``GlobalAveragePool``. TensorRT 8.6 reads the first as a reduce layer, which it runs
in float between INT8 layers (the head conv then writes FP32 and a reformat follows), and the
second as a pooling layer, which takes INT8 in and out. On EfficientNet-Lite0 that was the only
difference between the two exports' explicit engines (docs/decisions.md D35).

A ``ReduceMean`` of a 4-D tensor over exactly its two spatial axes (2 and 3, negative or not, in
the attribute or, from opset 18, a constant ``axes`` input) becomes ``GlobalAveragePool`` with the
node's name and output; with ``keepdims=0`` a ``Squeeze`` of those axes follows and takes the
output's name. Both compute the same mean, so every tensor keeps its name and meaning and a
calibration cache of the original model still applies. Other ranks are left alone (a 3-D
``[N, T, D]`` mean over its last axis is a LayerNorm's, not a pooling).
"""

from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtq.quantize.graph import attr, tensor_types
from trtq.quantize.rewrite import Namer, taken_names

SPATIAL = frozenset({2, 3})


def spatial_means_to_pools(model: onnx.ModelProto, notes: Optional[list] = None) -> int:
    """Rewrite ``model``'s spatial ReduceMeans in place; the number rewritten (a note if any)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    # axes alone rule out most means (a LayerNorm's one axis) before shape inference is paid for
    candidates = {n.name for n in graph.node if _spatial_axes(n, inits)}
    if not candidates:
        return 0
    _, shapes = tensor_types(model)
    namer = Namer(taken_names(graph))
    nodes, done = [], 0
    for node in graph.node:
        shape = shapes.get(node.input[0]) if node.name in candidates else None
        if shape is not None and len(shape) == 4:
            nodes.extend(_as_pool(node, namer, graph))
            done += 1
        else:
            nodes.append(node)
    if done:
        del graph.node[:]
        graph.node.extend(nodes)
        if notes is not None:
            notes.append(f"wrote {done} spatial ReduceMean node(s) as GlobalAveragePool (TensorRT pools INT8)")
    return done


def _spatial_axes(node: onnx.NodeProto, inits: dict) -> bool:
    """A default-domain ReduceMean whose constant axes are 2 and 3 of a 4-D tensor (its rank is
    checked by the caller): [2, 3], [-1, -2] or a mix, in the attribute or the opset-18 input."""
    if node.op_type != "ReduceMean" or node.domain not in ("", "ai.onnx"):
        return False
    if len(node.input) > 1 and node.input[1]:
        init = inits.get(node.input[1])
        axes = None if init is None else [int(a) for a in numpy_helper.to_array(init).reshape(-1)]
    else:
        axes = attr(node, "axes")
    return axes is not None and len(axes) == 2 and {int(a) % 4 for a in axes} == SPATIAL


def _as_pool(node: onnx.NodeProto, namer: Namer, graph: onnx.GraphProto) -> list:
    output = node.output[0]
    if attr(node, "keepdims", 1):
        return [helper.make_node("GlobalAveragePool", [node.input[0]], [output], name=node.name)]
    pooled = namer(f"{output}_pooled")
    pool = helper.make_node("GlobalAveragePool", [node.input[0]], [pooled], name=node.name)
    axes = namer(f"{node.name}_squeeze_axes")  # opset >= 13 here (prepare_model upgrades first)
    graph.initializer.append(numpy_helper.from_array(np.array([2, 3], np.int64), axes))
    return [pool, helper.make_node("Squeeze", [pooled, axes], [output], name=namer(f"{node.name}_squeeze"))]
