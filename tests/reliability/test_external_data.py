"""Issue 29: a model's external-data files are part of its identity. The provenance hashed only the
.onnx, so a cache stayed "fresh" after the weights file beside it changed."""

import json

import numpy as np
import onnx

from tests.reliability.conftest import one_line_error


def _external(kit, name="ext"):
    model = kit.root / f"{name}.onnx"
    onnx.save(
        onnx.load(str(kit.model)), str(model), save_as_external_data=True, location=f"{name}.weights", size_threshold=0
    )
    return model, kit.root / f"{name}.weights"


def _change_weights(weights):
    data = np.frombuffer(weights.read_bytes(), dtype=np.float32).copy()
    data[:8] *= 1.5  # still a valid model, other numbers
    weights.write_bytes(data.tobytes())


def test_a_cache_is_stale_once_the_external_data_changes(trtq, kit):
    model, weights = _external(kit)
    cache = kit.root / "e.cache"
    assert trtq(["calibrate", "--model", model, "--data", kit.data, "-o", cache, "-q"]).code == 0
    prov = json.loads((kit.root / "e.cache.json").read_text())
    assert prov["model"]["external_data"] == ["ext.weights"]
    out = kit.root / "q.onnx"
    assert trtq(["quantize", "--model", model, "--cache", cache, "-o", out, "-q"]).code == 0  # fresh
    out.unlink()
    _change_weights(weights)
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", out])
    assert r.code == 3 and one_line_error(r) and "calibrated for a different model" in r.err, r
    assert not out.exists()
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", out, "--allow-stale", "-q"])
    assert r.code == 0, r


def test_statistics_of_other_weights_are_refused(trtq, kit):
    model, weights = _external(kit)
    stats = kit.root / "e.npz"
    assert (
        trtq(
            ["calibrate", "--model", model, "--data", kit.data, "-o", kit.root / "e.cache", "--save-stats", stats, "-q"]
        ).code
        == 0
    )
    _change_weights(weights)
    r = trtq(["calibrate", "--from-stats", stats, "--model", model, "-o", kit.root / "f.cache"])
    assert r.code == 3 and one_line_error(r) and "different model" in r.err, r
    assert not (kit.root / "f.cache").exists()


def test_a_model_without_external_data_keeps_its_file_hash(kit):
    """Caches written before keep matching: the identity of a self-contained model is its sha256."""
    from trtq.fileio import sha256_file
    from trtq.model import model_sha256

    assert model_sha256(kit.model) == sha256_file(kit.model)
    model, weights = _external(kit)
    before = model_sha256(model)
    assert before != sha256_file(model)
    _change_weights(weights)
    assert model_sha256(model) != before
