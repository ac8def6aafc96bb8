"""quantize writes for the TensorRT its cache names: a cache calibrated for TensorRT 8 makes the
consumers of a float depthwise Conv float too (TensorRT 8.6.0 built such engines with garbage
outputs), the same thing `trtq build` does on TensorRT 8, so `quantize -> build` on 8.6 is safe."""

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import conv, conv_weight, init, make_model, value


def _depthwise_model(path):
    rng = np.random.default_rng(5)
    dw = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    model = make_model(
        [
            conv("stem", "x", "w0", "a"),
            helper.make_node("Relu", ["a"], ["ra"], name="relu0"),
            conv("dw", "ra", "wd", "d", group=16),
            helper.make_node("Relu", ["d"], ["rd"], name="relu1"),
            conv("pw", "rd", "wp", "y", k=1),
        ],
        [value("x", [1, 16, 8, 8])],
        [value("y", [1, 16, 8, 8])],
        [init("w0", conv_weight(rng, 16, 16)), init("wd", dw), init("wp", conv_weight(rng, 16, 16, k=1))],
    )
    onnx.save(model, str(path))
    data = path.parent / "x.npy"
    np.save(data, rng.standard_normal((8, 16, 8, 8)).astype(np.float32))
    return data


def _quantized_convs(path):
    """Conv nodes whose weight input comes from a DequantizeLinear."""
    model = onnx.load(str(path))
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return sorted(n.name for n in model.graph.node if n.op_type == "Conv" and n.input[1] in dq_outputs)


@pytest.mark.parametrize(
    "trt_version,quantized",
    [
        ("8.6.0", ["stem"]),  # pw is left float with the float depthwise conv that feeds it
        ("10.3.0", ["pw", "stem"]),  # not needed there: only the excluded conv is float
    ],
)
def test_float_depthwise_conv_takes_its_consumer_float_for_a_tensorrt_8_cache(trtq, tmp_path, trt_version, quantized):
    model = tmp_path / "m.onnx"
    data = _depthwise_model(model)
    cache = tmp_path / "m.cache"
    r = trtq(["calibrate", "--model", model, "--data", data, "--trt-version", trt_version, "-o", cache, "-q"])
    assert r.code == 0
    out = tmp_path / "m.qdq.onnx"
    r = trtq(["quantize", "--model", model, "--cache", cache, "--exclude", "^dw$", "-o", out])
    assert r.code == 0, r
    assert _quantized_convs(out) == quantized
    assert ("also leaving float pw" in r.err) == (trt_version.startswith("8.")), r.err


@pytest.mark.parametrize(
    "cache_version,build_version,refused",
    [
        ("10.3.0", "8.6.0", True),  # a Q/DQ model with a float depthwise conv feeding INT8, built on 8.6
        ("8.6.0", "8.6.0", False),  # quantized for TensorRT 8: the conv it feeds is float too
        ("10.3.0", "10.3.0", False),  # TensorRT 10 was not seen to need it
    ],
)
def test_build_refuses_a_qdq_model_tensorrt_8_would_compute_wrongly(
    trtq, tmp_path, cache_version, build_version, refused
):
    from tests.trt.fakes import fake_trt
    from trtq.errors import ModelError
    from trtq.pipeline.build import refuse_float_grouped_convs_feeding_int8

    model = tmp_path / "m.onnx"
    data = _depthwise_model(model)
    cache = tmp_path / "m.cache"
    r = trtq(["calibrate", "--model", model, "--data", data, "--trt-version", cache_version, "-o", cache, "-q"])
    assert r.code == 0
    out = tmp_path / "m.qdq.onnx"
    assert trtq(["quantize", "--model", model, "--cache", cache, "--exclude", "^dw$", "-o", out, "-q"]).code == 0
    if refused:
        with pytest.raises(ModelError) as e:
            refuse_float_grouped_convs_feeding_int8(fake_trt(build_version), onnx.load(str(out)), out)
        assert "float grouped/depthwise Conv dw feeds the INT8 layer pw" in str(e.value)
        assert "--trt-version 8.6.0" in e.value.hint
    else:
        refuse_float_grouped_convs_feeding_int8(fake_trt(build_version), onnx.load(str(out)), out)
