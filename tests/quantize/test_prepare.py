"""Real-model quirks: Constant weights, weights as inputs, old opsets, unnamed and unsorted nodes."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.quantize.conftest import (
    activation_amax,
    conv,
    conv_weight,
    init,
    make_model,
    nodes_of,
    random_feeds,
    run,
    value,
)
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.graph import default_opset


def quantize_checked(model, **opts):
    amax = activation_amax(model, [random_feeds(model)])
    result = quantize_model(model, amax, QuantizeOptions(**opts))
    onnx.checker.check_model(result.model, full_check=True)
    return result, amax


def constant(name, array):
    return helper.make_node("Constant", [], [name], name=f"{name}_const", value=numpy_helper.from_array(array))


def test_paddle_style_constant_weights_are_quantized():
    """Constant -> Identity -> Conv weight, Constant -> Reshape -> Add bias (paddle2onnx)."""
    rng = np.random.default_rng(1)
    w = conv_weight(rng, 16, 16)
    model = make_model(
        [
            constant("w_c", w),
            helper.make_node("Identity", ["w_c"], ["w"], name="w_id"),
            constant("b_c", rng.standard_normal(16).astype(np.float32)),
            constant("b_shape", np.array([1, 16, 1, 1], np.int64)),
            helper.make_node("Reshape", ["b_c", "b_shape"], ["b"], name="b_reshape"),
            conv("c", "x", "w", "h"),
            helper.make_node("Add", ["h", "b"], ["y"], name="bias_add"),
        ],
        [value("x", [1, 16, 6, 6])],
        [value("y", None)],
    )
    result, _ = quantize_checked(model, fold_affine=False)  # the bias Add kept as a node (quantize.fold_affine)
    q = result.model
    assert result.quantized == ["c"]  # the bias Add is not a residual Add
    assert not nodes_of(q, "Constant") and not nodes_of(q, "Identity") and not nodes_of(q, "Reshape")
    (wq,) = [n for n in nodes_of(q, "QuantizeLinear") if n.input[0] == "w"]
    assert wq.attribute[0].name == "axis" and wq.attribute[0].i == 0
    assert {"w", "b"} <= {i.name for i in q.graph.initializer}
    assert "w_c" not in {i.name for i in q.graph.initializer}  # the Identity was a rename
    feeds = random_feeds(model)
    np.testing.assert_allclose(run(q, feeds)[0], run(model, feeds)[0], atol=0.25)


def test_weights_listed_as_graph_inputs_are_treated_as_weights():
    rng = np.random.default_rng(2)
    model = make_model(
        [conv("c", "x", "w", "y")],
        [value("x", [1, 16, 6, 6]), value("w", [16, 16, 3, 3])],
        [value("y", None)],
        [init("w", conv_weight(rng, 16, 16))],
    )
    result, _ = quantize_checked(model)
    assert result.quantized == ["c"]
    assert [i.name for i in result.model.graph.input] == ["x"]
    assert any("removed 1 initializers from the graph inputs" in n for n in result.notes)
    run(result.model, {"x": random_feeds(model)["x"]})


def _old_opset_model(opset):
    rng = np.random.default_rng(3)
    nodes = [
        conv("c1", "x", "w1", "h"),
        helper.make_node(
            "BatchNormalization", ["h", "s", "b", "m", "v"], ["bn"], name="bn", **({"spatial": 1} if opset < 9 else {})
        ),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat", axis=1),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="fc", transB=1),
    ]
    inits = [
        init("w1", conv_weight(rng, 16, 16)),
        init("s", np.ones(16, np.float32)),
        init("b", np.zeros(16, np.float32)),
        init("m", np.zeros(16, np.float32)),
        init("v", np.ones(16, np.float32)),
        init("wg", rng.standard_normal((32, 16 * 16)).astype(np.float32) * 0.05),
        init("bg", np.zeros(32, np.float32)),
    ]
    model = make_model(nodes, [value("x", ["N", 16, 4, 4])], [value("y", ["N", 32])], inits, opset=opset)
    model.ir_version = 4 if opset == 9 else 6
    return model


@pytest.mark.parametrize("opset", [9, 11])
def test_old_opsets_are_upgraded_to_13_for_per_channel_qdq(opset):
    model = _old_opset_model(opset)
    result, _ = quantize_checked(model)
    q = result.model
    assert default_opset(model) == opset  # the caller's model is untouched
    assert default_opset(q) == 13 and q.ir_version >= 7
    assert f"upgraded default-domain opset {opset} -> 13" in result.notes
    assert result.quantized == ["c1", "fc"]
    axes = {n.input[0]: [a.i for a in n.attribute if a.name == "axis"] for n in nodes_of(q, "QuantizeLinear")}
    assert axes == {"x": [], "w1": [0], "f": [], "wg": [0]}
    feeds = random_feeds(model, batch=3)
    ref, out = run(model, feeds)[0], run(q, feeds)[0]
    assert out.shape == (3, 32)
    assert np.corrcoef(ref.ravel(), out.ravel())[0, 1] > 0.99


@pytest.mark.parametrize("opset", [13, 17, 19])
def test_opsets_13_and_later_are_kept(opset):
    rng = np.random.default_rng(4)
    model = make_model(
        [conv("c", "x", "w", "y")],
        [value("x", [1, 16, 4, 4])],
        [value("y", None)],
        [init("w", conv_weight(rng, 16, 16))],
        opset=opset,
    )
    result, _ = quantize_checked(model)
    assert default_opset(result.model) == opset and result.quantized == ["c"]
    assert not any("upgraded" in n for n in result.notes)
    run(result.model, random_feeds(model))


def test_unnamed_nodes_get_stable_names_and_unsorted_graphs_are_sorted():
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Relu", ["h"], ["r"]),  # before its producer: not topologically sorted
        helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="dup", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["z"], name="dup"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", [1, 16, 4, 4])],
        [value("z", [1, 16, 4, 4])],
        [init("w", conv_weight(rng, 16, 16)), init("w2", conv_weight(rng, 16, 16))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    amax = {"x": 3.0, "r": 2.0}
    result = quantize_model(model, amax, QuantizeOptions())
    onnx.checker.check_model(result.model, full_check=True)
    names = [n.name for n in result.model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert names == ["Conv_0", "Relu_1", "dup", "dup__2"]  # <op>_<position> after sorting
    assert result.quantized == ["Conv_0", "dup"]
    run(result.model, {"x": np.ones((1, 16, 4, 4), np.float32)})


def test_int64_constants_and_shape_subgraphs_are_left_alone():
    """Shape -> Slice -> Concat -> Reshape (the sample model's flatten) must survive preparation."""
    rng = np.random.default_rng(6)
    model = make_model(
        [
            conv("c", "x", "w", "h"),
            helper.make_node("Shape", ["h"], ["shp"], name="shape"),
            helper.make_node("Slice", ["shp", "zero", "one"], ["n"], name="slice"),
            helper.make_node("Concat", ["n", "minus1"], ["target"], name="cat", axis=0),
            helper.make_node("Reshape", ["h", "target"], ["f"], name="flatten"),
            helper.make_node("MatMul", ["f", "wm"], ["y"], name="fc"),
        ],
        [value("x", ["N", 16, 2, 2])],
        [value("y", ["N", 16])],
        [
            init("w", conv_weight(rng, 16, 16)),
            init("zero", np.array([0], np.int64)),
            init("one", np.array([1], np.int64)),
            init("minus1", np.array([-1], np.int64)),
            init("wm", rng.standard_normal((64, 16)).astype(np.float32)),
        ],
    )
    result, _ = quantize_checked(model)
    assert result.quantized == ["c", "fc"]
    q = result.model
    fc = next(n for n in q.graph.node if n.name == "fc")
    assert fc.input[0] == "f_DequantizeLinear_Output"
    assert run(q, random_feeds(model, batch=5))[0].shape == (5, 16)
    assert TensorProto.INT64 in {i.data_type for i in q.graph.initializer}


def _zoo_style_model(rng):
    """Weights the way some model-zoo graphs carry them: built in the graph from ConstantOfShape,
    arithmetic on constants, and a shape computed from constants."""
    w = conv_weight(rng, 8, 3)
    fc = rng.standard_normal((8 * 4 * 4, 16)).astype(np.float32)
    return make_model(
        [
            # conv weight = ConstantOfShape(1.0) * w_base  (the model zoo's "ones * values")
            helper.make_node(
                "ConstantOfShape",
                ["w_shape"],
                ["ones"],
                name="ones",
                value=numpy_helper.from_array(np.array([1.0], np.float32)),
            ),
            helper.make_node("Mul", ["ones", "w_base"], ["w"], name="w_mul"),
            # bias = zeros + b_base, reshaped by a shape that is itself computed: Concat([1], [8]) -> [1, 8, 1, 1]
            helper.make_node("ConstantOfShape", ["b_len"], ["zeros"], name="zeros"),
            helper.make_node("Add", ["zeros", "b_base"], ["b"], name="b_add"),
            conv("c", "x", "w", "h", bias="b"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Concat", ["one", "minus1"], ["flat_shape"], name="flat_shape", axis=0),
            helper.make_node("Reshape", ["r", "flat_shape"], ["f"], name="flatten"),
            # fc weight = Concat of two halves, then Transpose(Transpose(.)) (an exporter round trip)
            helper.make_node("Concat", ["fc_a", "fc_b"], ["fc_cat"], name="fc_cat", axis=0),
            helper.make_node("Sub", ["fc_cat", "fc_zero"], ["fc_w"], name="fc_sub"),
            helper.make_node("MatMul", ["f", "fc_w"], ["y"], name="fc"),
        ],
        [value("x", [1, 3, 4, 4])],
        [value("y", [1, 16])],
        [
            init("w_shape", np.array(w.shape, np.int64)),
            init("w_base", w),
            init("b_len", np.array([8], np.int64)),
            init("b_base", rng.standard_normal(8).astype(np.float32)),
            init("one", np.array([1], np.int64)),
            init("minus1", np.array([-1], np.int64)),
            init("fc_a", fc[:64]),
            init("fc_b", fc[64:]),
            init("fc_zero", np.zeros((1,), np.float32)),
        ],
    )


def _fold_by_running(model):
    """The independent route: run the FP32 model with ONNX's reference evaluator, keep every
    tensor computed from initializers only, and put it back as an initializer."""
    from onnx.reference import ReferenceEvaluator

    inits = {i.name for i in model.graph.initializer}
    constant_nodes, constant_names = [], set(inits)
    for node in model.graph.node:
        if all(i in constant_names for i in node.input if i):
            constant_nodes.append(node)
            constant_names.update(node.output)
    wanted = [o for n in constant_nodes for o in n.output]
    outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in wanted]
    graph = helper.make_graph(constant_nodes, "consts", [], outputs, list(model.graph.initializer))
    values = ReferenceEvaluator(helper.make_model(graph, opset_imports=model.opset_import)).run(None, {})
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    keep = [n for n in folded.graph.node if n not in constant_nodes]
    del folded.graph.node[:]
    folded.graph.node.extend(keep)
    folded.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), o) for o, v in zip(wanted, values))
    return folded


def test_weights_computed_from_constant_of_shape_are_folded_and_quantized():
    rng = np.random.default_rng(7)
    model = _zoo_style_model(rng)
    result, _ = quantize_checked(model)
    by_hand, _ = quantize_checked(_fold_by_running(model))
    assert result.quantized == by_hand.quantized == ["c", "fc"]
    assert any(n.startswith("computed 7 nodes on constants") for n in result.notes), result.notes
    q = result.model
    assert not nodes_of(q, "ConstantOfShape") and not nodes_of(q, "Mul") and not nodes_of(q, "Sub")
    # per-channel weight Q/DQ on the folded conv weight, and the folded model computes what the original does
    (wq,) = [n for n in nodes_of(q, "QuantizeLinear") if n.input[0] == "w"]
    assert wq.attribute[0].name == "axis" and wq.attribute[0].i == 0
    feeds = random_feeds(model)
    np.testing.assert_allclose(run(q, feeds)[0], run(model, feeds)[0], rtol=0.1, atol=0.5)
    from trtq.quantize.prepare import prepare_model

    prepared, _ = prepare_model(model)
    np.testing.assert_allclose(run(prepared, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-5)


def test_random_ops_are_never_folded():
    model = make_model(
        [
            helper.make_node("RandomNormal", [], ["noise"], name="noise", shape=[1, 4], dtype=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "noise"], ["y"], name="add"),
        ],
        [value("x", [1, 4])],
        [value("y", None)],
    )
    from trtq.quantize.prepare import prepare_model

    prepared, notes = prepare_model(model)
    assert [n.op_type for n in prepared.graph.node] == ["RandomNormal", "Add"] and not notes


def test_folded_scalars_stay_scalars():
    """ViT-style position-embedding arithmetic: scalar constants combined, unsqueezed and
    concatenated with a 1-D constant into a Reshape target. A scalar folded into shape (1,)
    made the Concat's inputs of different ranks: a model ONNX Runtime cannot load."""
    rng = np.random.default_rng(3)
    grid = init("grid", np.array(4, np.int64))  # 0-d, as torch exports a size
    two = init("two", np.array(2, np.int64))
    lead = init("lead", np.array([1], np.int64))
    chans = init("chans", np.array([32], np.int64))
    w = init("w", rng.standard_normal((32, 32)).astype(np.float32))
    pos = init("pos", rng.standard_normal((1, 16, 32)).astype(np.float32))
    model = make_model(
        [
            helper.make_node("Mul", ["grid", "two"], ["side"], name="side_mul"),  # scalar * scalar
            helper.make_node("Div", ["side", "two"], ["half"], name="half_div"),
            helper.make_node("Mul", ["half", "half"], ["tokens"], name="tokens_mul"),
            helper.make_node("Unsqueeze", ["tokens", "axes0"], ["tokens1"], name="tokens_unsq"),
            helper.make_node("Concat", ["lead", "tokens1", "chans"], ["target"], name="target_cat", axis=0),
            helper.make_node("Reshape", ["x", "target"], ["xr"], name="to_tokens"),
            helper.make_node("Add", ["xr", "pos"], ["xp"], name="add_pos"),
            helper.make_node("MatMul", ["xp", "w"], ["y"], name="proj"),
        ],
        [value("x", [1, 32, 4, 4])],
        [value("y", [1, 16, 32])],
        [grid, two, lead, chans, w, pos, init("axes0", np.array([0], np.int64))],
    )
    from trtq.quantize.prepare import prepare_model

    prepared, _ = prepare_model(model)
    target = {i.name: i for i in prepared.graph.initializer}["target"]
    assert list(target.dims) == [3]  # Concat of three 1-D pieces, not of mixed ranks
    result, _ = quantize_checked(model)  # the full checker passes
    assert result.quantized == ["proj"], result.left_float
    feeds = random_feeds(model)
    np.testing.assert_allclose(run(prepared, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-5)
    assert run(result.model, feeds)[0].shape == (1, 16, 32)
