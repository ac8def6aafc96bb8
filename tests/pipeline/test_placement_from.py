"""quantize / build --placement-from: the placement a `build --tune-placement` search kept, read from
its engine metadata and applied, so the tuned Q/DQ file is written again without searching."""

import json

import numpy as np
import onnx
import pytest

from tests.quantize.conftest import activation_amax, attention_model, random_feeds
from trtq.calib.cache import CalibrationTable, write_cache
from trtq.trt.metadata import FORMAT

CHOSEN = {"precision": "int8", "placement": "standard", "left_float": ["proj_q", "proj_o"], "attention": "int8"}


@pytest.fixture
def files(tmp_path):
    """The attention model, its cache and the metadata of an engine whose search kept CHOSEN, in
    the three forms --placement-from reads (plan + JSON beside it, the JSON, build --json)."""
    model = attention_model(np.random.default_rng(4))
    onnx.save(model, tmp_path / "m.onnx")
    amax = activation_amax(model, [random_feeds(model)])
    write_cache(tmp_path / "m.cache", CalibrationTable("10.3.0", "EntropyCalibration2", amax), "10.3.0")
    meta = {"format": FORMAT, "tensorrt_version": "10.3.0", "tuning": {"chosen": dict(CHOSEN), "candidates": []}}
    (tmp_path / "t.plan").write_bytes(b"\x00not json: an engine")
    (tmp_path / "t.plan.json").write_text(json.dumps(meta))
    (tmp_path / "build.json").write_text(json.dumps({"plan": "t.plan", "seconds": 1.0, "metadata": meta}))
    return tmp_path


def _quantize(trtq, files, *flags, out="q.onnx"):
    return trtq(["quantize", "--model", files / "m.onnx", "--cache", files / "m.cache", "-o", files / out, *flags])


def _float_matmuls(path):
    """MatMul nodes neither of whose inputs comes from a DequantizeLinear."""
    graph = onnx.load(path).graph
    dq = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    return sorted(n.name for n in graph.node if n.op_type == "MatMul" and not any(i in dq for i in n.input))


@pytest.mark.parametrize("source", ["t.plan", "t.plan.json", "build.json"])
def test_same_file_as_the_settings_it_names(trtq, files, source):
    r = _quantize(trtq, files, "--placement-from", files / source)
    assert r.code == 0, r
    flags = ["--placement", "standard", "--attention", "int8", "--exclude", "proj_q", "--exclude", "proj_o"]
    assert _quantize(trtq, files, *flags, out="by_hand.onnx").code == 0
    assert (files / "q.onnx").read_bytes() == (files / "by_hand.onnx").read_bytes()
    assert _float_matmuls(files / "q.onnx") == ["proj_o", "proj_q"]  # scores / context int8 as the search kept


def test_config_key_is_relative_to_the_config_and_adds_to_exclude(trtq, files):
    (files / "c.yaml").write_text("quantize:\n  placement_from: t.plan.json\n  exclude: ['^proj_k$']\n")
    r = _quantize(trtq, files, "-c", files / "c.yaml")
    assert r.code == 0, r
    assert _float_matmuls(files / "q.onnx") == ["proj_k", "proj_o", "proj_q"]


def _meta(files, **chosen):
    meta = json.loads((files / "t.plan.json").read_text())
    meta["tuning"]["chosen"].update(chosen)
    return meta


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("absent.plan", None, "does not exist"),
        ("bare.plan", b"\x00engine", "has no bare.plan.json beside it"),
        ("broken.json", b"{not json", "cannot read"),
        ("other.json", {"format": "something else"}, "is not trtq engine metadata"),
        ("untuned.json", {"format": FORMAT, "precision": "int8"}, "records no placement search"),
        ("fp16.json", "precision=fp16", "there is no INT8 placement to apply"),
        ("bad.json", "placement=diagonal", "malformed tuning.chosen"),
        ("foreign.json", "left_float=/model.2/m.0/Add", "tuned on another model"),
    ],
)
def test_bad_file_is_refused_and_nothing_written(trtq, files, name, content, message):
    path = files / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif isinstance(content, str):
        key, value = content.split("=")
        path.write_text(json.dumps(_meta(files, **{key: [value] if key == "left_float" else value})))
    r = _quantize(trtq, files, "--placement-from", path)
    assert r.code == 3, r
    assert message in r.err and "Traceback" not in r.err, r.err
    assert len([line for line in r.err.splitlines() if line.startswith("trtq: error")]) == 1
    assert not (files / "q.onnx").exists()


def test_build_refuses_it_with_a_new_search(trtq, files):
    np.save(files / "x.npy", random_feeds(onnx.load(files / "m.onnx"), batch=4)["x"])
    r = trtq(
        ["build", "--model", files / "m.onnx", "--cache", files / "m.cache", "--placement-from", files / "t.plan"]
        + ["--tune-placement", "--data", files / "x.npy", "-o", files / "e.plan"]
    )
    assert r.code == 2 and "--tune-placement searches again" in r.err, r
    assert not (files / "e.plan").exists()


def test_options_unchanged_without_a_file():
    from trtq.config import QuantizeOptions
    from trtq.pipeline.placement_from import with_tuned_placement

    options = QuantizeOptions(exclude=("^a$",))
    assert with_tuned_placement(options, attention_model(np.random.default_rng(0))) is options


def test_a_node_named_like_an_op_type_is_the_only_one_left_float(trtq, files):
    """`--exclude MatMul` would keep every MatMul float; the search's node "MatMul" is one node."""
    model = onnx.load(files / "m.onnx")
    (node,) = [n for n in model.graph.node if n.name == "proj_o"]
    node.name = "MatMul"
    onnx.save(model, files / "m.onnx")
    (files / "named.json").write_text(json.dumps(_meta(files, left_float=["MatMul"])))
    r = _quantize(trtq, files, "--placement-from", files / "named.json")
    assert r.code == 0, r
    assert _float_matmuls(files / "q.onnx") == ["MatMul"]
