"""Every model trtq writes is loaded and run before it replaces anything (trtq.model_check)."""

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import conv, conv_weight, init, make_model, value
from trtq.model_check import ProducedModelError, check_produced_model, node_named, synthetic_feeds


def _reshape_model(target):
    """x [N, 4] -> Reshape(target) -> y: valid for the checker whatever the target; ONNX Runtime
    refuses a target whose size does not divide the input's at run time."""
    return make_model(
        [helper.make_node("Reshape", ["x", "t"], ["y"], name="to_rows")],
        [value("x", ["N", 4])],
        [value("y", [None, None])],
        [init("t", np.array(target, np.int64))],
    )


def test_a_model_that_runs_passes():
    check_produced_model(_reshape_model([-1, 2]), "m")


def test_a_model_onnx_runtime_cannot_run_names_the_node():
    with pytest.raises(ProducedModelError) as info:
        check_produced_model(_reshape_model([-1, 3]), "the Q/DQ model of m.onnx")
    text = str(info.value)
    assert text.startswith("trtq produced an invalid model (the Q/DQ model of m.onnx): ONNX Runtime cannot run it")
    assert "'to_rows'" in text and "\n" not in text
    assert info.value.exit_code == 1


def test_a_model_the_checker_refuses_names_the_node():
    """Mixed-rank Concat inputs (what a scalar folded into shape (1,) produced): strict shape
    inference refuses it, and the node is named."""
    model = make_model(
        [helper.make_node("Concat", ["x", "c"], ["y"], name="cat", axis=0)],
        [value("x", [2])],
        [value("y", [3])],
        [init("c", np.array([1.0], np.float32))],
    )
    model.graph.initializer[0].CopyFrom(init("c", np.ones((1, 1), np.float32)))  # rank 2 beside rank 1
    with pytest.raises(ProducedModelError, match=r"the ONNX checker refuses it at node 'cat'"):
        check_produced_model(model, "m")


def test_the_original_models_own_checker_complaint_is_not_blamed_on_trtq():
    model = _reshape_model([-1, 2])
    model.graph.node[0].doc_string = "x"
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT64  # output type clash: checker error
    with pytest.raises(ProducedModelError):
        check_produced_model(bad, "m")
    # the same complaint on the model it was made from: ONNX Runtime decides
    with pytest.raises(ProducedModelError, match="ONNX Runtime"):
        check_produced_model(bad, "m", original=bad)


def test_synthetic_feeds_keep_fixed_dims_and_fill_named_ones():
    model = _reshape_model([-1, 2])
    assert synthetic_feeds(model)["x"].shape == (1, 4)
    assert synthetic_feeds(model, {"x": [8, 4]})["x"].shape == (8, 4)
    assert synthetic_feeds(model, {"x": [8, 9]})["x"].shape == (8, 4)  # a fixed dim is the model's


def test_node_named_reads_checker_and_runtime_messages():
    assert node_named("input 'zz' of node: name: conv_3 OpType: Conv is not output") == "conv_3"
    assert node_named("Inference error(s): (op_type:Concat, node name: cat): [ShapeInferenceError]") == "cat"
    assert node_named("Non-zero status code returned while running Reshape node. Name:'r1' Status") == "r1"
    assert node_named("[ONNXRuntimeError] : 1 : FAIL : Node (cat_7) Op (Concat) [ShapeInferenceError]") == "cat_7"
    assert node_named("nothing here") is None


def _conv_files(tmp_path):
    rng = np.random.default_rng(3)
    model = make_model(
        [conv("c1", "x", "w1", "h"), helper.make_node("Relu", ["h"], ["r"], name="relu"), conv("c2", "r", "w2", "y")],
        [value("x", ["N", 16, 6, 6])],
        [value("y", ["N", 16, 6, 6])],
        [init("w1", conv_weight(rng, 16, 16)), init("w2", conv_weight(rng, 16, 16))],
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    data = tmp_path / "x.npy"
    np.save(data, rng.standard_normal((8, 16, 6, 6)).astype(np.float32))
    return path, data


def test_quantize_refuses_to_write_a_model_its_rewrite_broke(trtq, tmp_path, monkeypatch):
    """A rewrite that leaves a dangling input (injected here) is caught before the file is written:
    exit 1, one line naming the node, no output, an older output left as it was."""
    import trtq.pipeline.quantize as pq

    model, data = _conv_files(tmp_path)
    cache = tmp_path / "m.cache"
    assert trtq(["calibrate", "--model", model, "--data", data, "-o", cache, "-q"]).code == 0
    out = tmp_path / "m.qdq.onnx"
    out.write_bytes(b"old")
    real = pq.quantize_for

    def broken(*args, **kwargs):
        result = real(*args, **kwargs)
        node = next(n for n in result.model.graph.node if n.name == "c2")
        node.input[1] = "no_such_weight"
        return result

    monkeypatch.setattr(pq, "quantize_for", broken)
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", out, "--data", data])
    assert r.code == 1, r
    lines = [line for line in r.err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "trtq produced an invalid model" in lines[0] and "'c2'" in lines[0], r
    assert out.read_bytes() == b"old"
    monkeypatch.setattr(pq, "quantize_for", real)
    assert trtq(["quantize", "--model", model, "--cache", cache, "-o", out, "-q"]).code == 0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
