"""Centring through padding (trtq.quantize.centering_border, quantize --center-padded).

A padded Conv reading a centred tensor is followed by a constant border map; the float model must
compute what it did before (ONNX Runtime) for every padding geometry, the map must be zero inside,
zero Pads must fold into the Conv exactly (and only zero Pads), and the Q/DQ model's engine form must
compute the Add form's levels.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import helper

import trtq.quantize.centering_fold as centering_fold
from tests.quantize.conftest import activation_amax, init, make_model, run, value
from tests.quantize.test_centering import _chain, _feeds, _representable, _sqnr, _weights_only, calibrated
from tests.quantize.test_centering_fold import _levels
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.centering import apply_centrings, find_centrings
from trtq.quantize.centering_border import SUFFIX, fold_zero_pads
from trtq.quantize.graph import GraphIndex

PADDED = QuantizeOptions(center_activations=True, center_padded=True)


def _padded_reader(rng, kernel, pads, strides=(1, 1), dilations=(1, 1), group=True, size=(10, 12)):
    """x -> Conv 1x1 -> Clip(0, 6) -> padded Conv (depthwise when ``group``) -> out."""
    c = 6
    w1 = (rng.standard_normal((c, 1 if group else c, *kernel)) * 0.5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], name="conv0"),
        helper.make_node("Clip", ["y0", "lo", "hi"], ["a0"], name="act0"),
        helper.make_node(
            "Conv",
            ["a0", "w1", "b1"],
            ["out"],
            name="reader",
            group=c if group else 1,
            kernel_shape=list(kernel),
            pads=list(pads),
            strides=list(strides),
            dilations=list(dilations),
        ),
    ]
    inits = [
        init("w0", (rng.standard_normal((c, 3, 1, 1)) * 0.8).astype(np.float32)),
        init("b0", rng.standard_normal(c).astype(np.float32) + 1.0),
        init("lo", np.array(0.0, np.float32)),
        init("hi", np.array(6.0, np.float32)),
        init("w1", w1),
        init("b1", rng.standard_normal(c).astype(np.float32) * 0.1),
    ]
    return make_model(nodes, [value("x", [None, 3, *size])], [value("out", None)], inits)


def _centred_copy(model, amax, padded=True):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    index = GraphIndex(m)
    centrings = find_centrings(index, amax, lambda i, s: True, padded)
    apply_centrings(m, centrings)
    return m, centrings


@pytest.mark.parametrize(
    "kernel,pads,strides,dilations,group",
    [
        ((3, 3), (1, 1, 1, 1), (1, 1), (1, 1), True),  # depthwise, "same"
        ((3, 3), (0, 0, 1, 1), (2, 2), (1, 1), True),  # TF "same" at stride 2: bottom/right only
        ((5, 5), (2, 1, 2, 3), (1, 2), (1, 1), True),  # asymmetric, unequal strides
        ((3, 3), (2, 2, 2, 2), (1, 1), (2, 2), False),  # dilated full conv
    ],
)
def test_border_map_keeps_the_function(kernel, pads, strides, dilations, group):
    rng = np.random.default_rng(0)
    model = _padded_reader(rng, kernel, pads, strides, dilations, group)
    feeds = [{"x": rng.standard_normal((2, 3, 10, 12)).astype(np.float32)}]
    amax = {"a0": 6.0}
    assert _centred_copy(model, amax, padded=False)[1] == []  # not without center_padded
    centred, centrings = _centred_copy(model, amax)
    assert [c.tensor for c in centrings] == ["a0"] and centrings[0].readers == ("reader",)
    border = next(n for n in centred.graph.node if SUFFIX in n.name)
    onnx.checker.check_model(centred)
    ref, got = run(model, feeds[0])[0], run(centred, feeds[0])[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    # the map is zero where no tap reads padding, and it is what makes the border right
    m = {i.name: onnx.numpy_helper.to_array(i) for i in centred.graph.initializer}[border.input[1]]
    assert m.shape == (1,) + ref.shape[1:]
    assert np.all(m[0, :, 3:-3, 3:-3] == 0) and np.abs(m).max() > 0.1
    for i in centred.graph.initializer:
        if i.name == border.input[1]:
            i.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(m), i.name))
    wrong = run(centred, feeds[0])[0]
    assert np.abs(wrong - ref).max() > 0.1


def test_zero_pads_fold_into_the_conv():
    rng = np.random.default_rng(0)
    model = _chain(rng, pad=True, reader_pads=[1, 0, 0, 1])
    feeds = _feeds(np.random.default_rng(1))
    ref = run(model, feeds[0])[0]
    assert fold_zero_pads(model) == 1
    assert "Pad" not in [n.op_type for n in model.graph.node]
    dw = next(n for n in model.graph.node if n.name == "dw1")
    assert list(next(a for a in dw.attribute if a.name == "pads").ints) == [2, 1, 1, 2]
    np.testing.assert_array_equal(run(model, feeds[0])[0], ref)


@pytest.mark.parametrize("case", ["value", "reflect", "two readers", "channels"])
def test_other_pads_stay(case):
    rng = np.random.default_rng(0)
    model = _chain(rng, pad=True)
    pad = next(n for n in model.graph.node if n.op_type == "Pad")
    if case == "value":
        model.graph.initializer.append(init("pv", np.array(0.5, np.float32)))
        pad.input.append("pv")
    elif case == "reflect":
        pad.attribute[0].CopyFrom(helper.make_attribute("mode", "reflect"))
    elif case == "channels":
        arr = next(i for i in model.graph.initializer if i.name == "pads")
        arr.CopyFrom(init("pads", np.array([0, 1, 1, 1, 0, 0, 1, 1], np.int64)))
    else:
        model.graph.node.append(helper.make_node("Identity", ["p0"], ["p0_copy"], name="copy"))
        model.graph.output.append(value("p0_copy", None))
    assert fold_zero_pads(model) == 0
    assert "Pad" in [n.op_type for n in model.graph.node]


def test_center_padded_centres_what_a_pad_reads_and_the_engine_form_matches(monkeypatch):
    model = _chain(np.random.default_rng(0), pad=True)
    feeds = _feeds(np.random.default_rng(1))
    amax = activation_amax(model, feeds)
    plain = quantize_model(model, amax, QuantizeOptions(center_activations=True))
    folded = quantize_model(model, amax, PADDED)
    assert "a0" not in {c["tensor"] for c in plain.centred}
    forms = {c["tensor"]: c["form"] for c in folded.centred}
    assert forms == {"a0": "fold", "a1": "fold", "f": "move", "ha": "fold"}
    assert any(n.startswith("centred through padding: 1 padded conv") for n in folded.notes)
    ops = [n.op_type for n in folded.model.graph.node]
    assert "Pad" not in ops and ops.count("Sub") == 1 and "act0" not in {n.name for n in folded.model.graph.node}
    onnx.checker.check_model(folded.model)
    with monkeypatch.context() as m:
        m.setattr(centering_fold, "fold_centrings", lambda model, centrings: {})
        added = quantize_model(model, amax, PADDED)
    for f in _feeds(np.random.default_rng(7), n=3):
        la, lb = _levels(added.model, f), _levels(folded.model, f)
        assert la.keys() == lb.keys()
        d = np.concatenate([np.abs(a.astype(np.int32) - lb[k].astype(np.int32)).ravel() for k, a in la.items()])
        assert d.max() <= 1 and (d > 0).mean() <= 5e-3, (int(d.max()), float((d > 0).mean()))


def test_nearest_rounding_keeps_the_uncentred_weight_error_through_padding(monkeypatch):
    """Without gptq the padded reader's bias and border map both move to Wq: with activation Q/DQ
    removed, the centred model computes what the uncentred one does (border included)."""
    monkeypatch.setattr(centering_fold, "fold_centrings", lambda model, centrings: {})
    model = _chain(np.random.default_rng(0), pad=True)
    feeds = _feeds(np.random.default_rng(1))
    amax = activation_amax(model, feeds)
    outs = [run(_weights_only(quantize_model(model, amax, o).model), feeds[0])[0] for o in (QuantizeOptions(), PADDED)]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_quantize_center_padded_cli(trtq, tmp_path):
    """--center-padded alone is refused (exit 2, nothing written); with --center-activations it centres
    the tensor the Pad reads too, and the written model is closer to FP32 than without it."""
    model = _chain(np.random.default_rng(0), pad=True)
    x, config, cache = calibrated(trtq, tmp_path, model)
    base = ["quantize", "--config", config, "--cache", cache]
    out = tmp_path / "p.onnx"
    r = trtq([*base, "--center-padded", "-o", out])
    assert r.code == 2 and "add --center-activations" in r.err and r.err.count("\n") == 1, r
    assert not out.exists()
    r = trtq([*base, "--center-padded", "--center-activations", "-o", out, "--json"])
    assert r.code == 0, r
    assert sorted(c["tensor"] for c in json.loads(r.out)["centred"]) == ["a0", "a1", "f", "ha"]
    text = trtq([*base, "--center-padded", "--center-activations", "-o", out])
    assert text.code == 0 and "centred through padding: 1 padded conv(s) followed by a constant border map" in text.out
    ref = run(model, {"x": x})[0]
    assert _sqnr(ref, run(onnx.load(str(out)), {"x": x})[0]) > 20


def test_centring_through_padding_halves_the_step_and_cuts_activation_noise():
    """With weights INT8 keeps exactly, activation rounding is the only error: the tensor a padded
    conv reads, centred through its border map, must gain close to 6 dB at the output."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], name="c0"),
        helper.make_node("Relu", ["y0"], ["a0"], name="r0"),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["out"], name="c1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ]
    inits = [
        init("w0", _representable(rng, (8, 4, 1, 1))),
        init("b0", np.full(8, 0.5, np.float32)),
        init("w1", _representable(rng, (16, 8, 3, 3))),
        init("b1", np.zeros(16, np.float32)),
    ]
    model = make_model(nodes, [value("x", [None, 4, 6, 6])], [value("out", None)], inits)
    feeds = [{"x": rng.uniform(-1, 1, (8, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    amax = activation_amax(model, feeds)
    plain = quantize_model(model, amax, QuantizeOptions(center_activations=True))
    centred = quantize_model(model, amax, PADDED)
    assert plain.centred == [] and [c["tensor"] for c in centred.centred] == ["a0"]
    ref = np.concatenate([run(model, f)[0] for f in feeds])
    gain = _sqnr(ref, np.concatenate([run(centred.model, f)[0] for f in feeds])) - _sqnr(
        ref, np.concatenate([run(plain.model, f)[0] for f in feeds])
    )
    assert 4.5 < gain < 7.5, gain
