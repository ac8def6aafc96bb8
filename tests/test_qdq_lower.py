"""--fix-qdq's exact lowering of ModelOpt / QAT exports for TensorRT 8.6 (trtq/qdq_lower.py,
trtq/opset_lower.py, trtq/pipeline/lower.py), on graphs built here the way ModelOpt writes them:
opset 19, FP16 Q/DQ scales behind a Cast of the FP32 input, weights stored int8 behind a
per-channel DequantizeLinear, a zero scale on an all-zero depthwise channel, opset-18 Split
(num_outputs) and ReduceMean (axes input). Every lowered model runs in ONNX Runtime (no graph
optimizations: each node computed as written) and gives the original's outputs bit for bit, or,
for FP16 graphs, those of the FP32 twin of the graph; ONNX Runtime runs the FP16 original too and
the two stay within FP16 rounding. A real ModelOpt 0.47 file is made at test time where modelopt
is installed.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.errors import ModelError
from trtq.qdq_lower import plan_lowering

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 4, 8, 8)).astype(np.float32)


def _halfable(shape, scale=1.0) -> np.ndarray:
    """Random values that FP16 represents exactly (so the FP16 graph and its FP32 twin store the same)."""
    return (RNG.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


W1 = np.clip(np.round(RNG.standard_normal((4, 1, 3, 3)) * 40), -127, 127).astype(np.int8)
W1[2] = 0  # an all-zero depthwise channel, as ModelOpt met in YOLOv8n
W1_SCALE = np.abs(_halfable((4,), 0.01)) + np.float32(0.001)
W1_SCALE[2] = 0.0
W2 = np.clip(np.round(RNG.standard_normal((8, 4, 1, 1)) * 40), -127, 127).astype(np.int8)
W2_SCALE = np.abs(_halfable((8,), 0.01)) + np.float32(0.001)
B1 = _halfable((4,), 0.1)


def modelopt_style(
    fp16: bool = False, opset: int = 19, split_parts: int = 2, w1_scale=None, extra=()
) -> onnx.ModelProto:
    """x[2,4,8,8] -> Q/DQ -> depthwise Conv (int8 weights, per-channel DQ) -> Relu -> Q/DQ -> 1x1
    Conv -> Split(num_outputs) -> Add of the first two parts -> ReduceMean(axes input) -> y."""
    ft = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    npt = np.float16 if fp16 else np.float32

    def init(name, array):
        array = np.asarray(array)
        if array.dtype.kind == "f":  # FP16 values in both forms: the FP32 twin stores what the FP16 graph stores
            array = array.astype(np.float16).astype(npt)
        return numpy_helper.from_array(array, name)

    inits = [
        init("x_scale", np.array(0.03, npt)),
        init("a_scale", np.array(0.05, npt)),
        init("zp", np.array(0, np.int8)),
        init("w1", W1),
        init("w1_scale", (W1_SCALE if w1_scale is None else w1_scale).astype(npt)),
        init("w1_zp", np.zeros(4, np.int8)),
        init("b1", B1.astype(npt)),
        init("w2", W2),
        init("w2_scale", W2_SCALE.astype(npt)),
        init("w2_zp", np.zeros(8, np.int8)),
        init("axes", np.array([2, 3], np.int64)),
    ]
    n = helper.make_node
    nodes = [n("Cast", ["x"], ["x16"], name="cast_in", to=ft)] if fp16 else []
    src = "x16" if fp16 else "x"
    parts = [f"part{i}" for i in range(split_parts)]
    nodes += [
        n("QuantizeLinear", [src, "x_scale", "zp"], ["xq"], name="x_q"),
        n("DequantizeLinear", ["xq", "x_scale", "zp"], ["xd"], name="x_dq"),
        n("DequantizeLinear", ["w1", "w1_scale", "w1_zp"], ["w1d"], name="w1_dq", axis=0),
        n("Conv", ["xd", "w1d", "b1"], ["c1"], name="dw", group=4, pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu"),
        n("QuantizeLinear", ["r1", "a_scale", "zp"], ["r1q"], name="r1_q"),
        n("DequantizeLinear", ["r1q", "a_scale", "zp"], ["r1d"], name="r1_dq"),
        n("DequantizeLinear", ["w2", "w2_scale", "w2_zp"], ["w2d"], name="w2_dq", axis=0),
        n("Conv", ["r1d", "w2d"], ["c2"], name="pw"),
        n("Split", ["c2"], parts, name="split", axis=1, num_outputs=split_parts),
        n("Add", parts[:2], ["s"], name="add"),
        n("ReduceMean", ["s", "axes"], ["m" if fp16 else "y"], name="mean", keepdims=1),
    ]
    nodes += [n("Cast", ["m"], ["y"], name="cast_out", to=TensorProto.FLOAT)] if fp16 else []
    nodes += list(extra)
    graph = helper.make_graph(
        nodes,
        "modelopt_style",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, None, 1, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 9
    return model


def run(model: onnx.ModelProto, x: np.ndarray = X) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def lowered(model: onnx.ModelProto):
    low = plan_lowering(model, 17, False, "8.6.0")
    assert not low.refused, [f.line() for f in low.refused]
    onnx.checker.check_model(low.model, full_check=True)
    assert [(o.domain, o.version) for o in low.model.opset_import] == [("", 17)] and low.model.ir_version == 8
    return low


@pytest.mark.parametrize("parts", [2, 3])
def test_opset19_with_a_zero_scale_channel_lowers_to_the_same_outputs(parts):
    """Split into 3 parts of 8 channels (3, 3, 2) becomes a split input; into 2 the old default."""
    model = modelopt_style(split_parts=parts)
    low = lowered(model)
    lines = [f.line() for f in low.findings]
    assert lines[0] == (
        "DequantizeLinear 'w1_dq': has a zero scale on 1 of 4 channels ('w1_scale'); TensorRT needs positive scales"
    )
    assert lines[1] == "Split 'split': opset 19: TensorRT 8.6.0 parses up to opset 17"
    assert "2 node(s) rewritten" in low.fixes[1]  # Split and ReduceMean
    scale, before = (
        numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "w1_scale")) for m in (low.model, model)
    )
    assert np.all(scale > 0) and scale[2] == before.max()
    np.testing.assert_array_equal(np.delete(scale, 2), np.delete(before, 2))
    np.testing.assert_array_equal(run(low.model), run(model))  # the original runs in ONNX Runtime too
    split = next(n for n in low.model.graph.node if n.op_type == "Split")
    assert [a.name for a in split.attribute] == ["axis"]
    if parts == 3:
        sizes = next(t for t in low.model.graph.initializer if t.name == split.input[1])
        assert numpy_helper.to_array(sizes).tolist() == [3, 3, 2]
    mean = next(n for n in low.model.graph.node if n.op_type == "ReduceMean")
    assert list(mean.input) == ["s"] and helper.get_attribute_value(mean.attribute[-1]) == [2, 3]


def test_fp16_graph_becomes_its_fp32_twin():
    """FP16 scales, weights and Casts widened: the lowered graph computes exactly what the same
    graph written in FP32 computes, and the FP16 original stays within its FP16 rounding of it."""
    fp16 = modelopt_style(fp16=True)
    twin = modelopt_style(fp16=False)
    low = lowered(fp16)
    assert low.findings[0].line().startswith("QuantizeLinear 'x_q': has a float16 scale (and 5 more Q/DQ nodes)")
    assert low.fixes[0].startswith("FP16 -> FP32: ")
    consts = [t for t in low.model.graph.initializer if t.data_type == TensorProto.FLOAT16]
    assert consts == [] and {n.name: n.attribute[0].i for n in low.model.graph.node if n.op_type == "Cast"} == {
        "cast_in": TensorProto.FLOAT,
        "cast_out": TensorProto.FLOAT,
    }
    y = run(low.model)
    np.testing.assert_array_equal(y, run(twin))
    try:
        original = run(fp16)
    except Exception as e:  # an ONNX Runtime without FP16 kernels for these ops on the CPU
        if "NOT_IMPLEMENTED" not in str(e) and "Could not find an implementation" not in str(e):
            raise
        return
    assert np.abs(original - y).max() <= 2e-2 * np.abs(y).max()


def test_fp16_inputs_and_outputs_keep_their_type():
    """A graph whose input and output are FP16: a Cast behind the input and before the output."""
    fp16 = modelopt_style(fp16=True)
    g = fp16.graph
    g.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    g.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    next(n for n in g.node if n.name == "cast_out").attribute[0].i = TensorProto.FLOAT16
    low = lowered(fp16)
    assert low.model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert low.model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    y = run(low.model, X.astype(np.float16))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, run(modelopt_style(), X.astype(np.float16).astype(np.float32)).astype(np.float16))


def _refused(model: onnx.ModelProto) -> list[str]:
    return [f.line() for f in plan_lowering(model, 17, False, "8.6.0").refused]


def test_a_zero_scale_on_non_zero_weights_is_refused():
    w1_scale = W1_SCALE.copy()
    w1_scale[1] = 0.0  # channel 1 has non-zero weights
    assert _refused(modelopt_style(w1_scale=w1_scale)) == [
        "DequantizeLinear 'w1_dq': has a zero scale on 2 of 4 channels: channel 1, whose weights are not all zero, "
        "so no positive scale is exact"
    ]


def test_a_zero_scale_on_an_activation_is_refused():
    model = modelopt_style()
    t = next(t for t in model.graph.initializer if t.name == "a_scale")
    t.CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), "a_scale"))
    assert _refused(model) == [
        "QuantizeLinear 'r1_q': has a zero scale on an activation: no positive scale gives the same values"
    ]


@pytest.mark.parametrize(
    ("opset", "attrs", "why"),
    [
        (21, {"block_size": 4}, "block_size 4 (blocked quantization), which opset 17 cannot express"),
        (19, {"saturate": 0}, "saturate=0; opset 17 always saturates"),
    ],
)
def test_quantize_attributes_opset_17_lacks_are_refused(opset, attrs, why):
    model = modelopt_style(opset=opset)
    q = next(n for n in model.graph.node if n.name == "r1_q")
    q.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    assert _refused(model) == [f"QuantizeLinear 'r1_q': opset {opset}: TensorRT 8.6.0 parses up to opset 17, and {why}"]


def test_saturate_1_is_dropped_and_exact():
    model = modelopt_style()
    next(n for n in model.graph.node if n.name == "r1_q").attribute.append(helper.make_attribute("saturate", 1))
    low = lowered(model)
    assert not any(a.name == "saturate" for n in low.model.graph.node for a in n.attribute)
    np.testing.assert_array_equal(run(low.model), run(model))


def test_an_operator_newer_than_opset_17_is_refused():
    model = modelopt_style(opset=20, extra=[helper.make_node("Gelu", ["y"], ["g"], name="gelu")])
    assert _refused(model) == [
        "Gelu 'gelu': opset 20: TensorRT 8.6.0 parses up to opset 17, and Gelu does not exist in opset 17"
    ]


def test_what_each_tensorrt_is_checked_for():
    """TensorRT 10 (no opset limit known, FP16 Q/DQ taken): only the zero scale is a finding; an
    opset-17 FP32 model with positive scales has none for 8.6."""
    findings = plan_lowering(modelopt_style(fp16=True), None, True, "10.16.1").findings
    assert [f.node for f in findings] == ["DequantizeLinear 'w1_dq'"]
    positive = np.where(W1_SCALE > 0, W1_SCALE, 0.01).astype(np.float32)
    model = modelopt_style(w1_scale=positive)
    model.opset_import[0].version = 17
    for n in model.graph.node:  # the opset-17 forms of Split and ReduceMean
        if n.op_type == "Split":
            del n.attribute[1:]
        if n.op_type == "ReduceMean":
            del n.input[1:]
            n.attribute.append(helper.make_attribute("axes", [2, 3]))
    assert plan_lowering(model, 17, False, "8.6.0").findings == []


def _pipeline(tmp_path, model, fix, monkeypatch):
    from trtq.config import DataOptions
    from trtq.pipeline.lower import tensorrt_parseable
    from trtq.trt import compat

    monkeypatch.setattr(compat, "installed_version", lambda: compat.TrtVersion(8, 6, 0))  # the GPU host's
    path = tmp_path / "modelopt.onnx"
    onnx.save(model, str(path))
    return tensorrt_parseable(model, path, fix, DataOptions())


def test_build_names_the_node_without_fix_qdq(tmp_path, monkeypatch):
    with pytest.raises(ModelError) as info:
        _pipeline(tmp_path, modelopt_style(fp16=True), False, monkeypatch)
    e = info.value
    assert e.exit_code == 3 and "\n" not in str(e).split("\n")[0]
    assert str(e).startswith(
        "modelopt.onnx: TensorRT 8.6.0 cannot parse it as it is: QuantizeLinear 'x_q': has a float16 scale"
    )
    assert "(+2 more)" in str(e) and "--fix-qdq" in e.hint


def test_fix_qdq_hands_on_the_checked_lowered_model(tmp_path, monkeypatch):
    model = modelopt_style(fp16=True)
    lowered_model, fixes = _pipeline(tmp_path, model, True, monkeypatch)
    assert len(fixes) == 3 and lowered_model.opset_import[0].version == 17
    assert model.opset_import[0].version == 19  # the caller's model is not changed
    w1 = modelopt_style(fp16=True, w1_scale=np.where(np.arange(4) == 1, 0.0, W1_SCALE).astype(np.float32))
    with pytest.raises(ModelError, match=r"^--fix-qdq cannot lower modelopt.onnx exactly: DequantizeLinear 'w1_dq'"):
        _pipeline(tmp_path, w1, True, monkeypatch)


def test_cli_fix_qdq_refusal_is_one_line_exit_3(tmp_path, trtq):
    """No TensorRT here: --fix-qdq lowers for 8.6 and refuses before TensorRT is needed."""
    model = modelopt_style(opset=20, extra=[helper.make_node("Gelu", ["y"], ["g"], name="gelu")])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    r = trtq(["build", "-m", path, "--fix-qdq"])
    assert r.code == 3, r
    assert "--fix-qdq cannot lower m.onnx exactly: Gelu 'gelu'" in r.err


def test_real_modelopt_export_lowers_to_outputs_within_fp16_rounding(tmp_path):
    """ModelOpt 0.47's ONNX INT8 PTQ (CPU calibration) of the residual CNN: opset 19, IR 10, FP16
    scales; lowered, it passes the checker and runs within FP16 rounding of the original. ModelOpt
    runs in a subprocess: importing it patches onnxruntime.quantization for the whole process."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("modelopt") is None:
        pytest.skip("nvidia-modelopt is not installed")
    from tests.trt.models import residual_cnn

    fp32 = residual_cnn(tmp_path / "fp32.onnx", batch=2, opset=13)
    x = np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "modelopt.onnx"
    code = (
        "import sys, numpy as np\n"
        "try:\n    import modelopt.onnx.quantization as q\n"
        "except ImportError as e:\n    print(e); sys.exit(77)\n"
        "q.quantize(sys.argv[1], calibration_data={'x': np.load(sys.argv[2])}, calibration_eps=['cpu'],"
        " output_path=sys.argv[3], log_level='ERROR')\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(fp32), str(tmp_path / "x.npy"), str(out)], capture_output=True)
    if r.returncode == 77:
        pytest.skip(f"nvidia-modelopt[onnx] cannot be imported: {r.stdout.decode().strip()}")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    model = onnx.load(str(out))
    assert model.opset_import[0].version == 19
    low = lowered(model)
    assert any("float16 scale" in f.problem for f in low.findings)
    feeds = {"x": x[:2]}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a, b = (
        ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for m in (model, low.model)
    )
    assert np.abs(a.astype(np.float32) - b).max() <= 2e-2 * np.abs(b).max()


def test_an_opset_import_alone_does_not_block_but_is_lowered_with_fix_qdq(tmp_path, monkeypatch):
    """Opset 19 whose operators all read as at 17 (Relu): TensorRT's parser gets it as it is;
    --fix-qdq lowers the import only."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    same, fixes = _pipeline(tmp_path, model, False, monkeypatch)
    assert same is model and fixes == []
    low, fixes = _pipeline(tmp_path, model, True, monkeypatch)
    assert fixes == ["opset 19 -> 17 (no operator in it changed since opset 17)"]
    np.testing.assert_array_equal(run(low), run(model))


def _conv_bn(variance: np.ndarray, fp16: bool = True, mask: bool = False) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv (DQ'd weight) -> BatchNormalization(variance) [-> Add(-inf mask)] -> y."""
    ft = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    npt = np.float16 if fp16 else np.float32
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0.05, npt), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(rng.integers(-100, 100, (4, 4, 3, 3)).astype(np.int8), "wq"),
        numpy_helper.from_array(np.full(4, 0.01, npt), "ws"),
        numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
        numpy_helper.from_array(np.ones(4, npt), "gamma"),
        numpy_helper.from_array(np.zeros(4, npt), "beta"),
        numpy_helper.from_array(np.zeros(4, npt), "mean"),
    ]
    nodes = [
        helper.make_node(
            "Constant", [], ["var"], name="var_const", value=numpy_helper.from_array(variance.astype(npt))
        ),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="x_dq"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="w_dq", axis=0),
        helper.make_node("Conv", ["xd", "w"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y0"], name="bn"),
    ]
    if mask:  # an attention-style mask: inf on purpose, not a parameter
        inits.append(numpy_helper.from_array(np.array([0, -np.inf, 0, 0], npt).reshape(1, 4, 1, 1), "mask"))
        nodes.append(helper.make_node("Add", ["y0", "mask"], ["y"], name="masked"))
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "conv_bn",
        [helper.make_tensor_value_info("x", ft, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", ft, [1, 4, 8, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_inf_parameter_is_refused_with_its_node():
    """ModelOpt 0.47's PP-OCRv4 det: a BatchNormalization variance past 65504 became inf in its FP16
    file, and TensorRT 8.6's builder failed with a CUDA illegal memory access. Refused, naming the node."""
    variance = np.array([1.0, 7e4, 2.0, 7e5], dtype=np.float32)  # two values beyond FP16
    with np.errstate(over="ignore"):
        model = _conv_bn(variance)
    low = plan_lowering(model, 17, False, "8.6.0")
    refused = low.refused
    assert len(refused) == 1 and refused[0].node == "BatchNormalization 'bn'"
    assert "input 4 'var' holds 2 of 4 values inf" in refused[0].problem
    assert any("float16 scale" in f.problem and f.fix for f in low.findings)  # the FP16 part alone is exact
    # finite parameters, and an inf that is not a parameter (a mask), are no finding
    assert not lowered(_conv_bn(np.array([1.0, 2.0, 3.0, 4.0]), fp16=False)).findings
    assert not lowered(_conv_bn(np.array([1.0, 2.0, 3.0, 4.0]), fp16=False, mask=True)).findings
