"""<plan>.json checks made before TensorRT loads a plan (no TensorRT needed)."""

import json

import pytest

from trtq.errors import ModelError
from trtq.trt.metadata import FORMAT, check_metadata, metadata_path, read_metadata

META = {
    "format": FORMAT,
    "tensorrt_version": "8.6.0",
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0",
    "precision": "int8",
    "mode": "explicit",
}


def test_metadata_path_is_beside_the_plan(tmp_path):
    assert metadata_path(tmp_path / "m.plan") == tmp_path / "m.plan.json"


def test_matching_metadata_passes(tmp_path):
    check_metadata(META, tmp_path / "m.plan", "8.6.0", "NVIDIA H100 80GB HBM3", "9.0")
    # the build number of the version string does not matter
    check_metadata(dict(META, tensorrt_version="8.6.0.12"), tmp_path / "m.plan", "8.6.0", META["gpu_name"], "9.0")


def test_other_tensorrt_version_is_refused(tmp_path):
    with pytest.raises(ModelError) as info:
        check_metadata(META, tmp_path / "m.plan", "10.3.0", META["gpu_name"], "9.0")
    e = info.value
    assert e.exit_code == 3
    assert "built by TensorRT 8.6.0 but TensorRT 10.3.0 is installed" in e.message
    assert "trtq build" in e.hint


def test_other_compute_capability_is_refused(tmp_path):
    with pytest.raises(ModelError, match=r"compute capability 9\.0 .*\(compute capability 8\.0\)"):
        check_metadata(META, tmp_path / "m.plan", "8.6.0", "NVIDIA A100-SXM4-80GB", "8.0")


def test_other_gpu_model_is_refused(tmp_path):
    with pytest.raises(ModelError, match="built on NVIDIA H100 80GB HBM3 but this GPU is NVIDIA H100 PCIe"):
        check_metadata(META, tmp_path / "m.plan", "8.6.0", "NVIDIA H100 PCIe", "9.0")


def test_read_metadata_absent_is_none(tmp_path):
    assert read_metadata(tmp_path / "m.plan") is None


def test_read_metadata_roundtrip(tmp_path):
    (tmp_path / "m.plan.json").write_text(json.dumps(META))
    assert read_metadata(tmp_path / "m.plan") == META


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": "other/1"}), "[]"])
def test_read_metadata_broken_is_model_error(tmp_path, text):
    (tmp_path / "m.plan.json").write_text(text)
    with pytest.raises(ModelError, match="m.plan.json"):
        read_metadata(tmp_path / "m.plan")
