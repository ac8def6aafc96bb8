"""Helpers behind benchmarks/: preprocessing, measured subprocesses, cache reading, goal lines."""

import importlib.util
import struct
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_calibrate  # noqa: E402
import bench_engines  # noqa: E402
import bench_trt  # noqa: E402
import common  # noqa: E402
import models  # noqa: E402

from trtq.config import PreprocessOptions, ResizeOptions  # noqa: E402
from trtq.errors import TrtqError  # noqa: E402


def test_imagenet_samples_parse_labels(tmp_path):
    for name in ("imagenet_01_559.jpg", "imagenet_00_243.jpg", "cifar10_00_3.png", "imagenet_x_1.jpg"):
        (tmp_path / name).write_bytes(b"")
    got = common.imagenet_samples(tmp_path)
    assert [(p.name, label) for p, label in got] == [("imagenet_00_243.jpg", 243), ("imagenet_01_559.jpg", 559)]


@pytest.mark.skipif(
    importlib.util.find_spec("foolbox") is None, reason="foolbox is not installed (pip install --no-deps foolbox)"
)
def test_foolbox_ships_twenty_labelled_images():
    got = common.imagenet_samples()
    assert len(got) == 20
    assert all(0 <= label < 1000 for _, label in got)


def test_preprocess_by_hand(tmp_path):
    # 4 wide x 2 high; centre crop 2x2 keeps columns 1..2
    px = np.arange(4 * 2 * 3, dtype=np.uint8).reshape(2, 4, 3) * 10
    path = tmp_path / "a.png"
    Image.fromarray(px).save(path)
    opts = PreprocessOptions(center_crop=(2,), scale=1.0, mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0))
    got = common.preprocess_image(path, opts)
    want = ((px[:, 1:3, :].astype(np.float32) - 127.0) / 128.0).transpose(2, 0, 1)
    assert got.shape == (3, 2, 2) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_preprocess_matches_trtq_batcher(tmp_path):
    """The ORT reference cases must see exactly the tensors trtq calibrates on."""
    from trtq.config import DataOptions, InputSource
    from trtq.data.batcher import Batcher
    from trtq.model import TensorSpec

    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(398, 381), (300, 451), (640, 333)]):  # odd sizes: rounding matters
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"p{i}.jpg")
    pre = PreprocessOptions(
        resize=ResizeOptions(mode="shorter", size=(64,), interpolation="bicubic"),
        center_crop=(56,),
        scale=1.0,
        mean=(127.0,) * 3,
        std=(128.0,) * 3,
    )
    data = DataOptions(inputs={"input": InputSource(images=str(tmp_path), preprocess=pre)}, batch_size=3)
    batch = next(iter(Batcher(data, [TensorSpec("input", ("N", 3, 56, 56), "float32")])))
    ours = np.stack([common.preprocess_image(p, pre) for p in common.list_images(tmp_path)])
    np.testing.assert_array_equal(batch.arrays["input"][: batch.valid], ours)


def _py(code: str):
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_run_measured_reports_peak_rss_of_that_child():
    big = common.run_measured(_py("import numpy as np; a = np.ones(300 * 2**20 // 8); print(a.sum())"), timeout=60)
    small = common.run_measured(_py("print(1)"), timeout=60)
    assert big.status == "ok" and big.stdout.strip() == str(float(300 * 2**20 // 8))
    assert big.peak_rss > 300 * common.MIB
    assert small.peak_rss < 100 * common.MIB  # not the previous child's figure


def test_run_measured_leaves_out_the_size_of_the_measuring_process():
    """A child forked from a large process starts with that process's peak RSS on Linux: the
    figure must be the command's own, whatever holds the measuring process (pytest late in the
    suite measured 428 MB for `print(1)` before the launcher)."""
    held = np.ones(400 * 2**20 // 8)  # 400 MB resident in this process
    small = common.run_measured(_py("print(1)"), timeout=60)
    assert held.sum() > 0 and small.status == "ok" and small.stdout.strip() == "1"
    assert small.peak_rss < 100 * common.MIB, small.peak_rss


def test_run_measured_timeout_cap_and_failure():
    t = common.run_measured(_py("import time; time.sleep(30)"), timeout=0.5)
    assert t.status == "timeout" and t.seconds < 10
    assert t.label(None, 0.5).startswith("timeout")
    k = common.run_measured(_py("import numpy as np; a = np.ones(2 * 2**30 // 8)"), timeout=60, mem_cap=1 * common.GIB)
    assert k.status == "killed" and k.label(common.GIB, 60) == "killed (> 1 GB)"
    f = common.run_measured(_py("import sys; sys.exit(3)"), timeout=60)
    assert f.status == "failed" and f.returncode == 3


def test_read_trt_cache_amax(tmp_path):
    scale = 2.5 / 127.0
    path = tmp_path / "c.cache"
    path.write_text(
        "TRT-8600-MinMaxCalibration\ninput: 3c010204\nname: with: colon: " + struct.pack(">f", scale).hex() + "\n"
    )
    got = bench_calibrate.read_trt_cache_amax(path)
    assert got["input"] == pytest.approx(1.0, rel=1e-6)
    assert got["name: with: colon"] == pytest.approx(2.5, rel=1e-6)


def test_calibrate_goals_pass_and_fail():
    G = common.GIB
    row = bench_calibrate.CaseRow
    rows = [
        row("ort-minmax", 256, "ok", 100.0, 2 * G),
        row("ort-entropy", 256, "ok", 1000.0, 16 * G),
        row("ort-entropy", 1024, "killed (> 20 GB)", 300.0, 20 * G),
        row("trtq-max", 256, "ok", 60.0, 1.0 * G),
        row("trtq-max", 1024, "ok", 240.0, 1.2 * G),
        row("trtq-entropy", 256, "ok", 150.0, 1.0 * G),
        row("trtq-entropy", 1024, "ok", 600.0, 1.05 * G),
    ]
    lines = bench_calibrate.goals(rows, [256, 1024])
    text = "\n".join(lines)
    assert "[PASS] trtq-max peak RSS <= 1.5 GiB at 1024" in text
    assert "[FAIL] trtq-max RSS at 1024 within +10% of 256: +20.0%" in text
    assert "[PASS] trtq-max wall <= 0.7x ORT MinMax at 256 images: 0.60x" in text
    assert "[PASS] trtq-entropy wall <= 0.2x ORT Entropy at 256 images: 0.15x" in text
    assert "[PASS] histogram methods finish 1024 images where ORT cannot" in text


def test_calibrate_goal_against_a_stopped_reference_is_an_upper_bound():
    row = bench_calibrate.CaseRow
    G = common.GIB
    fast = [row("ort-entropy", 256, "killed (> 20 GB)", 1000.0, 19 * G), row("trtq-mse", 256, "ok", 150.0, G)]
    text = "\n".join(bench_calibrate.goals(fast, [256]))
    assert "[PASS] trtq-mse wall <= 0.2x ORT Entropy at 256 images: <0.15x (ORT killed (> 20 GB) after 1000 s)" in text
    slow = [fast[0], row("trtq-mse", 256, "ok", 400.0, G)]
    goals = "\n".join(bench_calibrate.goals(slow, [256]))
    assert "[n/a] trtq-mse wall <= 0.2x ORT Entropy at 256 images: <0.40x" in goals
    table = bench_calibrate.report(fast, [256])
    assert ">1000.0" in table and "<0.15x" in table


def test_fold_constants_removes_constant_subgraph():
    c1 = helper.make_node("Constant", [], ["c1"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]))
    neg = helper.make_node("Neg", ["c1"], ["c2"])
    add = helper.make_node("Add", ["x", "c2"], ["y"])
    g = helper.make_graph(
        [c1, neg, add],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    assert models.fold_constants(m) == 2
    assert [n.op_type for n in m.graph.node] == ["Add"]
    onnx.checker.check_model(m)
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([10, 20], np.float32)})[0], [9.0, 18.0])


def test_cosine_rows():
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    b = np.array([[0.0, 2.0], [2.0, 2.0]])
    np.testing.assert_allclose(common.cosine_rows(a, b), [0.0, 1.0])


def test_flip_noise_counts_top1_changes_between_two_runtimes():
    ref = np.zeros((5, 3))
    a = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0]], dtype=float)
    b = a.copy()
    b[1] = [1, 0, 0]  # one sample flips ...
    b[4] = [0, 0, 1]  # ... and another
    got = bench_engines.flip_noise(ref, a, b, 5)
    assert got["flips"] == pytest.approx(2 / 5)
    assert got["gap_sigma"] == pytest.approx(np.sqrt(2) / 5)
    assert bench_engines.flip_noise(ref, a, a, 4) == {"flips": 0.0, "gap_sigma": 0.0}


def test_engine_goal_lines_name_the_chance_gap():
    rows = [
        {"name": "int8-implicit", "engine_top1": 0.9, "median_ms": 1.0, "spread_ms": 0.01},
        {
            "name": "q",
            "engine_top1": 0.95,
            "ort_top1": 0.93,
            "median_ms": 0.99,
            "spread_ms": 0.01,
            "flips": 0.05,
            "gap_sigma": 0.0125,
        },
    ]
    lines = bench_engines.goals(rows)
    assert lines[0].startswith("[PASS] best explicit engine") and "q 0.950" in lines[0]
    assert lines[1].startswith("[FAIL] q:") and "gap 0.020" in lines[1] and "1 sigma 0.013" in lines[1]
    rows[1]["median_ms"] = 1.2  # slower than the implicit engine + its noise: the goal fails
    assert bench_engines.goals(rows)[0].startswith("[FAIL]")
    rows[1].update(engine_top1=0.953, ort_top1=0.943)  # 20 of 2000 samples: exactly the 0.01 goal
    assert bench_engines.goals(rows)[1].startswith("[PASS] q:") and "gap 0.010" in bench_engines.goals(rows)[1]


@pytest.mark.parametrize("script", [bench_engines, bench_trt])
def test_engine_benchmarks_build_with_eager_module_loading(script, monkeypatch, tmp_path):
    """Both scripts build through trt.build directly, not `trtq build`: they ask for eager loading
    themselves before anything can start CUDA (D39). Here the run stops right after (no TensorRT,
    or no model), with the variable set."""
    import os

    monkeypatch.setenv("CUDA_MODULE_LOADING", "")  # unset for prefer_eager; restored after the test
    missing = tmp_path / "missing.onnx"
    argv = ["--model", str(missing), "--out", str(tmp_path / "out")]
    if script is bench_engines:
        argv += ["--config", str(missing), "--calib", str(tmp_path), "--eval", str(tmp_path)]
    else:
        argv += ["--cache", str(missing), "--data", str(tmp_path)]
    with pytest.raises((ImportError, TrtqError)):
        script.main(argv)
    assert os.environ["CUDA_MODULE_LOADING"] == "EAGER"


def test_engine_table_scores_onnx_runtime_with_the_engines_float_rest(tmp_path):
    """bench_engines builds the explicit engines with fp16, so its ONNX Runtime column casts the Q/DQ
    file's float rest to float16 the same way compare --float-rest fp16 does (D41); fp32 keeps it."""
    import onnx as onnx_

    from tests.trt.models import activation_amax, residual_cnn
    from trtq.compare.onnx_runner import OnnxRunner
    from trtq.quantize import quantize_model
    from trtq.quantize.fp16 import cast_float_rest

    fp32 = residual_cnn(tmp_path / "m.onnx", batch="N")
    x = np.random.default_rng(5).standard_normal((4, 3, 16, 16)).astype(np.float32)
    qdq = quantize_model(onnx_.load(str(fp32)), activation_amax(fp32, [{"x": x}])).model
    onnx_.save(qdq, str(tmp_path / "q.onnx"))
    batches = [x[:2], x[2:]]
    half = bench_engines.logits_onnxruntime(tmp_path / "q.onnx", batches, "x", float_rest="fp16")
    full = bench_engines.logits_onnxruntime(tmp_path / "q.onnx", batches, "x", float_rest="fp32")
    np.testing.assert_allclose(full, OnnxRunner.from_model(qdq).run({"x": x})["y"], atol=1e-6)
    np.testing.assert_allclose(half, OnnxRunner.from_model(cast_float_rest(qdq)).run({"x": x})["y"], atol=1e-6)
    assert np.abs(half - full).max() > 1e-5
    assert (
        bench_engines.parse_args(
            ["--model", "m", "--config", "c", "--calib", "a", "--eval", "b", "--out", "o"]
        ).ort_float_rest
        == "fp16"
    )
