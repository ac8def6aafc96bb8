"""trtq compare --task end to end on generated ONNX models of each output kind: the task is
inferred (and stated), the metric agrees with an independent scoring of the same outputs (ONNX
Runtime run here, scored by tests/compare/scoring.py), the gate reads the task metric, and a
--task that fits no output is a usage error."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from . import scoring

H, W = 32, 64


def _save(path: Path, nodes, out_name: str, out_shape, inits) -> Path:
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, H, W])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def _weights(rng, shape, scale=0.5):
    return rng.normal(0, scale, shape).astype(np.float32)


def classifier(path, rng):
    """[N, 10, 1, 1] scores."""
    return _save(
        path,
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["c"], ["y"]),
        ],
        "y",
        ["N", 10, 1, 1],
        {"w": _weights(rng, (10, 3, 3, 3))},
    )


def yolo_v8_head(path, rng, classes=3):
    """YOLOv8-shaped [N, 4+C, A]: a stride-4 conv, boxes sigmoid x 64 px, class scores sigmoid."""
    k = 4 + classes
    anchors = (H // 4) * (W // 4)
    return _save(
        path,
        [
            helper.make_node("Conv", ["x", "w"], ["c"], strides=[4, 4]),
            helper.make_node("Reshape", ["c", "shape"], ["flat"]),
            helper.make_node("Split", ["flat", "split"], ["box_raw", "cls_raw"], axis=1),
            helper.make_node("Sigmoid", ["box_raw"], ["box01"]),
            helper.make_node("Mul", ["box01", "px"], ["boxes"]),
            helper.make_node("Sigmoid", ["cls_raw"], ["scores"]),
            helper.make_node("Concat", ["boxes", "scores"], ["output0"], axis=1),
        ],
        "output0",
        ["N", k, anchors],
        {
            "w": _weights(rng, (k, 3, 4, 4), 0.4),
            "shape": np.array([0, k, anchors], np.int64),
            "split": np.array([4, classes], np.int64),
            "px": np.array(64.0, np.float32),
        },
    )


def seg_map(path, rng, classes=1):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c" if classes == 1 else "y"], pads=[1, 1, 1, 1])]
    if classes == 1:
        nodes.append(helper.make_node("Sigmoid", ["c"], ["y"]))
    return _save(path, nodes, "y", ["N", classes, H, W], {"w": _weights(rng, (classes, 3, 3, 3))})


def ctc_head(path, rng, classes=8):
    """[N, T=16, C] softmax over C, like PP-OCR rec."""
    t = W // 4
    return _save(
        path,
        [
            helper.make_node("Conv", ["x", "w"], ["c"], strides=[H, 4]),  # [N, C, 1, T]
            helper.make_node("Reshape", ["c", "shape"], ["ct"]),
            helper.make_node("Transpose", ["ct"], ["tc"], perm=[0, 2, 1]),
            helper.make_node("Softmax", ["tc"], ["probs"], axis=2),
        ],
        "probs",
        ["N", t, classes],
        {"w": _weights(rng, (classes, 3, H, 4), 0.2), "shape": np.array([0, classes, t], np.int64)},
    )


MAKERS = {"classify": classifier, "detect": yolo_v8_head, "segment": seg_map, "ctc": ctc_head}


def perturbed_copy(model_path: Path, out: Path, noise, seed: int = 7) -> Path:
    """The model with noise on its conv weights (``noise``: a scale, or one per output channel):
    a candidate that differs a little."""
    model = onnx.load(str(model_path))
    rng = np.random.default_rng(seed)
    for init in model.graph.initializer:
        if init.name == "w":
            w = numpy_helper.to_array(init)
            scale = np.reshape(noise, (-1, 1, 1, 1)) * np.abs(w).mean()
            init.CopyFrom(numpy_helper.from_array((w + rng.normal(0, 1, w.shape) * scale).astype(np.float32), "w"))
    onnx.save(model, str(out))
    return out


def run(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture
def inputs(tmp_path):
    x = np.random.default_rng(0).normal(0, 1, (12, 3, H, W)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return x, tmp_path / "x.npy"


DETECT_NOISE = [0.1] * 4 + [0.5] * 3  # boxes a little, class scores more: a worse score head


def pair(tmp_path, task, noise=0.3, **kw):
    ref = MAKERS[task](tmp_path / f"{task}.onnx", np.random.default_rng(1), **kw)
    return ref, perturbed_copy(ref, tmp_path / f"{task}.cand.onnx", noise)


def compare_json(trtq, ref, cand, npy, *extra):
    r = trtq(["compare", "--reference", ref, "--candidate", cand, "--data", npy, "--batch-size", "5", "--json", *extra])
    assert r.code == 0, r
    return json.loads(r.out)["outputs"][0]


def test_classify_inferred_for_1x1_scores(trtq, tmp_path, inputs):
    x, npy = inputs
    ref, cand = pair(tmp_path, "classify", noise=1.0)
    out = compare_json(trtq, ref, cand, npy)
    assert out["task"]["name"] == "classify" and out["task"]["how"].startswith("inferred: [N, 10, 1, 1]")
    r, c = run(ref, x)[:, :, 0, 0], run(cand, x)[:, :, 0, 0]
    expected = float(np.mean(r.argmax(1) == c.argmax(1)))
    assert out["task"]["metrics"]["top1_agreement"] == pytest.approx(expected)
    assert 0 < expected < 1  # the noise moved some answers: the test can tell a wrong count


def test_detect_inferred_and_scored_like_an_independent_nms(trtq, tmp_path, inputs):
    x, npy = inputs
    ref, cand = pair(tmp_path, "detect", noise=DETECT_NOISE)
    out = compare_json(trtq, ref, cand, npy)
    task = out["task"]
    assert task["name"] == "detect" and "YOLOv8 head" in task["how"] and task["gate_metric"] == "f1"
    r, c = run(ref, x), run(cand, x)
    p, rc, f1, matched, n_ref, n_cand = scoring.detection_f1(r.transpose(0, 2, 1), c.transpose(0, 2, 1), v5=False)
    m = task["metrics"]
    assert (m["matched"], m["reference_detections"], m["candidate_detections"]) == (matched, n_ref, n_cand)
    assert m["f1"] == pytest.approx(f1) and m["precision"] == pytest.approx(p) and m["recall"] == pytest.approx(rc)
    assert 0 < f1 < 1 and n_ref > 20
    box_err = np.sum((r[:, :4].astype(np.float64) - c[:, :4]) ** 2)
    box_energy = np.sum(r[:, :4].astype(np.float64) ** 2)
    assert m["box_sqnr_db"] == pytest.approx(10 * np.log10(box_energy / box_err), rel=1e-6)
    # the whole-tensor SQNR hides the score part: boxes in pixels dominate it
    assert out["sqnr_db"] > m["score_sqnr_db"] + 3


def test_detect_thresholds_from_flags(trtq, tmp_path, inputs):
    x, npy = inputs
    ref, cand = pair(tmp_path, "detect", noise=DETECT_NOISE)
    m = compare_json(trtq, ref, cand, npy, "--score-threshold", "0.6", "--nms-iou", "0.3")["task"]["metrics"]
    r, c = run(ref, x).transpose(0, 2, 1), run(cand, x).transpose(0, 2, 1)
    _, _, f1, _, n_ref, _ = scoring.detection_f1(r, c, v5=False, conf=0.6, nms_iou=0.3)
    assert m["reference_detections"] == n_ref and m["f1"] == pytest.approx(f1)
    assert (m["score_threshold"], m["nms_iou"]) == (0.6, 0.3)


@pytest.mark.parametrize("classes", [1, 4])
def test_segment_inferred_and_mask_iou(trtq, tmp_path, inputs, classes):
    x, npy = inputs
    ref, cand = pair(tmp_path, "segment", noise=0.4, classes=classes)
    out = compare_json(trtq, ref, cand, npy, "--mask-threshold", "0.6")
    assert out["task"]["name"] == "segment"
    r, c = run(ref, x), run(cand, x)
    if classes == 1:
        expected = scoring.mask_iou(r, c, 0.6)
    else:
        a, b = r.argmax(1), c.argmax(1)
        expected = np.mean(
            [
                np.logical_and(a == k, b == k).sum() / np.logical_or(a == k, b == k).sum()
                for k in range(classes)
                if np.logical_or(a == k, b == k).any()
            ]
        )
    assert out["task"]["metrics"]["iou"] == pytest.approx(expected) and 0 < expected < 1


def test_ctc_inferred_from_the_softmax(trtq, tmp_path, inputs):
    x, npy = inputs
    ref, cand = pair(tmp_path, "ctc", noise=0.5)
    out = compare_json(trtq, ref, cand, npy)
    assert out["task"]["name"] == "ctc" and "Softmax" in out["task"]["how"]
    agreement, cer = scoring.ctc_scores(run(ref, x), run(cand, x))
    m = out["task"]["metrics"]
    assert m["sequence_agreement"] == pytest.approx(agreement) and m["cer"] == pytest.approx(cer)
    assert cer > 0


def test_the_gate_reads_the_task_metric_and_says_which(trtq, tmp_path, inputs):
    _, npy = inputs
    ref, cand = pair(tmp_path, "detect", noise=DETECT_NOISE)
    args = ["compare", "--reference", ref, "--candidate", cand, "--data", npy]
    r = trtq(args + ["--min-agreement", "0.99"])
    assert r.code == 1 and "output0: detection F1" in r.err and "below --min-agreement 0.99" in r.err, r
    assert "task output0: detect (inferred: [N, 7, 128] is a YOLOv8 head" in r.out
    assert "detection F1" in r.out and "[gates --min-agreement]" in r.out
    assert trtq(args + ["--min-agreement", "0.01"]).code == 0
    # raw: today's metrics only, no task metric to gate
    r = trtq(args + ["--task", "raw", "--min-agreement", "0.5"])
    assert r.code == 1 and "cannot be checked" in r.err, r


@pytest.mark.parametrize("task,kind", [("detect", "classify"), ("ctc", "segment"), ("classify", "detect")])
def test_a_task_that_fits_no_output_is_a_usage_error(trtq, tmp_path, inputs, task, kind):
    _, npy = inputs
    ref = MAKERS[kind](tmp_path / "m.onnx", np.random.default_rng(1))
    r = trtq(["compare", "--reference", ref, "--candidate", ref, "--data", npy, "--task", task, "--json"])
    assert r.code == 2 and json.loads(r.out)["exit_code"] == 2, r  # --json: the error as JSON
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trtq: error: --task {task} does not fit"), r
    assert "Traceback" not in r.err


def test_explicit_task_on_an_ambiguous_shape(trtq, tmp_path, inputs):
    """[N, 7, 128] from a Concat reads as a YOLOv8 head; --task ctc scores it as CTC instead."""
    x, npy = inputs
    ref, cand = pair(tmp_path, "detect", noise=DETECT_NOISE)
    out = compare_json(trtq, ref, cand, npy, "--task", "ctc")
    assert out["task"]["name"] == "ctc" and out["task"]["how"] == "given (--task)"
    agreement, cer = scoring.ctc_scores(run(ref, x), run(cand, x))  # [N, T=7, C=128] as it is
    m = out["task"]["metrics"]
    assert m["sequence_agreement"] == pytest.approx(agreement) and m["cer"] == pytest.approx(cer)


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--score-threshold", "1.5", "--score-threshold must be between 0 and 1"),
        ("--nms-iou", "-0.1", "--nms-iou must be between 0 and 1"),
        ("--mask-threshold", "nan", "--mask-threshold must be a finite number"),
    ],
)
def test_bad_task_settings_are_usage_errors(trtq, tmp_path, inputs, flag, value, message):
    _, npy = inputs
    ref = seg_map(tmp_path / "m.onnx", np.random.default_rng(1))
    r = trtq(["compare", "--reference", ref, "--candidate", ref, "--data", npy, flag, value])
    assert r.code == 2 and message in r.err and r.out == "", r


def test_task_from_the_config(trtq, tmp_path, inputs):
    _, npy = inputs
    ref, cand = pair(tmp_path, "detect", noise=DETECT_NOISE)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {ref}\ndata:\n  inputs:\n    x:\n      npy: [{npy}]\ncompare:\n  task: raw\n")
    r = trtq(["compare", "--config", cfg, "--candidate", cand, "--json"])
    assert r.code == 0 and json.loads(r.out)["outputs"][0]["task"]["name"] == "raw", r
    cfg.write_text(f"model: {ref}\ndata:\n  inputs:\n    x:\n      npy: [{npy}]\ncompare:\n  task: dettect\n")
    r = trtq(["compare", "--config", cfg, "--candidate", cand])
    assert r.code == 2 and "compare.task" in r.err, r
