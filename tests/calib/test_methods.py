"""The methods registry (trtq.calib.methods): a method added there alone is one the whole tool
knows: the --method choices, the passes it takes, the cache header, --from-stats and the report."""

import json

import numpy as np
import pytest

from trtq.calib import methods
from trtq.calib.cache import read_cache
from trtq.calib.stats import load_stats


def half_range(counts, max_value: float, percentile: float) -> float:
    """A toy method: half of the histogram's range."""
    return max_value / 2


@pytest.fixture
def toy_method():
    methods.register(
        methods.Method("half-range", half_range, histogram=True, passes=2, algorithm="EntropyCalibration2")
    )
    yield "half-range"
    methods.METHODS.unregister("half-range")


def test_the_registry_holds_the_four_methods_in_order():
    assert methods.METHODS.names() == ("max", "entropy", "percentile", "mse")
    assert [m.passes for m in methods.METHODS.rows()] == [1, 2, 1, 1]
    assert [m.histogram for m in methods.METHODS.rows()] == [False, True, True, True]
    with pytest.raises(ValueError, match="passes"):
        methods.register(methods.Method("bad", half_range, histogram=False, passes=2, algorithm="MinMaxCalibration"))
    assert "bad" not in methods.METHODS.names()


def test_a_registered_method_calibrates_end_to_end(trtq, sample_config, tmp_path, toy_method):
    cache, stats = tmp_path / "toy.cache", tmp_path / "toy.npz"
    r = trtq(
        [
            "calibrate",
            "-c",
            sample_config,
            "--limit",
            "8",
            "--method",
            toy_method,
            "-o",
            cache,
            "--save-stats",
            stats,
            "--json",
        ]
    )
    assert r.code == 0, r
    assert json.loads(r.out)["method"] == toy_method
    table, st = read_cache(cache), load_stats(stats)
    assert table.algorithm == "EntropyCalibration2"
    assert st.tops is None  # two passes: histograms over [0, max], the range the method halves
    for name, amax in table.amax.items():
        assert amax == pytest.approx(max(st.maxima[name] / 2, methods.MIN_AMAX), rel=1e-6), name
    prov = json.loads((tmp_path / "toy.cache.json").read_text())
    assert prov["method"]["name"] == toy_method
    assert "histograms" not in prov["collection"]  # not the one-pass power-of-two histograms

    again = tmp_path / "again.cache"
    r = trtq(["calibrate", "-c", sample_config, "--from-stats", stats, "--method", toy_method, "-o", again])
    assert r.code == 0, r
    assert again.read_bytes() == cache.read_bytes()

    r = trtq(["report", "--cache", cache, "--stats", stats, "-o", tmp_path / "r.html", "--json"])
    assert r.code == 0, r
    row = next(t for t in json.loads(r.out)["tensors"] if t["name"] in st.maxima and st.maxima[t["name"]] > 0)
    assert row["ranges"][toy_method] == pytest.approx(st.maxima[row["name"]] / 2)
    page = (tmp_path / "r.html").read_text()
    assert '"name":"half-range"' in page and "mse / half-range: the range that method picks" in page


def test_a_registered_method_is_a_config_and_cli_choice(trtq, sample_config, tmp_path, toy_method):
    r = trtq(["calibrate", "--help"])
    assert toy_method in r.out
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        sample_config.read_text()
        .replace("method: mse", f"method: {toy_method}")
        .replace("../", str(sample_config.parent.parent) + "/")
    )
    out = tmp_path / "c.cache"
    r = trtq(["calibrate", "-c", cfg, "--limit", "8", "-o", out])
    assert r.code == 0 and "with half-range" in r.out, r
    methods.METHODS.unregister(toy_method)
    r = trtq(["calibrate", "-c", cfg, "--limit", "8", "-o", tmp_path / "d.cache"])
    assert r.code == 2 and "config key 'calibrate.method' must be one of" in r.err


def test_compute_all_runs_a_methods_search_and_its_rule_alike():
    """A row's ``search`` (every tensor at once) must give its per-tensor rule's amax."""
    rng = np.random.default_rng(3)
    counts = {f"t{i}": rng.integers(0, 50, 2048).astype(np.int64) for i in range(4)}
    maxima = {n: float(1 + i) for i, n in enumerate(counts)}
    for name in ("mse", "entropy"):
        assert methods.compute_all(name, maxima, counts) == {
            n: methods.compute_amax(name, counts[n], maxima[n]) for n in counts
        }
