"""CUDA module loading for builds (D39): trtq build asks for eager loading unless the user chose a
mode, before CUDA starts, and reads back what the driver made of it."""

import os
import sys
from types import SimpleNamespace

import pytest

from trtq.trt.module_loading import ENV, mode, prefer_eager


@pytest.mark.parametrize(
    "before, after", [({}, "EAGER"), ({ENV: ""}, "EAGER"), ({ENV: " "}, "EAGER"), ({ENV: "LAZY"}, "LAZY")]
)
def test_eager_unless_the_user_chose(before, after):
    env = dict(before, OTHER="1")
    assert prefer_eager(env) == after
    assert env[ENV] == after and env["OTHER"] == "1"


def _driver(result=None, raises=False):
    """The two enums and the one call of cuda-python's driver module that mode() reads."""
    modes = SimpleNamespace(CU_MODULE_EAGER_LOADING="E", CU_MODULE_LAZY_LOADING="L")
    codes = SimpleNamespace(CUDA_SUCCESS=0)

    def call():
        if raises:
            raise AttributeError("cuModuleGetLoadingMode")
        return result

    return SimpleNamespace(CUresult=codes, CUmoduleLoadingMode=modes, cuModuleGetLoadingMode=call)


@pytest.mark.parametrize(
    "driver, expected",
    [
        (_driver((0, "E")), "eager"),
        (_driver((0, "L")), "lazy"),
        (_driver((3, "E")), None),  # CUDA_ERROR_NOT_INITIALIZED: the process has not used CUDA
        (_driver((0, "?")), None),
        (_driver(raises=True), None),  # a binding without the call
    ],
)
def test_mode_reads_the_driver(driver, expected):
    assert mode(driver) == expected


def test_no_mode_without_cuda_python(monkeypatch):
    # every module import_cudriver tries, also where cuda-python is installed and imported already
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.cuda"):
        monkeypatch.setitem(sys.modules, name, None)
    assert mode() is None


def test_build_asks_for_eager_loading_before_tensorrt(tmp_path, monkeypatch):
    """The build's checks pass, then CUDA_MODULE_LOADING is set before TensorRT and the GPU are
    looked for: here, without TensorRT or a GPU, the build stops right after (exit 4)."""
    from tests.trt.models import residual_cnn
    from trtq.config import BuildOptions
    from trtq.errors import EnvironmentMissing
    from trtq.pipeline.build import checked_build_inputs

    try:
        from trtq.trt import cuda

        if cuda.device_count() > 0:
            pytest.skip("a GPU is visible: tests/trt/test_gpu_module_loading.py builds for real")
    except EnvironmentMissing:
        pass
    monkeypatch.delenv(ENV, raising=False)
    model = residual_cnn(tmp_path / "m.onnx", batch=2)
    with pytest.raises(EnvironmentMissing):
        checked_build_inputs(model, tmp_path / "m.plan", BuildOptions(precision="fp16"))
    assert os.environ[ENV] == "EAGER"
    assert not (tmp_path / "m.plan").exists()
