"""quantize without --cache reads the cache calibrate writes with the same config (calibrate.output)."""

from __future__ import annotations

import yaml

from tests.conftest import SAMPLE_CONFIG, SAMPLE_IMAGES, SAMPLE_MODEL


def _config(tmp_path):
    raw = yaml.safe_load(SAMPLE_CONFIG.read_text())
    raw["model"] = str(SAMPLE_MODEL)
    raw["data"]["inputs"]["x"]["images"] = str(SAMPLE_IMAGES)
    raw["calibrate"]["output"] = str(tmp_path / "out" / "c.cache")
    raw["quantize"]["output"] = str(tmp_path / "out" / "m.qdq.onnx")
    raw.pop("build", None)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_quantize_reads_the_configs_calibrate_output(trtq, tmp_path):
    config = _config(tmp_path)
    missing = trtq(["quantize", "-c", config])
    assert missing.code == 3, missing
    assert "no --cache given, and " in missing.err and "c.cache (calibrate.output, from the config)" in missing.err
    assert trtq(["calibrate", "-c", config, "--limit", "8", "-q"]).code == 0
    r = trtq(["quantize", "-c", config, "--json"])
    assert r.code == 0, r
    implicit = (tmp_path / "out" / "m.qdq.onnx").read_bytes()
    given = trtq(["quantize", "-c", config, "--cache", tmp_path / "out" / "c.cache", "-o", tmp_path / "g.onnx"])
    assert given.code == 0 and (tmp_path / "g.onnx").read_bytes() == implicit


def test_without_a_config_the_default_is_named(trtq, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = trtq(["quantize", "--model", SAMPLE_MODEL, "-o", tmp_path / "q.onnx"])
    assert r.code == 3 and "calibration.cache (calibrate.output, its default) does not exist" in r.err, r
