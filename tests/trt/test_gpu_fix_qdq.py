"""trtq build on a ModelOpt-style export that TensorRT 8.6 cannot parse (real TensorRT + GPU):
opset 19, FP16 Q/DQ scales, a zero scale on an all-zero depthwise channel (the graph of
tests/test_qdq_lower.py). Without --fix-qdq: one line naming the node, before TensorRT's parser.
With it: the lowered model builds, and the engine matches ONNX Runtime running the lowered model
(same tolerance as test_gpu_qdq: <= 5e-2 of the output range, cosine >= 0.999).
"""

import onnx
import pytest

from tests.test_qdq_lower import X, modelopt_style, run
from tests.trt.models import cosine, gpu_build_options, rel_max_err
from trtq.errors import ModelError

pytestmark = pytest.mark.gpu


@pytest.fixture
def export(tmp_path):
    path = tmp_path / "modelopt.onnx"
    onnx.save(modelopt_style(fp16=True), str(path))
    return path


def test_without_fix_qdq_the_node_is_named(export, tmp_path):
    from trtq.pipeline.build import build_engine

    with pytest.raises(ModelError) as info:
        build_engine(export, tmp_path / "m.plan", gpu_build_options())
    assert "cannot parse it as it is: QuantizeLinear 'x_q': has a float16 scale" in info.value.message
    assert not (tmp_path / "m.plan").exists()


def test_fix_qdq_builds_the_lowered_model(export, tmp_path):
    from trtq.pipeline.build import build_engine
    from trtq.qdq_lower import plan_lowering
    from trtq.trt.runtime import TrtRunner

    res = build_engine(export, tmp_path / "m.plan", gpu_build_options(fix_qdq=True))
    assert len(res.metadata["quantize"]["lowered"]) == 3
    with TrtRunner(res.plan_path) as r:
        y = r.run({"x": X})["y"]
    twin = run(plan_lowering(onnx.load(str(export)), 17, False, "8.6.0").model)
    err, cos = rel_max_err(y.reshape(twin.shape), twin), cosine(y.reshape(twin.shape), twin)
    assert err <= 5e-2 and cos >= 0.999, (err, cos)
