"""The per-array kernels of trtq.calib.collect.kernels and the I/O-bound collector of trtq.calib.collect.exposed.

The compiled kernels and the numpy fallback must give the same counts, bit for bit, as a direct
numpy statement of the binning rule; the collector must return what a plain ONNX
Runtime run returns.
"""

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.calib.kernel_paths import require_kernels
from trtq.calib.collect import compiled, kernels
from trtq.calib.collect.accumulators import AbsMaxAccumulator, HistogramAccumulator
from trtq.calib.collect.exposed import OrtCollector, select_tensors

NUM_BINS = 2048


def _reference(a: np.ndarray, scale: np.float32, num_bins: int):
    """The binning rule written directly: floor(|x| * scale) in float32, clipped to the last bin."""
    y = np.abs(a.astype(np.float32)).reshape(-1) * np.float32(scale)
    k = np.minimum(np.floor(y), num_bins - 1).astype(np.int64)
    return np.bincount(k, minlength=num_bins), int((y == 0).sum())


def _arrays():
    rng = np.random.default_rng(0)
    relu = np.maximum(rng.normal(size=(3, 17, 31)), 0).astype(np.float32)  # many zeros, odd size
    heavy = rng.standard_t(2, size=100_003).astype(np.float32)
    tiny = np.array([0.0, -0.0, 1e-30, 5.0], np.float32)
    return {
        "relu": relu,
        "heavy": heavy,
        "tiny": tiny,
        "half": heavy[:4099].astype(np.float16),
        "double": heavy[:5000].astype(np.float64),
    }


@pytest.fixture(params=["native", "numpy"])
def implementation(request, monkeypatch):
    require_kernels(monkeypatch, "compiled" if request.param == "native" else request.param)
    if request.param == "native":
        assert kernels.two_pass_kernel() is compiled.histogram_f32
    else:
        assert kernels.two_pass_kernel() is None
    return request.param


@pytest.mark.parametrize("name", list(_arrays()))
def test_histogram_into_matches_the_rule(implementation, name):
    a = _arrays()[name]
    top = float(np.abs(a.astype(np.float64)).max())
    scale = np.float32(NUM_BINS / top)
    counts = np.zeros(NUM_BINS, np.int64)
    zeros, flags = kernels.histogram_into(a, scale, counts)
    expected, expected_zeros = _reference(a, scale, NUM_BINS)
    assert np.array_equal(counts, expected)
    assert zeros == expected_zeros
    assert flags == 0
    assert counts[-1] >= 1  # the max lands in the last bin


def test_histogram_into_flags(implementation):
    counts = np.zeros(16, np.int64)
    _, flags = kernels.histogram_into(np.array([0.5, 3.0], np.float32), np.float32(16.0), counts)
    assert flags == kernels.EXCEEDED  # 3.0 * 16 is past the 16 bins: counted in the last one
    assert counts[8] == 1 and counts[15] == 1
    for bad in (np.nan, np.inf, -np.inf):
        _, flags = kernels.histogram_into(
            np.array([1.0, bad, 0.25], np.float32), np.float32(8.0), np.zeros(16, np.int64)
        )
        assert flags & kernels.NONFINITE


@pytest.mark.parametrize("stride", [7, 1039, 4289])
def test_histogram_into_counts_every_stride_th_element_of_each_row(implementation, stride):
    rng = np.random.default_rng(stride)
    rows = np.abs(rng.standard_t(3, size=(3, 20011))).astype(np.float32)
    rows[1, 4] = np.nan  # not counted (4 is no multiple of the stride): no flag, as the rule says
    rows[2, 5] = 1e9  # nor is this one: nothing past the top among the counted elements
    picked = rows[:, ::stride]
    scale = np.float32(NUM_BINS / float(picked.max()))
    counts = np.zeros(NUM_BINS, np.int64)
    zeros, flags = kernels.histogram_into(rows, scale, counts, stride)
    expected, expected_zeros = _reference(picked, scale, NUM_BINS)
    assert np.array_equal(counts, expected) and zeros == expected_zeros and flags == 0
    rows[0, 2 * stride] = np.inf  # a counted one is
    assert kernels.histogram_into(rows, scale, np.zeros(NUM_BINS, np.int64), stride)[1] & kernels.NONFINITE


def test_compiled_kernels_refuse_what_they_would_misread():
    """The C code trusts dtype, layout and indices: the wrappers check them first."""
    if compiled.library() is None:
        pytest.skip("the compiled kernels were not built in this install (no C compiler)")
    rows = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        compiled.pow2_count(rows[:, ::2], 1, 0, np.zeros((4, 16), np.int32), -100)  # a strided view
    with pytest.raises(ValueError, match="float32"):
        compiled.pow2_count(rows.astype(np.float64), 1, 0, np.zeros((4, 16), np.int32), -100)
    with pytest.raises(ValueError, match="int64"):
        compiled.histogram_f32(rows, np.float32(1), np.zeros((4, 16), np.int32), np.float32(16), 1)
    starts, weights = np.zeros((2, 3), np.int64), np.ones(3, np.int64)
    p = np.zeros((5, 4), np.int64)
    a, b = np.empty((2, 4), np.int64), np.empty((2, 4), np.int64)
    compiled.level_sums(starts, weights, p, p, a, b)
    with pytest.raises(ValueError, match="out of range"):
        compiled.level_sums(starts + 5, weights, p, p, a, b)


def test_compiled_avx2_and_scalar_loops_count_the_same():
    """Where the CPU has AVX2 the compiled kernels count whole blocks eight at a time; the scalar
    loops (every other CPU) must give the same integers, and both those of the rule, on every
    length (the vector loop leaves up to seven to the scalar one) and on zeros, -0.0 and values
    that land on a bin edge."""
    if compiled.library() is None:
        pytest.skip("the compiled kernels were not built in this install (no C compiler)")
    if not compiled.use_simd(True):
        pytest.skip("this CPU has no AVX2: the scalar loops are the only ones")
    rng = np.random.default_rng(11)
    x = np.abs(rng.standard_t(2, size=(1, 70001))).astype(np.float32)
    x[0, ::5] = 0.0
    x[0, 1::7] = -0.0
    x[0, 2::9] = np.float32(0.25)  # exactly on an edge at every range from 2**-1 up
    x[0, 0] = 3.0
    try:
        for n in (1, 7, 8, 9, 4095, 4096, 4103, 70001):
            row = np.ascontiguousarray(x[:, :n])
            results = []
            for simd in (True, False):
                assert compiled.use_simd(simd) == simd
                lanes = np.zeros((4, NUM_BINS), np.int32)
                e, top, zeros, status = compiled.pow2_count(row, 1, -(1 << 30), lanes, -100)
                lanes64 = np.zeros((4, NUM_BINS), np.int64)  # the two-pass kernel, over [0, max]
                scale = np.float32(NUM_BINS / float(row.max()))
                zeros2, _, _ = compiled.histogram_f32(row, scale, lanes64, np.float32(NUM_BINS * 1.000001), 1)
                results.append((e, top, zeros, status, zeros2, lanes.sum(axis=0), lanes64.sum(axis=0)))
            (a, b) = results
            assert a[:5] == b[:5] and np.array_equal(a[5], b[5]) and np.array_equal(a[6], b[6]), n
            expected, expected_zeros = _reference(row, np.float32(NUM_BINS * 2.0 ** -a[0]), NUM_BINS)
            assert np.array_equal(a[5], expected) and a[2] == expected_zeros and a[3] == 0, n
            expected, expected_zeros = _reference(row, scale, NUM_BINS)
            assert np.array_equal(a[6], expected) and a[4] == expected_zeros, n
    finally:
        compiled.use_simd(True)


def test_compiled_kernels_from_another_version_are_not_used(monkeypatch, caplog):
    """An editable install not rebuilt after a pull keeps an old library: trtq must not call it."""
    if compiled.library() is None:
        pytest.skip("the compiled kernels were not built in this install (no C compiler)")
    monkeypatch.setattr(compiled, "VERSION", compiled.VERSION + 1)
    # a CLI test earlier in the process stops "trtq" records at its own handler; caplog listens at the root
    monkeypatch.setattr(logging.getLogger("trtq"), "propagate", True)
    monkeypatch.setattr(compiled, "_state", "untried")
    monkeypatch.setattr(compiled, "_lib", None)
    with caplog.at_level("WARNING", logger="trtq.calib.collect.compiled"):
        assert compiled.library() is None
    assert "pip install -e ." in caplog.text
    assert kernels.pow2_kernel() is not compiled.pow2_count


def test_accumulators_split_large_tensors_in_parallel(monkeypatch):
    """Parts and threads must not change the result: compare with one-part, inline runs."""
    rng = np.random.default_rng(3)
    batch = {
        "a": rng.normal(size=(4, 64, 33, 33)).astype(np.float32),
        "b": np.maximum(rng.normal(size=(4, 1000)), 0).astype(np.float32),
    }
    results = []
    for part, cores in ((1 << 21, 1), (1000, 4)):
        monkeypatch.setattr(kernels, "PART", part)
        monkeypatch.setattr(kernels, "usable_cores", lambda cores=cores: cores)
        mx = AbsMaxAccumulator()
        mx.update_batch(batch)
        h = HistogramAccumulator(mx.maxima)
        h.update_batch(batch)
        results.append((mx.maxima, h.counts, h.zeros))
    (m1, c1, z1), (m2, c2, z2) = results
    assert m1 == m2 and z1 == z2
    assert all(np.array_equal(c1[k], c2[k]) for k in c1)
    assert m1["a"] == float(np.abs(batch["a"]).max())


# --------------------------------------------------------------------------------------------
# collector
# --------------------------------------------------------------------------------------------


def _conv_model(path):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["img", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, str(path))
    return model


def test_collector_returns_fresh_activations_every_batch(tmp_path):
    import onnxruntime as ort

    model = _conv_model(tmp_path / "m.onnx")
    tensors = select_tensors(model)
    assert tensors[0] == "img"
    collector = OrtCollector(model, tensors, ["CPUExecutionProvider"])
    plain = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    # same shape twice (reused bound buffers), then a smaller last batch, then back
    for n in (5, 5, 3, 5):
        x = rng.normal(size=(n, 3, 8, 8)).astype(np.float32)
        got = collector.run({"img": x})
        assert set(got) == set(tensors)
        np.testing.assert_array_equal(got["img"], x)
        np.testing.assert_array_equal(got["out"], plain.run(["out"], {"img": x})[0])
        assert got["relu"].shape == (n, 4, 8, 8)
        np.testing.assert_allclose(got["relu"].mean(axis=(2, 3)), got["out"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["relu"], np.maximum(got["conv"], 0))


def test_collector_drops_padding_rows(tmp_path):
    model = _conv_model(tmp_path / "m.onnx")
    collector = OrtCollector(model, select_tensors(model), ["CPUExecutionProvider"])
    x = np.random.default_rng(2).normal(size=(4, 3, 8, 8)).astype(np.float32)
    got = collector.run({"img": x}, valid=3)
    assert all(v.shape[0] == 3 for v in got.values())
