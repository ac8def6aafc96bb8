"""The reconstruction's ONNX -> torch converter (trtq.quantize.reconstruct.ops), op by op, against
ONNX Runtime on the same one-node models. Skips without torch (``pip install "trtq[reconstruct]"``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from trtq.quantize.reconstruct.ops import OPS, convert_node  # noqa: E402


class Const:
    """A node input given as an initializer (attributes of the op's shape logic: axes, shapes ...)."""

    def __init__(self, value):
        self.value = np.asarray(value)


def _rand(*shape, lo=-3.0, hi=3.0, seed=0):
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, size=shape).astype(np.float32)


def _case(op, inputs, opset=13, outputs=1, **attrs):
    return (op, inputs, opset, outputs, attrs)


X = _rand(2, 4, 7, 9)
W = _rand(6, 4, 3, 3, seed=1)
B = _rand(6, seed=2)
SEQ = _rand(2, 5, 8)

CASES = {
    "Conv": _case("Conv", [X, Const(W), Const(B)], pads=[1, 1, 1, 1]),
    "Conv-asym-stride": _case("Conv", [X, Const(W)], pads=[0, 1, 2, 0], strides=[2, 1]),
    "Conv-same-upper": _case("Conv", [X, Const(W)], auto_pad="SAME_UPPER", strides=[2, 2]),
    "Conv-depthwise-dilated": _case(
        "Conv", [X, Const(_rand(4, 1, 3, 3, seed=3))], group=4, dilations=[2, 2], pads=[2, 2, 2, 2]
    ),
    "Conv-1d": _case("Conv", [SEQ, Const(_rand(3, 5, 3, seed=4))], pads=[1, 1]),
    "ConvTranspose": _case(
        "ConvTranspose", [X, Const(_rand(4, 3, 3, 3, seed=5))], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]
    ),
    "Gemm": _case(
        "Gemm", [_rand(3, 5), Const(_rand(4, 5, seed=6)), Const(_rand(4, seed=7))], transB=1, alpha=0.5, beta=2.0
    ),
    "Gemm-transA": _case("Gemm", [_rand(5, 3), Const(_rand(5, 4, seed=8))], transA=1),
    "MatMul": _case("MatMul", [SEQ, Const(_rand(8, 3, seed=9))]),
    "MatMul-batched": _case("MatMul", [_rand(2, 3, 4, 5), _rand(2, 3, 5, 2, seed=10)]),
    "BatchNormalization": _case(
        "BatchNormalization",
        [
            X,
            Const(_rand(4, seed=11)),
            Const(_rand(4, seed=12)),
            Const(_rand(4, seed=13)),
            Const(_rand(4, lo=0.1, seed=14)),
        ],
        epsilon=1e-3,
    ),
    "Relu": _case("Relu", [X]),
    "LeakyRelu": _case("LeakyRelu", [X], alpha=0.1),
    "Clip": _case("Clip", [X, Const(np.float32(0)), Const(np.float32(6))]),
    "Clip-min-only": _case("Clip", [X, Const(np.float32(-1))]),
    "Clip-graph-bounds": _case("Clip", [X, np.float32(-1), np.float32(0.5)]),
    "Sigmoid": _case("Sigmoid", [X]),
    "HardSigmoid": _case("HardSigmoid", [X], alpha=0.25, beta=0.4),
    "HardSwish": _case("HardSwish", [X], opset=14),
    "Tanh": _case("Tanh", [X]),
    "Erf": _case("Erf", [X]),
    "Gelu": _case("Gelu", [X], opset=20),
    "Gelu-tanh": _case("Gelu", [X], opset=20, approximate="tanh"),
    "Sqrt": _case("Sqrt", [np.abs(X)]),
    "Exp": _case("Exp", [X]),
    "Pow": _case("Pow", [np.abs(X), Const(np.float32(2.0))]),
    "Pow-general": _case("Pow", [np.abs(X) + 0.1, Const(np.float32(1.7))]),
    "Neg": _case("Neg", [X]),
    "Reciprocal": _case("Reciprocal", [np.abs(X) + 0.5]),
    "Mul": _case("Mul", [X, Const(_rand(4, 1, 1, seed=15))]),
    "Add": _case("Add", [X, _rand(2, 4, 7, 9, seed=16)]),
    "Sub": _case("Sub", [X, Const(np.float32(0.5))]),
    "Div": _case("Div", [X, Const(_rand(9, lo=0.5, hi=2.0, seed=17))]),
    "Div-int": _case("Div", [Const(np.array([7, -7, 9], np.int64)), Const(np.array([2, 2, 3], np.int64))]),
    "Sum": _case("Sum", [X, X * 2, Const(np.float32(1))]),
    "Max": _case("Max", [X, _rand(2, 4, 7, 9, seed=18)]),
    "Where": _case("Where", [Const(np.array([True, False] * 2 + [True] * 5).reshape(9)), X, Const(np.float32(0))]),
    "GlobalAveragePool": _case("GlobalAveragePool", [X]),
    "GlobalMaxPool": _case("GlobalMaxPool", [X]),
    "AveragePool": _case("AveragePool", [X], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "AveragePool-incl-asym": _case("AveragePool", [X], kernel_shape=[2, 3], pads=[0, 1, 1, 0], count_include_pad=1),
    "AveragePool-ceil": _case("AveragePool", [X], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    "MaxPool": _case("MaxPool", [X], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "MaxPool-asym": _case("MaxPool", [X], kernel_shape=[2, 2], strides=[1, 2], pads=[0, 1, 1, 0]),
    "Flatten": _case("Flatten", [X], axis=2),
    "Reshape": _case("Reshape", [X, Const(np.array([0, -1, 9], np.int64))]),
    "Transpose": _case("Transpose", [X], perm=[0, 2, 3, 1]),
    "Concat": _case("Concat", [X, _rand(2, 3, 7, 9, seed=19)], axis=1),
    "Softmax": _case("Softmax", [SEQ], axis=1),
    "Softmax-opset11": _case("Softmax", [SEQ], opset=11, axis=1),
    "LogSoftmax": _case("LogSoftmax", [SEQ]),
    "LayerNormalization": _case(
        "LayerNormalization", [SEQ, Const(_rand(8, seed=20)), Const(_rand(8, seed=21))], opset=17, epsilon=1e-5
    ),
    "LayerNormalization-2axes": _case("LayerNormalization", [SEQ, Const(_rand(5, 8, seed=22))], opset=17, axis=1),
    "InstanceNormalization": _case("InstanceNormalization", [X, Const(_rand(4, seed=23)), Const(_rand(4, seed=24))]),
    "ReduceMean": _case("ReduceMean", [X], axes=[2, 3], keepdims=1),
    "ReduceMean-18": _case("ReduceMean", [X, Const(np.array([-1], np.int64))], opset=18, keepdims=0),
    "ReduceSum": _case("ReduceSum", [X, Const(np.array([1], np.int64))]),
    "ReduceMax": _case("ReduceMax", [X], axes=[1], keepdims=0),
    "ReduceL2": _case("ReduceL2", [X], axes=[3]),
    "ReduceMin": _case("ReduceMin", [X], axes=[0, 2]),
    "ReduceSumSquare": _case("ReduceSumSquare", [X], axes=[1]),
    "Squeeze": _case("Squeeze", [_rand(2, 1, 3, 1), Const(np.array([1], np.int64))]),
    "Unsqueeze": _case("Unsqueeze", [SEQ, Const(np.array([0, -1], np.int64))]),
    "Shape": _case("Shape", [X]),
    "Shape-slice": _case("Shape", [X], opset=15, start=1, end=-1),
    "Gather": _case("Gather", [X, Const(np.array([[0, 2], [-1, 1]], np.int64))], axis=1),
    "Gather-scalar": _case("Gather", [Const(np.array([5, 6, 7], np.int64)), Const(np.array(1, np.int64))]),
    "Slice": _case(
        "Slice",
        [
            X,
            Const(np.array([1, -5], np.int64)),
            Const(np.array([3, 100], np.int64)),
            Const(np.array([1, 3], np.int64)),
            Const(np.array([1, 2], np.int64)),
        ],
    ),
    "Slice-negative-step": _case(
        "Slice",
        [
            X,
            Const(np.array([-1], np.int64)),
            Const(np.array([-100], np.int64)),
            Const(np.array([2], np.int64)),
            Const(np.array([-2], np.int64)),
        ],
    ),
    "Split": _case("Split", [X, Const(np.array([1, 3], np.int64))], outputs=2, axis=1),
    "Split-even": _case("Split", [X], outputs=3, opset=13, axis=3),
    "Pad": _case("Pad", [X, Const(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)), Const(np.float32(0.5))]),
    "Pad-reflect": _case("Pad", [X, Const(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))], mode="reflect"),
    "Pad-edge": _case("Pad", [X, Const(np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64))], mode="edge"),
    "Expand": _case("Expand", [_rand(4, 1, 1), Const(np.array([2, 4, 3, 5], np.int64))]),
    "Tile": _case("Tile", [_rand(2, 3), Const(np.array([2, 1], np.int64))]),
    "Cast": _case("Cast", [X], to=TensorProto.INT64),
    "Identity": _case("Identity", [X]),
    "ConstantOfShape": _case(
        "ConstantOfShape",
        [Const(np.array([2, 3], np.int64))],
        value=numpy_helper.from_array(np.array([1.5], np.float32)),
    ),
    "Range": _case(
        "Range", [Const(np.array(1, np.int64)), Const(np.array(10, np.int64)), Const(np.array(3, np.int64))]
    ),
    "Equal": _case("Equal", [Const(np.array([1, 2, 3], np.int64)), Const(np.array([1, 0, 3], np.int64))]),
    "ArgMax": _case("ArgMax", [SEQ], axis=2, keepdims=0),
    "ArgMin": _case("ArgMin", [SEQ], axis=1),
    "DepthToSpace": _case("DepthToSpace", [_rand(2, 8, 3, 4)], blocksize=2, mode="CRD"),
    "DepthToSpace-dcr": _case("DepthToSpace", [_rand(2, 8, 3, 4)], blocksize=2),
    "Resize-nearest": _case(
        "Resize",
        [X, Const(np.zeros(0, np.float32)), Const(np.array([1, 1, 2, 2], np.float32))],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    ),
    "Resize-linear": _case(
        "Resize", [X, Const(np.zeros(0, np.float32)), Const(np.array([1, 1, 2, 1.5], np.float32))], mode="linear"
    ),
}

# every op of the table is checked here (Softplus and the other element-wise ones in one case)
ELEMENTWISE = [
    "Abs",
    "Log",
    "Floor",
    "Ceil",
    "Sin",
    "Cos",
    "Softplus",
    "Not",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Min",
    "Size",
]


def _model(op, inputs, opset, outputs, attrs):
    feeds, inits, names = {}, [], []
    for i, v in enumerate(inputs):
        name = f"in{i}"
        names.append(name)
        if isinstance(v, Const):
            inits.append(numpy_helper.from_array(v.value, name))
        else:
            feeds[name] = np.asarray(v)
    outs = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, name="node", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [onnx.ValueInfoProto(name=o) for o in outs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else 9
    return model, feeds, {i.name: numpy_helper.to_array(i) for i in inits}


def _run_both(op, inputs, opset, outputs, attrs):
    model, feeds, consts = _model(op, inputs, opset, outputs, attrs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    fn = convert_node(model.graph.node[0], opset, consts)
    args = [torch.as_tensor(np.array(feeds[n] if n in feeds else consts[n])) for n in model.graph.node[0].input]
    got = fn(*args)
    got = list(got) if isinstance(got, tuple) else [got]
    return want, [g.detach().numpy() for g in got]


@pytest.mark.parametrize("case", sorted(CASES), ids=str)
def test_each_converted_op_computes_what_onnx_runtime_computes(case):
    want, got = _run_both(*CASES[case])
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.shape == w.shape, case
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=case)
        else:
            np.testing.assert_array_equal(g.astype(w.dtype), w, err_msg=case)


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_the_simple_element_wise_ops_too(op):
    x = np.random.default_rng(3).uniform(0.2, 3.0, size=(2, 3, 4)).astype(np.float32)
    y = np.random.default_rng(4).uniform(0.2, 3.0, size=(2, 3, 4)).astype(np.float32)
    if op in ("Not", "And", "Or"):
        x, y = x > 1.5, y > 1.5
    inputs = [x] if op in ("Abs", "Log", "Floor", "Ceil", "Sin", "Cos", "Softplus", "Not", "Size") else [x, y]
    want, got = _run_both(op, inputs, 13, 1, {})
    np.testing.assert_allclose(got[0].astype(np.float64), want[0].astype(np.float64), rtol=1e-5, atol=1e-6)


def test_every_op_of_the_table_has_a_test():
    tested = {c[0] for c in CASES.values()} | set(ELEMENTWISE)
    assert sorted(set(OPS) - tested) == []


def test_an_op_the_converter_does_not_know_is_a_one_line_model_error():
    from trtq.errors import ModelError

    node = helper.make_node("NonMaxSuppression", ["a", "b"], ["c"], name="nms")
    with pytest.raises(ModelError, match="NonMaxSuppression .nms. is not supported"):
        convert_node(node, 13)
    custom = helper.make_node("Foo", ["a"], ["b"], name="foo", domain="com.example")
    with pytest.raises(ModelError, match="com.example::Foo"):
        convert_node(custom, 13)


def test_clip_with_constant_bounds_is_the_same_function_with_gradients():
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")
    consts = {"lo": np.float32(0), "hi": np.float32(6)}
    fn = convert_node(node, 13, consts)
    x = torch.linspace(-2, 8, 11, requires_grad=True)
    y = fn(x, torch.tensor(0.0), torch.tensor(6.0))
    y.sum().backward()
    assert y.tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 6, 6]
    assert x.grad.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
