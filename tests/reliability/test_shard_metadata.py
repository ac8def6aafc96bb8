"""Issue 29: shard metadata is bounded and validated, and every setting that shapes the statistics is
part of what shards must agree on before they merge.

Before: --shard 1/1e26 ran (shard 1 of 1e26 calibrated one sample) and merge-stats then built a set of
range(N); a shard file claiming N = 1e30 did the same; an index that is not a number was an internal
error; shards made with different --hist-elements merged into statistics that match neither run."""

import time

import pytest

pytest.importorskip("hypothesis", reason="the fuzz part needs hypothesis (dev extra)")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import one_line_error
from trtq.calib.stats import load_stats, save_stats


def _shards(trtq, kit, *extra_per_shard, n=2):
    paths = []
    for i in range(n):
        out = kit.root / f"h{i}.npz"
        extra = list(extra_per_shard[i]) if i < len(extra_per_shard) else []
        r = trtq(
            [
                "calibrate",
                "--model",
                kit.model,
                "--data",
                kit.data,
                "--shard",
                f"{i}/{n}",
                "--save-stats",
                out,
                "-q",
                *extra,
            ]
        )
        assert r.code == 0, r
        paths.append(out)
    return paths


def _forge(path, **shard):
    """Rewrite a shard file's meta (the file stays a valid statistics file otherwise)."""
    s = load_stats(path)
    meta = dict(s.meta)
    data = dict(meta.get("data") or {})
    if "samples" in shard:
        data["samples"] = shard.pop("samples")
    meta["data"] = data
    meta["shard"] = dict(meta["shard"], **shard)
    save_stats(path, s.maxima, s.counts, meta, s.zeros, s.tops)


def _refused(trtq, kit, args, code, *words):
    before = kit.snapshot()
    t0 = time.monotonic()
    r = trtq(args)
    assert r.code == code, r
    assert one_line_error(r), r.err
    for w in words:
        assert w in r.err, r.err
    assert time.monotonic() - t0 < 20  # refused, not allocated or looped over
    assert kit.snapshot() == before
    return r


def test_more_shards_than_samples_is_refused(trtq, kit):
    """6 samples: --shard 1/7 would leave shard 6 empty (shard 1 itself has a sample)."""
    _refused(
        trtq,
        kit,
        ["calibrate", "--model", kit.model, "--data", kit.data, "--shard", "1/7", "--save-stats", kit.root / "p.npz"],
        3,
        "7 shards but the data set has 6 samples",
    )


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("count", 10**30, "shard count 1000000000000000000000000000000"),
        ("count", "2", "shard count '2'"),
        ("count", True, "shard count True"),
        ("count", 0, "shard count 0"),
        ("index", "abc", "shard index 'abc'"),
        ("index", 1.0, "shard index 1.0"),
        ("index", -1, "shard index -1"),
        ("index", 5, "shard index 5, expected a whole number in 0..1"),
        ("pass", "bogus", "pass 'bogus'"),
        ("samples", "many", "data.samples 'many'"),
    ],
)
def test_a_forged_shard_entry_is_invalid_input(trtq, kit, field, value, words):
    h0, h1 = _shards(trtq, kit)
    _forge(h1, **{field: value})
    _refused(trtq, kit, ["merge-stats", h0, h1, "-o", kit.root / "m.npz"], 3, "is not a valid shard file", words)
    _refused(trtq, kit, ["calibrate", "--from-stats", h1, "-o", kit.root / "n.cache"], 3, "is not a valid shard file")


def test_a_huge_claimed_count_is_missing_shards_not_an_allocation(trtq, kit):
    """Both files claim 10**6 shards (the most a file may): two of them are missing shards, found in
    a few steps."""
    h0, h1 = _shards(trtq, kit)
    _forge(h0, count=10**6)
    _forge(h1, count=10**6)
    _refused(trtq, kit, ["merge-stats", h0, h1, "-o", kit.root / "m.npz"], 3, "missing shard(s) 2/1000000", "...")


def test_shards_with_other_hist_elements_do_not_merge(trtq, kit):
    h0, h1 = _shards(trtq, kit, ["--hist-elements", "64"], ["--hist-elements", "128"])
    _refused(
        trtq,
        kit,
        ["merge-stats", h0, h1, "-o", kit.root / "m.npz"],
        3,
        "other statistics settings",
        "hist_elements: 128 vs 64",
        "--hist-elements",
    )


def test_shards_with_the_same_settings_still_merge(trtq, kit):
    h0, h1 = _shards(trtq, kit, ["--hist-elements", "64"], ["--hist-elements", "64"])
    r = trtq(["merge-stats", h0, h1, "-o", kit.root / "m.npz"])
    assert r.code == 0, r
    assert load_stats(kit.root / "m.npz").meta["statistics"] == {"edges": "pow2", "num_bins": 2048, "hist_elements": 64}


@pytest.fixture(scope="module")
def shard_pair(tmp_path_factory):
    import numpy as np

    from tests.reliability.conftest import make_model
    from trtq.cli import main

    root = tmp_path_factory.mktemp("shards")
    make_model(root / "m.onnx")
    np.save(root / "x.npy", np.random.default_rng(1).normal(0, 1, (6, 3, 8, 8)).astype(np.float32))
    for i in range(2):
        try:
            main(
                [
                    "calibrate",
                    "--model",
                    str(root / "m.onnx"),
                    "--data",
                    str(root / "x.npy"),
                    "--shard",
                    f"{i}/2",
                    "--save-stats",
                    str(root / f"h{i}.npz"),
                    "-q",
                ]
            )
        except SystemExit as e:
            assert e.code in (0, None)
    return root


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**40), 10**40),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["count", "index", "pass", "ranges_sha256", "samples"]), scalars)
def test_any_shard_entry_merges_or_is_refused_in_one_line(trtq, shard_pair, field, value):
    import shutil
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    try:
        h0, h1 = folder / "h0.npz", folder / "h1.npz"
        shutil.copy(shard_pair / "h0.npz", h0)
        shutil.copy(shard_pair / "h1.npz", h1)
        try:
            _forge(h1, **{field: value})
        except ValueError:  # not JSON (nan): save_stats refuses to write it
            return
        out = folder / "m.npz"
        r = trtq(["merge-stats", h0, h1, "-o", out])
        assert r.code in (0, 3), (field, value, r)
        if r.code:
            assert one_line_error(r) and not out.exists(), (field, value, r.err)
    finally:
        shutil.rmtree(folder)
