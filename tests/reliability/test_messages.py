"""Defects 5, 6 and 8: providers, stdout, environment problems and the messages users see."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.reliability.conftest import child_env, one_line_error, run_child
from trtq.config import load_config

# ------------------------------------------------------------------------------------------------
# 5: providers and stdout
# ------------------------------------------------------------------------------------------------


def test_unknown_provider_is_refused_before_any_work(trtq, kit):
    out = kit.root / "n.cache"
    r = trtq(["calibrate", "--model", kit.model, "--data", kit.data, "-o", out, "--providers", "Bogus", "--json"])
    assert r.code == 2 and one_line_error(r), r
    assert "provider 'Bogus' is not available here" in r.err and "CPUExecutionProvider" in r.err
    assert json.loads(r.out)["exit_code"] == 2 and not out.exists()  # --json: the error as JSON


def test_only_the_result_reaches_stdout(kit):
    """ONNX Runtime prints its EP banner with print(); C code writes to fd 1: both go to stderr
    while a command runs, the result alone to stdout."""
    code = f"""
import os, onnxruntime as ort
from trtq.cli.process import stdout_guard as guard
guard.engage()
ort.InferenceSession({str(kit.model)!r}, providers=["Bogus"])   # prints its EP error banner
print("a library print")
os.write(1, b"a write to fd 1\\n")
guard.result.write('{{"result": 1}}\\n')
guard.restore()
print("after the command")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ['{"result": 1}', "after the command"]
    assert "EP Error" in p.stderr and "a library print" in p.stderr and "a write to fd 1" in p.stderr


def test_json_stdout_of_a_real_run_is_pure_json(kit):
    r = run_child(
        [
            "calibrate",
            "--model",
            kit.model,
            "--data",
            kit.data,
            "-o",
            kit.root / "n.cache",
            "--method",
            "max",
            "--json",
            "--providers",
            "CPUExecutionProvider",
        ]
    )
    assert r.code == 0, r
    assert json.loads(r.out)["providers"] == ["CPUExecutionProvider"]


# ------------------------------------------------------------------------------------------------
# 6: environment problems are not "internal errors"
# ------------------------------------------------------------------------------------------------


def test_non_utf8_config(trtq, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"model: m\xe9.onnx\n")
    r = trtq(["calibrate", "--config", cfg])
    assert r.code == 2 and one_line_error(r) and "not UTF-8" in r.err, r


def test_absurd_batch_size(trtq, kit):
    r = trtq(
        ["calibrate", "--model", kit.model, "--data", kit.data, "-o", kit.root / "n.cache", "--batch-size", str(10**12)]
    )
    assert r.code == 2 and one_line_error(r) and "lower --batch-size" in r.err and "GiB" in r.err, r


def test_missing_dependency_exits_4(trtq, kit, monkeypatch):
    for name in [m for m in sys.modules if m == "onnxruntime" or m.startswith("onnxruntime.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what Python does for a package that is not there
    r = trtq(["calibrate", "--model", kit.model, "--data", kit.data, "-o", kit.root / "n.cache"])
    assert r.code == 4 and one_line_error(r), r
    assert "onnxruntime" in r.err and "pip install" in r.err


# ------------------------------------------------------------------------------------------------
# 8: messages
# ------------------------------------------------------------------------------------------------


def test_bench_missing_plan_says_no_such_file(trtq, tmp_path):
    r = trtq(["bench", tmp_path / "nothere.plan"])
    assert r.code == 3 and one_line_error(r) and "engine not found" in r.err and "TensorRT" not in r.err, r


def test_model_or_cache_that_is_a_folder_is_invalid_input(trtq, kit):
    r = trtq(["quantize", "--model", kit.root, "--cache", kit.cache, "-o", kit.root / "q.onnx"])
    assert r.code == 3 and one_line_error(r) and "folder" in r.err, r
    r = trtq(["inspect-cache", kit.root])
    assert r.code == 3 and one_line_error(r) and "folder" in r.err, r


@pytest.mark.parametrize("what", ["model", "calibration cache", "statistics file"])
def test_unreadable_model_cache_or_stats_exits_3(kit, unprivileged, what):
    target = {"model": kit.model, "calibration cache": kit.cache, "statistics file": kit.stats}[what]
    os.chmod(target, 0)
    try:
        if what == "statistics file":
            args = ["calibrate", "--from-stats", kit.stats, "-o", kit.root / "n.cache"]
        else:
            args = ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.root / "q.onnx"]
        r = run_child(args, unprivileged)
    finally:
        os.chmod(target, 0o644)
    assert r.code == 3, r
    assert one_line_error(r) and f"cannot read {what}" in r.err and "Permission denied" in r.err, r.err


def test_duplicate_yaml_keys_are_refused(trtq, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: a.onnx\ncalibrate:\n  method: max\n  method: mse\n")
    r = trtq(["calibrate", "--config", cfg])
    assert r.code == 2 and one_line_error(r), r
    assert "'method' appears twice" in r.err and "lines 3 and 4" in r.err


def test_tactic_sources_string_in_the_config_is_split_like_the_flag(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("build:\n  tactic_sources: EDGE_MASK_CONVOLUTIONS, JIT_CONVOLUTIONS\n")
    want = ("EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS")
    assert load_config(cfg, environ={}).build.tactic_sources == want
    cfg.write_text("build:\n  tactic_sources: [EDGE_MASK_CONVOLUTIONS, JIT_CONVOLUTIONS]\n")
    assert load_config(cfg, environ={}).build.tactic_sources == want
    env = {"TRTQ_BUILD_TACTIC_SOURCES": "EDGE_MASK_CONVOLUTIONS,JIT_CONVOLUTIONS"}
    assert load_config(None, environ=env).build.tactic_sources == want


def test_readme_promises(tmp_path):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'pip install "trtq[fast]"' not in text  # not on PyPI
    assert "python3 -m venv .venv" in text
    assert "--per-layer-mode" in text
    assert "--data x=shards/*.npy" not in text  # unquoted glob: the shell expands it first
    assert "143" in text and "SIGTERM" in text


# ------------------------------------------------------------------------------------------------
# issue 29: ranking layers of a model with none to quantize
# ------------------------------------------------------------------------------------------------


def _relu_model(path):
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 8, 8])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("how", ["no weighted layer", "every layer excluded"])
def test_float_layers_and_per_layer_with_nothing_to_quantize_exit_3(trtq, kit, how):
    """Was exit 1 ("operation failed") for what is a property of the model, the cache or --exclude."""
    model = _relu_model(kit.root / "relu.onnx") if how == "no weighted layer" else kit.model
    cache = kit.root / "r.cache"
    assert trtq(["calibrate", "--model", model, "--data", kit.data, "-o", cache, "-q"]).code == 0
    exclude = []
    if how == "every layer excluded":  # a config: compare takes quantize options from it (it has no --exclude)
        (kit.root / "cfg.yaml").write_text("quantize: {exclude: [Conv, Gemm]}\n")
        exclude = ["--config", kit.root / "cfg.yaml"]
    before = kit.snapshot()
    r = trtq(
        [
            "quantize",
            "--model",
            model,
            "--cache",
            cache,
            "-o",
            kit.root / "q.onnx",
            "--data",
            kit.data,
            "--float-layers",
            "1",
            *exclude,
        ]
    )
    assert r.code == 3 and one_line_error(r) and "nothing to rank" in r.err, r
    r = trtq(
        [
            "compare",
            "--reference",
            model,
            "--candidate",
            model,
            "--data",
            kit.data,
            "--per-layer",
            "--cache",
            cache,
            *exclude,
        ]
    )
    assert r.code == 3 and one_line_error(r) and "nothing to rank" in r.err, r
    assert kit.snapshot() == before
