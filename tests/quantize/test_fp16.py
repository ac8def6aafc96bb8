"""fp16=True: the float rest in float16, Q/DQ and graph I/O in float32, runnable in ONNX Runtime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

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
from trtq.quantize.fp16 import FP16_MAX


def _types(model):
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


def _block(rng, var=None):
    c = 16
    bn_inits = [
        init("s", np.ones(c, np.float32)),
        init("b", np.zeros(c, np.float32)),
        init("m", np.zeros(c, np.float32)),
        init("v", np.full(c, 1.0 if var is None else var, np.float32)),
    ]
    return make_model(
        [
            conv("c1", "x", "w1", "h", bias="b1"),
            helper.make_node("BatchNormalization", ["h", "s", "b", "m", "v"], ["bn"], name="bn"),
            helper.make_node("Sigmoid", ["bn"], ["sg"], name="sig"),
            helper.make_node("Mul", ["bn", "sg"], ["act"], name="silu"),
            conv("c2", "act", "w2", "y"),
            helper.make_node("Softmax", ["y"], ["p"], name="softmax", axis=1),
        ],
        [value("x", ["N", 16, 6, 6])],
        [value("p", None), value("act", None)],
        [
            init("w1", conv_weight(rng, 16, 16)),
            init("b1", np.zeros(16, np.float32)),
            init("w2", conv_weight(rng, 16, 16)),
        ]
        + bn_inits,
    )


def test_fp16_rest_keeps_qdq_and_io_in_float32_and_runs():
    model = _block(np.random.default_rng(0))
    amax = activation_amax(model, [random_feeds(model)])
    q32 = quantize_model(model, amax, QuantizeOptions()).model
    result = quantize_model(model, amax, QuantizeOptions(fp16=True))
    q16 = result.model
    onnx.checker.check_model(q16, full_check=True)
    types = _types(q16)
    # graph I/O keep float32 and their names
    assert [(v.name, v.type.tensor_type.elem_type) for v in q16.graph.input] == [("x", TensorProto.FLOAT)]
    assert [(v.name, v.type.tensor_type.elem_type) for v in q16.graph.output] == [
        ("p", TensorProto.FLOAT),
        ("act", TensorProto.FLOAT),
    ]
    # Q/DQ pairs stay float32 around int8; weights behind QuantizeLinear stay float32
    for qn in nodes_of(q16, "QuantizeLinear"):
        assert types[qn.input[0]] == TensorProto.FLOAT and types[qn.input[1]] == TensorProto.FLOAT
    for dq in nodes_of(q16, "DequantizeLinear"):
        assert types[dq.output[0]] == TensorProto.FLOAT
    assert types["w1"] == TensorProto.FLOAT
    # the float rest is float16: Conv, BN, Sigmoid/Mul, Softmax and the bias
    for name in ("c1", "bn", "sig", "silu", "c2", "softmax"):
        n = next(x for x in q16.graph.node if x.name == name)
        assert types[n.output[0]] == TensorProto.FLOAT16, name
    assert types["b1"] == TensorProto.FLOAT16 and types["v"] == TensorProto.FLOAT16
    # "act" is an output and feeds c2: float16 inside, cast back under its own name
    assert any(n.op_type == "Cast" and n.output[0] == "act" for n in q16.graph.node)
    feeds = random_feeds(model, batch=3)
    ref = run(q32, feeds)
    got = run(q16, feeds)
    assert got[0].dtype == np.float32 and got[0].shape == (3, 16, 6, 6)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, atol=2e-2)


def test_fp16_keeps_nodes_that_would_overflow_in_float32():
    """A BatchNorm with variance beyond 65504 (large activations) must not be cast."""
    model = _block(np.random.default_rng(1), var=4 * FP16_MAX)
    amax = activation_amax(model, [random_feeds(model)])
    q16 = quantize_model(model, amax, QuantizeOptions(fp16=True)).model
    types = _types(q16)
    assert types["bn"] == TensorProto.FLOAT and types["v"] == TensorProto.FLOAT
    assert types["sg"] == TensorProto.FLOAT16
    huge = dict(amax, act=FP16_MAX)  # an activation near the float16 limit
    q16b = quantize_model(model, huge, QuantizeOptions(fp16=True)).model
    assert _types(q16b)["act"] == TensorProto.FLOAT
    feeds = random_feeds(model)
    ref = run(quantize_model(model, amax, QuantizeOptions()).model, feeds)[0]
    np.testing.assert_allclose(run(q16, feeds)[0], ref, atol=2e-2)


@pytest.mark.parametrize("opset", [13, 17])
def test_fp16_resize_keeps_its_float32_scales_input(opset):
    rng = np.random.default_rng(2)
    model = make_model(
        [
            conv("c", "x", "w", "h"),
            helper.make_node("Resize", ["h", "", "scales"], ["up"], name="resize", mode="nearest"),
            conv("c2", "up", "w2", "y"),
        ],
        [value("x", [1, 16, 4, 4])],
        [value("y", None)],
        [
            init("w", conv_weight(rng, 16, 16)),
            init("w2", conv_weight(rng, 16, 16)),
            init("scales", np.array([1, 1, 2, 2], np.float32)),
        ],
        opset=opset,
    )
    amax = activation_amax(model, [random_feeds(model)])
    q16 = quantize_model(model, amax, QuantizeOptions(fp16=True)).model
    onnx.checker.check_model(q16, full_check=True)
    types = _types(q16)
    assert types["scales"] == TensorProto.FLOAT and types["up"] == TensorProto.FLOAT16
    ref = run(quantize_model(model, amax, QuantizeOptions()).model, random_feeds(model))[0]
    np.testing.assert_allclose(run(q16, random_feeds(model))[0], ref, atol=2e-2)
