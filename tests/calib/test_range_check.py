"""The range check: a method's ranges against mse's expected INT8 error on the same histograms."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import SAMPLE_MODEL
from trtq.calib.range_check import RATIO, clipped_fraction, quantization_error, range_flags


def _by_hand(counts, top, amax):
    """The error model written out: every value at its bin centre, rounded to amax/127, clipped."""
    width = top / len(counts)
    total = 0.0
    for b, c in enumerate(counts):
        x = (b + 0.5) * width
        level = min(round(x / (amax / 127)), 127)
        total += c * (x - level * amax / 127) ** 2
    return total


def test_error_and_clipping_follow_the_model():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, 256)
    for amax in (0.3, 1.0, 2.7, 4.0):
        assert quantization_error(counts, 4.0, amax) == pytest.approx(_by_hand(counts, 4.0, amax), rel=1e-9)
    x = (np.arange(256) + 0.5) * (4.0 / 256)
    assert clipped_fraction(counts, 4.0, 1.0) == pytest.approx(counts[x > 1.0].sum() / counts.sum())


def test_a_range_that_clips_what_matters_and_one_spread_over_an_outlier_are_flagged():
    """Bulk in [0, 1) plus a tail to 8 that holds much of the energy: a range of 1 clips it. One
    outlier at 1000 beside 13M values below 64: a range of 1000 leaves the bulk 8 levels. mse's
    own ranges are never flagged."""
    from trtq.calib.methods import compute_all

    tail = np.zeros(2048, np.int64)
    tail[:256] = 1000  # [0, 1) of [0, 8)
    tail[256:] = 40
    spike = np.zeros(2048, np.int64)
    spike[:130] = 100_000  # 13M values below 64
    spike[-1] = 1
    maxima, counts = {"tail": 8.0, "spike": 1000.0}, {"tail": tail, "spike": spike}
    mse = compute_all("mse", maxima, counts)
    assert mse["tail"] > 7 and mse["spike"] < 100
    flags = range_flags({"tail": 1.0, "spike": 1000.0}, mse, maxima, counts)
    assert {f.tensor for f in flags} == {"tail", "spike"} and flags[0].ratio >= flags[1].ratio
    by_name = {f.tensor: f for f in flags}
    assert by_name["tail"].clipped > 0.1 and by_name["tail"].mse_clipped < 0.01
    assert by_name["spike"].clipped == 0.0 and by_name["spike"].ratio > RATIO
    assert by_name["spike"].ratio == pytest.approx(
        _by_hand(spike, 1000.0, 1000.0) / _by_hand(spike, 1000.0, mse["spike"])
    )
    assert range_flags(mse, mse, maxima, counts) == []


def _model(path):
    """x [N, 4096] -> MatMul(4096x32) -> y: one quantized activation (x) with a rare outlier."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.normal(0, 0.02, (4096, 32)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


@pytest.fixture
def files(tmp_path):
    _model(tmp_path / "m.onnx")
    x = np.random.default_rng(2).normal(0, 1, (512, 4096)).astype(np.float32)
    x[0, 0] = 40.0  # one value in 2M: max stretches the 127 levels to 40, 8x the bulk
    np.save(tmp_path / "x.npy", x)
    return tmp_path / "m.onnx", tmp_path / "x.npy"


def test_max_over_an_outlier_is_flagged_in_the_result_and_the_log(trtq, tmp_path, files):
    model, data = files
    r = trtq(["calibrate", "--model", model, "--data", data, "--method", "max", "-o", tmp_path / "max.cache", "--json"])
    assert r.code == 0, r
    flags = json.loads(r.out)["range_flags"]
    assert [f["tensor"] for f in flags] == ["x"] and flags[0]["error_vs_mse"] > RATIO
    assert flags[0]["clipped"] < 1e-5  # max clips nothing (but the bin centre past it): its step is the problem
    assert "max ranges cost more than 10x mse's expected INT8 error on 1 of the 1 tensors" in r.err
    text = trtq(["calibrate", "--model", model, "--data", data, "--method", "max", "-o", tmp_path / "m2.cache"])
    assert "ranges      max: 1 quantized tensor(s)" in text.out and "consider --method mse" in text.out
    ok = trtq(["calibrate", "--model", model, "--data", data, "-o", tmp_path / "mse.cache", "--json"])
    assert ok.code == 0 and json.loads(ok.out)["range_flags"] == [] and "WARNING" not in ok.err


def test_entropy_flags_agree_with_the_saved_histograms(trtq, tmp_path, sample_config):
    """On the sample (a real PP-LCNet classifier, real photos) entropy clips some hard-swish outputs;
    each flag's ratio is recomputed by hand from the --save-stats histograms, and only tensors the
    Q/DQ model quantizes are named."""
    from trtq.calib.methods import compute_all
    from trtq.calib.stats import load_stats
    from trtq.config import QuantizeOptions
    from trtq.model import load_model
    from trtq.quantize import planned_activations

    stats = tmp_path / "s.npz"
    r = trtq(
        [
            "calibrate",
            "--config",
            sample_config,
            "--method",
            "entropy",
            "-o",
            tmp_path / "e.cache",
            "--save-stats",
            stats,
            "--json",
        ]
    )
    assert r.code == 0, r
    flags = json.loads(r.out)["range_flags"]
    assert flags, "entropy clips on the sample"
    saved = load_stats(stats)
    amax = compute_all("entropy", saved.maxima, saved.counts, zeros=saved.zeros)
    mse = compute_all("mse", saved.maxima, saved.counts, zeros=saved.zeros)
    placement = QuantizeOptions().placement_used()  # the config's placement
    quantized = set(planned_activations(load_model(SAMPLE_MODEL), (placement,)))
    for f in flags:
        name = f["tensor"]
        assert name in quantized
        counts, top = saved.counts[name], saved.maxima[name]
        ratio = _by_hand(counts, top, amax[name]) / _by_hand(counts, top, mse[name])
        assert f["error_vs_mse"] == pytest.approx(ratio, rel=1e-3) and ratio > RATIO
    unflagged = [n for n in quantized if n not in {f["tensor"] for f in flags}]
    worst_unflagged = max(
        _by_hand(saved.counts[n], saved.maxima[n], amax[n])
        / max(_by_hand(saved.counts[n], saved.maxima[n], mse[n]), 1e-30)
        for n in unflagged
    )
    assert worst_unflagged <= RATIO


def test_an_all_but_zero_activation_is_floored_not_a_refused_cache(trtq, tmp_path):
    """An untrained BatchNorm leaves activations of 1e-10: its scale would be below what a cache
    can hold. The tensor is floored like an all-zero one and named; the cache is written."""
    from trtq.calib.cache import read_cache
    from trtq.calib.methods import MIN_AMAX

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (16, 16)).astype(np.float32), "w")
    tiny = numpy_helper.from_array(np.array(1e-10, np.float32), "tiny")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "tiny"], ["small"], name="shrink"),
            helper.make_node("MatMul", ["small", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        [w, tiny],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(tmp_path / "m.onnx")
    )
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (16, 16)).astype(np.float32))
    r = trtq(
        [
            "calibrate",
            "--model",
            tmp_path / "m.onnx",
            "--data",
            tmp_path / "x.npy",
            "-o",
            tmp_path / "c.cache",
            "--json",
        ]
    )
    assert r.code == 0, r
    out = json.loads(r.out)
    assert "small" in out["zero_tensors"] and "x" not in out["zero_tensors"]
    amax = read_cache(tmp_path / "c.cache").amax
    assert amax["small"] == pytest.approx(MIN_AMAX, rel=1e-6) and amax["x"] > 1
