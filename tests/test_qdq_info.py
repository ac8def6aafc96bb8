"""Reading Q/DQ models other tools write, and what TensorRT cannot build as it is."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.trt.models import activation_amax, ort_quantize_static, ort_run, qat_style_cnn, residual_cnn
from trtq.errors import ModelError
from trtq.qdq_info import check_for_tensorrt, fold_constant_dequantize, read_qdq
from trtq.quantize import quantize_model


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdqinfo")
    path = residual_cnn(d / "fp32.onnx", batch=2)
    rng = np.random.default_rng(4)
    batches = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    return {"dir": d, "path": path, "batches": batches}


@pytest.mark.parametrize("constants", [True, False])
def test_qat_style_export(tmp_path, constants):
    info = read_qdq(onnx.load(str(qat_style_cnn(tmp_path / "q.onnx", scales_in_constants=constants))))
    assert info.problems == [] and info.is_qdq
    assert info.activations == pytest.approx({"x": 3.5, "r1": 2.0, "f": 1.5}, rel=1e-6)
    assert (info.weights, info.per_channel, info.quantize_nodes, info.dequantize_nodes) == (3, 3, 6, 6)


def test_trtq_output_carries_the_cache_ranges(fp32):
    amax = activation_amax(fp32["path"], fp32["batches"])
    info = read_qdq(quantize_model(onnx.load(str(fp32["path"])), amax).model)
    assert info.problems == [] and info.weights == 3 and info.per_channel == 3
    for name, a in info.activations.items():
        assert a == pytest.approx(amax[name], rel=1e-6)


def test_onnxruntime_symmetric_model_is_buildable_and_its_int32_biases_fold_exactly(fp32):
    path = ort_quantize_static(fp32["path"], fp32["dir"] / "ort_sym.onnx", fp32["batches"], symmetric=True)
    model = onnx.load(str(path))
    info = read_qdq(model)
    assert info.problems == [] and info.weights == 3 and len(info.activations) >= 3
    check_for_tensorrt(info, "ort_sym.onnx")  # no error
    before = ort_run(path, fp32["batches"][0])["y"]
    assert fold_constant_dequantize(model) == 3  # b1, b2, bg
    assert not [
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0][:1] == "b" and n.input[0].endswith("_quantized")
    ]
    onnx.checker.check_model(model)
    onnx.save(model, str(fp32["dir"] / "folded.onnx"))
    after = ort_run(fp32["dir"] / "folded.onnx", fp32["batches"][0])["y"]
    np.testing.assert_array_equal(before, after)


def test_onnxruntime_default_asymmetric_model_is_refused(fp32):
    path = ort_quantize_static(fp32["path"], fp32["dir"] / "ort_asym.onnx", fp32["batches"], symmetric=False)
    info = read_qdq(onnx.load(str(path)))
    assert info.problems and "zero point" in info.problems[0]
    with pytest.raises(ModelError) as e:
        check_for_tensorrt(info, "ort_asym.onnx")
    assert e.value.exit_code == 3 and "ActivationSymmetric" in e.value.hint
    assert "ort_asym.onnx cannot be built by TensorRT as it is" in e.value.message


def test_qoperator_model_is_refused(fp32):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(fp32["batches"])

        def get_next(self):
            return next(self._it, None)

    out = fp32["dir"] / "qop.onnx"
    quantize_static(
        str(fp32["path"]),
        str(out),
        Reader(),
        quant_format=QuantFormat.QOperator,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    info = read_qdq(onnx.load(str(out)))
    assert "QLinearConv" in info.other_ops and "QOperator" in info.problems[0]


def test_quantize_without_zero_point_is_uint8_and_refused():
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])],
    )
    info = read_qdq(helper.make_model(graph))
    assert len(info.problems) == 1 and "uint8" in info.problems[0]
