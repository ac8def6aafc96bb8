"""trtq.calib.search (all tensors at once, closed form) against the per-tensor searches of
trtq.calib.stats (mse_errors / entropy_divergences, kept as the reference): same errors to
rounding, same chosen amax, on random and on real activation histograms."""

import numpy as np
import pytest

from tests.calib.kernel_paths import use_kernels
from trtq.calib import methods as M
from trtq.calib import search
from trtq.calib import stats as S
from trtq.calib.collect import kernels


def _random_histograms(seed: int, n: int = 60, nb: int = 2048) -> tuple[list[np.ndarray], list[float]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            c = rng.poisson(rng.uniform(0.1, 50), nb)
        elif kind == 1:  # long tail
            c = (rng.exponential(1, nb) * 1e3 * np.exp(-np.arange(nb) / rng.uniform(5, 500))).astype(np.int64)
        elif kind == 2:
            c = rng.integers(0, 3, nb)
        else:  # |gaussian| with outliers
            x = np.abs(rng.standard_normal(50000)) * rng.uniform(50, 3000)
            c = np.bincount(np.minimum(x.astype(np.int64), nb - 1), minlength=nb)
            c[rng.integers(0, nb, 3)] += rng.integers(1, 5, 3)
        out.append(c.astype(np.int64))
    return out, list(rng.uniform(1e-3, 100.0, n))


@pytest.fixture(scope="module")
def real_histograms():
    """Histograms of every activation of the bundled classifier on a small batch of noise images."""
    import onnx

    from tests.conftest import SAMPLE_MODEL
    from trtq.calib.collect.accumulators import AbsMaxAccumulator, HistogramAccumulator
    from trtq.calib.collect.exposed import OrtCollector, select_tensors

    model = onnx.load(str(SAMPLE_MODEL))
    tensors = select_tensors(model)
    x = {"x": np.random.default_rng(1).normal(0, 1, (2, 3, 224, 224)).astype(np.float32)}
    col = OrtCollector(model, tensors)
    mx = AbsMaxAccumulator()
    mx.update_batch(col.run(x))
    h = HistogramAccumulator(mx.maxima)
    h.update_batch(col.run(x))
    return h.counts, h.maxima, h.zeros


def _reference_mse(counts, maxima):
    return [S.mse_amax(c, m) for c, m in zip(counts, maxima)]


def test_mse_errors_match_reference_on_random_histograms():
    counts, maxima = _random_histograms(0, 24)
    js, err = search.mse_errors_many(np.stack(counts), np.array(maxima))
    for i, (c, m) in enumerate(zip(counts, maxima)):
        cand, ref = S.mse_errors(c, m)
        np.testing.assert_array_equal(js * (m / c.size), cand)
        np.testing.assert_allclose(err[i], ref, rtol=1e-11, atol=1e-12 * ref.max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mse_amax_identical_on_random_histograms(seed):
    counts, maxima = _random_histograms(seed)
    assert search.mse_amax_many(counts, maxima) == _reference_mse(counts, maxima)


def test_mse_and_entropy_identical_on_real_histograms(real_histograms):
    counts, maxima, zeros = real_histograms
    names = [n for n in counts if maxima[n] > 0 and counts[n].sum() > 0]
    assert len(names) > 50
    got = search.mse_amax_many([counts[n] for n in names], [maxima[n] for n in names])
    assert got == _reference_mse([counts[n] for n in names], [maxima[n] for n in names])
    for method in ("mse", "entropy"):
        fast = M.compute_all(method, maxima, counts, zeros=zeros)
        slow = {n: M.compute_amax(method, counts[n], maxima[n], zeros=zeros[n]) for n in maxima}
        assert fast == slow and list(fast) == list(slow)


def test_entropy_choices_match_reference():
    counts, _ = _random_histograms(3)
    counts.append(np.zeros(2048, dtype=np.int64))  # nothing to search
    got = search.entropy_choices(counts)
    for c, i in zip(counts, got):
        kl = S.entropy_divergences(c)
        assert i == (None if not np.isfinite(kl).any() else 128 + S._first_min(kl))
    kl = search.entropy_divergences_many(np.stack(counts[:-1]))
    ref = np.stack([S.entropy_divergences(c) for c in counts[:-1]])
    assert np.array_equal(np.isinf(kl), np.isinf(ref))
    np.testing.assert_allclose(np.where(np.isinf(ref), 0, kl), np.where(np.isinf(ref), 0, ref), atol=1e-12)


def test_mse_exact_ties_take_the_first():
    """One spike: several candidates have exactly the same error (the reference's rounding of
    x - q can put them > 1e-12 apart); the first of them is chosen and its error is the least."""
    c = np.zeros(2048, dtype=np.int64)
    c[73] = 51434
    js, err = search.mse_errors_many(c[None], np.array([7.5]))
    (amax,) = search.mse_amax_many([c], [7.5])
    i = int(round(amax / 7.5 * 2048)) - 128
    _, ref = S.mse_errors(c, 7.5)
    assert ref[i] <= ref.min() * (1 + 1e-10)
    assert err[0, i] == err[0].min() and not (err[0, :i] <= err[0, i] * (1 + 1e-12)).any()


def test_compute_all_special_tensors_take_the_per_tensor_path():
    counts, maxima = _random_histograms(4, 4)
    c = {f"t{i}": x for i, x in enumerate(counts)}
    m = {f"t{i}": v for i, v in enumerate(maxima)}
    c["zero"], m["zero"] = np.zeros(2048, dtype=np.int64), 0.0
    c["empty"], m["empty"] = np.zeros(2048, dtype=np.int64), 3.0
    big = np.zeros(2048, dtype=np.int64)
    big[5], big[2000] = 10**12, 7  # too large for the exact int64 sums
    c["big"], m["big"] = big, 2.0
    assert not search.mse_fits(int(big.sum()), 2048)
    for method in ("mse", "entropy"):
        got = M.compute_all(method, m, c)
        assert got == {n: M.compute_amax(method, c[n], m[n]) for n in m}
    assert list(M.compute_all("mse", m, c)) == list(m)


def test_level_sums_identical_on_every_path(monkeypatch):
    """The compiled kernel and the numpy gather give the same int64 sums."""
    rng = np.random.default_rng(5)
    starts = np.sort(rng.integers(0, 2049, (50, 127)), axis=1)
    weights = 2 * np.arange(1, 128) - 1
    p1 = np.cumsum(rng.integers(0, 10**9, (2049, 7)), axis=0)
    p0 = np.cumsum(rng.integers(0, 10**6, (2049, 7)), axis=0)
    use_kernels(monkeypatch, "numpy")
    slow = kernels.level_sums(starts, weights, p1, p0)
    assert np.array_equal(slow[0][3], p1[starts[3]].sum(axis=0))
    assert np.array_equal(slow[1][3], weights @ p0[starts[3]])
    if not use_kernels(monkeypatch, "compiled"):
        pytest.skip("the compiled kernels were not built in this install")
    fast = kernels.level_sums(starts, weights, p1, p0)
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])
