"""quantize_model's contract: errors, reports, options, names, exact Q/DQ arithmetic."""

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import (
    activation_amax,
    conv,
    conv_weight,
    init,
    initializer,
    make_model,
    nodes_of,
    random_feeds,
    run,
    value,
)
from trtq.config import QuantizeOptions
from trtq.errors import CacheError, ConfigError, ModelError, UsageError
from trtq.quantize import is_quantized, quantize_model


@pytest.fixture
def two_convs():
    """x -> c1 -> relu -> c2 -> y, plus a MatMul head on the relu output."""
    rng = np.random.default_rng(0)
    return make_model(
        [
            conv("c1", "x", "w1", "h", bias="b1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            conv("c2", "r", "w2", "y"),
            helper.make_node("Flatten", ["r"], ["f"], name="flat"),
            helper.make_node("MatMul", ["f", "wm"], ["z"], name="head"),
        ],
        [value("x", [2, 16, 4, 4])],
        [value("y", None), value("z", None)],
        [
            init("w1", conv_weight(rng, 16, 16)),
            init("b1", rng.standard_normal(16).astype(np.float32)),
            init("w2", conv_weight(rng, 16, 16)),
            init("wm", rng.standard_normal((256, 32)).astype(np.float32)),
        ],
    )


@pytest.fixture
def amax(two_convs):
    return activation_amax(two_convs, [random_feeds(two_convs)])


def test_golden_names_and_order(two_convs, amax):
    q = quantize_model(two_convs, amax, QuantizeOptions()).model
    assert [n.name for n in q.graph.node] == [
        "x_QuantizeLinear",
        "x_DequantizeLinear",
        "w1_QuantizeLinear",
        "w1_DequantizeLinear",
        "c1",
        "relu",
        "r_QuantizeLinear",
        "r_DequantizeLinear",
        "w2_QuantizeLinear",
        "w2_DequantizeLinear",
        "c2",
        "flat",
        "f_QuantizeLinear",
        "f_DequantizeLinear",
        "wm_QuantizeLinear",
        "wm_DequantizeLinear",
        "head",
    ]
    added = sorted(i.name for i in q.graph.initializer if i.name.endswith(("_scale", "_zero_point")))
    assert added == sorted(f"{t}_{k}" for t in ("x", "w1", "r", "w2", "f", "wm") for k in ("scale", "zero_point"))
    dq = next(n for n in q.graph.node if n.name == "r_DequantizeLinear")
    assert list(dq.input) == ["r_QuantizeLinear_Output", "r_scale", "r_zero_point"]
    assert list(dq.output) == ["r_DequantizeLinear_Output"]


def test_output_is_deterministic_and_input_not_mutated(two_convs, amax):
    before = two_convs.SerializeToString()
    first = quantize_model(two_convs, amax, QuantizeOptions()).model.SerializeToString()
    second = quantize_model(two_convs, dict(reversed(list(amax.items()))), QuantizeOptions()).model
    assert first == second.SerializeToString()
    assert two_convs.SerializeToString() == before


def test_names_that_exist_already_get_a_suffix():
    rng = np.random.default_rng(1)
    model = make_model(
        [helper.make_node("Relu", ["x"], ["x_scale"], name="x_QuantizeLinear"), conv("c", "x", "w", "y")],
        [value("x", [1, 16, 4, 4])],
        [value("y", None), value("x_scale", None)],
        [init("w", conv_weight(rng, 16, 16))],
    )
    q = quantize_model(model, {"x": 2.0}, QuantizeOptions()).model
    onnx.checker.check_model(q, full_check=True)
    names = [n.name for n in q.graph.node]
    assert "x_QuantizeLinear_1" in names and len(set(names)) == len(names)
    assert float(initializer(q, "x_scale_1")) == pytest.approx(2.0 / 127)


def test_qdq_arithmetic_matches_a_numpy_fake_quant_reference(two_convs, amax):
    """The quantized model equals the FP32 model fed fake-quantized x and weights (c1 only)."""
    q = quantize_model(two_convs, amax, QuantizeOptions(), only_nodes=["c1"]).model
    feeds = random_feeds(two_convs, seed=5)
    x = feeds["x"]
    sx = amax["x"] / 127.0
    xq = np.clip(np.round(x / np.float32(sx)), -128, 127) * np.float32(sx)
    w = initializer(two_convs, "w1")
    sw = np.abs(w).reshape(16, -1).max(axis=1) / 127.0
    wq = np.clip(np.round(w / sw[:, None, None, None]), -128, 127) * sw[:, None, None, None]
    reference = onnx.ModelProto()
    reference.CopyFrom(two_convs)
    for t in reference.graph.initializer:
        if t.name == "w1":
            t.CopyFrom(onnx.numpy_helper.from_array(wq.astype(np.float32), "w1"))
    expected = run(reference, {"x": xq.astype(np.float32)})
    got = run(q, feeds)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
    assert not np.allclose(run(two_convs, feeds)[0], got[0], atol=1e-4)  # quantization did something


def test_report_lists_quantized_float_and_missing(two_convs, amax):
    partial = {k: v for k, v in amax.items() if k != "r"}
    result = quantize_model(two_convs, partial, QuantizeOptions(exclude=("MatMul",)))
    assert result.quantized == ["c1"]
    assert result.missing_amax == ["r"]
    assert dict(result.left_float) == {
        "c2": "no amax in the cache for r",
        "head": "excluded by --exclude MatMul",
    }
    data = json.loads(json.dumps(result.to_dict()))
    assert data["quantized"] == ["c1"] and data["missing_amax"] == ["r"]
    assert {"node": "head", "reason": "excluded by --exclude MatMul"} in data["left_float"]
    assert data["qdq_pairs"] == 2 and data["opset"] == 13
    # the one quantized activation (c1's input x) with the range its pair applies: 127 x the float32 scale
    assert list(data["activations"]) == ["x"]
    assert data["activations"]["x"] == pytest.approx(partial["x"], rel=1e-6)


def test_exclude_by_regex_and_only_nodes(two_convs, amax):
    by_regex = quantize_model(two_convs, amax, QuantizeOptions(exclude=("^c[0-9]$",)))
    assert by_regex.quantized == ["head"]
    assert ("c1", "excluded by --exclude ^c[0-9]$") in by_regex.left_float
    only = quantize_model(two_convs, amax, QuantizeOptions(), only_nodes=["c2"])
    assert only.quantized == ["c2"]
    assert ("c1", "not selected (only_nodes)") in only.left_float
    assert [n.input[0] for n in nodes_of(only.model, "QuantizeLinear")] == ["r", "w2"]
    with pytest.raises(UsageError, match="only_nodes names 1 node"):
        quantize_model(two_convs, amax, QuantizeOptions(), only_nodes=["nope"])
    with pytest.raises(ConfigError, match="not a valid regular expression|neither an op type"):
        quantize_model(two_convs, amax, QuantizeOptions(exclude=("conv(",)))


def test_already_quantized_model_is_rejected(two_convs, amax):
    q = quantize_model(two_convs, amax, QuantizeOptions()).model
    assert is_quantized(q) and not is_quantized(two_convs)
    with pytest.raises(ModelError) as e:
        quantize_model(q, amax, QuantizeOptions())
    assert str(e.value).startswith("model already has Q/DQ nodes; quantize the FP32 model, or build this one as it is")
    assert e.value.exit_code == 3


def test_foreign_cache_is_rejected(two_convs):
    with pytest.raises(CacheError) as e:
        quantize_model(two_convs, {"conv_99.out": 1.0, "other": 2.0, "third": 0.5}, QuantizeOptions())
    assert str(e.value).startswith("cache does not belong to this model: none of its 3 tensors are in the model")
    with pytest.raises(CacheError, match="none of its 0 tensors"):
        quantize_model(two_convs, {}, QuantizeOptions())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_invalid_amax_values_are_rejected(two_convs, bad):
    with pytest.raises(CacheError, match="amax for tensor 'x'"):
        quantize_model(two_convs, {"x": bad, "r": 1.0}, QuantizeOptions())


def test_zero_amax_gives_a_positive_scale(two_convs, amax):
    q = quantize_model(two_convs, dict(amax, r=0.0), QuantizeOptions()).model
    assert float(initializer(q, "r_scale")) > 0
    onnx.checker.check_model(q, full_check=True)


def test_several_inputs_and_dynamic_batch():
    rng = np.random.default_rng(2)
    model = make_model(
        [
            conv("ca", "a", "wa", "ha"),
            conv("cb", "b", "wb", "hb"),
            helper.make_node("Concat", ["ha", "hb"], ["cat"], name="cat", axis=1),
            conv("cc", "cat", "wc", "y"),
        ],
        [value("a", ["N", 16, 5, 5]), value("b", ["N", 16, 5, 5])],
        [value("y", None)],
        [
            init("wa", conv_weight(rng, 16, 16)),
            init("wb", conv_weight(rng, 16, 16)),
            init("wc", conv_weight(rng, 16, 32)),
        ],
    )
    amax = activation_amax(model, [random_feeds(model, batch=2)])
    result = quantize_model(model, amax, QuantizeOptions())
    onnx.checker.check_model(result.model, full_check=True)
    assert result.quantized == ["ca", "cb", "cc"]
    for batch in (1, 4):
        feeds = random_feeds(model, seed=batch, batch=batch)
        ref, got = run(model, feeds)[0], run(result.model, feeds)[0]
        assert got.shape == (batch, 16, 5, 5)
        assert np.corrcoef(ref.ravel(), got.ravel())[0, 1] > 0.99
