"""In-graph statistics (trtq.calib.collect.ingraph, trtq/calib/collect/_ingraph.c): trtq's operator inside ONNX
Runtime must give exactly the statistics of the outputs collector (activations exposed, then
trtq.calib.collect.one_pass.Pow2Histograms), on hand-made graphs that reach every rule (padding rows, per-sample
strides, tensors whose leading dim only looks like the batch, one sample per call, ranges below the
float32 counting range, NaN) and on real models, through the CLI."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.calib.kernel_paths import require_kernels
from trtq.calib.collect import ingraph
from trtq.calib.collect.accumulators import AbsMaxAccumulator, HistogramAccumulator
from trtq.calib.collect.batch_leading import batch_leading, one_sample_calls
from trtq.calib.collect.exposed import OrtCollector, select_tensors
from trtq.calib.collect.one_pass import Pow2Histograms
from trtq.errors import DataError, ModelError


@pytest.fixture(autouse=True)
def _compiled(monkeypatch):
    require_kernels(monkeypatch, "compiled")


def _model(batch="N", cast_double=False, hw=6) -> onnx.ModelProto:
    """x[batch,4,hw,hw] -> Conv -> Relu -> Mul; Transpose(1,0,2,3) of it (leading dim 4: the batch's
    size in the tests, but not the batch); Reshape that folds the batch; optionally a float64 Cast."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    k = numpy_helper.from_array(np.array([0.5], np.float32), "k")
    shape = numpy_helper.from_array(np.array([-1, hw * hw], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Mul", ["r", "k"], ["m"]),
        helper.make_node("Transpose", ["m"], ["t"], perm=[1, 0, 2, 3]),
        helper.make_node("Reshape", ["c", "shape"], ["y"]),
    ]
    outputs = [
        helper.make_tensor_value_info("t", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
    ]
    if cast_double:
        nodes += [helper.make_node("Cast", ["m"], ["d"], to=TensorProto.DOUBLE), helper.make_node("Abs", ["d"], ["a"])]
        outputs.append(helper.make_tensor_value_info("a", TensorProto.DOUBLE, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, hw, hw])],
        outputs,
        initializer=[w, k, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _histograms(model, tensors, cap):
    leading = batch_leading(model, tensors) if cap else set()
    return Pow2Histograms(tensors, 64, cap, leading, one_sample_calls(model)), leading


def _collector(model, hist, leading, **kw):
    return ingraph.InGraphCollector(
        model,
        list(hist.counts),
        hist.num_bins,
        hist_elements=hist.hist_elements,
        leading=leading,
        one_sample=hist.one_sample_calls,
        **kw,
    )


def _run(collector, batches):
    for x, valid in batches:
        list(collector.run_groups({"x": x}, valid))


def _both(model, batches, cap=0):
    """(in-graph, outputs) histograms of ``batches`` ([(array, valid)])."""
    tensors = select_tensors(model)
    a, leading = _histograms(model, tensors, cap)
    collector = _collector(model, a, leading)
    _run(collector, batches)
    collector.fill_pow2(a)
    collector.close()
    b, _ = _histograms(model, tensors, cap)
    outputs = OrtCollector(model, tensors)
    for x, valid in batches:
        b.update_batch(outputs.run({"x": x}, valid))
    return a, b


def _assert_same(a: Pow2Histograms, b: Pow2Histograms):
    assert list(a.counts) == list(b.counts)
    for name in a.counts:
        assert np.array_equal(a.counts[name], b.counts[name]), name
        assert (a.maxima[name], a.exponents[name], a.zeros[name]) == (
            b.maxima[name],
            b.exponents[name],
            b.zeros[name],
        ), name
    assert a.strides == b.strides


@pytest.mark.parametrize("cap", [0, 7, 50])
def test_same_statistics_as_the_outputs_collector(cap):
    rng = np.random.default_rng(1)
    # batches of 4 whose ranges grow by binades; the last batch holds 3 samples and a padding row
    # that repeats the last one with huge values: it must count nowhere (t's leading dim is 4 too)
    batches = [(rng.standard_normal((4, 4, 6, 6)).astype(np.float32) * 4.0**i, 4) for i in range(4)]
    last = rng.standard_normal((4, 4, 6, 6)).astype(np.float32)
    last[3] = 1e6
    batches.append((last, 3))
    a, b = _both(_model(), batches, cap)
    _assert_same(a, b)
    assert a.maxima["x"] < 1e6 and a.maxima["x"] > 10
    assert a.counts["c"].sum() == 4 * 4 * 36 * 4 + 3 * 4 * 36 or cap  # every element unless subsampled
    if cap == 50:
        assert set(a.strides) == {"x", "c", "r", "m"}  # batch-leading only: not t, not y
    if cap == 7:  # a stride that would divide a dim (2, 3) is skipped: 5 then 7 ...
        assert all(k % 2 and k % 3 for k in a.strides.values())


def test_a_free_batch_dim_runs_no_padding_rows():
    """With a free batch dim the last batch runs its samples only (as the outputs collector's
    groups do): t = Transpose(1, 0, 2, 3) holds the batch on axis 1, where the padding rule (rows
    of a batch-sized leading dim) cannot see it."""
    model, rng = _model(), np.random.default_rng(5)
    x = rng.standard_normal((4, 4, 6, 6)).astype(np.float32)
    tensors = select_tensors(model)
    a, leading = _histograms(model, tensors, 0)
    collector = _collector(model, a, leading, free_batch=True)
    _run(collector, [(x, 3)])
    collector.fill_pow2(a)
    collector.close()
    b, _ = _histograms(model, tensors, 0)
    b.update_batch(OrtCollector(model, tensors).run({"x": x[:3]}))
    _assert_same(a, b)
    assert a.counts["t"].sum() == 4 * 3 * 36


def test_tensors_split_over_threads_merge_at_the_widest_range():
    """Tensors past 16K elements run as several pieces on ONNX Runtime's threads, each thread's
    counts from the slot's range up to its own max; the merge must raise each to the widest one."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 4, 100, 100)).astype(np.float32)
    x[2:] *= np.float32(1000.0)  # the later tasks reach ~10 binades higher than the first ones
    for cap in (0, 9000):
        a, b = _both(_model(hw=100), [(x * np.float32(0.01), 4), (x, 4)], cap)
        _assert_same(a, b)
        assert a.counts["x"].sum() == (2 * x.size if not cap else 8 * -(-40000 // a.strides["x"]))


def test_pieces_below_the_counting_range_and_a_late_nan_in_a_tensor_of_many_pieces():
    """A tensor of ~10 pieces (16K elements each) counted by whichever threads take them: pieces
    whose values sit below the float32 counting range next to normal ones, a later batch wholly
    below it, then normal again, must give the outputs collector's integers; a NaN in the last
    piece must still be found."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 4, 100, 100)).astype(np.float32)
    low = x.copy()
    low[:2] *= np.float32(1e-39)  # the first pieces alone would be below 2**-100
    for cap in (0, 9000):
        a, b = _both(_model(hw=100), [(x * np.float32(1e-39), 4), (low, 4), (x, 4)], cap)
        _assert_same(a, b)
        assert a.maxima["x"] > 1
    x[3, 3, 99, 99] = np.nan
    with pytest.raises(DataError, match="non-finite values .* in activation 'x'"):
        _both(_model(hw=100), [(x, 4)])


def test_one_sample_per_call_model_is_subsampled_as_the_outputs_collector():
    model = _model(batch=1)
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((1, 4, 6, 6)).astype(np.float32) * (i + 1), 1) for i in range(5)]
    a, b = _both(model, batches, cap=40)
    _assert_same(a, b)
    assert a.one_sample_calls and a.strides  # every tensor as one row, t and y included
    assert set(a.strides) == set(a.counts)


def test_ranges_below_the_float32_counting_range_take_the_exact_path():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 4, 6, 6)).astype(np.float32)
    batches = [(x * np.float32(3e-38), 4), (np.zeros_like(x), 4), (x * np.float32(1e-39), 4), (x, 4)]
    a, b = _both(_model(), batches)
    _assert_same(a, b)
    assert a.exponents["x"] is not None and a.maxima["x"] > 1


def test_a_nan_is_an_error_naming_the_tensor():
    x = np.ones((4, 4, 6, 6), np.float32)
    x[1, 2, 3, 4] = np.nan
    with pytest.raises(DataError, match="non-finite values .* in activation 'x'"):
        _both(_model(), [(np.ones_like(x), 4), (x, 4)])


def test_a_session_that_does_not_take_the_operator_is_a_model_error():
    model = _model(cast_double=True)  # 'd', 'a' are float64: the operator takes float32
    tensors = select_tensors(model)
    assert "d" in tensors
    with pytest.raises(ModelError, match="does not run the in-graph statistics"):
        ingraph.InGraphCollector(model, tensors, 64)


def test_nodes_follow_their_producers():
    model = ingraph._with_stats_nodes(_model(), ["x", "c", "t"], 5)
    order = [n.output[0] for n in model.graph.node]
    assert order == ["trtq_stats_0", "c", "trtq_stats_1", "r", "m", "t", "trtq_stats_2", "y"]
    assert [o.name for o in model.graph.output] == ["trtq_stats_0", "trtq_stats_1", "trtq_stats_2"]
    stats = [n for n in model.graph.node if n.op_type == ingraph.OP]
    assert {(a.name, a.i) for a in stats[2].attribute} == {("collection", 5), ("slot", 2)}


def _two_passes(model, batches, num_bins=50):
    """(in-graph, outputs) (AbsMaxAccumulator, HistogramAccumulator) of entropy's two passes; the
    in-graph collector runs both in one session, as calibrate does."""
    tensors = select_tensors(model)
    collector = ingraph.InGraphCollector(model, tensors, num_bins)
    collector.start_extremes()
    _run(collector, batches)
    ext_a = AbsMaxAccumulator()
    collector.fill_extremes(ext_a)
    hist_a = HistogramAccumulator(ext_a.maxima, num_bins)
    collector.start_histograms(hist_a.maxima)
    _run(collector, batches[::-1])  # pass 2 in another order: the data "changed" for nobody
    collector.fill_histograms(hist_a)
    collector.close()
    outputs = OrtCollector(model, tensors)
    ext_b = AbsMaxAccumulator()
    for x, valid in batches:
        ext_b.update_batch(outputs.run({"x": x}, valid))
    hist_b = HistogramAccumulator(ext_b.maxima, num_bins)
    for x, valid in batches[::-1]:
        hist_b.update_batch(outputs.run({"x": x}, valid))
    return (ext_a, hist_a), (ext_b, hist_b)


def _assert_same_two_passes(a, b):
    (ext_a, hist_a), (ext_b, hist_b) = a, b
    assert ext_a.maxima == ext_b.maxima and ext_a.extremes == ext_b.extremes
    assert hist_a.exceeded == hist_b.exceeded and hist_a.zeros == hist_b.zeros
    for name, c in hist_b.counts.items():
        assert np.array_equal(hist_a.counts[name], c), name


def test_two_passes_match_the_outputs_collector():
    """entropy / max: signed extremes, then counts over [0, max] in float32 clamped to the last bin
    (a value equal to the max lands there), padding rows left out of both passes."""
    rng = np.random.default_rng(7)
    batches = [(rng.standard_normal((4, 4, 6, 6)).astype(np.float32) * 3.0**i, 4) for i in range(3)]
    last = rng.standard_normal((4, 4, 6, 6)).astype(np.float32)
    last[3] = -1e6  # padding: in neither pass
    batches.append((last, 2))
    a, b = _two_passes(_model(), batches)
    _assert_same_two_passes(a, b)
    assert a[0].extremes["x"][0] > -1e5 and a[1].counts["c"].sum() == 3 * 4 * 4 * 36 + 2 * 4 * 36


def test_two_passes_of_tensors_in_many_pieces_match_the_outputs_collector():
    """Pass 2 of a 160K-element tensor runs in ~10 pieces over ONNX Runtime's threads, each thread
    counting into its own int64 lanes; a NaN in its last piece is still found."""
    rng = np.random.default_rng(9)
    batches = [(rng.standard_normal((4, 4, 100, 100)).astype(np.float32) * 2.0**i, 4) for i in range(2)]
    a, b = _two_passes(_model(hw=100), batches)
    _assert_same_two_passes(a, b)
    assert a[1].counts["x"].sum() == 2 * 4 * 4 * 100 * 100
    model = _model(hw=100)
    collector = ingraph.InGraphCollector(model, select_tensors(model), 50)
    collector.start_histograms(a[0].maxima)  # pass 2 alone: the NaN is its to find
    x = batches[1][0].copy()
    x[3, 3, 99, 99] = np.nan
    with pytest.raises(DataError, match="non-finite values .* in activation 'x'"):
        _run(collector, [batches[0], (x, 4)])
    collector.close()


def test_two_passes_special_ranges_and_values_past_the_range():
    """A tensor that is 0 in pass 1 (range 0: everything in bin 0, anything else past the range), a
    range so small that bins / max is no float32 (the float64 path), and pass 2 data above pass 1's
    max (flagged, counted in the last bin)."""
    model = _model()
    tensors = select_tensors(model)
    x = np.random.default_rng(8).standard_normal((4, 4, 6, 6)).astype(np.float32)
    for first, second in ((np.zeros_like(x), x), (x * np.float32(1e-37), x * np.float32(1e-37)), (x, x * 2)):
        collector = ingraph.InGraphCollector(model, tensors, 64)
        collector.start_extremes()
        _run(collector, [(first, 4)])
        ext = AbsMaxAccumulator()
        collector.fill_extremes(ext)
        hist_a = HistogramAccumulator(ext.maxima, 64)
        collector.start_histograms(hist_a.maxima)
        _run(collector, [(second, 4)])
        collector.fill_histograms(hist_a)
        collector.close()
        hist_b = HistogramAccumulator(ext.maxima, 64)
        hist_b.update_batch(OrtCollector(model, tensors).run({"x": second}))
        assert hist_a.exceeded == hist_b.exceeded and hist_a.zeros == hist_b.zeros
        for name, c in hist_b.counts.items():
            assert np.array_equal(hist_a.counts[name], c), name
    assert hist_a.exceeded  # the last case: pass 2 went past pass 1's range


def test_two_passes_refuse_a_nan():
    x = np.ones((4, 4, 6, 6), np.float32)
    x[0, 0, 0, 0] = np.inf
    with pytest.raises(DataError, match="non-finite values .* in activation 'x'"):
        _two_passes(_model(), [(x, 4)])


# ------------------------------------------------------------------------------------------------
# through the CLI
# ------------------------------------------------------------------------------------------------


def _calibrate(trtq, model, data, out: Path, *extra, preprocess=("--preprocess", "imagenet")):
    r = trtq(
        [
            "calibrate",
            "--model",
            model,
            "--data",
            data,
            *preprocess,
            "-o",
            out,
            "--save-stats",
            out.with_suffix(".npz"),
            *extra,
        ]
    )
    assert r.code == 0, r
    return out.read_bytes(), np.load(out.with_suffix(".npz")), json.loads(Path(f"{out}.json").read_text())


@pytest.mark.parametrize("method", ["mse", "percentile", "entropy", "max"])
def test_cli_caches_and_statistics_match(trtq, sample_model, sample_images, tmp_path, method):
    args = ("--method", method, "--limit", "7", "--batch-size", "4")  # a padded last batch
    cache_a, stats_a, prov_a = _calibrate(trtq, sample_model, sample_images, tmp_path / "a.cache", *args)
    cache_b, stats_b, prov_b = _calibrate(
        trtq, sample_model, sample_images, tmp_path / "b.cache", *args, "--collect", "outputs"
    )
    assert prov_a["collection"]["mode"] == "in-graph" and prov_b["collection"]["mode"] == "outputs"
    assert cache_a == cache_b
    for key in stats_b.files:
        if key != "header":
            assert np.array_equal(stats_a[key], stats_b[key]), key


def test_cli_refusals_and_fallback(trtq, sample_model, sample_images, tmp_path, monkeypatch):
    out = tmp_path / "c.cache"
    base = [
        "calibrate",
        "--model",
        sample_model,
        "--data",
        sample_images,
        "--preprocess",
        "imagenet",
        "--limit",
        "4",
        "-o",
        out,
    ]
    monkeypatch.setenv("TRTQ_NO_NATIVE", "1")  # no compiled kernels: no operator
    r = trtq([*base, "--collect", "in-graph"])
    assert r.code == 2 and "compiled kernels are not built" in r.err and not out.exists()
    assert len(r.err.strip().splitlines()) == 1
    r = trtq(base)  # auto: the outputs collector
    assert r.code == 0, r
    assert json.loads(Path(f"{out}.json").read_text())["collection"]["mode"] == "outputs"


def _paddle_model(name: str) -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / name
    if not path.exists():
        pytest.skip(f"{name} is not in this rapidocr-onnxruntime")
    return path


@pytest.mark.parametrize(
    "name,shape", [("ch_PP-OCRv4_rec_infer.onnx", (3, 48, 160)), ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192))]
)
def test_real_paddle_models_give_the_same_cache(trtq, tmp_path, name, shape):
    """PP-OCRv4 rec and PP-OCR cls (weights in Constant nodes, dynamic width; hundreds of tensors)
    on text-line-like inputs: bright background, dark strokes, a padded last batch."""
    model = _paddle_model(name)
    rng = np.random.default_rng(4)
    x = np.ones((11, *shape), np.float32)
    for i in range(11):
        for _ in range(12):
            r, c = rng.integers(8, shape[1] - 8), rng.integers(4, shape[2] - 20)
            x[i, :, r - 6 : r + 6, c : c + rng.integers(2, 16)] = -1.0
    x += rng.normal(0, 0.05, x.shape).astype(np.float32)
    data = tmp_path / "x.npy"
    np.save(data, x)
    a = _calibrate(trtq, model, data, tmp_path / "a.cache", "--batch-size", "4", preprocess=())
    b = _calibrate(trtq, model, data, tmp_path / "b.cache", "--batch-size", "4", "--collect", "outputs", preprocess=())
    assert a[2]["collection"]["mode"] == "in-graph"
    assert a[0] == b[0]
    assert np.array_equal(a[1]["counts"], b[1]["counts"])
