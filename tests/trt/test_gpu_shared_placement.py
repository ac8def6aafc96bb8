"""The shared Q/DQ placement on a real engine (TensorRT + GPU): YOLOv8's C2f block (Split, a
residual bottleneck behind SiLU, Concat) keeps more of its layers in INT8 than with the standard
placement, with fewer INT8<->float conversions."""

import numpy as np
import onnx
import pytest

from tests.quantize.test_fused_placement import c2f_block
from tests.trt.models import activation_amax, gpu_build_options
from trtq.config import QuantizeOptions

pytestmark = pytest.mark.gpu


def test_shared_placement_keeps_the_c2f_block_in_int8(tmp_path):
    from trtq.pipeline.build import build_engine
    from trtq.quantize import quantize_model

    model = c2f_block()
    fp32 = tmp_path / "c2f.onnx"
    onnx.save(model, str(fp32))
    rng = np.random.default_rng(0)
    amax = activation_amax(fp32, [{"x": rng.standard_normal((1, 16, 8, 8)).astype(np.float32)} for _ in range(3)])
    cov = {}
    for placement in ("standard", "shared"):
        q = quantize_model(model, amax, QuantizeOptions(placement=placement)).model
        onnx.save(q, str(tmp_path / f"{placement}.onnx"))
        res = build_engine(tmp_path / f"{placement}.onnx", tmp_path / f"{placement}.plan", gpu_build_options())
        assert res.coverage is not None
        cov[placement] = res.coverage
    assert len(cov["shared"].conversions) <= len(cov["standard"].conversions), cov
    assert cov["shared"].int8_layers >= cov["standard"].int8_layers, cov
    assert not cov["shared"].fallbacks, cov["shared"].fallbacks
