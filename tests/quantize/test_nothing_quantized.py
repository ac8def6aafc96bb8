"""A model with Conv/Gemm/MatMul whose quantization places no Q/DQ pair is an error (exit 3), not
an "INT8" copy of the FP32 model that every accuracy gate would pass."""

import numpy as np
import onnx
from onnx import helper

from tests.quantize.conftest import conv, conv_weight, init, make_model, value


def _conv_model(path):
    rng = np.random.default_rng(3)
    model = make_model(
        [conv("c1", "x", "w1", "h"), helper.make_node("Relu", ["h"], ["r"], name="relu"), conv("c2", "r", "w2", "y")],
        [value("x", [1, 16, 6, 6])],
        [value("y", [1, 16, 6, 6])],
        [init("w1", conv_weight(rng, 16, 16)), init("w2", conv_weight(rng, 16, 16))],
    )
    onnx.save(model, str(path))
    data = path.parent / "x.npy"
    np.save(data, rng.standard_normal((8, 16, 6, 6)).astype(np.float32))
    return data


def test_quantizing_nothing_is_an_error_naming_the_reason(trtq, tmp_path):
    model = tmp_path / "m.onnx"
    data = _conv_model(model)
    cache = tmp_path / "m.cache"
    assert trtq(["calibrate", "--model", model, "--data", data, "-o", cache, "-q"]).code == 0
    out = tmp_path / "m.qdq.onnx"
    r = trtq(["quantize", "--model", model, "--cache", cache, "--exclude", "Conv", "-o", out])
    assert r.code == 3, r
    lines = r.err.strip().splitlines()
    assert len(lines) <= 2 and "quantized 0 of its 2 Conv/Gemm/MatMul nodes" in r.err, r
    assert "excluded" in r.err, r  # the reason the placement gave
    assert not out.exists()
    # the same model quantizes when nothing is excluded: the error is about the outcome, not the model
    assert trtq(["quantize", "--model", model, "--cache", cache, "-o", out, "-q"]).code == 0 and out.exists()
