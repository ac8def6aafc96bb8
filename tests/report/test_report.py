"""``trtq report``: the data (``--json``) checked against independent computations and real runs;
refusals of foreign or malformed inputs. The browser test is in test_report_browser.py."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.calib.test_calibrate import _activations, _mlp
from trtq.calib.cache import read_cache

METHODS = ("max", "entropy", "percentile", "mse")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real calibration (mse, with --save-stats) of the small MLP on heavy-tailed data."""
    from trtq.cli import main

    root = tmp_path_factory.mktemp("report")
    model = root / "mlp.onnx"
    weights = _mlp(model)
    x = np.random.default_rng(3).standard_t(2, size=(300, 16)).astype(np.float32)
    np.save(root / "x.npy", x)
    cache, stats = root / "c.cache", root / "s.npz"
    for args in (
        [
            "calibrate",
            "-m",
            model,
            "--data",
            root / "x.npy",
            "--method",
            "mse",
            "-o",
            cache,
            "--save-stats",
            stats,
            "-q",
        ],
    ):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            assert e.code in (0, None)
    return root, model, x, weights, cache, stats


def _ok(r):
    assert r.code == 0, r
    return r


def test_json_ranges_are_the_caches_each_method_writes(trtq, run, tmp_path):
    root, model, x, weights, cache, stats = run
    rep = json.loads(_ok(trtq(["report", "--cache", cache, "--stats", stats, "-o", tmp_path / "r.html", "--json"])).out)
    rows = {r["name"]: r for r in rep["tensors"]}
    assert list(rows) == list(read_cache(cache).amax)
    # mse's one-pass (power-of-two) histograms: every method but entropy, which is TensorRT's over [0, max]
    assert all("entropy" not in r["ranges"] for r in rows.values())
    for m in ("max", "percentile", "mse"):
        out = tmp_path / f"{m}.cache"
        _ok(trtq(["calibrate", "--from-stats", stats, "--method", m, "-o", out]))
        for name, a in read_cache(out).amax.items():
            assert rows[name]["ranges"][m] == pytest.approx(a, rel=1e-6), (m, name)  # the cache rounds to f32
    # entropy's two-pass histograms over [0, max]: all four
    two = tmp_path / "two.npz"
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                model,
                "--data",
                root / "x.npy",
                "--method",
                "entropy",
                "-o",
                tmp_path / "e.cache",
                "--save-stats",
                two,
            ]
        )
    )
    rep2 = json.loads(
        _ok(trtq(["report", "--cache", tmp_path / "e.cache", "--stats", two, "-o", tmp_path / "r2.html", "--json"])).out
    )
    rows2 = {r["name"]: r for r in rep2["tensors"]}
    for m in METHODS:
        out = tmp_path / f"two-{m}.cache"
        _ok(trtq(["calibrate", "--from-stats", two, "--method", m, "-o", out]))
        for name, a in read_cache(out).amax.items():
            assert rows2[name]["ranges"][m] == pytest.approx(a, rel=1e-6), (m, name)
    for name, a in read_cache(cache).amax.items():
        assert rows[name]["amax"] == a
        assert rows[name]["step"] == pytest.approx(a / 127)
    assert rep["provenance"]["method"] == "mse"
    assert rep["provenance"]["histograms"].startswith("one pass, power-of-two ranges; ")
    assert rep2["provenance"]["histograms"] == "two passes, [0, max] ranges"  # entropy's, from its stats file
    assert "histograms: one pass" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_clipped_fraction_and_histogram_match_the_activations(trtq, run, tmp_path):
    """Recompute the activations with numpy: the histogram holds every value, and the clipped
    count is the true count of |x| > amax (exact where the histogram decides, else bracketed)."""
    root, model, x, weights, cache, stats = run
    rep = json.loads(_ok(trtq(["report", "--cache", cache, "--stats", stats, "-o", tmp_path / "r.html", "--json"])).out)
    acts = _activations(x, weights)
    checked = 0
    for r in rep["tensors"]:
        a = np.abs(acts[r["name"]].astype(np.float64))
        h = r["histogram"]
        assert sum(h["counts"]) == a.size == r["values"]
        assert r["max"] == pytest.approx(float(a.max()), rel=1e-6)
        true = int((a > r["amax"]).sum())
        if r["amax"] >= a.max() * (1 - 1e-6):  # set at the max (float32 scale): clips nothing
            assert r["clipped_values"] == 0, r["name"]
        elif r["clipped_exact"]:
            assert r["clipped_values"] == true, r["name"]
        else:
            assert r["clipped_min"] * a.size <= true <= r["clipped_values"], r["name"]
        assert r["clipped"] == r["clipped_values"] / a.size
        checked += r["clipped"] > 0
    assert checked >= 2  # the heavy tail makes mse clip: the check above is not about zeros


def _convnet(path: Path) -> None:
    """x[N,16,8,8] -> Conv -> Relu -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> y[N,5]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = {
        "w1": rng.normal(0, 0.2, (16, 16, 3, 3)),
        "b1": rng.normal(0, 0.1, 16),
        "w2": rng.normal(0, 0.1, (32, 16, 3, 3)),
        "b2": rng.normal(0, 0.1, 32),
        "w3": rng.normal(0, 0.3, (5, 32)),
        "b3": rng.normal(0, 0.1, 5),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_html_is_self_contained_and_names_the_runtimes(trtq, tmp_path):
    model = tmp_path / "convnet.onnx"
    _convnet(model)
    xs = tmp_path / "x.npy"
    np.save(xs, np.random.default_rng(1).standard_t(3, size=(32, 16, 8, 8)).astype(np.float32))
    cache, stats = tmp_path / "c.cache", tmp_path / "s.npz"
    _ok(trtq(["calibrate", "-m", model, "--data", xs, "-o", cache, "--save-stats", stats]))
    qdq = tmp_path / "m.qdq.onnx"
    q = _ok(trtq(["quantize", "-m", model, "--cache", cache, "-o", qdq, "--exclude", "fc", "--json"]))
    (tmp_path / "q.json").write_text(q.out)
    c = trtq(
        ["compare", "--reference", model, "--candidate", qdq, "--data", xs, "--per-layer", "--cache", cache, "--json"]
    )
    assert c.code == 0, c
    cj = json.loads(c.out)
    cj["outputs"][0]["task_top1"] = 0.8125  # a metric a later compare may add: shown as a column too
    (tmp_path / "c.json").write_text(json.dumps(cj))
    bench = [
        {
            "plan": "m.int8.plan",
            "precision": "int8",
            "batch": 8,
            "median_ms": 0.5,
            "p99_ms": 0.6,
            "samples_per_s": 16000.0,
            "tensorrt_version": "10.3.0",
            "gpu_name": "NVIDIA H100",
        },
        {
            "plan": "m.fp16.plan",
            "precision": "fp16",
            "batch": 8,
            "median_ms": 1.0,
            "p99_ms": 1.2,
            "samples_per_s": 8000.0,
            "tensorrt_version": "10.3.0",
            "gpu_name": "NVIDIA H100",
        },
    ]
    (tmp_path / "b.json").write_text(json.dumps(bench))
    out = tmp_path / "report.html"
    r = _ok(
        trtq(
            [
                "report",
                "--cache",
                cache,
                "--stats",
                stats,
                "--compare",
                tmp_path / "c.json",
                "--quantize",
                tmp_path / "q.json",
                "--bench",
                tmp_path / "b.json",
                "-o",
                out,
                "--json",
            ]
        )
    )
    data = json.loads(r.out)
    assert data["accuracy"]["runtime"] == cj["runtime"] and "Q/DQ semantics" in cj["runtime"]  # compare's own words
    assert data["latency"]["runtime"] == "TensorRT engine (TensorRT 10.3.0) on NVIDIA H100"
    assert [p["speedup_vs_first"] for p in data["latency"]["plans"]] == [1.0, 0.5]
    assert "fc" in {f["node"] for f in data["float_layers"]}
    assert data["layers"]["rows"] and all(row["node"] for row in data["layers"]["rows"])
    page = out.read_text(encoding="utf-8")
    assert data["accuracy"]["outputs"][0]["task_top1"] == 0.8125
    page = out.read_text(encoding="utf-8")
    assert "<th>task top1</th>" in page and "<td>0.8125</td>" in page
    for needle in (
        "id=histogram",
        "id=layers",
        "id=float",
        "id=accuracy",
        "id=latency",
        ">fc<",
        "TensorRT engine (TensorRT 10.3.0)",
        "Q/DQ semantics (what TensorRT computes",
    ):
        assert needle in page, needle
    # nothing to fetch: no external URL in src/href, no CDN
    low = page.lower()
    assert 'src="http' not in low and 'href="http' not in low and "@import" not in low and "cdn" not in low
    embedded = page.split("id=trtq-data>", 1)[1].split("</script>", 1)[0]
    assert json.loads(embedded.replace("<\\/", "</")) == {k: v for k, v in data.items() if k != "report"}


def _refused(r, code, *words):
    assert r.code == code, r
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trtq: error: "), r.err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_refuses_foreign_stats_and_malformed_inputs(trtq, run, tmp_path):
    root, model, x, weights, cache, stats = run
    other = tmp_path / "other.onnx"
    _mlp(other, seed=9)
    _ok(
        trtq(
            [
                "calibrate",
                "-m",
                other,
                "--data",
                root / "x.npy",
                "-o",
                tmp_path / "o.cache",
                "--save-stats",
                tmp_path / "o.npz",
            ]
        )
    )
    out = tmp_path / "r.html"
    _refused(trtq(["report", "--cache", cache, "--stats", tmp_path / "o.npz", "-o", out]), 3, "another model")
    _refused(trtq(["report", "--cache", tmp_path / "none.cache", "-o", out]), 3, "not found")
    (tmp_path / "bad.json").write_text("{not json")
    _refused(trtq(["report", "--cache", cache, "--compare", tmp_path / "bad.json", "-o", out]), 3, "not JSON")
    (tmp_path / "list.json").write_text("[1, 2]")
    _refused(trtq(["report", "--cache", cache, "--bench", tmp_path / "list.json", "-o", out]), 3, "trtq bench")
    _refused(trtq(["report", "--cache", cache, "--quantize", tmp_path / "list.json", "-o", out]), 3, "trtq quantize")
    _refused(trtq(["report", "--cache", cache, "--stats", tmp_path / "bad.json", "-o", out]), 3, "statistics")
    assert not out.exists()


def test_cache_alone_gives_a_table_without_histograms(trtq, run, tmp_path):
    root, model, x, weights, cache, stats = run
    data = json.loads(_ok(trtq(["report", "--cache", cache, "-o", tmp_path / "r.html", "--json"])).out)
    assert all("histogram" not in r for r in data["tensors"])
    assert [r["amax"] for r in data["tensors"]] == list(read_cache(cache).amax.values())
    assert Path(tmp_path / "r.html").is_file()
