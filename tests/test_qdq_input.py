"""Q/DQ models as input to calibrate, inspect-cache and compare (build: tests/trt/test_build_cpu.py)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.trt.models import activation_amax, qat_style_cnn, residual_cnn, write_trt_cache
from trtq.compare.accuracy import CompareReport
from trtq.compare.metrics import OutputMetrics
from trtq.compare.onnx_runner import QDQ_CHANGING_OPTIMIZERS, OnnxRunner
from trtq.compare.semantics import semantics_gaps
from trtq.quantize import quantize_model
from trtq.quantize.fp16 import cast_float_rest


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdqin")
    fp32 = residual_cnn(d / "fp32.onnx", batch="N")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 3, 16, 16)).astype(np.float32)
    np.save(d / "x.npy", x)
    amax = activation_amax(fp32, [{"x": x}])
    cache = write_trt_cache(d / "c.cache", amax, "MinMaxCalibration", "8600")
    other = write_trt_cache(d / "other.cache", {k: v * 1.5 for k, v in amax.items()}, "MinMaxCalibration", "8600")
    onnx.save(quantize_model(onnx.load(str(fp32)), amax).model, str(d / "q.onnx"))
    return {"dir": d, "fp32": fp32, "x": x, "cache": cache, "other": other, "qdq": d / "q.onnx"}


def test_calibrate_refuses_a_quantized_model(files, trtq):
    r = trtq(
        [
            "calibrate",
            "--model",
            files["qdq"],
            "--data",
            f"x={files['dir'] / 'x.npy'}",
            "-o",
            files["dir"] / "new.cache",
        ]
    )
    assert r.code == 3, r
    assert "already quantized" in r.err and "trtq build --model q.onnx" in r.err
    assert not (files["dir"] / "new.cache").exists()


def test_inspect_cache_checks_a_qdq_model_against_the_cache(files, trtq):
    r = trtq(["inspect-cache", files["cache"], "--model", files["qdq"], "--json"])
    assert r.code == 0, r
    check = json.loads(r.out)["model_check"]
    assert check["qdq_model"] and check["verdict"] == "qdq-same" and check["model_tensors"] >= 3
    assert check["covered"] == check["model_tensors"] and check["missing_from_cache"] == []
    r = trtq(["inspect-cache", files["other"], "--model", files["qdq"]])
    assert "verdict    qdq-differs" in r.out and "differ " in r.out


def test_inspect_cache_on_a_qat_model_names_what_the_cache_lacks(files, tmp_path, trtq):
    qat = qat_style_cnn(tmp_path / "qat.onnx")  # scales of its own: x 3.5, r1 2.0, f 1.5
    cache = write_trt_cache(tmp_path / "qat.cache", {"x": 3.5, "r1": 2.0}, "MinMaxCalibration", "8600")
    r = trtq(["inspect-cache", cache, "--model", qat, "--json"])
    check = json.loads(r.out)["model_check"]
    assert check["verdict"] == "qdq-differs" and check["missing_from_cache"] == ["f"] and check["differing"] == []


def test_qdq_semantics_are_onnxruntime_basic_optimizations(files):
    """The default runner of a Q/DQ model gives exactly what a basic-optimizations session gives
    (less the transformers that change a Q/DQ model's numbers: D40)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        str(files["qdq"]), so, providers=["CPUExecutionProvider"], disabled_optimizers=list(QDQ_CHANGING_OPTIMIZERS)
    )
    want = session.run(None, {"x": files["x"]})[0]
    with OnnxRunner.from_path(files["qdq"]) as r:
        assert r.semantics == "qdq" and "Q/DQ semantics" in r.describe_runtime()
        np.testing.assert_array_equal(r.run({"x": files["x"]})["y"], want)
    with OnnxRunner.from_path(files["qdq"], semantics="onnxruntime") as r:
        assert "as ONNX Runtime deploys it" in r.describe_runtime()
    with OnnxRunner.from_path(files["fp32"]) as r:  # no Q/DQ: nothing to say about semantics
        assert r.semantics is None and "semantics" not in r.describe_runtime()


@pytest.mark.parametrize("semantics", ["qdq", "onnxruntime"])
def test_compare_reports_its_runtime_and_the_other_semantics(files, trtq, semantics):
    r = trtq(
        [
            "compare",
            "--reference",
            files["fp32"],
            "--candidate",
            files["qdq"],
            "--data",
            f"x={files['dir'] / 'x.npy'}",
            "--batch-size",
            "4",
            "--semantics",
            semantics,
            "--json",
        ]
    )
    assert r.code == 0, r
    out = json.loads(r.out)
    first, second = ("Q/DQ semantics", "as ONNX Runtime deploys it")[:: 1 if semantics == "qdq" else -1]
    assert first in out["runtime"] and second in out["other_semantics"]["runtime"]
    assert out["other_semantics"]["outputs"][0]["name"] == "y"
    r = trtq(
        [
            "compare",
            "--reference",
            files["fp32"],
            "--candidate",
            files["qdq"],
            "--data",
            f"x={files['dir'] / 'x.npy'}",
            "--batch-size",
            "4",
            "--semantics",
            semantics,
        ]
    )
    assert f"runtime    ONNX Runtime {ort.__version__}" in r.out


def _report(top1, sqnr, runtime):
    o = OutputMetrics(
        name="y",
        sample_shape=(10,),
        samples=100,
        top1_agreement=top1,
        top1_matches=int(top1 * 100),
        cosine_mean=0.99,
        cosine_min=0.9,
        max_abs_error=1.0,
        mean_abs_error=0.1,
        sqnr_db=sqnr,
        ref_max_abs=5.0,
        nonfinite=0,
    )
    return CompareReport("a", "b", 100, 4, (o,), runtime=runtime)


def test_semantics_gap_warning_only_beyond_noise():
    a = _report(0.90, 17.2, "qdq")
    assert semantics_gaps(a, _report(0.895, 16.5, "ort"), "qdq", "onnxruntime") == []
    (line,) = semantics_gaps(a, _report(0.33, 1.8, "ort"), "qdq", "onnxruntime")
    assert "top-1 agreement 0.9000 vs 0.3300" in line and "SQNR 17.20 vs 1.80 dB" in line
    (line,) = semantics_gaps(a, _report(0.90, 15.0, "ort"), "qdq", "onnxruntime")
    assert "top-1" not in line and "SQNR" in line
    assert semantics_gaps(_report(1.0, float("inf"), "x"), _report(1.0, float("inf"), "y"), "qdq", "onnxruntime") == []


def test_compare_float_rest_fp16_runs_the_rest_as_float16(files, trtq):
    """--float-rest fp16 scores an .onnx candidate with everything outside its Q/DQ pairs cast to
    float16, as an engine built with --fp16 runs it: the FP32 model against itself is no longer
    exact, by what the cast model gives in ONNX Runtime; the Q/DQ candidate keeps its pairs; the
    report's runtime line says it."""
    base = ["compare", "--reference", files["fp32"], "--data", f"x={files['dir'] / 'x.npy'}", "--json"]
    plain = json.loads(trtq([*base, "--candidate", files["fp32"]]).out)
    assert plain["outputs"][0]["max_abs_error"] == 0
    r = trtq([*base, "--candidate", files["fp32"], "--float-rest", "fp16"])
    assert r.code == 0, r
    half = json.loads(r.out)
    assert "float rest cast to FP16" in half["runtime"] and "float rest" not in plain["runtime"]
    ref = OnnxRunner.from_path(files["fp32"]).run({"x": files["x"]})["y"]
    cast = OnnxRunner.from_model(cast_float_rest(onnx.load(str(files["fp32"])))).run({"x": files["x"]})["y"]
    want = float(np.abs(cast - ref).max())
    assert want > 1e-4 and half["outputs"][0]["max_abs_error"] == pytest.approx(want, rel=0.05)
    q = json.loads(trtq([*base, "--candidate", files["qdq"], "--float-rest", "fp16"]).out)
    assert "Q/DQ semantics" in q["runtime"] and "float rest cast to FP16" in q["runtime"]


def test_compare_float_rest_refuses_an_engine(files, tmp_path, trtq):
    plan = tmp_path / "e.plan"
    plan.write_bytes(b"not an engine")
    r = trtq(
        ["compare", "--reference", files["fp32"], "--candidate", plan, "--data", f"x={files['dir'] / 'x.npy'}"]
        + ["--float-rest", "fp16"]
    )
    assert r.code == 2 and "applies to .onnx candidates" in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1
