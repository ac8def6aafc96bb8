"""INT8 coverage of real engines (TensorRT + GPU): trtq build's coverage agrees with the engine's
own inspector list and profile, and --require-int8 fails exactly when a layer fell back.

Models: the residual CNN of tests/trt/models.py quantized by trtq (a Q/DQ file built as it is) and
the bundled sample classifier built from a cache (explicit: trtq places the Q/DQ; its hardswish /
SE layers stay float between INT8 convolutions, the case --require-int8 is for).
"""

import json
from pathlib import Path

import pytest

from tests.trt.models import TACTICS, build_residual_and_sample, gpu_build_options, residual_cnn

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (BuildResult, the inspector's layer list, the profiled times)} for both models."""
    from trtq.trt.layers import measure_layers

    out = {}
    for name, res in build_residual_and_sample(tmp_path_factory.mktemp("coverage"), seed=3).items():
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
