"""``calibrate --tensors qdq``: only the activations trtq quantize places Q/DQ on, on the bundled
real model; checked against the Q/DQ model a full cache gives (an independent reading of its
QuantizeLinear nodes), and refused where it cannot serve (implicit builds, TensorRT's backend)."""

import json

import onnx
import pytest

from tests.conftest import SAMPLE_IMAGES, SAMPLE_MODEL
from trtq.calib.cache import read_cache


def _qdq_activation_inputs(path) -> set:
    m = onnx.load(str(path))
    static = {i.name for i in m.graph.initializer} | {
        o for n in m.graph.node if n.op_type == "Constant" for o in n.output
    }
    return {n.input[0] for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in static}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    from trtq.cli import main

    root = tmp_path_factory.mktemp("qdq_tensors")
    out = {}
    for name, extra in (("full", []), ("qdq", ["--tensors", "qdq"]), ("listed", ["--tensors", "x"])):
        path = root / f"{name}.cache"
        try:
            main(
                [
                    "calibrate",
                    "--model",
                    str(SAMPLE_MODEL),
                    "--data",
                    str(SAMPLE_IMAGES),
                    "--preprocess",
                    "imagenet",
                    "--limit",
                    "16",
                    "-o",
                    str(path),
                    "-q",
                    *extra,
                ]
            )
        except SystemExit as e:
            assert e.code in (0, None)
        out[name] = path
    return root, out


def test_qdq_cache_holds_what_quantize_reads(trtq, caches, sample_model):
    """What every placement reads: a --tensors qdq cache serves quantize --placement standard, fused
    and shared as the full cache does (it held the standard placement's tensors only, so the
    others left nodes float for want of an amax)."""
    root, c = caches
    full, qdq = read_cache(c["full"]).amax, read_cache(c["qdq"]).amax
    wanted, quantized = set(), {}
    for placement in ("standard", "fused", "shared"):
        out = root / f"full.{placement}.qdq.onnx"
        r = trtq(
            ["quantize", "--model", sample_model, "--cache", c["full"], "-o", out, "--json", "--placement", placement]
        )
        assert r.code == 0, r
        wanted |= _qdq_activation_inputs(out)
        quantized[placement] = json.loads(r.out)["quantized"]
    assert set(qdq) == wanted and 0 < len(qdq) < len(full) / 2
    assert len(quantized["shared"]) > len(quantized["standard"])  # the sample has pooling the shared one reads
    for t in qdq:
        assert qdq[t] == pytest.approx(full[t], rel=1e-6), t
    for placement in ("standard", "fused", "shared"):
        out = root / f"qdq.{placement}.qdq.onnx"
        r2 = trtq(
            ["quantize", "--model", sample_model, "--cache", c["qdq"], "-o", out, "--json", "--placement", placement]
        )
        assert r2.code == 0, r2
        assert json.loads(r2.out)["quantized"] == quantized[placement], placement
        assert _qdq_activation_inputs(out) == _qdq_activation_inputs(root / f"full.{placement}.qdq.onnx")
    prov = {k: json.loads((c[k].parent / f"{c[k].name}.json").read_text())["collection"]["tensors"] for k in c}
    assert prov == {"full": "all", "qdq": "qdq", "listed": "listed"}


def test_qdq_cache_is_refused_where_it_cannot_serve(trtq, caches, sample_model, sample_images, tmp_path):
    root, c = caches
    plan = tmp_path / "m.plan"
    r = trtq(["build", "--model", sample_model, "--cache", c["qdq"], "--mode", "implicit", "-o", plan])
    assert r.code == 2 and "--tensors qdq" in r.err and "drop --mode implicit" in r.err and not plan.exists()
    base = ["calibrate", "--model", sample_model, "--data", sample_images, "--preprocess", "imagenet", "--limit", "4"]
    r = trtq(base + ["--tensors", "qdq,x", "-o", tmp_path / "a.cache"])
    assert r.code == 2 and "stands alone" in r.err
    r = trtq(base + ["--tensors", "qdq", "--backend", "tensorrt", "--method", "entropy", "-o", tmp_path / "b.cache"])
    assert r.code == 2 and "onnxruntime backend" in r.err
    assert not list(tmp_path.glob("*.cache"))


def test_inspect_cache_names_the_qdq_set(trtq, caches, sample_model):
    root, c = caches
    r = trtq(["inspect-cache", c["qdq"], "--model", sample_model, "--json"])
    assert r.code == 0, r
    check = json.loads(r.out)["model_check"]
    assert check["verdict"] == "qdq-set" and "--tensors qdq" in check["message"]
    assert check["covered"] == len(read_cache(c["qdq"]).amax)
    r = trtq(["inspect-cache", c["listed"], "--model", sample_model, "--json"])
    assert json.loads(r.out)["model_check"]["verdict"] == "incomplete"  # a hand-picked list stays a gap


def test_a_cache_for_tensorrt_11_calibrates_the_qdq_set_unless_told_all(
    trtq, caches, sample_model, sample_images, tmp_path
):
    """TensorRT 11 has no implicit INT8: its cache is only read through Q/DQ placement."""
    root, c = caches
    base = ["calibrate", "--model", sample_model, "--data", sample_images, "--preprocess", "imagenet", "--limit", "16"]
    for extra, expected, names in (
        ([], "qdq", set(read_cache(c["qdq"]).amax)),
        (["--tensors", "all"], "all", set(read_cache(c["full"]).amax)),
    ):
        out = tmp_path / f"t11-{expected}.cache"
        r = trtq(base + ["--trt-version", "11.0.0", "-o", out, *extra])
        assert r.code == 0, r
        assert set(read_cache(out).amax) == names
        assert json.loads((tmp_path / f"{out.name}.json").read_text())["collection"]["tensors"] == expected


def test_tune_guided_builds_no_implicit_engine_from_a_qdq_cache(caches):
    """build --tune-placement's guided candidate reads TensorRT's implicit engine: from a --tensors
    qdq cache that engine would run every unranged tensor float, so it is not built (decided before
    TensorRT is touched; the tuner stand-in has no TensorRT)."""
    from types import SimpleNamespace

    from trtq.pipeline.build import qdq_only_cache
    from trtq.pipeline.tune_candidates import Candidate
    from trtq.pipeline.tune_guided import build_implicit

    root, c = caches
    assert qdq_only_cache(c["qdq"]) and not qdq_only_cache(c["full"]) and not qdq_only_cache(None)
    engine = build_implicit(SimpleNamespace(inputs=SimpleNamespace(cache_path=c["qdq"])), Candidate("shared"))
    assert engine.plan is None and "--tensors qdq" in engine.verdict
