"""Bench statistics, option checks and the text table (no GPU)."""

import sys

import pytest

from trtq.config import BenchOptions
from trtq.errors import ConfigError, EnvironmentMissing
from trtq.trt.bench import BenchResult, bench_plans, render_table, summarize
from trtq.trt.runtime import TrtRunner


def test_summarize_statistics():
    s = summarize(list(range(1, 101)), batch=8)  # 1..100 ms
    assert s["median_ms"] == 50.5 and s["mean_ms"] == 50.5
    assert s["min_ms"] == 1 and s["max_ms"] == 100
    assert s["p90_ms"] == pytest.approx(90.1)  # linear interpolation: 1 + 0.90 * 99
    assert s["p99_ms"] == pytest.approx(99.01)
    assert s["inferences_per_s"] == pytest.approx(1000 / 50.5)
    assert s["samples_per_s"] == pytest.approx(8 * 1000 / 50.5)


def _result(name, median, **kw):
    base = dict(
        plan=f"/x/{name}",
        precision="int8",
        batch=64,
        input_shapes={"x": [64, 3, 224, 224]},
        iterations=100,
        median_ms=median,
        mean_ms=median,
        p90_ms=median,
        p95_ms=median,
        p99_ms=median,
        min_ms=median,
        max_ms=median,
        inferences_per_s=1000 / median,
        samples_per_s=64000 / median,
        include_copies=False,
        cuda_graph=False,
        tensorrt_version="8.6.0",
        gpu_name="GPU",
    )
    base.update(kw)
    return BenchResult(**base)


def test_render_table_and_dict():
    a = _result("fp32.plan", 2.0, precision="fp32")
    b = _result("int8.plan", 1.0, speedup_vs_first=2.0, notes=["CUDA graph capture failed (x)"])
    text = render_table([a, b])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["plan", "prec", "batch"]
    assert "fp32.plan" in lines[2] and "1.00x" in lines[2]
    assert "int8.plan" in lines[3] and "2.00x" in lines[3] and "64,000" in lines[3]
    assert "note: int8.plan: CUDA graph capture failed" in text
    d = b.to_dict()
    assert d["speedup_vs_first"] == 2.0 and d["notes"] == ["CUDA graph capture failed (x)"]


@pytest.mark.parametrize("opts", [BenchOptions(iterations=0), BenchOptions(duration=0), BenchOptions(warmup=-1)])
def test_bad_bench_options(opts, tmp_path, monkeypatch):
    from trtq.trt.bench import _check_options

    with pytest.raises(ConfigError):
        _check_options(opts)


def test_bench_needs_plans():
    with pytest.raises(ConfigError):
        bench_plans([], BenchOptions())


def test_runner_without_tensorrt_is_exit_4(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    (tmp_path / "m.plan").write_bytes(b"plan")
    with pytest.raises(EnvironmentMissing) as info:
        TrtRunner(tmp_path / "m.plan")
    assert info.value.exit_code == 4


def test_layer_details_from_the_engine_inspector():
    """bench --layers reads precisions from the inspector's detailed JSON: INT8 and FP16 by name,
    TensorRT's long linear-float format as fp32; names-only entries (a plan built without detail)
    give nothing rather than guesses."""
    from trtq.trt.layers import _details

    layers = [
        {
            "Name": "conv1 + relu",
            "LayerType": "CaskConvolution",
            "TacticName": "sm90_xmma",
            "Inputs": [{"Name": "x", "Format/Datatype": "Channel major INT8 format where channel % 32 == 0"}],
            "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP32"}],
        },
        {
            "Name": "pool",
            "LayerType": "CaskPooling",
            "Inputs": [{"Format/Datatype": "Row major linear FP16 format"}],
            "Outputs": [{"Format/Datatype": "Int8 NC32"}],
        },
        "names only",
    ]
    d = _details(layers)
    assert d["conv1 + relu"] == {"kind": "CaskConvolution", "precision": "int8->fp32", "tactic": "sm90_xmma"}
    assert d["pool"]["precision"] == "fp16->int8"
    assert "names only" not in d


def test_render_layers_lists_the_slowest_then_the_rest():
    from trtq.trt.layers import LayerProfile, LayerTime, render_layers

    p = LayerProfile(
        "/x/m.plan",
        10,
        1.0,
        [LayerTime("a", 0.6, 0.6, "Conv", "int8->int8"), LayerTime("b", 0.3, 0.3), LayerTime("c", 0.1, 0.1)],
    )
    lines = render_layers([p], top=2).splitlines()
    assert lines[0].startswith("m.plan: 3 layers, 1.000 ms")
    assert "int8->int8" in lines[2] and lines[2].rstrip().endswith(" a")
    assert lines[3].rstrip().endswith(" b")
    assert "0.1000" in lines[4] and "(1 more layers)" in lines[4]
    assert lines[5] == "  by precision: int8->int8 0.600 ms (60.0%, 1), ? 0.400 ms (40.0%, 2)"


def test_bench_layers_needs_a_positive_count(tmp_path):
    import subprocess

    plan = tmp_path / "m.plan"
    plan.write_bytes(b"x")
    r = subprocess.run(
        [sys.executable, "-m", "trtq", "bench", "--layers", "0", str(plan)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "trtq: error: --layers must be a positive number of rows, got 0; e.g. --layers 30"
