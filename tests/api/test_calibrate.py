"""trtq.calibrate from data in memory writes the bytes `trtq calibrate` writes on the same samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import trtq as api
from tests.api.tiny import two_input_model, write_npy_config
from tests.conftest import SAMPLE_CONFIG


def sample_arrays(limit: int | None = None) -> tuple[str, np.ndarray]:
    """(the sample config's model path, its photos as trtq's own preprocessing makes them)."""
    import dataclasses

    from trtq.config import load_config
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    cfg = load_config(SAMPLE_CONFIG, environ={})
    data = dataclasses.replace(cfg.data, limit=limit)
    rows = [b.arrays["x"][: b.valid].copy() for b in Batcher(data, input_specs(load_model(cfg.model)))]
    return cfg.model, np.concatenate(rows)


def chunks(array: np.ndarray, size: int) -> list[np.ndarray]:
    return [array[i : i + size] for i in range(0, len(array), size)]


# 32 photos in batches of 5 (re-cut into 4 batches of 8); 29 photos in batches of 7 (the last of the
# 4 batches holds 5 samples and 3 rows of padding)
@pytest.mark.parametrize(("limit", "chunk"), [(None, 5), (29, 7)])
def test_numpy_batches_write_the_cli_cache_bytes(trtq, tmp_path, limit, chunk):
    model, photos = sample_arrays(limit)
    args = ["calibrate", "-c", SAMPLE_CONFIG, "-o", tmp_path / "cli.cache"]
    assert trtq([*args, "--limit", limit] if limit else args).code == 0
    cal = api.calibrate(model, chunks(photos, chunk), method="mse")
    assert (cal.samples, cal.batches) == (len(photos), 4)
    written = cal.write_cache(tmp_path / "api.cache")
    assert written.read_bytes() == (tmp_path / "cli.cache").read_bytes()
    cli = json.loads((tmp_path / "cli.cache.json").read_text())
    mine = json.loads((tmp_path / "api.cache.json").read_text())
    assert cal.amax == cli["amax"]
    # the provenance differs only where it names the data: its fingerprint and options
    assert mine["data"].pop("options") == {"source": "in-memory", "batch_size": 8, "last_batch": "pad"}
    assert cli["data"].pop("options")["inputs"]["x"]["images"].endswith("images")
    assert mine["data"].pop("fingerprint") != cli["data"].pop("fingerprint")
    assert mine == cli


def test_dict_batches_write_the_cli_cache_bytes_of_npy_files(trtq, tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(3)
    a = rng.normal(size=(21, 4, 16)).astype(np.float32)
    b = rng.normal(size=(21, 4, 16)).astype(np.float64)  # cast to float32 as .npy files are
    config = write_npy_config(tmp_path, model, {"a": a, "b": b}, method="entropy")
    assert trtq(["calibrate", "-c", config, "-o", tmp_path / "cli.cache"]).code == 0
    batches = [{"b": b[i : i + 4], "a": a[i : i + 4]} for i in range(0, 21, 4)]
    cal = api.calibrate(model, batches, method="entropy")
    assert cal.batches == 3  # 21 samples: 8 + 8 + 5 (padded)
    cal.write_cache(tmp_path / "api.cache")
    assert (tmp_path / "api.cache").read_bytes() == (tmp_path / "cli.cache").read_bytes()
    # a tuple in the model's input order is the same data
    again = api.calibrate(model, [(a[i : i + 10], b[i : i + 10]) for i in range(0, 21, 10)], method="entropy")
    assert again.amax == cal.amax


def test_a_one_shot_generator_calibrates_with_two_passes(tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(4)
    batches = [{"a": rng.normal(size=(5, 4, 16)), "b": rng.normal(size=(5, 4, 16))} for _ in range(5)]
    listed = api.calibrate(model, batches, method="entropy")
    generated = api.calibrate(model, (batch for batch in batches), method="entropy")
    listed.write_cache(tmp_path / "list.cache")
    generated.write_cache(tmp_path / "gen.cache")
    assert (tmp_path / "gen.cache").read_bytes() == (tmp_path / "list.cache").read_bytes()
    assert generated.samples == 25


def test_a_generator_whose_batches_cannot_be_kept_is_refused_in_one_line(tmp_path, monkeypatch):
    from trtq.calib.collect import replay
    from trtq.errors import DataError

    monkeypatch.setattr(replay.ReplayedBatches, "_fits", lambda self, batch: False)  # as on a full temp disk
    model = two_input_model(tmp_path / "two.onnx")
    batches = ({"a": np.ones((8, 4, 16)), "b": np.ones((8, 4, 16))} for _ in range(2))
    with pytest.raises(DataError) as e:
        api.calibrate(model, batches, method="entropy")
    assert "generator" in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 3


def test_the_cache_is_written_for_the_version_asked(tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    cal = api.calibrate(model, [{"a": np.ones((2, 4, 16)), "b": np.full((2, 4, 16), 2.0)}], trt_version="10.3.0")
    cal.write_cache(tmp_path / "c.cache", trt_version="8.6.1")
    assert (tmp_path / "c.cache").read_text().splitlines()[0] == "TRT-8601-EntropyCalibration2"
    assert json.loads(Path(f"{tmp_path / 'c.cache'}.json").read_text())["trt_version"] == "8.6.1"
    cal.write_cache(tmp_path / "d.cache")
    assert (tmp_path / "d.cache").read_text().splitlines()[0] == "TRT-100300-EntropyCalibration2"


def test_progress_is_called_after_every_batch(tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    seen = []
    batches = [{"a": np.ones((8, 4, 16)), "b": np.ones((8, 4, 16))}] * 3
    api.calibrate(model, batches, method="max", progress=seen.append)
    assert [(p.batches_done, p.samples_done) for p in seen] == [(1, 8), (2, 16), (3, 24)]
