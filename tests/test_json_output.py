"""One rule for ``--json``: stdout holds exactly one JSON object, the result or, when a command
fails before it has one, ``{"error": ..., "exit_code": N}`` (trtq.cli.process), so that
``trtq CMD --json > out.json`` leaves valid JSON on a machine without TensorRT too."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SAMPLE_CONFIG, have_tensorrt


def _one_object(out: str) -> dict:
    data = json.loads(out)  # one document: a second object would not parse
    assert isinstance(data, dict)
    return data


def test_a_failure_with_json_is_a_json_error_on_stdout(trtq, tmp_path):
    r = trtq(["bench", tmp_path / "missing.plan", "--json"])
    assert r.code == 3
    data = _one_object(r.out)
    assert data["exit_code"] == 3 and "engine not found" in data["error"]
    assert f"trtq: error: {data['error']}" in r.err  # the same line as on stderr


def test_usage_errors_and_every_command_follow_the_rule(trtq, tmp_path):
    r = trtq(["calibrate", "--json", "--method", "nosuch"])
    assert r.code == 2 and _one_object(r.out)["exit_code"] == 2
    r = trtq(["inspect-cache", tmp_path / "none.cache", "--json"])
    assert r.code == 3 and "none.cache" in _one_object(r.out)["error"]
    r = trtq(["report", "--cache", tmp_path / "none.cache", "--json", "-o", tmp_path / "r.html"])
    assert r.code == 3 and _one_object(r.out)["exit_code"] == 3


def test_without_json_stdout_stays_empty_on_failure(trtq, tmp_path):
    r = trtq(["bench", tmp_path / "missing.plan"])
    assert r.code == 3 and r.out == ""


@pytest.mark.skipif(have_tensorrt(), reason="needs a machine without TensorRT")
def test_bench_without_tensorrt_writes_json(trtq, tmp_path):
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"not an engine")
    r = trtq(["bench", plan, "--json"])
    assert r.code == 4
    data = _one_object(r.out)
    assert data["exit_code"] == 4 and "TensorRT" in data["error"]
    # and report says what such a file is, instead of "not the JSON of trtq bench"
    bench = tmp_path / "bench.json"
    bench.write_text(r.out, encoding="utf-8")
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "-c", SAMPLE_CONFIG, "--limit", "8", "-o", cache, "-q"]).code == 0
    r = trtq(["report", "--cache", cache, "--bench", bench, "-o", tmp_path / "r.html"])
    assert r.code == 3 and "failed trtq bench run (exit 4" in r.err


@pytest.mark.slow
def test_a_failed_gate_keeps_its_result_as_the_one_object(trtq, tmp_path):
    cache, qdq = tmp_path / "c.cache", tmp_path / "m.qdq.onnx"
    assert trtq(["calibrate", "-c", SAMPLE_CONFIG, "--limit", "8", "-o", cache, "-q"]).code == 0
    assert trtq(["quantize", "-c", SAMPLE_CONFIG, "--cache", cache, "-o", qdq, "-q"]).code == 0
    r = trtq(["compare", "-c", SAMPLE_CONFIG, "--candidate", qdq, "--limit", "8", "--min-agreement", "0.99", "--json"])
    assert r.code == 1
    data = _one_object(r.out)
    assert "error" not in data and "reference" in data
    assert "accuracy gate failed" in r.err
