"""``trtq calibrate`` end to end: real ONNX Runtime runs, real files, the cache TensorRT reads.

The small model is built here so every activation can be recomputed with numpy, independently of
trtq's collector; the bundled sample (a real classifier and real photos) covers the image path.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import repo_env
from trtq.calib.cache import read_cache, read_provenance
from trtq.calib.freshness import provenance_matches_cache
from trtq.fileio import sha256_file

IR_VERSION = 8  # also loads in the ONNX Runtime of the GPU bundle


def _mlp(path: Path, seed: int = 0) -> dict:
    """x[N,16] -> MatMul -> Add -> Relu -> MatMul -> y[N,4]; returns the weights."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    b1 = rng.normal(0, 0.1, (8,)).astype(np.float32)
    w2 = rng.normal(0, 0.5, (8, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h_mm"], name="mm1"),
        helper.make_node("Add", ["h_mm", "b1"], ["h add:1"], name="add1"),  # space and colon in a name
        helper.make_node("Relu", ["h add:1"], ["h_relu"], name="relu1"),
        helper.make_node("MatMul", ["h_relu", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return {"w1": w1, "b1": b1, "w2": w2}


def _activations(x: np.ndarray, w: dict) -> dict:
    mm = x @ w["w1"]
    add = mm + w["b1"]
    relu = np.maximum(add, 0)
    return {"x": x, "h_mm": mm, "h add:1": add, "h_relu": relu, "y": relu @ w["w2"]}


@pytest.fixture
def mlp(tmp_path):
    path = tmp_path / "mlp.onnx"
    weights = _mlp(path)
    rng = np.random.default_rng(1)
    # a heavy tail, so entropy / percentile / mse clip well below max|x|
    x = rng.standard_t(3, size=(64, 16)).astype(np.float32)
    data = tmp_path / "x.npy"
    np.save(data, x)
    return path, data, x, weights


def _calibrate(trtq, model, data, out, *extra):
    r = trtq(["calibrate", "--model", model, "--data", data, "-o", out, *extra])
    assert r.code == 0, r
    return r


def test_max_equals_an_independent_max_abs(trtq, mlp, tmp_path):
    model, data, x, weights = mlp
    out = tmp_path / "max.cache"
    _calibrate(trtq, model, data, out, "--method", "max", "--batch-size", "8")
    table = read_cache(out)
    expected = {name: float(np.abs(a).max()) for name, a in _activations(x.astype(np.float64), weights).items()}
    assert list(table.amax) == ["x", "h_mm", "h add:1", "h_relu", "y"]
    for name, want in expected.items():
        # the cache holds float32 scale = amax / 127: float32 precision, nothing more
        assert table.amax[name] == pytest.approx(want, rel=2e-6), name
    assert table.algorithm == "MinMaxCalibration"


@pytest.mark.parametrize("method", ["entropy", "percentile", "mse"])
def test_same_cache_for_any_batch_size_and_order(trtq, mlp, tmp_path, method):
    model, data, x, _ = mlp
    caches = []
    for i, extra in enumerate(
        [
            ["--batch-size", "1"],
            ["--batch-size", "8"],
            ["--batch-size", "32"],
            ["--batch-size", "10"],  # last batch padded: the padding is not counted
            ["--batch-size", "8", "--shuffle", "--seed", "7"],
        ]
    ):
        out = tmp_path / f"{method}{i}.cache"
        _calibrate(trtq, model, data, out, "--method", method, *extra)
        caches.append(out.read_bytes())
    assert all(c == caches[0] for c in caches[1:])
    table = read_cache(tmp_path / f"{method}0.cache")
    # never above max|x|; entropy clips this heavy tail well below it
    assert table.amax["x"] <= float(np.abs(x).max()) * (1 + 1e-6)
    if method == "entropy":
        assert table.amax["x"] < float(np.abs(x).max()) * 0.9


def test_sharded_npy_gives_the_same_cache(trtq, mlp, tmp_path):
    model, data, x, _ = mlp
    np.save(tmp_path / "shard_a.npy", x[:40])
    np.save(tmp_path / "shard_b.npy", x[40:])
    _calibrate(trtq, model, data, tmp_path / "one.cache", "--batch-size", "8")
    _calibrate(trtq, model, tmp_path / "shard_*.npy", tmp_path / "two.cache", "--batch-size", "8")
    assert (tmp_path / "one.cache").read_bytes() == (tmp_path / "two.cache").read_bytes()


def test_from_stats_equals_a_direct_run(trtq, mlp, tmp_path):
    model, data, _, _ = mlp
    # two-pass histograms over [0, max] (max, entropy) and one-pass power-of-two ones (mse, percentile)
    stats = tmp_path / "stats.npz"
    _calibrate(trtq, model, data, tmp_path / "max.cache", "--method", "max", "--save-stats", stats)
    assert stats.exists()
    one_pass = tmp_path / "one_pass.npz"
    _calibrate(trtq, model, data, tmp_path / "mse.cache", "--method", "mse", "--save-stats", one_pass)
    sources = {"entropy": stats, "max": stats, "percentile": one_pass, "mse": one_pass}
    for method in ("entropy", "percentile", "mse", "max"):
        direct = tmp_path / f"direct_{method}.cache"
        _calibrate(trtq, model, data, direct, "--method", method)
        later = tmp_path / f"later_{method}.cache"
        r = trtq(["calibrate", "--from-stats", sources[method], "--method", method, "--model", model, "-o", later])
        assert r.code == 0, r
        assert later.read_bytes() == direct.read_bytes(), method
        assert read_provenance(later)["model"]["sha256"] == sha256_file(model)
    r = trtq(["calibrate", "--from-stats", one_pass, "--method", "max", "--model", model, "-o", tmp_path / "m2"])
    assert r.code == 0 and (tmp_path / "m2").read_bytes() == (tmp_path / "direct_max.cache").read_bytes()
    r = trtq(["calibrate", "--from-stats", one_pass, "--method", "entropy", "--model", model, "-o", tmp_path / "e2"])
    assert r.code == 3 and "one-pass histograms" in r.err and "--method entropy --save-stats" in r.err
    assert not (tmp_path / "e2").exists()
    other = tmp_path / "other.onnx"
    _mlp(other, seed=5)
    r = trtq(["calibrate", "--from-stats", stats, "--model", other, "-o", tmp_path / "x.cache"])
    assert r.code == 3 and "different model" in r.err
    assert not (tmp_path / "x.cache").exists()


def test_provenance_describes_the_run(trtq, mlp, tmp_path):
    model, data, _, _ = mlp
    out = tmp_path / "c.cache"
    r = _calibrate(
        trtq, model, data, out, "--method", "percentile", "--percentile", "99.9", "--trt-version", "8.6.1", "--json"
    )
    result = json.loads(r.out)
    assert result["samples"] == 64 and result["tensors"] == 5 and result["cache"] == str(out)
    table = read_cache(out)
    assert table.trt_version.startswith("8.6") and table.algorithm == "EntropyCalibration2"
    assert out.read_text().splitlines()[0] == "TRT-8601-EntropyCalibration2"
    prov = json.loads(Path(f"{out}.json").read_text())
    assert prov["model"]["sha256"] == sha256_file(model)
    assert prov["model"]["inputs"] == [{"name": "x", "shape": ["N", 16], "dtype": "float32"}]
    assert prov["data"]["samples"] == 64 and prov["data"]["fingerprint"]
    assert prov["method"] == {"name": "percentile", "percentile": 99.9, "num_bins": 2048}
    assert provenance_matches_cache(prov, table.amax)
    # files get the usual mode, not mkstemp's 0600
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_tensors_subset_and_unknown_tensor(trtq, mlp, tmp_path):
    model, data, _, _ = mlp
    out = tmp_path / "sub.cache"
    _calibrate(trtq, model, data, out, "--tensors", "h_relu,x")
    assert list(read_cache(out).amax) == ["x", "h_relu"]  # model order, not the order given
    bad = tmp_path / "bad.cache"
    r = trtq(["calibrate", "--model", model, "--data", data, "-o", bad, "--tensors", "nope"])
    assert r.code == 3 and "nope" in r.err and r.err.count("\n") == 1
    assert not bad.exists()


def test_non_finite_activation_names_the_tensor(trtq, tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["log_x"]), helper.make_node("Relu", ["log_x"], ["y"])],
        "log",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = tmp_path / "log.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=IR_VERSION), str(model))
    data = tmp_path / "x.npy"
    np.save(data, np.array([[1, 2, 3, 4], [0.5, 0, 1, 1]], dtype=np.float32))  # log(0) = -inf
    out = tmp_path / "c.cache"
    r = trtq(["calibrate", "--model", model, "--data", data, "-o", out, "--batch-size", "1"])
    assert r.code == 3, r
    from trtq.progress import is_progress_line

    assert "log_x" in r.err and "Traceback" not in r.err
    assert len([ln for ln in r.err.splitlines() if not is_progress_line(ln)]) == 1  # the one error line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.onnx", "x.npy"]


def test_failed_run_leaves_the_previous_cache(trtq, mlp, tmp_path):
    model, data, x, _ = mlp
    out = tmp_path / "c.cache"
    _calibrate(trtq, model, data, out)
    before = (out.read_bytes(), Path(f"{out}.json").read_bytes())
    bad = tmp_path / "bad.npy"
    np.save(bad, x[:, :15])  # wrong shape
    r = trtq(["calibrate", "--model", model, "--data", bad, "-o", out])
    assert r.code == 3 and "bad.npy" in r.err
    assert (out.read_bytes(), Path(f"{out}.json").read_bytes()) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_ctrl_c_exits_130_and_keeps_the_previous_cache(mlp, tmp_path):
    model, data, x, _ = mlp
    out = tmp_path / "c.cache"
    env = repo_env()
    base = [sys.executable, "-m", "trtq", "calibrate", "--model", str(model), "-o", str(out)]
    r = subprocess.run(base + ["--data", str(data)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    before = (out.read_bytes(), Path(f"{out}.json").read_bytes())
    big = tmp_path / "big.npy"
    np.save(big, np.tile(x, (3000, 1)))  # 192k rows at batch 1: far longer than the test waits
    p = subprocess.Popen(
        base + ["--data", str(big), "--batch-size", "1", "--progress"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = p.stderr.readline()  # the first progress line: the model is running
        assert "pass 1/1 (histogram)" in line, line  # mse: one pass
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert (out.read_bytes(), Path(f"{out}.json").read_bytes()) == before
    assert sorted(q.name for q in tmp_path.iterdir()) == ["big.npy", "c.cache", "c.cache.json", "mlp.onnx", "x.npy"]


def test_dry_run_on_the_sample_writes_nothing(trtq, sample_model, sample_images, tmp_path):
    out = tmp_path / "out" / "c.cache"
    r = trtq(
        [
            "calibrate",
            "--model",
            sample_model,
            "--data",
            sample_images,
            "--preprocess",
            "imagenet",
            "--batch-size",
            "8",
            "--limit",
            "16",
            "-o",
            out,
            "--dry-run",
            "--json",
        ]
    )
    assert r.code == 0, r
    d = json.loads(r.out)
    assert d["inputs"][0]["name"] == "x" and d["inputs"][0]["dtype"] == "float32"
    assert d["summary"]["samples"] == 16 and d["summary"]["batches"] == 2
    assert not (tmp_path / "out").exists()


def test_sample_model_with_its_config(trtq, sample_config, tmp_path):
    out = tmp_path / "sample.cache"
    r = trtq(["calibrate", "--config", sample_config, "-o", out, "--limit", "16"])
    assert r.code == 0, r
    assert "calibrated 16 samples (2 batches) with mse" in r.out and str(out) in r.out
    table = read_cache(out)
    assert table.algorithm == "EntropyCalibration2" and len(table.amax) > 50
    assert all(a > 0 for a in table.amax.values())
    # every tensor the quantizer needs is there: quantize reports nothing missing
    r = trtq(["quantize", "--config", sample_config, "--cache", out, "-o", tmp_path / "q.onnx", "--json"])
    assert r.code == 0, r
    assert json.loads(r.out)["missing_amax"] == []


def test_stale_cache_is_refused_unless_allowed(trtq, mlp, tmp_path):
    model, data, _, _ = mlp
    out = tmp_path / "c.cache"
    _calibrate(trtq, model, data, out, "--method", "max")
    other = tmp_path / "other.onnx"
    _mlp(other, seed=9)  # same tensor names, other weights
    q = tmp_path / "q.onnx"
    r = trtq(["quantize", "--model", other, "--cache", out, "-o", q])
    assert r.code == 3 and "different model" in r.err and "--allow-stale" in r.err
    assert not q.exists()
    r = trtq(["quantize", "--model", other, "--cache", out, "-o", q, "--allow-stale"])
    # past the stale check, quantization itself runs: this MLP's layers are below INT8 kernel sizes,
    # and a model that comes out with no Q/DQ at all is refused for that reason
    assert r.code == 3 and "different model" not in r.err and "quantized 0 of its 2" in r.err, r
    assert "too small for INT8 kernels" in r.err and not q.exists()


def test_compare_gate_failure_exits_1(trtq, mlp, tmp_path):
    model, data, _, _ = mlp
    other = tmp_path / "other.onnx"
    _mlp(other, seed=3)
    r = trtq(["compare", "--reference", model, "--candidate", other, "--data", data, "--min-cosine", "0.999"])
    assert r.code == 1, r
    assert "accuracy gate failed" in r.err
    r = trtq(["compare", "--reference", model, "--candidate", model, "--data", data, "--min-cosine", "0.999"])
    assert r.code == 0, r


def test_tensorrt_backend_keeps_an_explicit_method(trtq, mlp, tmp_path):
    """A config's method: mse is not silently swapped for entropy by --backend tensorrt."""
    model, data, _, _ = mlp
    cfg = tmp_path / "c.yaml"
    cfg.write_text("calibrate: {method: mse}\n")
    r = trtq(
        [
            "calibrate",
            "--config",
            cfg,
            "--model",
            model,
            "--data",
            data,
            "--backend",
            "tensorrt",
            "-o",
            tmp_path / "c.cache",
        ]
    )
    assert r.code == 2 and "supports --method max or entropy, not mse" in r.err
    assert not (tmp_path / "c.cache").exists()
