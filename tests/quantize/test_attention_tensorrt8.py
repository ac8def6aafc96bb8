"""quantize.attention int8 for a TensorRT 8 target: the Q/DQ model is written (ONNX Runtime runs it
right) with a warning that TensorRT 8.6.0 computed the Softmax x V MatMul wrongly; the score MatMul
(Q x K^T) alone was right (docs/decisions.md D34)."""

import logging

import numpy as np
import onnx
import pytest

from tests.quantize.conftest import activation_amax, attention_model, random_feeds
from trtq.calib.cache import CalibrationTable, write_cache

WARNING = "attention MatMul(s) quantized for TensorRT"


@pytest.fixture
def attention_files(tmp_path):
    model = attention_model(np.random.default_rng(3))
    onnx.save(model, tmp_path / "m.onnx")
    amax = activation_amax(model, [random_feeds(model)])

    def cache(version: str):
        path = tmp_path / f"c{version}.cache"
        write_cache(path, CalibrationTable(trt_version=version, algorithm="EntropyCalibration2", amax=amax), version)
        return path

    return tmp_path / "m.onnx", cache


@pytest.mark.parametrize(
    "version,attention,warned",
    [
        ("8.6.0", "int8", True),  # measured: PP-OCRv4 rec's engine decoded 0.195 of lines as FP32 does
        ("10.3.0", "int8", False),  # not run there: no claim either way
        ("8.6.0", "float", False),  # the default keeps the attention MatMuls float
    ],
)
def test_int8_attention_warns_for_tensorrt_8(trtq, tmp_path, attention_files, version, attention, warned):
    model, cache = attention_files
    out = tmp_path / "q.onnx"
    r = trtq(["quantize", "--model", model, "--cache", cache(version), "--attention", attention, "-o", out])
    assert r.code == 0, r
    assert (WARNING in r.err) == warned, r.err
    if warned:
        assert "1 attention MatMul(s)" in r.err and "read the Softmax output (context)" in r.err
    graph = onnx.load(out).graph  # written either way, the attention MatMuls quantized as asked
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    (scores,) = [n for n in graph.node if n.name == "scores"]
    assert all(i in dequantized for i in scores.input) == (attention == "int8")


def test_warning_lists_only_attention_matmuls(attention_files):
    from tests.trt.test_build_cpu import build_warnings
    from trtq.config import QuantizeOptions
    from trtq.pipeline.quantize import warn_int8_attention
    from trtq.quantize import quantize_model

    model = attention_model(np.random.default_rng(3))
    amax = activation_amax(model, [random_feeds(model)])
    result = quantize_model(model, amax, QuantizeOptions(attention="int8"))
    assert {"proj_q", "scores", "context"} <= set(result.quantized)
    with build_warnings("trtq.pipeline.quantize") as records:
        assert warn_int8_attention("8.6.0", model, result) == ["context"]  # Softmax x V, not the scores
        assert warn_int8_attention("10.3.0", model, result) == []
    assert sum(WARNING in r.getMessage() for r in records) == 1
    assert records[0].levelno == logging.WARNING


@pytest.mark.parametrize("version,warned", [("8.6.0", True), ("10.3.0", False)])
def test_build_warns_for_the_installed_tensorrt(version, warned):
    """`trtq build` quantizing from a cache warns for the TensorRT it builds with, not the cache's."""
    from tests.trt.fakes import fake_trt
    from tests.trt.test_build_cpu import build_warnings
    from trtq.config import DataOptions, QuantizeOptions
    from trtq.pipeline.build import _quantized_network_model
    from trtq.trt import compat

    model = attention_model(np.random.default_rng(3))
    amax = activation_amax(model, [random_feeds(model)])
    trt = fake_trt(version)
    table = CalibrationTable(trt_version="10.3.0", algorithm="EntropyCalibration2", amax=amax)
    recipe = compat.plan_build(trt, "int8", "explicit", True)
    with build_warnings("trtq.pipeline.quantize") as records:
        _, _, quantized = _quantized_network_model(
            trt, model, table, recipe, QuantizeOptions(attention="int8"), DataOptions(), None
        )
    assert {"scores", "context"} <= set(quantized)
    assert any(WARNING in r.getMessage() for r in records) == warned


def test_int8_attention_set_by_placement_from_warns_too(trtq, tmp_path, attention_files):
    """The warning follows the attention setting quantize applies, also when a tuned engine's
    metadata (--placement-from) sets it rather than the config."""
    import json

    from trtq.trt.metadata import FORMAT

    model, cache = attention_files
    chosen = {"precision": "int8", "placement": "standard", "left_float": [], "attention": "int8"}
    tuned = tmp_path / "t.plan.json"
    tuned.write_text(json.dumps({"format": FORMAT, "tuning": {"chosen": chosen}}))
    r = trtq(
        ["quantize", "--model", model, "--cache", cache("8.6.0"), "--placement-from", tuned, "-o", tmp_path / "q.onnx"]
    )
    assert r.code == 0, r
    assert WARNING in r.err and "(context)" in r.err, r.err


@pytest.mark.parametrize("excluded,warned", [("context", False), ("scores", True)])
def test_only_a_quantized_softmax_x_v_matmul_warns(trtq, tmp_path, attention_files, excluded, warned):
    """Measured on TensorRT 8.6.0 (PP-OCRv4 rec): Q x K^T alone in INT8 decoded 0.630 of lines as
    FP32 does against 0.650 on ONNX Runtime; Softmax x V alone 0.265 against 0.670."""
    model, cache = attention_files
    out = tmp_path / "q.onnx"
    args = ["quantize", "--model", model, "--cache", cache("8.6.0"), "--attention", "int8", "--exclude", excluded]
    r = trtq([*args, "-o", out])
    assert r.code == 0, r
    assert (WARNING in r.err) == warned, r.err
    quantized = {
        n.name for n in onnx.load(out).graph.node if any(i.endswith("_DequantizeLinear_Output") for i in n.input)
    }
    assert {"scores", "context"} - {excluded} <= quantized and excluded not in quantized
