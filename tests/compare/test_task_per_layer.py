"""compare --per-layer ranks layers by the task metric (SQNR breaks ties): on a YOLO-shaped head
whose box conv dominates the whole-output SQNR while its class conv decides the detections."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.compare import per_layer_sensitivity, render_layer_table
from trtq.config import CompareOptions, QuantizeOptions

from . import scoring


class Batch:
    def __init__(self, index, arrays, valid):
        self.index, self.arrays, self.valid = index, arrays, valid


def two_head_detector():
    """x [N,16,8,16] -> box conv (sigmoid x 64 px) and class conv (sigmoid), concat -> [N, 4+8, 128]."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["x", "wb"], ["b8"], name="box_conv"),
        helper.make_node("Slice", ["b8", "zero", "four", "one"], ["b4"]),
        helper.make_node("Sigmoid", ["b4"], ["bs"]),
        helper.make_node("Mul", ["bs", "px"], ["boxes"]),
        helper.make_node("Conv", ["x", "wc"], ["c8"], name="cls_conv"),
        helper.make_node("Sigmoid", ["c8"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["output0"]),
    ]
    inits = {
        "wb": rng.normal(0, 0.3, (8, 16, 1, 1)),
        "wc": rng.normal(0, 0.6, (8, 16, 1, 1)),
        "zero": np.array([0]),
        "four": np.array([4]),
        "one": np.array([1]),
        "px": np.array(64.0),
        "shape": np.array([0, 12, 128]),
    }
    inits = {k: v.astype(np.float32) if v.dtype.kind == "f" else v.astype(np.int64) for k, v in inits.items()}
    graph = helper.make_graph(
        nodes,
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 8, 16])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 12, 128])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_per_layer_ranks_by_detection_f1_then_sqnr():
    from trtq.quantize import quantize_model

    model = two_head_detector()
    x = np.random.default_rng(6).normal(0, 1, (8, 16, 8, 16)).astype(np.float32)
    amax = {"x": float(np.abs(x).max())}
    batches = [Batch(0, {"x": x[:5]}, 5), Batch(1, {"x": x[5:]}, 3)]
    plain = per_layer_sensitivity(model, amax, QuantizeOptions(), batches)
    rows = per_layer_sensitivity(model, amax, QuantizeOptions(), batches, task_options=CompareOptions())
    assert {r.node for r in rows} == {"box_conv", "cls_conv"}
    assert all(r.task_metric_name == "detection F1" for r in rows) and plain[0].task_metric is None
    ref = _run(model, x).transpose(0, 2, 1)
    for row in rows:  # each row's F1 is an independent scoring of that layer quantized alone
        only = quantize_model(model, amax, QuantizeOptions(), only_nodes={row.node}).model
        f1 = scoring.detection_f1(ref, _run(only, x).transpose(0, 2, 1), v5=False)[2]
        assert row.task_metric == pytest.approx(f1)
    # the box conv costs the most SQNR (pixels dwarf scores), the class conv the most detections
    assert [r.node for r in plain] == ["box_conv", "cls_conv"]
    assert [r.node for r in rows] == ["cls_conv", "box_conv"]
    assert rows[0].task_metric < rows[1].task_metric
    text = render_layer_table(rows)
    assert "ranked by detection F1, then SQNR" in text and "detection F1" in text.splitlines()[1]
    assert rows[0].to_dict()["task_metric_name"] == "detection F1"


def test_leave_one_out_ranks_by_the_metric_with_the_layer_float():
    model = two_head_detector()
    x = np.random.default_rng(6).normal(0, 1, (8, 16, 8, 16)).astype(np.float32)
    rows = per_layer_sensitivity(
        model,
        {"x": float(np.abs(x).max())},
        QuantizeOptions(),
        [Batch(0, {"x": x}, 8)],
        mode="leave-one-out",
        task_options=CompareOptions(),
    )
    # keeping the class conv float saves the most detections, though keeping the box conv float gains more dB
    assert [r.node for r in rows] == ["cls_conv", "box_conv"]
    assert rows[0].task_metric > rows[1].task_metric and rows[0].gain_db < rows[1].gain_db
    assert "ranked by detection F1 with the layer float, then gain" in render_layer_table(rows, "leave-one-out")


def test_compare_per_layer_cli_ranks_by_the_task_metric(trtq, tmp_path):
    import json

    import onnx

    onnx.save(two_head_detector(), str(tmp_path / "det.onnx"))
    np.save(tmp_path / "x.npy", np.random.default_rng(6).normal(0, 1, (8, 16, 8, 16)).astype(np.float32))
    args = ["--model", tmp_path / "det.onnx", "--data", tmp_path / "x.npy", "--method", "max"]
    assert trtq(["calibrate", *args, "-o", tmp_path / "c.cache", "-q"]).code == 0
    assert (
        trtq(
            [
                "quantize",
                "--model",
                tmp_path / "det.onnx",
                "--cache",
                tmp_path / "c.cache",
                "-o",
                tmp_path / "q.onnx",
                "-q",
            ]
        ).code
        == 0
    )
    r = trtq(
        [
            "compare",
            "--reference",
            tmp_path / "det.onnx",
            "--candidate",
            tmp_path / "q.onnx",
            "--data",
            tmp_path / "x.npy",
            "--per-layer",
            "--cache",
            tmp_path / "c.cache",
            "--json",
        ]
    )
    assert r.code == 0, r
    rows = json.loads(r.out)["per_layer"]
    assert [row["node"] for row in rows] == ["cls_conv", "box_conv"]
    assert rows[0]["task_metric_name"] == "detection F1" and rows[0]["task_metric"] < rows[1]["task_metric"]
    assert rows[0]["sqnr_db"] > rows[1]["sqnr_db"]  # SQNR alone would rank them the other way
