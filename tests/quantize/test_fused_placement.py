"""``placement: fused`` (quantize/fused.py): where Q/DQ goes around Split, residual Adds behind
SiLU, Concat and pooling, against the standard placement, on small graphs run by ONNX Runtime."""

import json
import math

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import (
    activation_amax,
    conv,
    conv_weight,
    init,
    initializer,
    make_model,
    nodes_of,
    producer_of,
    random_feeds,
    run,
    value,
)
from tests.zoo import zoo_steps
from trtq.config import QuantizeOptions
from trtq.model_check import check_produced_model
from trtq.quantize import quantize_model

ZOO = zoo_steps.zoo_dir()
MANIFEST = zoo_steps.load_manifest(ZOO)


def _silu(x, y):
    return [
        helper.make_node("Sigmoid", [x], [y + "_sig"], name=y + "_sigmoid"),
        helper.make_node("Mul", [x, y + "_sig"], [y], name=y + "_mul"),
    ]


def c2f_block():
    """conv -> SiLU -> Split -> (a, b); b -> conv -> SiLU -> conv -> SiLU -> Add(b, .) -> r;
    Concat(a, b, r) -> conv -> y: YOLOv8's C2f with one bottleneck."""
    rng = np.random.default_rng(3)
    nodes = [conv("cv1", "x", "w1", "t1", bias="b1", k=1)] + _silu("t1", "s")
    nodes.append(helper.make_node("Split", ["s", "split"], ["a", "b"], name="split", axis=1))
    nodes += [conv("m1", "b", "w2", "t2", bias="b2")] + _silu("t2", "u")
    nodes += [conv("m2", "u", "w3", "t3", bias="b3")] + _silu("t3", "v")
    nodes.append(helper.make_node("Add", ["b", "v"], ["r"], name="residual"))
    nodes.append(helper.make_node("Concat", ["a", "b", "r"], ["cat"], name="concat", axis=1))
    nodes.append(conv("cv2", "cat", "w4", "y", bias="b4", k=1))
    inits = [
        init("w1", conv_weight(rng, 32, 16, 1)),
        init("split", np.array([16, 16], dtype=np.int64)),
        init("w2", conv_weight(rng, 16, 16)),
        init("w3", conv_weight(rng, 16, 16)),
        init("w4", conv_weight(rng, 32, 48, 1)),
    ]
    inits += [init(f"b{i}", rng.standard_normal(c).astype(np.float32)) for i, c in ((1, 32), (2, 16), (3, 16), (4, 32))]
    return make_model(nodes, [value("x", [1, 16, 8, 8])], [value("y", None)], inits)


def quantize(model, placement, amax=None, **opts):
    amax = activation_amax(model, [random_feeds(model, seed=s) for s in range(2)]) if amax is None else amax
    result = quantize_model(model, amax, QuantizeOptions(placement=placement, **opts))
    onnx.checker.check_model(result.model, full_check=True)
    return result, amax


def dq_scale(model, tensor):
    """The scale of the DequantizeLinear that produces ``tensor``, or None when it is float."""
    node = producer_of(model, tensor)
    if node is None or node.op_type != "DequantizeLinear":
        return None
    return float(initializer(model, node.input[1]))


def reads(model, name):
    return list(next(n for n in model.graph.node if n.name == name).input)


def sqnr(ref, got):
    return 10 * math.log10(float(np.sum(ref.astype(np.float64) ** 2)) / float(np.sum((ref - got) ** 2.0)))


def test_standard_leaves_the_c2f_split_add_and_concat_float():
    q = quantize(c2f_block(), "standard")[0].model
    assert all(dq_scale(q, t) is None for t in reads(q, "residual"))  # SiLU ends the residual walk
    assert all(dq_scale(q, t) is None for t in reads(q, "concat"))
    assert dq_scale(q, reads(q, "split")[0]) is None
    assert dq_scale(q, reads(q, "cv2")[0]) is not None  # only the Concat output, for cv2


def test_fused_quantizes_the_c2f_group_with_one_scale():
    model = c2f_block()
    result, amax = quantize(model, "fused")
    q = result.model
    # residual Add behind SiLU, skip from a Split: both inputs
    assert all(dq_scale(q, t) is not None for t in reads(q, "residual"))
    # Split reads the SiLU output through Q/DQ; the group (s, a, b, r, cat) shares one scale: the
    # largest amax among the tensors the standard plan quantizes there (b for m1, cat for cv2)
    group = {"b", "cat"}
    scales = {dq_scale(q, t) for t in reads(q, "concat") + [reads(q, "split")[0], reads(q, "cv2")[0]]}
    assert len(scales) == 1 and None not in scales
    np.testing.assert_allclose(scales.pop(), max(amax[t] for t in group) / 127, rtol=1e-6)
    # the residual's main input (v, SiLU output) keeps its own scale
    assert dq_scale(q, reads(q, "residual")[1]) == pytest.approx(amax["v"] / 127, rel=1e-6)
    assert {"split", "residual", "concat"} <= set(result.quantized)
    # accuracy on ONNX Runtime: within 1 dB of the standard placement
    feeds = random_feeds(model, seed=7)
    ref = run(model, feeds)[0]
    standard = run(quantize(model, "standard", amax)[0].model, feeds)[0]
    fused = run(q, feeds)[0]
    assert sqnr(ref, fused) > sqnr(ref, standard) - 1.0
    assert len(nodes_of(q, "QuantizeLinear")) > len(
        nodes_of(quantize(model, "standard", amax)[0].model, "QuantizeLinear")
    )


def test_fused_keeps_conv_add_relu_fusion_of_a_resnet_block():
    """A plain Conv -> Add(skip) -> Relu keeps the standard skip-only pair (Conv + Add fusion)."""
    rng = np.random.default_rng(5)
    nodes = [
        conv("c0", "x", "w0", "t0", bias="b0"),
        helper.make_node("Relu", ["t0"], ["h"], name="relu0"),
        conv("c1", "h", "w1", "t1", bias="b1"),
        helper.make_node("Add", ["t1", "h"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["y"], name="relu1"),
    ]
    inits = [init("w0", conv_weight(rng, 16, 16)), init("w1", conv_weight(rng, 16, 16))]
    inits += [
        init("b0", rng.standard_normal(16).astype(np.float32)),
        init("b1", rng.standard_normal(16).astype(np.float32)),
    ]
    model = make_model(nodes, [value("x", [1, 16, 8, 8])], [value("y", None)], inits)
    standard = quantize(model, "standard")[0].model
    fused = quantize(model, "fused")[0].model
    for q in (standard, fused):
        main, skip = reads(q, "residual")
        assert main == "t1" and dq_scale(q, skip) is not None
    assert standard.SerializeToString() == fused.SerializeToString()


@pytest.mark.parametrize("mode, moved", [("nearest", True), ("linear", False)])
def test_fused_moves_qdq_above_pooling_and_nearest_resize(mode, moved):
    rng = np.random.default_rng(6)
    nodes = [
        conv("c0", "x", "w0", "t0", bias="b0"),
        helper.make_node("Relu", ["t0"], ["h"], name="relu0"),
        helper.make_node("MaxPool", ["h"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Resize", ["p", "", "scales"], ["u"], name="up", mode=mode),
        conv("c1", "u", "w1", "y", bias="b1"),
    ]
    inits = [init("w0", conv_weight(rng, 16, 16)), init("w1", conv_weight(rng, 16, 16))]
    inits += [
        init("b0", rng.standard_normal(16).astype(np.float32)),
        init("b1", rng.standard_normal(16).astype(np.float32)),
    ]
    inits.append(init("scales", np.array([1, 1, 2, 2], dtype=np.float32)))
    model = make_model(nodes, [value("x", [1, 16, 8, 8])], [value("y", None)], inits)
    q = quantize(model, "fused")[0].model
    assert (dq_scale(q, reads(q, "up")[0]) is not None) is moved
    assert (dq_scale(q, reads(q, "pool")[0]) is not None) is moved
    if moved:  # one scale through the group: exact on the INT8 grid
        assert dq_scale(q, reads(q, "pool")[0]) == dq_scale(q, reads(q, "c1")[0])
    run(q, random_feeds(model))


def test_fused_respects_exclude():
    q = quantize(c2f_block(), "fused", exclude=("Concat", "Split"))[0].model
    assert all(dq_scale(q, t) is None for t in reads(q, "concat"))
    assert dq_scale(q, reads(q, "split")[0]) is None


def _zoo_entry(name):
    if MANIFEST is None:
        pytest.skip(f"no model zoo in {ZOO}")
    entry = next((e for e in MANIFEST["models"] if e["name"] == name), None)
    if entry is None:  # CI exports the fast subset only
        pytest.skip(f"{name} is not in the zoo in {ZOO} (bash scripts/zoo_env.sh --full exports it)")
    return entry


@pytest.mark.parametrize(
    "name, more_concats",
    # shufflenet's channel shuffles chain every stage into one group whose Conv inputs have
    # different scales: left to the standard placement
    [("googlenet", True), ("unet_small", True), ("shufflenet_v2_x0_5", False)],
)
def test_fused_on_zoo_models_quantizes_more_concats_and_keeps_accuracy(name, more_concats):
    entry = _zoo_entry(name)
    model = onnx.load(str(ZOO / entry["file"]))
    shape = entry["input"]["feed_shape"]
    feeds = [
        {entry["input"]["name"]: np.random.default_rng(s).standard_normal(shape).astype(np.float32)} for s in range(3)
    ]
    amax = activation_amax(model, feeds[:2])
    ref = run(model, feeds[2])[0]
    got, scales = {}, {}
    for placement in ("standard", "fused"):
        q = quantize(model, placement, amax)[0].model
        check_produced_model(q, name)
        scales[placement] = _activation_scales(q)
        concats = nodes_of(q, "Concat")
        got[placement] = (
            sum(all(dq_scale(q, t) is not None for t in n.input) for n in concats),
            sqnr(ref, run(q, feeds[2])[0]),
        )
    assert (got["fused"][0] > got["standard"][0] == 0) is more_concats, json.dumps(got)
    assert got["fused"][1] > got["standard"][1] - 1.0, json.dumps(got)
    # the pairs the standard placement has keep their scales (readers see what they were calibrated for)
    assert {t: v for t, v in scales["fused"].items() if t in scales["standard"]} == scales["standard"]
    assert len(scales["fused"]) > len(scales["standard"])


def _activation_scales(model):
    """tensor -> scale of every per-tensor QuantizeLinear on an activation."""
    weights = {i.name for i in model.graph.initializer}
    return {
        n.input[0]: float(initializer(model, n.input[1]))
        for n in nodes_of(model, "QuantizeLinear")
        if n.input[0] not in weights and initializer(model, n.input[1]).size == 1
    }
