"""pipeline.build: which network model each mode hands to trt's builder, checked with fake
TensorRT modules (the real build needs a GPU: tests/trt/test_gpu_*.py). Only ``build_plan``, the
part that drives TensorRT itself, is replaced by a recorder."""

from __future__ import annotations

import types

import numpy as np
import onnx
import pytest

from tests.trt.fakes import fake_trt
from tests.trt.models import qat_style_cnn, residual_cnn
from trtq.calib.cache import CalibrationTable, write_cache
from trtq.config import BuildOptions, DataOptions, QuantizeOptions
from trtq.pipeline import build as pipeline_build
from trtq.pipeline.quantize import quantize_for
from trtq.quantize.graph import GraphIndex


@pytest.fixture
def built(monkeypatch):
    """Run build_engine on fake TensorRT `version`; return what it handed to build_plan."""
    from trtq.trt import compat, cuda

    calls = []

    def record(trt, recipe, model, model_path, output, options, profiles, **kw):
        calls.append(
            dict(
                trt=trt,
                recipe=recipe,
                model=model,
                model_path=model_path,
                output=output,
                options=options,
                profiles=profiles,
                **kw,
            )
        )
        return types.SimpleNamespace(plan_path=output, coverage=None, measured=None)

    monkeypatch.setattr(pipeline_build, "build_plan", record)
    # the coverage is read back from the built plan (a real engine): here the call itself is recorded
    monkeypatch.setattr(
        pipeline_build, "checked_coverage", lambda plan, require, measured: ("coverage of", plan, require)
    )
    monkeypatch.setattr(cuda, "require_gpu", lambda: None)

    def run(version, *args, **kwargs):
        monkeypatch.setattr(compat, "import_tensorrt", lambda: fake_trt(version))
        result = pipeline_build.build_engine(*args, **kwargs)
        assert result.plan_path == calls[-1]["output"]
        int8 = calls[-1]["options"].precision == "int8"
        assert result.coverage == (("coverage of", result.plan_path, False) if int8 else None)
        return calls[-1]

    return run


def _amax_for(model_path):
    index = GraphIndex(onnx.load(str(model_path)))
    rng = np.random.default_rng(0)
    return {t: float(rng.uniform(0.5, 4.0)) for t in index.types if t not in index.initializers}


def test_fp32_model_with_a_cache_is_quantized_as_quantize_for_does(tmp_path, built):
    model = residual_cnn(tmp_path / "m.onnx", batch="N")
    cache = tmp_path / "c.cache"
    amax = _amax_for(model)
    write_cache(cache, CalibrationTable("8.6.0", "EntropyCalibration2", amax), "8.6.0")
    call = built(
        "8.6.0", model, tmp_path / "m.plan", BuildOptions(), cache_path=cache, data_options=DataOptions(batch_size=4)
    )
    expected = quantize_for(onnx.load(str(model)), call["table"].amax, QuantizeOptions(), DataOptions(), "8.6.0")
    assert call["model"].SerializeToString() == expected.model.SerializeToString()
    assert call["quant_info"]["quantized"] == len(expected.quantized) > 0
    assert call["profiles"] == {"x": ((4, 3, 16, 16),) * 3}  # data.batch_size fills the dynamic batch dim
    assert call["cache_path"] == cache and call["recipe"].builder_flags == ("INT8",)


def test_a_qdq_model_is_built_as_it_is(tmp_path, built):
    model = qat_style_cnn(tmp_path / "q.onnx")
    call = built("10.3.0", model, tmp_path / "q.plan", BuildOptions())
    assert call["quant_info"]["source"] == "model" and call["table"] is None
    ops = [n.op_type for n in call["model"].graph.node]
    assert ops.count("QuantizeLinear") == [n.op_type for n in onnx.load(str(model)).graph.node].count("QuantizeLinear")


@pytest.mark.parametrize("precision, mode", [("fp32", "explicit"), ("int8", "implicit")])
def test_fp32_and_implicit_builds_parse_the_file(tmp_path, built, precision, mode):
    model = residual_cnn(tmp_path / "m.onnx")
    cache = tmp_path / "c.cache"
    write_cache(cache, CalibrationTable("8.6.0", "EntropyCalibration2", _amax_for(model)), "8.6.0")
    call = built("8.6.0", model, tmp_path / "m.plan", BuildOptions(precision=precision, mode=mode), cache_path=cache)
    assert call["model"] is None  # build_plan parses model_path itself
    assert (call["table"] is not None) == (precision == "int8")
    assert call["recipe"].calibrator == (mode == "implicit")
