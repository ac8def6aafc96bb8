"""``trtq report``'s clipping: counted only for the tensors the Q/DQ model quantizes, exactly from
the saved histograms, and equal to a count made independently on the activations (ONNX Runtime over
the calibration data, numpy's ``|x| > amax``); the sensitivity chart's order and metric."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import SAMPLE_CONFIG
from trtq.calib.cache import read_cache
from trtq.report.clipping import REL_TOL, clip_count


def _ok(r):
    assert r.code == 0, r
    return r


# ------------------------------------------------------------------ the rule, on known values


def _hist(values: np.ndarray, top: float, bins: int) -> np.ndarray:
    """The histogram as trtq builds it: bin floor(|x| / w), w = top / bins (top a power of two here,
    so the division is exact)."""
    k = np.floor(np.abs(values) / (top / bins)).astype(np.int64)
    return np.bincount(np.minimum(k, bins - 1), minlength=bins)


def test_a_range_on_an_edge_or_at_the_max_is_counted_exactly():
    x = np.random.default_rng(0).standard_t(3, 200_000).astype(np.float32)
    m, top, bins = float(np.abs(x).max()), 128.0, 2048
    assert m < top
    c = _hist(x, top, bins)
    w = top / bins
    for j in (5, 40, 200, int(m / w)):  # edges, the last one just below the max
        a = j * w
        got = clip_count(c, top, m, a)
        assert got.exact and got.at_most == int((np.abs(x) > a).sum()), j
        # the same edge through a float32 scale (as a cache stores it): still that edge
        a32 = float(np.float32(a / 127)) * 127
        assert clip_count(c, top, m, a32).at_most == got.at_most
    # at the max, and at the max through a float32 scale a hair below it: nothing clips
    for a in (m, float(np.float32(m / 127)) * 127, m * (1 - 1e-7)):
        assert clip_count(c, top, m, a).at_most == 0
    # just below the max, inside its bin: the max certainly clips; the rest of the bin may
    a = m * 0.99999
    got = clip_count(c, top, m, a)
    assert got.at_least <= int((np.abs(x) > a).sum()) <= got.at_most


def test_a_range_inside_a_bin_counts_the_whole_bin_and_brackets_the_truth():
    x = np.random.default_rng(1).normal(0, 1, 100_000).astype(np.float32)
    m, top, bins = float(np.abs(x).max()), 8.0, 256
    c = _hist(x, top, bins)
    w = top / bins
    for j in (10, 40, 90):
        a = (j + 0.5) * w  # entropy's (i + 0.5) * width
        got = clip_count(c, top, m, a)
        true = int((np.abs(x) > a).sum())
        assert not got.exact
        assert got.at_least == int(c[j + 1 :].sum()) <= true <= got.at_most == int(c[j:].sum())
    assert clip_count(np.zeros(16, np.int64), 1.0, 0.0, 0.5).at_most == 0  # nothing counted


# ------------------------------------------------------------------ the sample, end to end


def _activations(model_path: Path, names, batches) -> dict:
    """Every named tensor of the FP32 model on ``batches``, by ONNX Runtime (graph outputs added)."""
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    inputs = {i.name for i in model.graph.input}
    have = {o.name for o in model.graph.output}
    for n in names:
        if n not in inputs and n not in have:
            model.graph.output.append(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = [n for n in names if n not in inputs]
    out = {n: [] for n in names}
    for b in batches:
        feeds = {k: v for k, v in b.arrays.items()}
        got = dict(zip(wanted, sess.run(wanted, feeds)))
        for n in names:
            v = feeds[n] if n in inputs else got[n]
            out[n].append(np.asarray(v[: b.valid], dtype=np.float32))
    return {n: np.concatenate(v) for n, v in out.items()}


def _quantized_by_the_model(path: Path) -> set:
    """Activation tensors a QuantizeLinear reads, from the ONNX graph itself."""
    g = onnx.load(str(path)).graph
    consts = {i.name for i in g.initializer}
    dq_out = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.input[0] for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] not in consts | dq_out}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The sample calibrated (mse, every element histogrammed), quantized, reported with --json."""
    from trtq.cli import main

    root = tmp_path_factory.mktemp("clip")
    cache, stats, qdq = root / "c.cache", root / "s.npz", root / "m.qdq.onnx"

    def run(args, out=None):
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                assert e.code in (0, None), args
        if out is not None:
            out.write_text(buf.getvalue())

    run(["calibrate", "-c", SAMPLE_CONFIG, "-o", cache, "--save-stats", stats, "--hist-elements", "0", "-q"])
    run(["quantize", "-c", SAMPLE_CONFIG, "--cache", cache, "-o", qdq, "--json", "-q"], root / "q.json")
    run(["report", "--cache", cache, "--stats", stats, "--quantize", root / "q.json", "-o", root / "r.html",
         "--json", "-q"], root / "r.json")  # fmt: skip
    return root, json.loads((root / "r.json").read_text())


def test_clip_counts_agree_with_the_activations(sample):
    from trtq.config import load_config
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    root, rep = sample
    cfg = load_config(SAMPLE_CONFIG)
    rows = {r["name"]: r for r in rep["tensors"]}
    acts = _activations(Path(cfg.model), list(rows), Batcher(cfg.data, input_specs(load_model(cfg.model))))
    quantized = _quantized_by_the_model(root / "m.qdq.onnx")
    assert quantized and quantized < set(rows)
    clipping = []
    for name, r in rows.items():
        a = np.abs(acts[name].astype(np.float64))
        assert r["values"] == a.size  # --hist-elements 0: the histogram holds every value
        assert r["quantized"] == (name in quantized)
        true = int((a > r["clip_amax"]).sum())
        if r["clip_amax"] >= a.max() * (1 - REL_TOL):
            # a range set at the max, moved below it by the cache's float32 scale: clips nothing
            assert r["clipped_values"] == 0 and r["clipped_exact"], name
        elif r["clipped_exact"]:
            assert r["clipped_values"] == true, name
        else:
            assert r["clipped_min"] * a.size <= true <= r["clipped_values"], name
        assert r["clipped_by"]["max"] == 0 and r["clipped_by_exact"]["max"]  # max clips nothing
        if name in quantized and true / a.size > rep["summary"]["threshold"]:
            clipping.append(name)
    s = rep["summary"]
    assert s["quantized_only"] and s["quantized"] == len(quantized)
    assert sorted(s["clip_list"]) == sorted(clipping) and clipping  # only quantized tensors, every one
    assert set(s["clip_list"]) <= quantized
    assert s["other_range"] == []  # the Q/DQ model applies the cache's ranges


def test_a_quantize_json_of_another_cache_is_named(trtq, sample, tmp_path):
    root, rep = sample
    other, page = tmp_path / "p.cache", tmp_path / "r.html"
    _ok(trtq(["calibrate", "--from-stats", root / "s.npz", "--method", "percentile", "-o", other]))
    args = ["report", "--cache", other, "--stats", root / "s.npz", "--quantize", root / "q.json", "-o", page, "--json"]
    data = json.loads(_ok(trtq(args)).out)
    rows = {r["name"]: r for r in data["tensors"]}
    moved = sorted(n for n, r in rows.items() if r["quantized"] and abs(r["clip_amax"] / r["amax"] - 1) > 1e-6)
    assert moved and sorted(data["summary"]["other_range"]) == moved
    assert f"{len(moved)} of them are quantized with another range than the cache" in page.read_text(encoding="utf-8")


def test_without_quantize_the_list_covers_every_calibrated_tensor(trtq, sample, tmp_path):
    root, rep = sample
    page = tmp_path / "r.html"
    data = json.loads(
        _ok(trtq(["report", "--cache", root / "c.cache", "--stats", root / "s.npz", "-o", page, "--json"])).out
    )
    assert not data["summary"]["quantized_only"] and all(r["quantized"] is None for r in data["tensors"])
    clipped = {r["name"]: r["clipped"] for r in data["tensors"]}
    assert [clipped[n] for n in data["summary"]["clip_list"]] == sorted(
        (v for v in clipped.values() if v > data["summary"]["threshold"]), reverse=True
    )
    with_q = {r["name"]: r["clipped_values"] for r in rep["tensors"] if not r["quantized"]}
    # the tensors the Q/DQ model leaves alone now count too, at the cache's amax
    assert set(data["summary"]["clip_list"]) > set(rep["summary"]["clip_list"])
    assert any(n in with_q for n in data["summary"]["clip_list"])
    assert "covers every calibrated tensor" in page.read_text(encoding="utf-8")


def test_a_quantize_json_without_activations_reads_its_model(trtq, sample, tmp_path):
    root, rep = sample
    q = json.loads((root / "q.json").read_text())
    del q["activations"]
    (tmp_path / "q.json").write_text(json.dumps(q))  # "output" still names the Q/DQ model
    args = ["report", "--cache", root / "c.cache", "--stats", root / "s.npz", "-o", tmp_path / "r.html", "--json"]
    data = json.loads(_ok(trtq([*args, "--quantize", tmp_path / "q.json"])).out)
    assert data["summary"]["clip_list"] == rep["summary"]["clip_list"]
    q["output"] = str(tmp_path / "gone.onnx")
    (tmp_path / "q.json").write_text(json.dumps(q))
    r = _ok(trtq([*args, "--quantize", tmp_path / "q.json"]))
    assert not json.loads(r.out)["summary"]["quantized_only"] and "gone.onnx" in r.err


def test_the_page_shows_the_same_numbers(sample):
    root, rep = sample
    page = (root / "r.html").read_text(encoding="utf-8")
    s = rep["summary"]
    line = page.split("<p id=clip-summary>", 1)[1].split("</p>", 1)[0]
    assert f"<b class=warn>{s['clipping']}</b> of the {s['quantized']} tensors the Q/DQ model quantizes" in line
    assert ", ".join(s["most_clipped"]) in line
    embedded = page.split("id=trtq-data>", 1)[1].split("</script>", 1)[0]
    assert json.loads(embedded.replace("<\\/", "</")) == {k: v for k, v in rep.items() if k != "report"}


# ------------------------------------------------------------------ the sensitivity chart


def test_layers_are_sorted_by_the_metric_they_are_labelled_with(trtq, sample, tmp_path):
    root, _ = sample
    rows = [  # as compare writes them, in no particular order
        {"node": "a", "op_type": "Conv", "sqnr_db": 9.0, "task_metric": 0.90, "task_metric_name": "top-1 agreement"},
        {"node": "b", "op_type": "Conv", "sqnr_db": 30.0, "task_metric": 0.70, "task_metric_name": "top-1 agreement"},
        {"node": "c", "op_type": "Conv", "sqnr_db": 12.0, "task_metric": 0.70, "task_metric_name": "top-1 agreement"},
        {"node": "d", "op_type": "Conv", "sqnr_db": "inf", "task_metric": 1.0, "task_metric_name": "top-1 agreement"},
    ]
    compare = {"reference": "m.onnx", "candidate": "q.onnx", "samples": 8, "outputs": [], "per_layer": rows}
    (tmp_path / "c.json").write_text(json.dumps(compare))
    args = [
        "report",
        "--cache",
        root / "c.cache",
        "--compare",
        tmp_path / "c.json",
        "-o",
        tmp_path / "r.html",
        "--json",
    ]
    layers = json.loads(_ok(trtq(args)).out)["layers"]
    assert layers["metric"] == {"key": "task_metric", "name": "top-1 agreement", "then_key": "sqnr_db"}
    assert [r["node"] for r in layers["rows"]] == ["c", "b", "a", "d"]  # top-1 lowest first, then SQNR
    for r in rows:
        del r["task_metric"], r["task_metric_name"]
    (tmp_path / "c.json").write_text(json.dumps(compare))
    layers = json.loads(_ok(trtq(args)).out)["layers"]
    assert layers["metric"] == {"key": "sqnr_db", "name": "SQNR (dB)", "then_key": None}
    assert [r["node"] for r in layers["rows"]] == ["a", "c", "b", "d"]


def test_cache_rows_follow_the_cache(sample):
    root, rep = sample
    assert [r["name"] for r in rep["tensors"]] == list(read_cache(root / "c.cache").amax)
