"""build --tune-placement on a real engine (TensorRT + GPU): the bundled sample classifier (its
hardswish / SE layers fall back to float between INT8 convolutions) from an mse cache of its
sample images, through the CLI. The search builds at most --tune-builds candidates, keeps one within
the tolerance, and the kept engine is the one it scored: trtq compare of the written plan gives the
metric the search recorded for it, and bench runs it. The FP16 reference without Q/DQ is built,
timed beside the kept engine and reported, or written with --tune-float keep when faster; TensorRT's
implicit engine is built and what it ran in float is tried as a candidate."""

import json
from pathlib import Path

import pytest

from tests.trt.models import TACTICS
from trtq.config import QuantizeOptions
from trtq.pipeline.tune_candidates import MIN_GAIN

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "sample.yaml"


ENGINE = ["--optimization-level", "0", "--tactic-sources", ",".join(TACTICS), "--workspace-mb", "1024"]


@pytest.fixture(scope="module")
def sample_cache(tmp_path_factory):
    """An mse cache of the sample images, calibrated once for this module's searches."""
    from trtq.cli import main

    cache = tmp_path_factory.mktemp("tune") / "sample.cache"
    try:
        main(["calibrate", "--config", str(CONFIG), "-o", str(cache), "-q"])
        code = 0
    except SystemExit as e:
        code = e.code
    assert code in (0, None) and cache.is_file(), code
    return cache


def _compared_metric(trtq, plan):
    """trtq compare's gate metric (or top-1 agreement) of the written plan against the FP32 model."""
    res = trtq(["compare", "--config", CONFIG, "--candidate", plan, "--json", "-q"])
    assert res.code == 0, res
    report = json.loads(res.out)
    task = report["outputs"][0]["task"]
    return (
        task["metrics"][task["gate_metric"]]
        if task and task.get("gate_metric")
        else report["outputs"][0]["top1_agreement"]
    )


def test_tune_placement_keeps_a_scored_candidate_within_the_tolerance(trtq, tmp_path, sample_cache):
    cache = sample_cache
    plan = tmp_path / "tuned.plan"
    res = trtq(
        ["build", "--config", CONFIG, "--cache", cache, "--tune-placement", "--tune-builds", "4", "-o", plan, "--json"]
        + ENGINE
    )
    assert res.code == 0, res
    out = json.loads(res.out)
    tuning = out["metadata"]["tuning"]
    assert tuning == json.loads((tmp_path / "tuned.plan.json").read_text())["tuning"]
    cands = tuning["candidates"]
    built = [c for c in cands if c["median_ms"] is not None]
    assert 2 <= tuning["builds"] <= 4 and len(built) >= 2, tuning
    # the sample config names no placement: the default (auto) is shared, and standard is tried next
    assert cands[0]["verdict"] == "default" and cands[0]["placement"] == QuantizeOptions().placement_used() == "shared"
    assert {c["placement"] for c in cands} >= {"standard", "shared"}
    chosen = tuning["chosen"]
    kept = [c for c in built if c["placement"] == chosen["placement"] and c["left_float"] == chosen["left_float"]]
    assert len(kept) == 1, tuning
    kept = kept[0]
    assert kept["metric"] >= tuning["default_metric"] - tuning["tolerance"] - 1e-9
    assert kept["verdict"] in ("default", "kept") or kept["verdict"].startswith("replaced"), kept
    # every candidate that replaced the best was faster than it by the margin, so the kept engine
    # is no slower than the default as timed side by side
    assert kept["median_ms"] <= cands[0]["median_ms"] * 1.05, tuning
    assert out["int8_coverage"] is not None
    # the guided candidate: TensorRT 8.6 has implicit INT8, so its engine was built, timed and read
    implicit = tuning["implicit"]
    assert implicit["median_ms"] > 0 and implicit["best_ms"] > 0 and implicit["build_seconds"] > 0, implicit
    guided = [c for c in cands if c["source"] == "implicit"]
    assert len(guided) == (1 if implicit["float_nodes"] else 0), tuning
    if guided:
        assert len(guided[0]["left_float"]) >= implicit["float_nodes"] and guided[0]["verdict"], guided
    # the FP16 reference (--tune-float report, the default): built, timed beside the kept engine,
    # scored, and never written
    ref = tuning["float_reference"]
    assert ref["precision"] == "fp16" and ref["median_ms"] > 0 and ref["int8_median_ms"] > 0, ref
    assert ref["metric"] >= tuning["default_metric"] - 0.05, ref  # FP16 is at least as close to FP32
    assert chosen["precision"] == "int8" and out["metadata"]["precision"] == "int8"
    reported = ref["median_ms"] <= ref["int8_median_ms"] * (1 - MIN_GAIN)
    assert ref["verdict"].startswith("faster") == reported, ref
    assert ("INT8 does not pay" in res.err) == ref["verdict"].endswith("writes it)"), res.err
    # the written engine is the scored one: compare gives the recorded metric
    value = _compared_metric(trtq, plan)
    assert value == pytest.approx(kept["metric"], abs=1e-6), (value, kept)
    res = trtq(["bench", plan, "--duration", "0.3", "--json", "-q"])
    assert res.code == 0, res
    assert json.loads(res.out)[0]["median_ms"] > 0


def test_tune_float_keep_writes_the_faster_engine_it_scored(trtq, tmp_path, sample_cache):
    plan = tmp_path / "kept.plan"
    args = ["build", "--config", CONFIG, "--cache", sample_cache, "--tune-placement", "--tune-builds", "2"]
    res = trtq(args + ["--tune-float", "keep", "-o", plan, "--json"] + ENGINE)
    assert res.code == 0, res
    out = json.loads(res.out)
    tuning = out["metadata"]["tuning"]
    ref, chosen = tuning["float_reference"], tuning["chosen"]
    fp16_kept = ref["verdict"].startswith("kept")
    # kept exactly when it was faster by the margin (its metric is FP16's: within any tolerance here)
    assert fp16_kept == (ref["median_ms"] <= ref["int8_median_ms"] * (1 - MIN_GAIN)), ref
    assert chosen["precision"] == out["metadata"]["precision"] == ("fp16" if fp16_kept else "int8"), tuning
    assert (out["int8_coverage"] is None) == fp16_kept
    int8 = [c for c in tuning["candidates"] if c["placement"] == chosen["placement"] and c["median_ms"] is not None]
    expected = ref["metric"] if fp16_kept else int8[0]["metric"]
    assert _compared_metric(trtq, plan) == pytest.approx(expected, abs=1e-6), tuning
