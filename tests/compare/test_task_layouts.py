"""Layouts task inference must not guess: CTC as [T, N, C], NHWC maps, detectors with split heads,
YOLO-shaped outputs that are not YOLO heads. Each model is generated here, run with ONNX Runtime,
and compare's numbers are held against tests/compare/scoring.py on the same outputs."""

import json
import math

import numpy as np
import pytest
from onnx import helper

from . import scoring
from .test_task_cli import H, W, _save, _weights, perturbed_copy, run


@pytest.fixture
def inputs(tmp_path):
    x = np.random.default_rng(0).normal(0, 1, (12, 3, H, W)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return x, tmp_path / "x.npy"


def compare_json(trtq, ref, cand, npy, *extra, code=0):
    r = trtq(["compare", "--reference", ref, "--candidate", cand, "--data", npy, "--batch-size", "5", "--json", *extra])
    assert r.code == code, r
    return {o["name"]: o for o in json.loads(r.out)["outputs"]} if code == 0 else r


def ctc_tnc(path, rng, classes=8):
    """[T=16, N, C], softmax over C: an LSTM-style recogniser's layout."""
    t = W // 4
    return _save(
        path,
        [
            helper.make_node("Conv", ["x", "w"], ["c"], strides=[H, 4]),  # [N, C, 1, T]
            helper.make_node("Reshape", ["c", "shape"], ["ct"]),
            helper.make_node("Transpose", ["ct"], ["tnc"], perm=[2, 0, 1]),
            helper.make_node("Softmax", ["tnc"], ["probs"], axis=2),
        ],
        "probs",
        [t, "N", classes],
        {"w": _weights(rng, (classes, 3, H, 4), 0.2), "shape": np.array([0, classes, t], np.int64)},
    )


def seg_nhwc(path, rng, classes=4, softmax=True):
    """[N, H, W, C] class maps: a Conv transposed to channels-last (a Keras / tf2onnx export)."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c"], ["t" if softmax else "y"], perm=[0, 2, 3, 1]),
    ]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["t"], ["y"], axis=-1))
    return _save(path, nodes, "y", ["N", H, W, classes], {"w": _weights(rng, (classes, 3, 3, 3))})


def seg_unknown_layout(path, rng, classes=4):
    """[N, H, W, C] made by a MatMul over channels-last pixels: the graph names no class axis."""
    return _save(
        path,
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", ["xt", "w"], ["y"]),
        ],
        "y",
        ["N", H, W, classes],
        {"w": _weights(rng, (3, classes))},
    )


REG = 4  # reg_max + 1 bins per side


def split_heads(path, rng, classes=5):
    """PicoDet-style: per stride (8, 16) a sigmoid score map [N, HW, C] and a DFL box map
    [N, HW, 4 x REG]."""
    nodes, inits, outs = [], {}, []
    for s in (8, 16):
        cells = (H // s) * (W // s)
        for kind, ch in (("scores", classes), ("boxes", 4 * REG)):
            w = f"w_{kind}_{s}"
            inits[w] = _weights(rng, (ch, 3, s, s), 0.3 if kind == "scores" else 0.6)
            inits[f"shape_{kind}_{s}"] = np.array([0, ch, cells], np.int64)
            nodes += [
                helper.make_node("Conv", ["x", w], [f"c_{kind}_{s}"], strides=[s, s]),
                helper.make_node("Reshape", [f"c_{kind}_{s}", f"shape_{kind}_{s}"], [f"r_{kind}_{s}"]),
                helper.make_node("Transpose", [f"r_{kind}_{s}"], [f"t_{kind}_{s}"], perm=[0, 2, 1]),
            ]
            if kind == "scores":
                nodes.append(helper.make_node("Sigmoid", [f"t_{kind}_{s}"], [f"{kind}_{s}"]))
            else:
                nodes.append(helper.make_node("Identity", [f"t_{kind}_{s}"], [f"{kind}_{s}"]))
            outs.append((f"{kind}_{s}", ["N", cells, ch]))
    import onnx
    from onnx import TensorProto, numpy_helper

    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, H, W])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def perturbed_all(model_path, out, noise, seed=7):
    """Noise on every conv weight (split_heads names them w_*)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path))
    rng = np.random.default_rng(seed)
    for init in model.graph.initializer:
        if init.name.startswith("w"):
            w = numpy_helper.to_array(init)
            w = w + rng.normal(0, 1, w.shape) * noise * np.abs(w).mean()
            init.CopyFrom(numpy_helper.from_array(w.astype(np.float32), init.name))
    onnx.save(model, str(out))
    return out


def run_all(model, x):
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))


def decode_rows(outs):
    """[N, A, 4 + C] rows (cx, cy, w, h, scores) of both strides, decoded with plain loops."""
    rows = []
    for n in range(outs["scores_8"].shape[0]):
        sample = []
        for s in (8, 16):
            cols = W // s
            for i in range(outs["scores_8" if s == 8 else "scores_16"].shape[1]):
                p = outs[f"boxes_{s}"][n, i].astype(np.float64).reshape(4, REG)
                dist = []
                for side in p:
                    e = [math.exp(v - max(side)) for v in side]
                    dist.append(sum(k * v for k, v in enumerate(e)) / sum(e) * s)
                cx, cy = (i % cols + 0.5) * s, (i // cols + 0.5) * s
                x1, y1, x2, y2 = cx - dist[0], cy - dist[1], cx + dist[2], cy + dist[3]
                sample.append(
                    [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, *outs[f"scores_{s}"][n, i].astype(np.float64)]
                )
        rows.append(sample)
    return np.asarray(rows)


def test_ctc_in_tnc_is_inferred_and_scored_per_sample(trtq, tmp_path, inputs):
    x, npy = inputs
    ref = ctc_tnc(tmp_path / "r.onnx", np.random.default_rng(1))
    cand = perturbed_copy(ref, tmp_path / "c.onnx", 0.05)
    out = compare_json(trtq, ref, cand, npy)["probs"]
    assert out["task"]["name"] == "ctc" and "TNC" in out["task"]["how"], out["task"]
    r, c = run(ref, x).transpose(1, 0, 2), run(cand, x).transpose(1, 0, 2)  # [N, T, C]
    agreement, cer = scoring.ctc_scores(r, c)
    m = out["task"]["metrics"]
    assert m["sequence_agreement"] == pytest.approx(agreement) and m["cer"] == pytest.approx(cer)
    assert 0 < agreement < 1 and out["samples"] == 12
    # stated: the same numbers
    given = compare_json(trtq, ref, cand, npy, "--task", "ctc", "--layout", "tnc")["probs"]["task"]
    assert given["how"] == "given (--task), TNC" and given["metrics"]["sequence_agreement"] == m["sequence_agreement"]


def test_nhwc_maps_are_scored_over_the_last_axis(trtq, tmp_path, inputs):
    x, npy = inputs
    ref = seg_nhwc(tmp_path / "r.onnx", np.random.default_rng(1))
    cand = perturbed_copy(ref, tmp_path / "c.onnx", 0.4)
    out = compare_json(trtq, ref, cand, npy)["y"]
    assert out["task"]["name"] == "segment" and out["task"]["how"].startswith("inferred: NHWC"), out["task"]
    a, b = run(ref, x).argmax(-1), run(cand, x).argmax(-1)
    expected = np.mean(
        [
            np.logical_and(a == k, b == k).sum() / np.logical_or(a == k, b == k).sum()
            for k in range(4)
            if np.logical_or(a == k, b == k).any()
        ]
    )
    assert out["task"]["metrics"]["iou"] == pytest.approx(expected) and 0 < expected < 1
    assert out["top1_agreement"] is None  # argmax over the flattened maps would mean nothing


def test_maps_of_unknown_layout_are_raw_until_the_layout_is_given(trtq, tmp_path, inputs):
    x, npy = inputs
    ref = seg_unknown_layout(tmp_path / "r.onnx", np.random.default_rng(1))
    cand = perturbed_copy(ref, tmp_path / "c.onnx", 0.4)
    task = compare_json(trtq, ref, cand, npy)["y"]["task"]
    assert task["name"] == "raw" and "--layout NCHW or --layout NHWC" in task["how"], task
    given = compare_json(trtq, ref, cand, npy, "--task", "segment", "--layout", "NHWC")["y"]["task"]
    a, b = run(ref, x).argmax(-1), run(cand, x).argmax(-1)
    expected = np.mean(
        [
            np.logical_and(a == k, b == k).sum() / np.logical_or(a == k, b == k).sum()
            for k in range(4)
            if np.logical_or(a == k, b == k).any()
        ]
    )
    assert given["name"] == "segment" and given["metrics"]["iou"] == pytest.approx(expected)
    # a layout for a task that has none
    r = compare_json(trtq, ref, cand, npy, "--task", "classify", "--layout", "NHWC", code=2)
    assert "--layout is for --task ctc" in r.err


def test_split_heads_are_raw_when_inferred_and_an_error_as_yolo_heads(trtq, tmp_path, inputs):
    _, npy = inputs
    ref = split_heads(tmp_path / "r.onnx", np.random.default_rng(1))
    outs = compare_json(trtq, ref, ref, npy)
    for name, o in outs.items():
        assert o["task"]["name"] == "raw" and "split detector heads" in o["task"]["how"], (name, o["task"])
    r = compare_json(trtq, ref, ref, npy, "--task", "detect", code=2)
    assert "split detector heads" in r.err and "--scores" in r.err and len(r.err.strip().splitlines()) == 1


def test_split_heads_scored_when_named(trtq, tmp_path, inputs):
    x, npy = inputs
    ref = split_heads(tmp_path / "r.onnx", np.random.default_rng(1))
    cand = perturbed_all(ref, tmp_path / "c.onnx", 0.3)
    outs = compare_json(
        trtq, ref, cand, npy, "--task", "detect", "--scores", "scores_8,scores_16", "--boxes", "boxes_8,boxes_16"
    )
    task = outs["scores_8"]["task"]
    assert task["name"] == "detect" and "strides 8, 16" in task["how"] and "dfl" in task["how"], task
    p, rc, f1, matched, n_ref, n_cand = scoring.detection_f1(
        decode_rows(run_all(ref, x)), decode_rows(run_all(cand, x)), v5=False
    )
    m = task["metrics"]
    assert (m["matched"], m["reference_detections"], m["candidate_detections"]) == (matched, n_ref, n_cand)
    assert m["f1"] == pytest.approx(f1) and 0 < f1 < 1 and n_ref > 10
    assert all(outs[n]["task"]["name"] == "raw" for n in ("boxes_8", "scores_16", "boxes_16"))


def test_a_score_map_alone_is_not_read_as_a_yolo_head(trtq, tmp_path, inputs):
    """One [N, HW, C] sigmoid map has a YOLOv5 head's shape; every value in [0, 1] says it is not."""
    _, npy = inputs
    s = 4
    cells = (H // s) * (W // s)
    ref = _save(
        tmp_path / "m.onnx",
        [
            helper.make_node("Conv", ["x", "w"], ["c"], strides=[s, s]),
            helper.make_node("Reshape", ["c", "shape"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
            helper.make_node("Sigmoid", ["t"], ["y"]),
        ],
        "y",
        ["N", cells, 10],
        {"w": _weights(np.random.default_rng(1), (10, 3, s, s)), "shape": np.array([0, 10, cells], np.int64)},
    )
    task = compare_json(trtq, ref, ref, npy)["y"]["task"]
    assert task["name"] == "raw" and "shaped like a YOLO head" in task["how"], task


def test_no_reference_detections_fail_the_gate_saying_why(trtq, tmp_path, inputs):
    _, npy = inputs
    from .test_task_cli import yolo_v8_head

    ref = yolo_v8_head(tmp_path / "m.onnx", np.random.default_rng(1))
    r = trtq(
        [
            "compare",
            "--reference",
            ref,
            "--candidate",
            ref,
            "--data",
            npy,
            "--score-threshold",
            "1.0",
            "--min-agreement",
            "0.5",
        ]
    )
    assert r.code == 1 and "detection F1 cannot be measured: the reference made no detection" in r.err, r
    assert "F1 1.0" not in r.out and "no verdict" in r.out
