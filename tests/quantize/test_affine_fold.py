"""Constant affine epilogues folded into Conv weights (trtq.quantize.affine_fold).

The folded FP32 model must compute what the original computes (ONNX Runtime), keep every remaining
tensor's name, and leave alone the chains it cannot fold exactly.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.quantize.conftest import IR_VERSION, activation_amax, cosine, producer_of, run
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.affine_fold import fold_affine

C = 16
ONE_HOT = np.eye(1, C, 3, dtype=np.float32).reshape(1, C, 1, 1)  # channel 3 only: the others multiplied by 0


def _model(epilogue, *, outputs=("out",), extra_inits=(), conv2=True, bias=True, seed=0):
    """x [2, 3, 8, 8] -> Conv ("conv", 16 channels, weight "w") -> ``epilogue`` nodes -> Relu ->
    Conv ("conv2") -> out. ``epilogue``: (op, inputs, output) with "y" the Conv's output."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((16, C, 1, 1)).astype(np.float32), "w2"),
    ]
    conv_inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b"))
        conv_inputs.append("b")
    inits += [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in extra_inits]
    nodes = [helper.make_node("Conv", conv_inputs, ["y"], name="conv", pads=[1, 1, 1, 1])]
    last = "y"
    for i, (op, inputs, out) in enumerate(epilogue):
        nodes.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}{i}"))
        last = out
    nodes.append(helper.make_node("Relu", [last], ["r"], name="relu"))
    if conv2:
        nodes.append(helper.make_node("Conv", ["r", "w2"], ["out"], name="conv2"))
    graph = helper.make_graph(
        nodes,
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, None, 8, 8]) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _x(seed=1):
    return np.random.default_rng(seed).standard_normal((2, 3, 8, 8)).astype(np.float32)


def _folded(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    notes = []
    count = fold_affine(copy, notes)
    onnx.checker.check_model(copy, full_check=True)
    return copy, count, notes


def _ops(model):
    return [n.op_type for n in model.graph.node]


AFFINE = dict(
    epilogue=[("Mul", ["s", "y"], "m"), ("Add", ["m", "t"], "a"), ("Sub", ["a", "c"], "z")],
    extra_inits=[("s", [0.5]), ("t", np.arange(C, dtype=np.float32).reshape(1, C, 1, 1) - 1.5), ("c", 0.25)],
)


@pytest.mark.parametrize("bias", [True, False])
def test_scale_shift_chain_folds_exactly_and_keeps_the_last_name(bias):
    model = _model(bias=bias, **AFFINE)
    folded, count, notes = _folded(model)
    assert count == 3 and _ops(folded) == ["Conv", "Relu", "Conv"]
    assert notes and "folded 3 constant Mul/Add/Sub/BatchNormalization into 1 Conv" in notes[0]
    conv = folded.graph.node[0]
    assert conv.output[0] == "z" and folded.graph.node[1].input[0] == "z"  # the Relu reads the same name
    names = {i.name for i in folded.graph.initializer}
    assert "w" not in names and {"s", "t", "c"}.isdisjoint(names) and len(conv.input) == 3
    w = numpy_helper.to_array(next(i for i in folded.graph.initializer if i.name == conv.input[1]))
    original = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(w, 0.5 * original, rtol=1e-6)
    x = _x()
    ref, got = run(model, {"x": x})[0], run(folded, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _bn(name, x, y, rng, channels=C, **attrs):
    """An inference BatchNormalization of ``x`` with random statistics (initializers name_*)."""
    stats = {
        "g": rng.uniform(0.5, 2.0, channels),
        "b": rng.standard_normal(channels),
        "m": rng.standard_normal(channels),
        "v": rng.uniform(0.1, 3.0, channels),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), f"{name}_{k}") for k, v in stats.items()]
    node = helper.make_node("BatchNormalization", [x] + [f"{name}_{k}" for k in stats], [y], name=name, **attrs)
    return node, inits


def _deconv_model(group=1, computed_mean=False):
    """x [2, 16, 8, 8] -> ConvTranspose (stride 2, ``group``) -> Add(bias) -> BatchNormalization ->
    Relu -> Conv -> out: PP-OCRv4 det's head. ``computed_mean``: the BN's mean comes out of a node."""
    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array(rng.standard_normal((C, C // group, 2, 2)).astype(np.float32), "wt"),
        numpy_helper.from_array(rng.standard_normal((1, C, 1, 1)).astype(np.float32), "bt"),
        numpy_helper.from_array(rng.standard_normal((8, C, 1, 1)).astype(np.float32), "w2"),
    ]
    bn, bn_inits = _bn("bn", "d1", "d2", rng)
    pre = []
    if computed_mean:
        pre = [helper.make_node("Identity", ["bn_m"], ["bn_mean"], name="mean")]
        bn.input[3] = "bn_mean"
    nodes = pre + [
        helper.make_node("ConvTranspose", ["x", "wt"], ["d0"], name="deconv", strides=[2, 2], group=group),
        helper.make_node("Add", ["d0", "bt"], ["d1"], name="bias"),
        bn,
        helper.make_node("Relu", ["d2"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["out"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes,
        "deconv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8, 16, 16])],
        inits + bn_inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def test_a_conv_batch_norm_is_left_to_tensorrt():
    """TensorRT fuses a Conv's BatchNormalization itself (INT8 output included): not folded, and
    a scale behind it is not folded through it either."""
    model = _model([("Mul", ["y", "s"], "m")], extra_inits=[("s", [0.5])])
    rng = np.random.default_rng(2)
    bn, inits = _bn("bn", "y", "n", rng, epsilon=1e-3)
    model.graph.initializer.extend(inits)
    nodes = list(model.graph.node)
    nodes[1].input[0] = "n"
    del model.graph.node[:]
    model.graph.node.extend([nodes[0], bn] + nodes[1:])
    onnx.checker.check_model(model)
    assert _folded(model)[1] == 0


def test_deconv_bias_and_batch_norm_fold_along_the_second_weight_axis():
    model = _deconv_model()
    folded, count, notes = _folded(model)
    assert count == 2 and _ops(folded) == ["ConvTranspose", "Relu", "Conv"]
    assert folded.graph.node[0].output[0] == "d2" and "into 1 Conv" in notes[0]
    x = np.random.default_rng(5).standard_normal((2, C, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run(folded, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group, computed_mean", [(2, False), (1, True)])
def test_grouped_deconv_and_computed_statistics_are_left_alone(group, computed_mean):
    model = _deconv_model(group, computed_mean)
    folded, count, _ = _folded(model)
    # the grouped deconv folds nothing; a BN with a computed mean stops the chain after the bias Add
    assert count == (0 if group > 1 else 1)
    assert "BatchNormalization" in _ops(folded)


@pytest.mark.parametrize(
    "case, epilogue, inits, outputs",
    [
        # the Conv's output is read twice (by the Mul and by a second output)
        ("two readers", [("Mul", ["y", "s"], "m")], [("s", 2.0)], ("out", "y")),
        # the Mul's output is a graph output and the Add behind it reads it too
        ("graph output", [("Mul", ["y", "s"], "m"), ("Add", ["m", "s"], "a")], [("s", 2.0)], ("out", "m")),
        # one channel multiplied by 0 would lose its weights
        ("zero scale", [("Mul", ["y", "s"], "m")], [("s", ONE_HOT)], ("out",)),
        # a [8] constant broadcasts along the width, not the channels
        ("width-wise", [("Mul", ["y", "s"], "m")], [("s", np.linspace(1, 2, 8, dtype=np.float32))], ("out",)),
        # 1 / c is not exact
        ("div", [("Div", ["y", "s"], "m")], [("s", 3.0)], ("out",)),
        # c - y flips the sign
        ("constant minus", [("Sub", ["s", "y"], "m")], [("s", 1.0)], ("out",)),
        # a non-finite constant
        ("inf", [("Add", ["y", "s"], "m")], [("s", np.inf)], ("out",)),
    ],
)
def test_chains_that_do_not_fold_exactly_are_left_alone(case, epilogue, inits, outputs):
    model = _model(epilogue, outputs=outputs, extra_inits=inits)
    folded, count, notes = _folded(model)
    if case == "graph output":  # the Mul folds (the Conv writes "m"), the Add after the output does not
        assert count == 1 and _ops(folded) == ["Conv", "Add", "Relu", "Conv"] and folded.graph.node[0].output[0] == "m"
        return
    assert count == 0 and not notes, case
    assert _ops(folded) == _ops(model)
    assert [i.name for i in folded.graph.initializer] == [i.name for i in model.graph.initializer]


def test_a_computed_operand_stops_the_chain():
    # Mul(y, y): both operands are the Conv's output, nothing constant to fold
    model = _model([("Mul", ["y", "y"], "m")])
    assert _folded(model)[1] == 0


def test_a_shared_weight_is_copied_not_changed():
    model = _model([("Mul", ["y", "s"], "m")], extra_inits=[("s", 2.0)])
    # a second Conv reads the same weight "w"
    model.graph.node.append(helper.make_node("Conv", ["x", "w"], ["y2"], name="twin", pads=[1, 1, 1, 1]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, C, 8, 8]))
    folded, count, _ = _folded(model)
    assert count == 1
    twin = next(n for n in folded.graph.node if n.name == "twin")
    assert twin.input[1] == "w"
    w = numpy_helper.to_array(next(i for i in folded.graph.initializer if i.name == "w"))
    np.testing.assert_array_equal(w, numpy_helper.to_array(model.graph.initializer[0]))
    x = _x()
    for ref, got in zip(run(model, {"x": x}), run(folded, {"x": x})):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_quantize_folds_by_default_and_not_when_told():
    model = _model(**AFFINE)
    feeds = [{"x": _x(s)} for s in range(4)]
    amax = activation_amax(model, feeds)
    folded = quantize_model(model, amax, QuantizeOptions())
    kept = quantize_model(model, amax, QuantizeOptions(fold_affine=False))
    assert not {"Mul", "Add", "Sub"} & set(_ops(folded.model))
    assert {"Mul", "Add", "Sub"} <= set(_ops(kept.model))
    assert any("folded 3 constant" in n for n in folded.notes) and not any("folded" in n for n in kept.notes)
    assert folded.quantized == kept.quantized == ["conv", "conv2"]
    x = _x(9)
    ref = run(model, {"x": x})[0]
    a, b = run(folded.model, {"x": x})[0], run(kept.model, {"x": x})[0]
    assert cosine(ref, a) > 0.999 and cosine(a, b) > 0.9999


def test_cli_no_fold_affine_keeps_the_chain(tmp_path):
    model = _model(**AFFINE)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    amax = activation_amax(model, [{"x": _x()}])
    from trtq.calib.cache import CalibrationTable, write_cache

    write_cache(tmp_path / "m.cache", CalibrationTable("8.6.0", "EntropyCalibration2", amax), "8.6.0")
    outs = {}
    for flag in ([], ["--no-fold-affine"]):
        out = tmp_path / f"q{len(flag)}.onnx"
        cmd = [sys.executable, "-m", "trtq", "quantize", "--model", str(path), "--cache", str(tmp_path / "m.cache")]
        done = subprocess.run(cmd + ["-o", str(out), "-q"] + flag, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outs[bool(flag)] = _ops(onnx.load(str(out)))
    assert "Mul" not in outs[False] and "Mul" in outs[True]


def _det_model() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    path = Path(spec.origin).parent / "models" / "ch_PP-OCRv4_det_infer.onnx"
    if not path.exists():
        pytest.skip("PP-OCRv4 det is not in this rapidocr-onnxruntime version")
    return path


def test_ppocr_det_mobileone_affines_fold_exactly():
    """PP-OCRv4 det writes each MobileOne block's learnable scale and shift as Conv -> Mul -> Add
    with scalar constants (weights in Constant nodes), and its head ConvTranspose -> Add(bias) ->
    BatchNormalization: all of them fold, the model computes the same
    probability map, and no grouped Conv's output reaches a Quantize through a Mul or Add."""
    from trtq.quantize.prepare import prepare_model

    model = onnx.load(str(_det_model()))
    prepared, _ = prepare_model(model)
    folded, count, notes = _folded(prepared)
    convs = [n for n in folded.graph.node if n.op_type == "Conv"]
    # 56 MobileOne Mul / Add into 28 Conv, and the head's two ConvTranspose with their bias Add
    # (and the first one's BatchNormalization); the BatchNormalization of two Convs stays
    assert count == 59 and "into 30 Conv" in notes[0]
    bns = [n for n in folded.graph.node if n.op_type == "BatchNormalization"]
    assert [producer_of(folded, n.input[0]).op_type for n in bns] == ["Conv", "Conv"]
    readers = {}
    for n in folded.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    grouped = [c for c in convs if any(a.name == "group" and a.i > 1 for a in c.attribute)]
    assert len(grouped) == 14
    for c in grouped:  # read by the next Conv, the HardSwish's Add(3) and Mul, or an SE block's pool and Mul
        after = readers[c.output[0]]
        assert len(after) > 1 or after[0] not in ("Mul", "Add", "Sub"), (c.name, after)
    assert _folded(folded)[1] == 0  # nothing left to fold
    x = np.random.default_rng(0).standard_normal((1, 3, 160, 160)).astype(np.float32)
    ref, got = run(model, {"x": x})[0], run(folded, {"x": x})[0]
    np.testing.assert_allclose(got, ref, atol=2e-5)
