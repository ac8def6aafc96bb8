"""Where Q/DQ goes: weights per channel, residual Adds, Concat scales, shared tensors, kept-float patterns."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.quantize.conftest import (
    activation_amax,
    attention_model,
    conv,
    conv_weight,
    cosine,
    init,
    initializer,
    make_model,
    nodes_of,
    random_feeds,
    run,
    value,
)
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.rules import ZERO_SCALE


def quantize(model, amax=None, **opts):
    """The standard placement's rules, which these tests pin (the default, shared, adds its pairs on
    top: tests/quantize/test_shared_placement.py)."""
    amax = activation_amax(model, [random_feeds(model)]) if amax is None else amax
    result = quantize_model(model, amax, QuantizeOptions(**{"placement": "standard", **opts}))
    onnx.checker.check_model(result.model, full_check=True)
    return result


def q_of(model, tensor):
    """The QuantizeLinear nodes reading ``tensor``."""
    return [n for n in nodes_of(model, "QuantizeLinear") if n.input[0] == tensor]


def axis_of(node):
    return next((a.i for a in node.attribute if a.name == "axis"), None)


def node(model, name):
    return next(n for n in model.graph.node if n.name == name)


# ------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------


def test_conv_weight_per_channel_scales_are_max_abs_over_127():
    rng = np.random.default_rng(1)
    w = conv_weight(rng, 16, 16)
    w[5] = 0.0  # an all-zero output channel
    model = make_model(
        [conv("c", "x", "w", "y", bias="b")],
        [value("x", [1, 16, 8, 8])],
        [value("y", None)],
        [init("w", w), init("b", rng.standard_normal(16).astype(np.float32))],
    )
    result = quantize(model)
    q = result.model
    (wq,) = q_of(q, "w")
    assert axis_of(wq) == 0
    scale = initializer(q, "w_scale")
    expected = np.abs(w).reshape(16, -1).max(axis=1) / 127.0
    expected[5] = ZERO_SCALE
    assert scale.dtype == np.float32 and scale.shape == (16,)
    np.testing.assert_allclose(scale, expected, rtol=1e-6)
    assert (scale > 0).all()
    zp = initializer(q, "w_zero_point")
    assert zp.dtype == np.int8 and zp.shape == (16,) and not zp.any()
    # activation: scalar float32 scale and int8 scalar zero point; bias stays float and unquantized
    assert initializer(q, "x_scale").shape == () and initializer(q, "x_zero_point").dtype == np.int8
    assert node(q, "c").input[2] == "b" and not q_of(q, "b")
    run(q, random_feeds(model))


def test_a_dead_channel_scale_keeps_its_bias_within_int32():
    """Channel 3's weights are ~1e-9 (training left it dead) and its bias 2.0: at max|W| / 127 the
    bias over input scale x weight scale is ~1e11, beyond int32, which runtimes that quantize the
    bias (ONNX Runtime 1.21+ even at basic level, D40) saturate. Its scale is raised to keep it
    within 2**30; the live channels keep max|W| / 127, and plain ONNX Runtime computes the model as
    trtq's Q/DQ semantics do."""
    import onnxruntime as ort

    from trtq.quantize.plan import INT32_BIAS_LIMIT

    rng = np.random.default_rng(2)
    w = conv_weight(rng, 8, 4)
    w[3] = rng.standard_normal(w[3].shape).astype(np.float32) * 1e-9
    b = rng.standard_normal(8).astype(np.float32)
    b[3] = 2.0
    model = make_model(  # c's output feeds c2's Q/DQ pair: what ONNX Runtime's bias quantization looks for
        [conv("c", "x", "w", "h", bias="b"), conv("c2", "h", "w2", "y")],
        [value("x", [2, 4, 6, 6])],
        [value("y", None)],
        [init("w", w), init("b", b), init("w2", conv_weight(rng, 16, 8))],
    )
    q = quantize(model, amax={"x": 3.0, "h": 4.0}).model
    scale = initializer(q, "w_scale").astype(np.float64)
    s_x = float(initializer(q, "x_scale"))
    peak = np.abs(w).reshape(8, -1).max(axis=1) / 127.0
    live = np.arange(8) != 3
    np.testing.assert_allclose(scale[live], peak[live], rtol=1e-6)
    assert 2.0 / (s_x * scale[3]) <= INT32_BIAS_LIMIT * 1.0001 and scale[3] > 100 * peak[3]
    feeds = {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    plain = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(plain.run(None, feeds)[0], run(q, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op, w_shape, attrs, axis",
    [
        ("Gemm", (32, 16), {"transB": 1}, 0),  # B is [N, K]
        ("Gemm", (16, 32), {}, 1),  # B is [K, N]
        ("MatMul", (16, 32), {}, 1),
    ],
)
def test_gemm_and_matmul_weight_axis_is_the_output_channel(op, w_shape, attrs, axis):
    rng = np.random.default_rng(2)
    w = rng.standard_normal(w_shape).astype(np.float32)
    model = make_model(
        [helper.make_node(op, ["x", "w"], ["y"], name="mm", **attrs)],
        [value("x", [4, 16])],
        [value("y", None)],
        [init("w", w)],
    )
    q = quantize(model).model
    (wq,) = q_of(q, "w")
    assert axis_of(wq) == axis
    reduce = 1 - axis
    np.testing.assert_allclose(initializer(q, "w_scale"), np.abs(w).max(axis=reduce) / 127.0, rtol=1e-6)
    assert initializer(q, "w_scale").shape == (32,)
    assert node(q, "mm").input[0] == "x_DequantizeLinear_Output"


def test_conv_transpose_weight_axis_1_and_depthwise_axis_0():
    rng = np.random.default_rng(3)
    wt = rng.standard_normal((16, 32, 2, 2)).astype(np.float32)  # [C_in, C_out, k, k]
    wd = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)  # depthwise: group 32
    model = make_model(
        [
            helper.make_node("ConvTranspose", ["x", "wt"], ["t"], name="up", strides=[2, 2]),
            conv("dw", "t", "wd", "y", group=32),
        ],
        [value("x", [1, 16, 4, 4])],
        [value("y", None)],
        [init("wt", wt), init("wd", wd)],
    )
    result = quantize(model)
    q = result.model
    assert result.quantized == ["up", "dw"]
    assert axis_of(q_of(q, "wt")[0]) == 1
    np.testing.assert_allclose(initializer(q, "wt_scale"), np.abs(wt).max(axis=(0, 2, 3)) / 127.0, rtol=1e-6)
    assert axis_of(q_of(q, "wd")[0]) == 0 and initializer(q, "wd_scale").shape == (32,)
    # TensorRT 8.6 cannot infer kernel_shape from a weight behind DequantizeLinear: it is written out
    kernel = {n.name: [list(a.ints) for a in n.attribute if a.name == "kernel_shape"] for n in q.graph.node}
    assert kernel["up"] == [[2, 2]] and kernel["dw"] == [[3, 3]]


def test_per_tensor_weights_when_per_channel_is_off():
    rng = np.random.default_rng(4)
    w = conv_weight(rng, 16, 16)
    model = make_model([conv("c", "x", "w", "y")], [value("x", [1, 16, 6, 6])], [value("y", None)], [init("w", w)])
    q = quantize(model, per_channel=False).model
    (wq,) = q_of(q, "w")
    assert axis_of(wq) is None
    assert initializer(q, "w_scale").shape == ()
    np.testing.assert_allclose(initializer(q, "w_scale"), np.abs(w).max() / 127.0, rtol=1e-6)


def test_matmul_of_two_activations_quantizes_both_per_tensor():
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [value("a", [2, 16, 32]), value("b", [2, 32, 16])],
        [value("y", None)],
    )
    result = quantize(model)
    q = result.model
    assert result.quantized == ["mm"]
    assert list(node(q, "mm").input) == ["a_DequantizeLinear_Output", "b_DequantizeLinear_Output"]
    assert initializer(q, "a_scale").shape == () and initializer(q, "b_scale").shape == ()


def test_shared_weight_and_shared_activation_get_one_pair_each():
    rng = np.random.default_rng(5)
    model = make_model(
        [
            conv("c1", "x", "w", "h"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            conv("c2", "r", "w", "y1"),  # same weight as c1
            conv("c3", "r", "w3", "y2"),  # same activation as c2
        ],
        [value("x", [1, 16, 6, 6])],
        [value("y1", None), value("y2", None)],
        [init("w", conv_weight(rng, 16, 16)), init("w3", conv_weight(rng, 16, 16))],
    )
    q = quantize(model).model
    assert len(q_of(q, "w")) == 1 and len(q_of(q, "r")) == 1
    assert node(q, "c1").input[1] == node(q, "c2").input[1] == "w_DequantizeLinear_Output"
    assert node(q, "c2").input[0] == node(q, "c3").input[0] == "r_DequantizeLinear_Output"
    # x, w, r, w3: one pair each
    assert len(nodes_of(q, "QuantizeLinear")) == len(nodes_of(q, "DequantizeLinear")) == 4


# ------------------------------------------------------------------------------------------------
# residual Add
# ------------------------------------------------------------------------------------------------


def _bn(name, x, y, c, rng):
    inits = [
        init(f"{name}_s", rng.uniform(0.5, 1.5, c).astype(np.float32)),
        init(f"{name}_b", rng.standard_normal(c).astype(np.float32) * 0.1),
        init(f"{name}_m", rng.standard_normal(c).astype(np.float32) * 0.1),
        init(f"{name}_v", rng.uniform(0.5, 1.5, c).astype(np.float32)),
    ]
    node_ = helper.make_node("BatchNormalization", [x] + [i.name for i in inits], [y], name=name)
    return node_, inits


def test_identity_residual_add_quantizes_the_skip_input_only():
    rng = np.random.default_rng(6)
    bn1, i1 = _bn("bn1", "c1", "b1", 16, rng)
    bn2, i2 = _bn("bn2", "c2", "b2", 16, rng)
    model = make_model(
        [
            conv("conv1", "x", "w1", "c1"),
            bn1,
            helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
            conv("conv2", "r1", "w2", "c2"),
            bn2,
            helper.make_node("Add", ["b2", "x"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["y"], name="relu2"),
        ],
        [value("x", [1, 16, 8, 8])],
        [value("y", None)],
        [init("w1", conv_weight(rng, 16, 16)), init("w2", conv_weight(rng, 16, 16))] + i1 + i2,
    )
    result = quantize(model)
    q = result.model
    assert result.quantized == ["conv1", "conv2", "add"]
    add = node(q, "add")
    assert add.input[0] == "b2"  # the Conv branch stays float so TensorRT fuses Conv+BN+Add
    assert add.input[1] == "x_DequantizeLinear_Output"  # the skip reuses conv1's Q/DQ of x
    assert len(q_of(q, "x")) == 1
    run(q, random_feeds(model))


def test_downsampling_block_quantizes_the_shorter_shortcut_branch():
    rng = np.random.default_rng(7)
    bn1, i1 = _bn("bn1", "c1", "b1", 16, rng)
    bn2, i2 = _bn("bn2", "c2", "b2", 16, rng)
    bnd, i3 = _bn("bnd", "cd", "bd", 16, rng)
    model = make_model(
        [
            conv("stem", "x", "w0", "s0"),
            helper.make_node("Relu", ["s0"], ["t"], name="relu0"),
            conv("conv1", "t", "w1", "c1"),
            bn1,
            helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
            conv("conv2", "r1", "w2", "c2"),
            bn2,
            conv("convd", "t", "wd", "cd", k=1),
            bnd,
            helper.make_node("Add", ["b2", "bd"], ["y"], name="add"),
        ],
        [value("x", [1, 16, 8, 8])],
        [value("y", None)],
        [init(n, conv_weight(rng, 16, 16, 1 if n == "wd" else 3)) for n in ("w0", "w1", "w2", "wd")] + i1 + i2 + i3,
    )
    q = quantize(model).model
    add = node(q, "add")
    assert add.input[0] == "b2" and add.input[1] == "bd_DequantizeLinear_Output"


def test_adds_that_are_not_residual_get_nothing():
    rng = np.random.default_rng(8)
    model = make_model(
        [
            conv("c1", "x", "w1", "h"),
            helper.make_node("Add", ["h", "bias"], ["hb"], name="bias_add"),  # constant operand
            helper.make_node("Relu", ["x"], ["rx"], name="relu"),
            helper.make_node("Add", ["x", "rx"], ["plain"], name="plain_add"),  # no Conv on either side
            helper.make_node("Add", ["hb", "plain"], ["y"], name="out_add"),  # hb feeds only this Add
        ],
        [value("x", [1, 16, 6, 6])],
        [value("y", None)],
        [init("w1", conv_weight(rng, 16, 16)), init("bias", np.ones((1, 16, 1, 1), np.float32))],
    )
    result = quantize(model, fold_affine=False)  # the bias Add kept as a node (quantize.fold_affine)
    q = result.model
    assert list(node(q, "bias_add").input) == ["h", "bias"]
    assert list(node(q, "plain_add").input) == ["x", "rx"]
    # out_add: h -> bias Add is a Conv+bias chain feeding only out_add, so "plain" is its skip input
    assert list(node(q, "out_add").input) == ["hb", "plain_DequantizeLinear_Output"]
    assert "bias_add" not in result.quantized and "plain_add" not in result.quantized
    # folded (the default): c1 writes "hb" itself, and out_add is the same residual Add
    folded = quantize(model).model
    assert not [n for n in folded.graph.node if n.name == "bias_add"] and node(folded, "c1").output[0] == "hb"
    assert list(node(folded, "out_add").input) == ["hb", "plain_DequantizeLinear_Output"]


def test_residual_add_stays_float_when_its_conv_is_excluded():
    rng = np.random.default_rng(9)
    model = make_model(
        [conv("c1", "x", "w1", "h"), helper.make_node("Add", ["h", "x"], ["y"], name="add")],
        [value("x", [1, 16, 6, 6])],
        [value("y", None)],
        [init("w1", conv_weight(rng, 16, 16))],
    )
    assert quantize(model).quantized == ["c1", "add"]
    result = quantize(model, exclude=("c1",))
    assert result.quantized == []
    assert ("c1", "excluded by --exclude c1") in result.left_float
    assert list(node(result.model, "add").input) == ["h", "x"]
    excluded_add = quantize(model, exclude=("^add$",))
    assert excluded_add.quantized == ["c1"] and ("add", "excluded by --exclude ^add$") in excluded_add.left_float


# ------------------------------------------------------------------------------------------------
# Concat and commuting ops
# ------------------------------------------------------------------------------------------------


def test_concat_quantized_inputs_and_output_share_the_largest_amax():
    rng = np.random.default_rng(10)
    model = make_model(
        [
            conv("ca", "x", "wa", "a"),
            conv("cb", "x", "wb", "b"),
            helper.make_node("Concat", ["a", "b"], ["cat"], name="concat", axis=1),
            conv("cc", "cat", "wc", "y0"),
            conv("cd", "a", "wd", "y1"),
            conv("ce", "b", "we", "y2"),
        ],
        [value("x", [1, 16, 6, 6])],
        [value("y0", None), value("y1", None), value("y2", None)],
        [
            init("wa", conv_weight(rng, 16, 16)),
            init("wb", conv_weight(rng, 16, 16) * 3),
            init("wc", conv_weight(rng, 16, 32)),
            init("wd", conv_weight(rng, 16, 16)),
            init("we", conv_weight(rng, 16, 16)),
        ],
    )
    amax = activation_amax(model, [random_feeds(model)])
    assert amax["a"] != amax["b"]
    q = quantize(model, amax).model
    shared = max(amax["a"], amax["b"], amax["cat"]) / 127.0
    for t in ("a", "b", "cat"):
        assert float(initializer(q, f"{t}_scale")) == pytest.approx(shared, rel=1e-6)
    assert float(initializer(q, "x_scale")) == pytest.approx(amax["x"] / 127.0, rel=1e-6)


def test_concat_scale_group_counts_only_quantized_tensors():
    """Concat output not quantized: its inputs a and b share a scale only while both have Q/DQ."""
    rng = np.random.default_rng(17)
    model = make_model(
        [
            conv("ca", "x", "wa", "a"),
            conv("cb", "x", "wb", "b"),
            helper.make_node("Concat", ["a", "b"], ["cat"], name="concat", axis=1),
            conv("cd", "a", "wd", "y1"),
            conv("ce", "b", "we", "y2"),
        ],
        [value("x", [1, 16, 6, 6])],
        [value("cat", None), value("y1", None), value("y2", None)],
        [
            init("wa", conv_weight(rng, 16, 16) * 4),
            init("wb", conv_weight(rng, 16, 16)),
            init("wd", conv_weight(rng, 16, 16)),
            init("we", conv_weight(rng, 16, 16)),
        ],
    )
    amax = activation_amax(model, [random_feeds(model)])
    assert amax["a"] > amax["b"]
    both = quantize(model, amax).model
    assert float(initializer(both, "b_scale")) == pytest.approx(amax["a"] / 127.0, rel=1e-6)
    only_b = quantize(model, amax, exclude=("cd",)).model  # a keeps no Q/DQ
    assert not q_of(only_b, "a")
    assert float(initializer(only_b, "b_scale")) == pytest.approx(amax["b"] / 127.0, rel=1e-6)


def test_amax_is_found_through_data_movement_ops():
    """NHWC input: x -> Transpose -> Conv. A cache naming only x still quantizes the Conv."""
    rng = np.random.default_rng(11)
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["xt"], name="to_nchw", perm=[0, 3, 1, 2]), conv("c", "xt", "w", "y")],
        [value("x", ["N", 8, 8, 16])],
        [value("y", None)],
        [init("w", conv_weight(rng, 16, 16))],
    )
    feeds = random_feeds(model)
    amax = {"x": float(np.abs(feeds["x"]).max())}
    result = quantize(model, amax)
    assert result.quantized == ["c"] and result.missing_amax == []
    assert node(result.model, "c").input[0] == "xt_DequantizeLinear_Output"
    assert float(initializer(result.model, "xt_scale")) == pytest.approx(amax["x"] / 127.0, rel=1e-6)
    for batch in (1, 3):
        out = run(result.model, {"x": random_feeds(model, batch=batch)["x"]})[0]
        assert out.shape == (batch, 16, 8, 8)


# ------------------------------------------------------------------------------------------------
# kept float
# ------------------------------------------------------------------------------------------------


def test_attention_core_is_kept_float_and_projections_quantized():
    result = quantize(attention_model(np.random.default_rng(12)))
    assert result.quantized == ["proj_q", "proj_k", "proj_v", "proj_o"]
    reasons = dict(result.left_float)
    assert reasons["scores"].startswith("attention scores (feeds Softmax softmax)")
    assert reasons["context"].startswith("attention (Softmax output softmax")
    assert not any(n.input[0] == "p" for n in nodes_of(result.model, "QuantizeLinear"))


def _dequantized(model, name):
    """Whether every input of node ``name`` is a DequantizeLinear output."""
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    return all(producers.get(i) == "DequantizeLinear" for i in node(model, name).input)


def test_attention_int8_quantizes_both_matmuls_and_the_softmax_output():
    model = attention_model(np.random.default_rng(12))
    feeds = random_feeds(model)
    amax = activation_amax(model, [feeds])
    result = quantize(model, amax, attention="int8")
    assert result.quantized == ["proj_q", "proj_k", "proj_v", "scores", "context", "proj_o"]
    assert result.left_float == [] and result.missing_amax == []
    q = result.model
    assert _dequantized(q, "scores") and _dequantized(q, "context")
    (softmax_q,) = q_of(q, "p")  # the Softmax output, scale amax / 127
    assert float(initializer(q, softmax_q.input[1])) == pytest.approx(amax["p"] / 127.0, rel=1e-6)
    ref, got = run(model, feeds)[0], run(q, feeds)[0]
    assert cosine(ref, got) > 0.999
    # the default keeps the same two MatMuls float (test above): one option flips exactly them
    assert set(result.quantized) - set(quantize(model, amax).quantized) == {"scores", "context"}


@pytest.mark.parametrize("length, quantized", [(512, True), (600, False), (None, True)])
def test_attention_int8_stops_at_512_keys(length, quantized):
    """TensorRT's INT8 attention kernels take at most 512 keys (ModelOpt's INT8 rule): a longer
    Softmax keeps its MatMuls float; a length shape inference cannot tell is quantized."""
    model = attention_model(np.random.default_rng(12), length=length or "L")
    amax = {t: 1.0 for t in ("x", "q", "k", "kt", "v", "qk", "qk_s", "p", "ctx")}
    result = quantize(model, amax, attention="int8")
    reasons = dict(result.left_float)
    assert ("scores" in result.quantized and "context" in result.quantized) is quantized, reasons
    if not quantized:
        assert "over 600 keys kept float" in reasons["scores"] and "at most 512" in reasons["context"]


def test_attention_setting_is_checked():
    from trtq.quantize.graph import GraphIndex
    from trtq.quantize.plan import make_plan

    with pytest.raises(ValueError, match="unknown attention"):
        make_plan(GraphIndex(attention_model(np.random.default_rng(1))), {}, (), True, None, {}, "standard", "fp8")


def test_small_gemms_and_convs_are_kept_float():
    rng = np.random.default_rng(13)
    model = make_model(
        [
            conv("big", "x", "w_big", "h"),
            conv("narrow", "h", "w_narrow", "n", k=1),  # 16 -> 4: 16 in, a multiple of 8: quantized
            conv("tiny", "n", "w_tiny", "t"),  # 4 -> 4: too few channels
            helper.make_node("Flatten", ["h"], ["f"], name="flat"),
            helper.make_node("MatMul", ["f", "w_head"], ["y"], name="head"),  # N = 4
        ],
        [value("x", [1, 16, 4, 4])],
        [value("y", None), value("t", None)],
        [
            init("w_big", conv_weight(rng, 16, 16)),
            init("w_narrow", conv_weight(rng, 4, 16, 1)),
            init("w_tiny", conv_weight(rng, 4, 4)),
            init("w_head", rng.standard_normal((256, 4)).astype(np.float32)),
        ],
    )
    result = quantize(model)
    reasons = dict(result.left_float)
    assert result.quantized == ["big", "narrow"]
    assert "too small for INT8 kernels" in reasons["head"] and "K=256 N=4" in reasons["head"]
    assert "too few channels" in reasons["tiny"]


def test_first_conv_on_rgb_input_is_quantized():
    rng = np.random.default_rng(14)
    model = make_model(
        [conv("stem", "x", "w", "y")],
        [value("x", [1, 3, 8, 8])],
        [value("y", None)],
        [init("w", conv_weight(rng, 16, 3))],
    )
    assert quantize(model).quantized == ["stem"]


def test_graph_outputs_are_never_quantized():
    rng = np.random.default_rng(15)
    model = make_model(
        [conv("c1", "x", "w1", "h"), helper.make_node("Relu", ["h"], ["r"], name="relu"), conv("c2", "r", "w2", "y")],
        [value("x", [1, 16, 4, 4])],
        [value("r", None), value("y", None)],  # r is an output and feeds c2
        [init("w1", conv_weight(rng, 16, 16)), init("w2", conv_weight(rng, 16, 16))],
    )
    q = quantize(model).model
    assert [o.name for o in q.graph.output] == ["r", "y"]
    assert node(q, "relu").output[0] == "r"
    assert not any(n.input and n.input[0] in ("y",) for n in nodes_of(q, "QuantizeLinear"))
    assert node(q, "c2").input[0] == "r_DequantizeLinear_Output"


def test_float16_inputs_are_left_float_with_a_reason():
    rng = np.random.default_rng(16)
    model = make_model(
        [conv("c", "x", "w", "y")],
        [value("x", [1, 16, 4, 4], TensorProto.FLOAT16)],
        [value("y", None, TensorProto.FLOAT16)],
        [init("w", conv_weight(rng, 16, 16).astype(np.float16))],
    )
    result = quantize_model(model, {"x": 1.0}, QuantizeOptions())
    assert result.quantized == []
    assert "FLOAT16" in dict(result.left_float)["c"]


def test_exclude_takes_exact_node_names_before_regexes():
    """``--exclude Conv@1`` is that node only (a regex search would also hit Conv@10..Conv@19)."""
    from tests.quantize.conftest import conv, conv_weight, init, make_model, value

    rng = np.random.default_rng(11)
    names = [f"Conv@{i}" for i in (0, 1, 10, 11)]
    nodes, inits, x = [], [], "x"
    for i, name in enumerate(names):
        nodes.append(conv(name, x, f"w{i}", f"h{i}"))
        inits.append(init(f"w{i}", conv_weight(rng, 16, 16)))
        x = f"h{i}"
    model = make_model(nodes, [value("x", [1, 16, 6, 6])], [value(x, [1, 16, 6, 6])], inits)
    assert quantize(model, exclude=("Conv@1",)).quantized == ["Conv@0", "Conv@10", "Conv@11"]
    assert quantize(model, exclude=("Conv@1.",)).quantized == ["Conv@0", "Conv@1"]  # not a name: a regex
    assert quantize(model, exclude=("^Conv@1",)).quantized == ["Conv@0"]
    assert quantize(model, exclude=("Conv",)).quantized == []  # an op type
