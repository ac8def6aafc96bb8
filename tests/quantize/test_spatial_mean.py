"""A spatial ReduceMean (torch dynamo's global pooling) is written as GlobalAveragePool before
placement, so the explicit engine pools in INT8 as it does for the TorchScript export."""

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import (
    activation_amax,
    conv,
    conv_weight,
    init,
    make_model,
    nodes_of,
    random_feeds,
    run,
    value,
)
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.prepare import prepare_model


def head(axes, keepdims, opset=17, axes_input=False):
    """Conv -> Relu -> ReduceMean(axes) -> a 1x1 Conv (keepdims) or a Gemm, as exporters write a
    squeeze-excite branch or a classifier head."""
    rng = np.random.default_rng(3)
    mean_inputs, mean_attrs = ["r"], {"keepdims": keepdims}
    inits = [init("w", conv_weight(rng, 32, 32)), init("w2", conv_weight(rng, 16, 32, k=1))]  # enough channels for INT8
    inits.append(init("fc", rng.standard_normal((4, 32)).astype(np.float32)))
    if axes_input:
        mean_inputs.append("axes")
        inits.append(init("axes", np.array(axes, np.int64)))
    else:
        mean_attrs["axes"] = axes
    last = conv("c2", "m", "w2", "y", k=1) if keepdims else helper.make_node("Gemm", ["m", "fc"], ["y"], transB=1)
    nodes = [
        conv("c", "x", "w", "h"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("ReduceMean", mean_inputs, ["m"], name="mean", **mean_attrs),
        last,
    ]
    return make_model(nodes, [value("x", [2, 32, 5, 6])], [value("y", None)], inits, opset=opset)


def other_mean(axes, shape):
    """A ReduceMean that is not a global pooling: over channels, one axis, the batch, or a
    LayerNorm's last axis of a [N, T, D] tensor."""
    node = helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=axes, keepdims=1)
    return make_model([node], [value("x", shape)], [value("m", None)], opset=17)


@pytest.mark.parametrize(
    "axes, keepdims, opset, axes_input",
    [([-1, -2], 1, 17, False), ([2, 3], 0, 17, False), ([3, 2], 1, 18, True), ([-2, -1], 0, 18, True)],
)
def test_spatial_mean_becomes_global_average_pool_with_the_same_output(axes, keepdims, opset, axes_input):
    model = head(axes, keepdims, opset=opset, axes_input=axes_input)
    prepared, notes = prepare_model(model)
    onnx.checker.check_model(prepared, full_check=True)
    (pool,) = nodes_of(prepared, "GlobalAveragePool")
    assert not nodes_of(prepared, "ReduceMean")
    assert pool.name == "mean" and pool.input[0] == "r"
    if keepdims:
        assert pool.output[0] == "m" and not nodes_of(prepared, "Squeeze")
    else:  # the Squeeze takes the name, so the cache's "m" still means the pooled vector
        (squeeze,) = nodes_of(prepared, "Squeeze")
        assert squeeze.input[0] == pool.output[0] and squeeze.output[0] == "m"
    assert any("GlobalAveragePool" in n for n in notes)
    feeds = random_feeds(model)
    np.testing.assert_allclose(run(prepared, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "axes, shape",
    [
        ([1, 2, 3], [2, 8, 5, 6]),
        ([3], [2, 8, 5, 6]),
        ([0, 2], [2, 8, 5, 6]),
        ([-1], [2, 5, 8]),
        ([2, 3], [2, 8, 5, 6, 2]),
    ],
)
def test_other_means_are_left_alone(axes, shape):
    model = other_mean(axes, shape)
    prepared, notes = prepare_model(model)
    assert [n.name for n in nodes_of(prepared, "ReduceMean")] == ["mean"]
    assert not nodes_of(prepared, "GlobalAveragePool")
    assert not any("GlobalAveragePool" in n for n in notes)


def test_the_pool_reads_the_quantized_tensor_in_the_shared_placement():
    """What TensorRT needs to run the conv's output and the pooling INT8: a Q/DQ pair on the pool's input."""
    model = head([-1, -2], 1)
    amax = activation_amax(model, [random_feeds(model)])
    result = quantize_model(model, amax, QuantizeOptions(placement="shared"))
    q = result.model
    (pool,) = nodes_of(q, "GlobalAveragePool")
    producer = {o: n for n in q.graph.node for o in n.output}
    assert producer[pool.input[0]].op_type == "DequantizeLinear"
    assert producer[producer[pool.input[0]].input[0]].input[0] == "r"
    feeds = random_feeds(model)
    ref, out = run(model, feeds)[0], run(q, feeds)[0]
    assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max()
