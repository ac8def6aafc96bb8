"""GPU tests (``@pytest.mark.gpu``) skip cleanly without TensorRT, cuda-python or a visible GPU."""

import pytest


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    pytest.importorskip("tensorrt", reason="TensorRT is not installed")
    pytest.importorskip("cuda", reason="cuda-python is not installed")
    from trtq.trt import cuda, module_loading

    module_loading.prefer_eager()  # builds here run as trtq build's do (D39): CUDA starts below
    if cuda.device_count() == 0:
        pytest.skip("no CUDA GPU visible")
