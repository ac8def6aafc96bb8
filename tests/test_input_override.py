"""--override-input-shape / model_input_shapes: a fixed declared input shape rewritten and checked."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.errors import ModelError, UsageError
from trtq.input_override import override_input_shapes, parse_override


def _fixed_detector(path, reshape_to=None):
    """x declared [10,3,32,32] -> Conv -> Relu -> (GlobalAveragePool | Reshape to a constant size)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
    ]
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32), "w")]
    if reshape_to is None:
        nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool"))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 16, 1, 1])
    else:
        inits.append(numpy_helper.from_array(np.array(reshape_to, np.int64), "target"))
        nodes.append(helper.make_node("Reshape", ["r", "target"], ["y"], name="flatten"))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(reshape_to))
    graph = helper.make_graph(
        nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 3, 32, 32])], [out], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, str(path))
    return path


def test_parse_override():
    assert parse_override(["x=1x3x240x320", "y=2,4"]) == {"x": (1, 3, 240, 320), "y": (2, 4)}
    for bad in (["1x3x8x8"], ["x=1x3xQ"], ["x=0x3"], ["x=1x3", "x=2x3"]):
        with pytest.raises(UsageError):
            parse_override(bad)


def test_the_model_runs_at_the_new_shape(tmp_path):
    model = onnx.load(str(_fixed_detector(tmp_path / "d.onnx")))
    out = override_input_shapes(model, {"x": (1, 3, 64, 96)}, "d.onnx")
    dims = [d.dim_value for d in out.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 64, 96]
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [1, 16, 1, 1]
    import onnxruntime as ort

    y = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((1, 3, 64, 96), np.float32)}
    )[0]
    assert y.shape == (1, 16, 1, 1)


def test_a_graph_that_fixes_the_shape_is_refused(tmp_path):
    model = onnx.load(str(_fixed_detector(tmp_path / "d.onnx", reshape_to=[10, 16 * 32 * 32])))
    with pytest.raises(ModelError, match=r"d\.onnx cannot take x=\[1, 3, 64, 96\]|d\.onnx does not run at x="):
        override_input_shapes(model, {"x": (1, 3, 64, 96)}, "d.onnx")
    with pytest.raises(ModelError, match="has rank 3 but d.onnx declares x as \\[10, 3, 32, 32\\]"):
        override_input_shapes(model, {"x": (3, 64, 96)}, "d.onnx")
    with pytest.raises(UsageError, match="names 'image', which is not an input"):
        override_input_shapes(model, {"image": (1, 3, 64, 96)}, "d.onnx")


def test_cli_calibrates_and_quantizes_at_the_overridden_shape(trtq, tmp_path):
    model = _fixed_detector(tmp_path / "d.onnx")
    np.save(tmp_path / "frames.npy", np.random.default_rng(1).normal(0, 1, (4, 3, 48, 64)).astype(np.float32))
    cache, q = tmp_path / "d.cache", tmp_path / "d.qdq.onnx"
    r = trtq(["calibrate", "--model", model, "--data", tmp_path / "frames.npy", "-o", cache])
    assert r.code == 3 and "expects samples of shape [3, 32, 32]" in r.err, r  # the declared shape refuses frames
    args = ["--override-input-shape", "x=2x3x48x64"]
    r = trtq(["calibrate", "--model", model, "--data", tmp_path / "frames.npy", "-o", cache, "-q", *args])
    assert r.code == 0, r
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", q, "--json", *args])
    assert r.code == 0, r
    assert json.loads(r.out)["quantized"] == ["conv"]  # its pool feeds the output: no pair (shared)
    written = onnx.load(str(q))
    assert [d.dim_value for d in written.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 48, 64]
    # the same through the config, and the temporary copy is gone after the command
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {model}\nmodel_input_shapes:\n  x: [2, 3, 48, 64]\n")
    r = trtq(["calibrate", "--config", cfg, "--data", tmp_path / "frames.npy", "--dry-run", "--json"])
    assert r.code == 0 and json.loads(r.out)["batches"]["inputs"]["x"]["shape"] == [2, 3, 48, 64], r
    import trtq.input_override as io

    assert io._temp_dirs == []


def test_a_cache_is_fresh_for_its_model_at_any_overridden_shape(trtq, tmp_path):
    """Found building the issue-34 engine table: `build --cache C --override-input-shape ...` refused
    the model's own cache as made for another model (the rewritten copy was hashed). Calibrated at
    one shape, the cache serves the same model at another; another model's cache is still refused."""
    model = _fixed_detector(tmp_path / "d.onnx")
    np.save(tmp_path / "frames.npy", np.random.default_rng(1).normal(0, 1, (4, 3, 48, 64)).astype(np.float32))
    cache, q = tmp_path / "d.cache", tmp_path / "d.qdq.onnx"
    r = trtq(
        ["calibrate", "--model", model, "--data", tmp_path / "frames.npy", "-o", cache, "-q"]
        + ["--override-input-shape", "x=2x3x48x64"]
    )
    assert r.code == 0, r
    prov = json.loads((tmp_path / "d.cache.json").read_text())
    from trtq.model import model_sha256

    assert prov["model"]["sha256"] == model_sha256(model)  # the user's model, not the rewritten copy
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", q, "-q", "--override-input-shape", "x=4x3x48x64"])
    assert r.code == 0, r
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", tmp_path / "plain.qdq.onnx", "-q"])
    assert r.code == 0, r  # and at its declared shape
    other = _fixed_detector(tmp_path / "other.onnx", reshape_to=[10, 16 * 32 * 32])
    r = trtq(
        [
            "quantize",
            "--model",
            other,
            "--cache",
            cache,
            "-o",
            tmp_path / "o.onnx",
            "--override-input-shape",
            "x=10x3x32x32",
        ]
    )
    assert r.code == 3 and "calibrated for a different model" in r.err, r
