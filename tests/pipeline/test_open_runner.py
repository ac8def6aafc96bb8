"""trtq.pipeline.open_runner: choosing a runner by the file's kind, the TensorRT engine adapter."""

import importlib.util

import numpy as np
import pytest

from trtq.errors import EnvironmentMissing, ModelError
from trtq.model import TensorSpec
from trtq.pipeline.open_runner import EngineRunner, open_runner


@pytest.mark.parametrize("name, content", [("missing.onnx", None), ("empty.onnx", b""), ("model.tflite", b"x")])
def test_bad_paths_are_model_errors(tmp_path, name, content):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelError):
        open_runner(path)


def test_folder_is_a_model_error(tmp_path):
    folder = tmp_path / "m.onnx"
    folder.mkdir()
    with pytest.raises(ModelError, match="folder"):
        open_runner(folder)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_engine_without_tensorrt_is_environment_missing(tmp_path):
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"not really an engine")
    with pytest.raises(EnvironmentMissing):
        open_runner(plan)


def test_engine_adapter_normalises_specs_and_closes():
    """EngineRunner wraps trtq.trt.runtime.TrtRunner; here around a stand-in with the same
    surface (TensorRT cannot run on this machine), checking only the adapter's own work."""

    class Inner:
        inputs = [TensorSpec("x", (-1, 3), "float32")]
        outputs = [TensorSpec("y", (-1, 2), "float16")]
        closed = 0

        def run(self, feeds):
            return {"y": feeds["x"][:, :2] * 2}

        def close(self):
            Inner.closed += 1

    with EngineRunner(Inner(), "m.plan") as runner:
        assert runner.name == "m.plan"
        assert runner.inputs == [TensorSpec("x", (None, 3), "float32")]
        assert runner.outputs == [TensorSpec("y", (None, 2), "float16")]
        np.testing.assert_array_equal(runner.run({"x": np.ones((1, 3))})["y"], [[2.0, 2.0]])
    runner.close()
    assert Inner.closed == 1
