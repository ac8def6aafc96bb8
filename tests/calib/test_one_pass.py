"""One-pass power-of-two histograms (trtq.calib.collect.one_pass) and the batch-dim proof
(trtq.calib.collect.batch_leading).

References are written here independently: bins computed in float64 over the final range, every
k-th element of each sample taken by plain slicing, primes found by trial division.
"""

import json
import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.calib.kernel_paths import require_kernels, use_kernels
from trtq.calib import methods as M
from trtq.calib import stats as S
from trtq.calib.collect import compiled, kernels
from trtq.calib.collect import one_pass as P
from trtq.calib.collect.batch_leading import batch_leading, one_sample_calls
from trtq.errors import ConfigError, DataError

NB = 64


def _reference(values: np.ndarray, nb: int = NB):
    """(counts, top, max, zeros) of |values| over [0, 2**e) with 2**e the first power above the max."""
    a = np.abs(values.astype(np.float64).reshape(-1))
    m = float(a.max()) if a.size else 0.0
    if m == 0:
        return np.bincount(np.zeros(a.size, np.intp), minlength=nb), 0.0, m, a.size
    top = 2.0 ** (math.floor(math.log2(m)) + 1)
    assert m < top <= 2 * m
    k = np.floor(a / top * nb).astype(np.intp)
    return np.bincount(k, minlength=nb), top, m, int((a == 0).sum())


@pytest.fixture(params=["native", "two-reads"])
def path(request, monkeypatch):
    """The compiled kernel that takes the max and the counts in one read, and the numpy fallback
    (max first, then counts): the tests hold both to the same references."""
    require_kernels(monkeypatch, {"native": "compiled", "two-reads": "numpy"}[request.param])
    if request.param == "native":
        assert kernels.pow2_kernel() is compiled.pow2_count
    else:
        assert kernels.pow2_kernel() is None
    return request.param


def _fold(batches, **kw):
    h = P.Pow2Histograms(["t"], NB, **kw)
    for b in batches:
        h.update_batch({"t": b})
    return h


@pytest.mark.parametrize("seed", range(6))
def test_any_split_and_order_gives_the_histogram_of_the_final_range(seed, path):
    rng = np.random.default_rng(seed)
    # ranges that grow by 1 to 40 binades across batches, with zeros and a ReLU-like half
    parts = [np.maximum(rng.standard_normal((rng.integers(1, 5), 7)), 0) * 10.0 ** rng.uniform(-6, 6) for _ in range(8)]
    x = np.concatenate(parts).astype(np.float32)
    counts, top, m, zeros = _reference(x)
    for order in (parts, parts[::-1], [x], list(x[:, None, :])):
        h = _fold([p.astype(np.float32) for p in order])
        assert np.array_equal(h.counts["t"], counts)
        assert h.tops["t"] == top and h.maxima["t"] == m and h.zeros["t"] == zeros


@pytest.mark.parametrize("cap", [0, 20000, 58, 14])
def test_one_read_regrows_inside_a_row_and_across_tasks(path, monkeypatch, cap):
    """Rows longer than the kernel's 4096-element blocks whose range grows block by block (in-row
    regrow), tensors split into many tasks that each reach their own range (merged by regrow), a
    start above or below the data's range, and strides past the block size (58, 14: 1039, 4289)."""
    monkeypatch.setattr(kernels, "PART", 5000)
    rng = np.random.default_rng(cap)
    n = 60037
    x = (rng.standard_normal((3, n)) * np.logspace(-3, 4, n)[None, :]).astype(np.float32)
    x[:, ::7] = 0.0
    stride = P.stride_for(n, cap, (n,))
    assert stride == {0: 1, 20000: 5, 58: 1039, 14: 4289}[cap]
    picked = x[:, ::stride]
    expect, top, m, zeros = _reference(np.concatenate([picked.reshape(-1), [np.abs(x).max()]]))
    expect[min(NB - 1, int(np.abs(x).max() / top * NB))] -= 1  # the max itself, unless picked
    for batches in ([x], [x[:1], x[1:]], [x[2:], x[:2]]):
        h = _fold(batches, hist_elements=cap, batch_leading={"t"})
        assert h.strides == ({"t": stride} if stride > 1 else {})
        assert np.array_equal(h.counts["t"], expect) and h.tops["t"] == top and h.maxima["t"] == m
    h = P.Pow2Histograms(["t"], NB)
    h.update_batch({"t": np.array([1000.0], np.float32)})  # starts above the later data's range
    h.update_batch({"t": x})
    both, top2, _, _ = _reference(np.concatenate([x.reshape(-1), [1000.0]]))
    assert np.array_equal(h.counts["t"], both) and h.tops["t"] == top2


def test_one_read_kernel_statuses(path):
    if path == "two-reads":
        pytest.skip("the numpy fallback has no kernel statuses")
    ok = np.ones((1, 5000), np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        x = ok.copy()
        x[0, 4500] = bad  # in the second block, after one was counted
        assert kernels.pow2_histogram(x, 1, None, NB, -100)[4] == kernels.POW2_NONFINITE
    tiny = np.full((1, 10), 1e-35, np.float32)  # 2**-116: below the float32 counting range
    assert kernels.pow2_histogram(tiny, 1, None, NB, -100)[4] == kernels.POW2_TINY
    counts, e, m, zeros, status = kernels.pow2_histogram(tiny, 1, 0, NB, -100)  # already counting at 2**0
    assert status == kernels.POW2_OK and e == 0 and counts[0] == 10 and m == float(np.float32(1e-35))
    counts, e, m, zeros, status = kernels.pow2_histogram(np.array([[0.0, -0.0]], np.float32), 1, None, NB, -100)
    assert e is None and counts[0] == 2 and zeros == 2 and m == 0.0


def test_regrow_merges_runs_of_bins():
    c = np.arange(NB, dtype=np.int64)
    assert np.array_equal(P.regrow(c, 1)[: NB // 2], c[0::2] + c[1::2])
    assert P.regrow(c, 1)[NB // 2 :].sum() == 0
    assert P.regrow(c, 6)[0] == c.sum() and P.regrow(c, 60)[0] == c.sum()
    assert P.regrow(c, 0) is c


def test_values_at_a_power_of_two_open_the_next_range(path):
    h = _fold([np.array([1.0, 0.5, 0.25], np.float32)])
    assert h.tops["t"] == 2.0  # max 1.0 must be strictly below the top
    assert h.counts["t"][NB // 2] == 1 and h.counts["t"][NB // 4] == 1 and h.counts["t"][NB // 8] == 1


def test_zero_tensor_then_values_and_tiny_ranges(path):
    h = _fold([np.zeros((2, 3), np.float32), np.array([[0.0, 3.0, -1.0]], np.float32)])
    counts, top, _, zeros = _reference(np.array([0, 0, 0, 0, 0, 0, 0, 3, -1.0]))
    assert np.array_equal(h.counts["t"], counts) and h.tops["t"] == top == 4.0 and h.zeros["t"] == zeros == 7
    assert _fold([np.zeros(4, np.float32)]).tops["t"] == 0.0
    tiny = np.array([1e-40, 5e-41, 0.0, -3e-41], np.float32)  # denormals: the float64 path
    h = _fold([tiny])
    counts, top, _, _ = _reference(tiny)
    assert np.array_equal(h.counts["t"], counts) and h.tops["t"] == top


def test_a_range_below_the_float32_counting_range_stays_exact_in_later_batches(path):
    # a first batch of 5e-38 leaves the range at 2**-124; later batches of zeros and of values
    # under that range must still count (the scale 64 * 2**124 is no float32)
    batches = [
        np.full((2, 5), 5e-38, np.float32),
        np.zeros((3, 5000), np.float32),
        np.array([[0.0, 2e-38, -4e-38]], np.float32),
    ]
    h = _fold(batches)
    counts, top, _, zeros = _reference(np.concatenate([b.reshape(-1) for b in batches]))
    assert np.array_equal(h.counts["t"], counts) and h.tops["t"] == top and h.zeros["t"] == zeros == 15001


def test_non_finite_and_a_non_power_of_two_bin_count_are_refused(path):
    with pytest.raises(DataError, match="non-finite"):
        _fold([np.array([1.0, np.nan], np.float32)])
    with pytest.raises(ConfigError, match="power-of-two"):
        P.Pow2Histograms(["t"], 1000)


def _is_prime(k):
    return k > 1 and all(k % p for p in range(2, k))


@pytest.mark.parametrize("n,cap", [(10, 10), (11, 10), (100, 7), (409600, 65536), (5000, 1), (7, 0)])
def test_stride_is_the_smallest_prime_within_the_cap(n, cap):
    k = P.stride_for(n, cap)
    if cap == 0 or n <= cap:
        assert k == 1
        return
    assert _is_prime(k) and -(-n // k) <= cap
    assert not any(_is_prime(j) and -(-n // j) <= cap for j in range(2, k))


def test_stride_never_divides_a_dim_of_the_sample():
    # 4 x 11 x 11 with a cap of 44: the smallest prime within the cap is 11, the row length
    assert P.stride_for(484, 44) == 11
    k = P.stride_for(484, 44, (4, 11, 11))
    assert k == 13 and all(d % k for d in (4, 11, 11))


def test_a_padded_map_is_not_sampled_on_its_padding_column():
    """Column 0 of every row is zero padding (as in EfficientNet-Lite0's padded depthwise inputs):
    a stride equal to the row length would see only the padding."""
    rng = np.random.default_rng(8)
    x = np.abs(rng.standard_normal((6, 4, 11, 11))).astype(np.float32) + 1.0
    x[..., 0] = 0.0
    h = _fold([x], hist_elements=44, batch_leading={"t"})
    assert h.strides == {"t": 13}
    zeros, total = h.zeros["t"], int(h.counts["t"].sum())
    assert total == 6 * -(-484 // 13)
    assert 0.04 < zeros / total < 0.15  # about the 1/11 of the data that is padding


def test_subsample_is_every_kth_element_of_each_sample_whatever_the_batching(path):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((10, 4, 5, 6)) * 3).astype(np.float32)  # 120 elements a sample
    k = P.stride_for(120, 16, (4, 5, 6))
    picked = np.concatenate([s.reshape(-1)[::k] for s in x])
    counts, _, _, _ = _reference(np.concatenate([picked, [np.abs(x).max()]]))  # the range comes from every element
    counts[np.floor(np.abs(x).max() / 2 ** math.ceil(math.log2(np.abs(x).max())) * NB).astype(int)] -= 1
    results = []
    for rows in (1, 3, 10):
        h = _fold([x[i : i + rows] for i in range(0, 10, rows)], hist_elements=16, batch_leading={"t"})
        assert h.strides == {"t": k} and h.maxima["t"] == float(np.abs(x).max())
        results.append(h.counts["t"])
    assert all(np.array_equal(r, counts) for r in results)
    # a tensor not proven batch-leading is histogrammed whole
    h = _fold([x], hist_elements=16)
    assert h.strides == {} and h.counts["t"].sum() == x.size
    # one sample per call: the whole array is the sample
    h = _fold([x[i : i + 1] for i in range(10)], hist_elements=16, one_sample_calls=True)
    assert np.array_equal(h.counts["t"], counts)


def test_merge_into_equals_one_run():
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((5, 9)) * 0.01).astype(np.float32)
    b = (rng.standard_normal((5, 9)) * 300).astype(np.float32)
    one = _fold([a, b])
    for first, second in ((a, b), (b, a)):
        total, other = _fold([first]), _fold([second])
        P.merge_into(total, other.maxima, other.tops, other.counts, other.zeros)
        assert np.array_equal(total.counts["t"], one.counts["t"]) and total.tops == one.tops
        assert total.maxima == one.maxima and total.zeros == one.zeros


def test_methods_on_pow2_histograms_search_the_range_and_stop_at_the_max():
    rng = np.random.default_rng(5)
    x = np.abs(rng.standard_t(3, 200_000)).astype(np.float32)
    h = P.Pow2Histograms(["t"], 2048)
    h.update_batch({"t": x})
    m, top = h.maxima["t"], h.tops["t"]
    mse = M.compute_all("mse", {"t": m}, h.counts, tops=h.tops)["t"]
    assert mse == S.mse_amax(h.counts["t"], top) < m  # heavy tails: mse clips
    pct = M.compute_all("percentile", {"t": m}, h.counts, 100.0, tops=h.tops)["t"]
    assert pct == m  # the 100th percentile is the top bin's edge, capped at the max
    with pytest.raises(ValueError, match="entropy"):
        M.compute_all("entropy", {"t": m}, h.counts, tops=h.tops)


def test_stats_file_keeps_the_tops_and_old_readers_formats(tmp_path):
    h = _fold([np.array([[0.0, 3.0, -1.5]], np.float32)])
    p = tmp_path / "s.npz"
    S.save_stats(p, h.maxima, h.counts, {"k": 1}, h.zeros, h.tops)
    st = S.load_stats(p)
    assert st.edges == "pow2" and st.tops == {"t": 4.0} and st.top("t") == 4.0
    S.save_stats(tmp_path / "old.npz", h.maxima, h.counts, {}, h.zeros)
    old = S.load_stats(tmp_path / "old.npz")
    assert old.edges == "max" and old.tops is None and old.top("t") == 3.0
    with pytest.raises(ValueError, match="tops"):
        S.save_stats(tmp_path / "bad.npz", h.maxima, h.counts, {}, h.zeros, {"t": 2.0})  # below the max


def _model(reshape_to):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2, 1, 1], np.ones(6, np.float32))
    shape = helper.make_tensor("shape", TensorProto.INT64, [len(reshape_to)], reshape_to)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    g = helper.make_graph(nodes, "g", [x], [y], [w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_batch_leading_is_proven_from_the_graph():
    m = _model([0, -1])  # keeps dim 0
    assert batch_leading(m, ["x", "c", "r", "y"]) == {"x", "c", "r", "y"}
    m = _model([-1])  # folds the batch away
    assert batch_leading(m, ["x", "c", "r", "y"]) == {"x", "c", "r"}
    fixed = _model([0, -1])
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    assert batch_leading(fixed, ["x", "c"]) == set() and one_sample_calls(fixed)
    assert not one_sample_calls(m)


def test_calibrate_on_photos_subsamples_and_keeps_caches_batch_independent(trtq, sample_config, tmp_path):
    """The sample model on real photos, strides forced small: the cache does not depend on the
    batch size, and differs from histogramming every element (so the stride is really taken)."""
    import json

    caches = []
    for bs in ("1", "3", "8"):
        out = tmp_path / f"b{bs}.cache"
        r = trtq(
            ["calibrate", "-c", sample_config, "--limit", "10", "--batch-size", bs, "--hist-elements", "500", "-o", out]
        )
        assert r.code == 0, r
        caches.append(out.read_bytes())
    assert caches[0] == caches[1] == caches[2]
    hist = json.loads((tmp_path / "b1.cache.json").read_text())["collection"]["histograms"]
    assert hist["edges"] == "pow2" and hist["hist_elements"] == 500 and hist["subsampled_tensors"] > 50
    full = tmp_path / "full.cache"
    assert trtq(["calibrate", "-c", sample_config, "--limit", "10", "--hist-elements", "0", "-o", full]).code == 0
    assert full.read_bytes() != caches[0]
    assert json.loads((tmp_path / "full.cache.json").read_text())["collection"]["histograms"]["subsampled_tensors"] == 0
    r = trtq(["calibrate", "-c", sample_config, "--hist-elements", "-1", "-o", tmp_path / "neg.cache"])
    assert r.code == 2 and "--hist-elements" in r.err and not (tmp_path / "neg.cache").exists()


def test_calibrate_records_its_kernels_and_each_writes_the_same_cache(trtq, sample_config, tmp_path, monkeypatch):
    """The provenance names the kernels a run used ("compiled", "numpy"); the caches agree."""
    caches = []
    for name in ("numpy", "compiled"):
        if not use_kernels(monkeypatch, name):
            continue
        for method in ("mse", "entropy"):
            out = tmp_path / f"{name}-{method}.cache"
            r = trtq(["calibrate", "-c", sample_config, "--limit", "10", "--method", method, "-o", out])
            assert r.code == 0, r
            assert json.loads((tmp_path / f"{out.name}.json").read_text())["collection"]["kernels"] == name
            caches.append((method, out.read_bytes()))
    for method in ("mse", "entropy"):
        assert len({c for m, c in caches if m == method}) == 1
