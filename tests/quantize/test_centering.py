"""Centred activations (trtq.quantize.centering, quantize --center-activations).

The float rewrite must leave the model's function unchanged (checked in ONNX Runtime on every
producer / activation / reader kind it accepts), the Q/DQ model must give the shifted tensors half
the step, and that must show up as less error where activation rounding is the only error.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.quantize.conftest import activation_amax, init, make_model, run, value
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.centering import apply_centrings, find_centrings
from trtq.quantize.graph import GraphIndex
from trtq.quantize.prepare import prepare_model


def _chain(rng, act="clip", pad=True, producer="conv", reader_pads=None, extra_output=False, clip=(0.0, 6.0)):
    """x -> producer -> activation -> [Pad] -> depthwise 3x3 -> Relu -> 1x1 -> Relu -> GAP -> Flatten
    -> Gemm -> Relu -> Gemm."""
    c = 8
    nodes, inits = [], []
    inits.append(init("w0", (rng.standard_normal((c, 4, 1, 1)) * 0.8).astype(np.float32)))
    if producer == "conv":
        inits.append(init("b0", rng.standard_normal(c).astype(np.float32)))
        nodes.append(helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], name="conv0"))
    else:  # unfused BatchNormalization after a bias-free conv
        nodes.append(helper.make_node("Conv", ["x", "w0"], ["t0"], name="conv0"))
        inits += [
            init("bn_s", rng.uniform(0.5, 2, c).astype(np.float32)),
            init("bn_b", rng.standard_normal(c).astype(np.float32)),
            init("bn_m", rng.standard_normal(c).astype(np.float32) * 0.1),
            init("bn_v", rng.uniform(0.5, 2, c).astype(np.float32)),
        ]
        nodes.append(helper.make_node("BatchNormalization", ["t0", "bn_s", "bn_b", "bn_m", "bn_v"], ["y0"], name="bn0"))
    if act == "clip":
        inits += [init("lo", np.array(clip[0], np.float32)), init("hi", np.array(clip[1], np.float32))]
        nodes.append(helper.make_node("Clip", ["y0", "lo", "hi"], ["a0"], name="act0"))
    else:
        nodes.append(helper.make_node("Relu", ["y0"], ["a0"], name="act0"))
    dw_in = "a0"
    if pad:
        inits.append(init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)))
        nodes.append(helper.make_node("Pad", ["a0", "pads"], ["p0"], name="pad0", mode="constant"))
        dw_in = "p0"
    inits += [
        init("w1", (rng.standard_normal((c, 1, 3, 3)) * 0.5).astype(np.float32)),
        init("b1", rng.standard_normal(c).astype(np.float32) * 0.1),
    ]
    dw_pads = reader_pads if reader_pads is not None else [0, 0, 0, 0]
    nodes.append(
        helper.make_node("Conv", [dw_in, "w1", "b1"], ["y1"], name="dw1", group=c, kernel_shape=[3, 3], pads=dw_pads)
    )
    nodes.append(helper.make_node("Relu", ["y1"], ["a1"], name="act1"))
    inits.append(init("w2", (rng.standard_normal((16, c, 1, 1)) * 0.4).astype(np.float32)))
    nodes.append(helper.make_node("Conv", ["a1", "w2"], ["y2"], name="pw2"))  # no bias: one gets added
    nodes.append(helper.make_node("Relu", ["y2"], ["a2"], name="act3"))
    nodes.append(helper.make_node("GlobalAveragePool", ["a2"], ["g"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"], name="flat"))
    inits += [
        init("wf", (rng.standard_normal((32, 16)) * 0.3).astype(np.float32)),
        init("bf", rng.standard_normal(32).astype(np.float32) * 0.1),
        init("wh", (rng.standard_normal((32, 24)) * 0.3).astype(np.float32)),
    ]
    nodes.append(helper.make_node("Gemm", ["f", "wf", "bf"], ["h"], name="fc1", transB=1))
    nodes.append(helper.make_node("Relu", ["h"], ["ha"], name="act2"))
    nodes.append(helper.make_node("Gemm", ["ha", "wh"], ["out"], name="fc2", alpha=0.5))
    outputs = [value("out", None)] + ([value("a0", None)] if extra_output else [])
    return make_model(nodes, [value("x", [None, 4, 10, 10])], outputs, inits)


def _feeds(rng, n=2):
    return [{"x": rng.standard_normal((4, 4, 10, 10)).astype(np.float32) * 1.5} for _ in range(n)]


def _centrings(model, amax=None):
    prepared, _ = prepare_model(model)
    index = GraphIndex(prepared)
    amax = amax or activation_amax(model, _feeds(np.random.default_rng(1)))
    acts = {"p0": amax.get("p0", amax["a0"]), "a0": amax["a0"], "a1": amax["a1"], "ha": amax["ha"], "f": amax["f"]}
    return prepared, find_centrings(index, {t: a for t, a in acts.items() if t in index.producer}, lambda i, s: True)


@pytest.mark.parametrize(
    "act,pad,producer", [("clip", True, "conv"), ("relu", False, "conv"), ("clip", True, "bn"), ("relu", True, "bn")]
)
def test_rewrite_keeps_the_function(act, pad, producer):
    rng = np.random.default_rng(0)
    model = _chain(rng, act=act, pad=pad, producer=producer)
    prepared, found = _centrings(model)
    # the activation (not when a Pad reads it), the dw conv's Relu output, the pooled Relu output
    # and the Gemm's Relu output
    assert sorted(c.tensor for c in found) == sorted(([] if pad else ["a0"]) + ["a1", "f", "ha"])
    # 0 lands on level -128: shift 128 steps, amax 127 steps of the new scale
    assert all(c.shift > 0 and c.shift == pytest.approx(c.amax * 128 / 127) for c in found)
    feeds = _feeds(np.random.default_rng(5))
    before = [run(prepared, f)[0] for f in feeds]
    apply_centrings(prepared, found)
    onnx.checker.check_model(prepared)
    for b, f in zip(before, feeds):
        np.testing.assert_allclose(run(prepared, f)[0], b, rtol=1e-4, atol=1e-4)
    used = {i for n in prepared.graph.node for i in n.input}
    assert [i.name for i in prepared.graph.initializer if i.name not in used] == []


def test_not_centred_where_the_rewrite_would_be_wrong_or_useless():
    rng = np.random.default_rng(0)
    amax = activation_amax(_chain(np.random.default_rng(0)), _feeds(np.random.default_rng(1)))
    # the activation is also a graph output: its values must not change
    _, found = _centrings(_chain(np.random.default_rng(0), extra_output=True), amax)
    assert "p0" not in {c.tensor for c in found} and "a0" not in {c.tensor for c in found}
    # the reader pads implicitly with zeros, or a Pad does (a zero would stand for x = shift; a
    # Pad of -shift instead is its own layer in TensorRT 8.6, 4.3x slower on EfficientNet-Lite0)
    _, found = _centrings(_chain(rng, pad=False, reader_pads=[1, 1, 1, 1]), amax)
    assert "a0" not in {c.tensor for c in found} and "a1" in {c.tensor for c in found}
    _, found = _centrings(_chain(np.random.default_rng(0), pad=True), amax)
    assert not {"a0", "p0"} & {c.tensor for c in found}
    # a symmetric clip gains nothing; with a lower bound other than 0, zeros (the Pad's border)
    # would fall between INT8 levels
    for clip in ((-6.0, 6.0), (-1.0, 6.0), (0.5, 6.0)):
        _, found = _centrings(_chain(np.random.default_rng(0), clip=clip, pad=False), dict(amax, a0=6.0))
        assert "a0" not in {c.tensor for c in found}, clip


def test_not_centred_when_a_reader_is_not_linear_or_not_quantized():
    model = _chain(np.random.default_rng(0))
    prepared, _ = prepare_model(model)
    index = GraphIndex(prepared)
    amax = {"p0": 6.0, "a1": 3.0, "ha": 2.0}
    assert {c.tensor for c in find_centrings(index, amax, lambda i, s: index.nodes[i].name != "dw1")} == {"a1", "ha"}
    # a residual-style reader (Add) keeps the tensor as it is
    g = model.graph
    g.node.append(helper.make_node("Add", ["a1", "a1"], ["r"], name="add"))
    g.output.append(value("r", None))
    prepared, _ = prepare_model(model)
    index = GraphIndex(prepared)
    assert "a1" not in {c.tensor for c in find_centrings(index, amax, lambda i, s: True)}


def _representable(rng, shape):
    """Weights that per-channel symmetric INT8 keeps exactly: levels times a per-row scale."""
    levels = rng.integers(-127, 128, size=shape)
    levels[:, 0] = 127  # each row's max|level| is 127, so the scale is exactly row_max / 127
    return (levels * (rng.uniform(0.002, 0.01, size=(shape[0],) + (1,) * (len(shape) - 1)))).astype(np.float32)


def _sqnr(ref, got):
    return 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum())


def test_centring_halves_the_step_and_cuts_activation_noise():
    """With weights INT8 keeps exactly, activation rounding is the only error: half the step on the
    centred tensors must gain close to 6 dB at the output."""
    rng = np.random.default_rng(3)
    w0 = _representable(rng, (8, 4, 1, 1))
    w1 = _representable(rng, (16, 8, 1, 1))
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], name="c0"),
        helper.make_node("Relu", ["y0"], ["a0"], name="r0"),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["out"], name="c1"),
    ]
    model = make_model(
        nodes,
        [value("x", [None, 4, 6, 6])],
        [value("out", None)],
        [init("w0", w0), init("b0", np.full(8, 0.5, np.float32)), init("w1", w1), init("b1", np.zeros(16, np.float32))],
    )
    feeds = [{"x": rng.uniform(-1, 1, (8, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    amax = activation_amax(model, feeds)
    plain = quantize_model(model, amax, QuantizeOptions())
    centred = quantize_model(model, amax, QuantizeOptions(center_activations=True))
    assert any(n.startswith("centred activations: 1 ") for n in centred.notes)
    scales = {}
    for r in (plain, centred):
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in r.model.graph.initializer}
        q = next(n for n in r.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "a0")
        scales[id(r)] = float(inits[q.input[1]])
    assert scales[id(centred)] == pytest.approx(scales[id(plain)] * 127 / 255, rel=1e-6)
    ref = np.concatenate([run(model, f)[0] for f in feeds])
    gain = _sqnr(ref, np.concatenate([run(centred.model, f)[0] for f in feeds])) - _sqnr(
        ref, np.concatenate([run(plain.model, f)[0] for f in feeds])
    )
    assert 4.5 < gain < 7.5, gain


def test_nearest_rounding_keeps_the_uncentred_weight_error(monkeypatch):
    """Without gptq, readers add c * sum(Wq): with activation Q/DQ removed the centred Q/DQ model
    computes exactly what the uncentred one does. (Checked on the Add form: in the engine form the
    quantizer's clamp is the activation, so removing the Q/DQ pairs would remove the activation.)"""
    import trtq.quantize.centering_fold as centering_fold

    monkeypatch.setattr(centering_fold, "fold_centrings", lambda model, centrings: {})
    model = _chain(np.random.default_rng(0))
    feeds = _feeds(np.random.default_rng(1))
    amax = activation_amax(model, feeds)
    outs = []
    for centre in (False, True):
        r = quantize_model(model, amax, QuantizeOptions(center_activations=centre))
        outs.append(run(_weights_only(r.model), feeds[0])[0])
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_gptq_without_bias_correction_settles_the_readers_it_keeps_at_nearest():
    """gptq keeps nearest where it has too few input rows (here the Gemms, 16 samples): those
    readers get the nearest path's compensation; the ones gptq rounded keep theirs."""
    from types import SimpleNamespace

    model = _chain(np.random.default_rng(0), pad=False)
    x = np.random.default_rng(1).standard_normal((16, 4, 10, 10)).astype(np.float32) * 1.5
    amax = activation_amax(model, [{"x": x}])
    batches = [SimpleNamespace(arrays={"x": x[i : i + 8]}, valid=8) for i in (0, 8)]
    nearest = quantize_model(model, amax, QuantizeOptions(center_activations=True))
    gptq = quantize_model(model, amax, QuantizeOptions(center_activations=True, weight_rounding="gptq"), data=batches)
    kept = next(n for n in gptq.notes if n.startswith("weight rounding gptq"))
    assert "nearest kept for 2: fc1" in kept and "fc2" in kept, kept

    def bias(result, node):
        n = next(n for n in result.model.graph.node if n.name == node)
        return onnx.numpy_helper.to_array(next(i for i in result.model.graph.initializer if i.name == n.input[2]))

    for node in ("fc1", "fc2"):  # kept at nearest: settled exactly as without gptq
        np.testing.assert_allclose(bias(gptq, node), bias(nearest, node), rtol=1e-6, atol=1e-6)
    assert not np.allclose(bias(gptq, "dw1"), bias(nearest, "dw1"), rtol=1e-6, atol=1e-6)  # gptq's own


def _weights_only(model):
    """The Q/DQ model without its activation Q/DQ pairs (weights stay quantized)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    rename, drop = {}, set()
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear":
            q = prod.get(n.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in inits:
                rename[n.output[0]] = q.input[0]
                drop |= {id(n), id(q)}
    keep = [n for n in m.graph.node if id(n) not in drop]
    for n in keep:
        n.input[:] = [rename.get(i, i) for i in n.input]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


def calibrated(trtq, tmp_path, model):
    """(input batch, config, max cache) for ``model`` saved under ``tmp_path``, through the CLI."""
    onnx.save(model, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((16, 4, 10, 10)).astype(np.float32) * 1.5
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "c.yaml").write_text(
        f"model: {tmp_path / 'm.onnx'}\ndata:\n  batch_size: 4\n  inputs:\n    x:\n      npy: {tmp_path / 'x.npy'}\n"
    )
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--config", tmp_path / "c.yaml", "-o", cache, "--method", "max"]).code == 0
    return x, tmp_path / "c.yaml", cache


@pytest.mark.parametrize(
    "extra", [[], ["--fp16"], ["--weight-rounding", "gptq", "--bias-correction", "--samples", "8"]]
)
def test_quantize_center_activations_cli(trtq, tmp_path, extra):
    model = _chain(np.random.default_rng(0))
    x, config, cache = calibrated(trtq, tmp_path, model)
    out = tmp_path / "q.onnx"
    r = trtq(
        [
            "quantize",
            "--config",
            tmp_path / "c.yaml",
            "--cache",
            cache,
            "-o",
            out,
            "--center-activations",
            "--json",
            *extra,
        ]
    )
    assert r.code == 0, r
    report = json.loads(r.out)
    assert sorted(c["tensor"] for c in report["centred"]) == ["a1", "f", "ha"], report["left_float"]
    assert any(n.startswith("centred activations: 3 ") for n in report["notes"])
    q = onnx.load(str(out))
    onnx.checker.check_model(q)
    ref = run(model, {"x": x})[0]
    got = run(q, {"x": x})[0]
    assert _sqnr(ref, got) > 20, _sqnr(ref, got)
    text = trtq(["quantize", "--config", tmp_path / "c.yaml", "--cache", cache, "-o", out, "--center-activations"])
    assert text.code == 0 and "centred activations: 3 shifted" in text.out
    assert "centring in engine form: 2 folded into their producer" in text.out and "1 shifted after pooling" in text.out


def test_nothing_to_centre_is_reported(trtq, sample_config, tmp_path):
    """The sample's activations are HardSwish (not one-sided): the report says none qualified."""
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--config", sample_config, "-o", cache, "--method", "max"]).code == 0
    r = trtq(
        [
            "quantize",
            "--config",
            sample_config,
            "--cache",
            cache,
            "-o",
            tmp_path / "q.onnx",
            "--center-activations",
            "--json",
        ]
    )
    assert r.code == 0, r
    report = json.loads(r.out)
    assert report["centred"] == [] and any(n.startswith("centred activations: none") for n in report["notes"])


def test_config_key(tmp_path):
    from trtq.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("model: m.onnx\nquantize:\n  center_activations: true\n")
    assert load_config(path).quantize.center_activations is True


def test_editor_adds_a_bias_in_its_slot_under_a_free_name():
    """InitializerEditor.add_to_bias (shared with bias correction): an empty bias slot is filled in
    place, a taken name gets a suffix, an existing bias is added to in its own dtype."""
    from trtq.quantize.edit import InitializerEditor

    w = np.ones((2, 3, 1, 1), np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", ""], ["y"], name="c"),
        helper.make_node("Conv", ["y", "w2", "b2"], ["z"], name="d"),
    ]
    model = make_model(
        nodes,
        [value("x", [1, 3, 2, 2])],
        [value("z", None)],
        [
            init("w", w),
            init("w2", np.ones((2, 2, 1, 1), np.float32)),
            init("b2", np.array([1, 2], np.float32)),
            init("c/centring_bias", np.zeros(1, np.float32)),
        ],
    )
    ed = InitializerEditor(model)
    ed.add_to_bias(ed.nodes["c"], 2, np.array([0.5, -0.5]), np.float32, "centring_bias")
    ed.add_to_bias(ed.nodes["d"], 2, np.array([0.25, 0.25]), np.float32, "centring_bias")
    assert list(ed.nodes["c"].input) == ["x", "w", "c/centring_bias_2"]
    assert ed.array("c/centring_bias_2").tolist() == [0.5, -0.5]
    assert ed.array("b2").tolist() == [1.25, 2.25] and ed.array("b2").dtype == np.float32
    onnx.checker.check_model(model)


@pytest.mark.parametrize("act,pad,producer", [("clip", True, "conv"), ("relu", False, "conv"), ("relu", True, "bn")])
def test_shift_is_an_add_after_the_activation(act, pad, producer):
    """The form TensorRT 8.6 builds right: Add(-c) after the activation, the activation's output
    name moved to it, producer bias (unless it reads another centred tensor) and bounds untouched."""
    rng = np.random.default_rng(0)
    model = _chain(rng, act=act, pad=pad, producer=producer)
    prepared, found = _centrings(model)
    before_inits = {i.name: numpy_helper.to_array(i).copy() for i in prepared.graph.initializer}
    acts_before = {n.name: (n.op_type, list(n.input)) for n in prepared.graph.node if n.op_type in ("Relu", "Clip")}
    feeds = _feeds(np.random.default_rng(5))
    before = [run(prepared, f)[0] for f in feeds]
    apply_centrings(prepared, found)
    onnx.checker.check_model(prepared)
    for b, f in zip(before, feeds):
        np.testing.assert_allclose(run(prepared, f)[0], b, rtol=1e-4, atol=1e-4)
    nodes = list(prepared.graph.node)
    by_name = {n.name: n for n in nodes}
    for c in found:
        a = by_name[c.activation]
        assert (a.op_type, list(a.input)) == acts_before[c.activation]  # same op, same bounds
        sub = nodes[nodes.index(a) + 1]
        assert sub.op_type == "Add" and sub.input[0] == a.output[0] == f"{c.activation}/uncentred"
        shift = numpy_helper.to_array(next(i for i in prepared.graph.initializer if i.name == sub.input[1]))
        assert shift.size == 1 and float(shift.reshape(-1)[0]) == pytest.approx(-c.shift)
        prod = by_name[c.producer]
        bias_slot = 2
        is_reader = any(c.producer in other.readers for other in found)  # then it gains + c' sum(W) for that one
        if len(prod.input) > bias_slot and prod.input[bias_slot] in before_inits and not is_reader:
            np.testing.assert_array_equal(
                numpy_helper.to_array(next(i for i in prepared.graph.initializer if i.name == prod.input[bias_slot])),
                before_inits[prod.input[bias_slot]],
            )
