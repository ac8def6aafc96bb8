"""--exclude entries that name no node get one warning line (quantize and build share the step)."""

from __future__ import annotations

import onnx
import pytest

from tests.conftest import SAMPLE_CONFIG, SAMPLE_MODEL
from trtq.quantize.plan import Exclusions


def _node(op: str, name: str) -> onnx.NodeProto:
    return onnx.helper.make_node(op, ["a"], ["b"], name=name)


def test_unmatched_entries_by_op_type_exact_name_and_regex():
    nodes = [_node("Conv", "backbone/conv1"), _node("Relu", "Conv@1"), _node("Softmax", "head")]
    patterns = ["Conv", "Conv@1", "^backbone/", "Gemm", "^neck/", "Conv@10", "head$"]
    assert Exclusions(patterns, [n.name for n in nodes]).unmatched(nodes) == ["Gemm", "^neck/", "Conv@10"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from trtq.cli import main

    out = tmp_path_factory.mktemp("cache") / "c.cache"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "-c", str(SAMPLE_CONFIG), "-o", str(out), "-q"])
    assert e.value.code in (0, None)
    return out


def _warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("trtq: WARNING: --exclude matched no node")]


def test_quantize_warns_once_on_one_line(trtq, tmp_path, cache):
    args = ["quantize", "-c", SAMPLE_CONFIG, "--cache", cache, "-o", tmp_path / "q.onnx", "--exclude", "Softmax"]
    r = trtq([*args, "--exclude", "no_such_node", "--exclude", "^Conv\\.1$", "--exclude", "Gemm"])
    assert r.code == 0, r
    assert _warnings(r.err) == [
        "trtq: WARNING: --exclude matched no node: 'no_such_node', 'Gemm' (op types, exact node names or "
        "regexes searched in node names: see the names in trtq quantize --json's quantized and left_float)"
    ]
    clean = trtq(args)
    assert clean.code == 0 and _warnings(clean.err) == [], clean
    quiet = trtq([*args, "--exclude", "no_such_node", "-q"])
    assert quiet.code == 0 and quiet.err == "", quiet


def test_build_s_quantize_step_warns_too(cache):
    """trtq build quantizes through pipeline.quantize.quantize_for, where the warning is made."""
    import dataclasses

    from tests.trt.test_build_cpu import build_warnings
    from trtq.calib.cache import read_cache
    from trtq.config import load_config
    from trtq.model import load_model
    from trtq.pipeline.quantize import quantize_for

    cfg = load_config(SAMPLE_CONFIG)
    options = dataclasses.replace(cfg.quantize, exclude=("typo_conv",))
    # read the logger's records directly: caplog sees none where an earlier CLI test stopped trtq's
    # loggers propagating (seen under the GPU bundle's Python 3.9)
    with build_warnings("trtq.pipeline.quantize") as records:
        quantize_for(load_model(SAMPLE_MODEL), read_cache(cache).amax, options, cfg.data, "10.16.0")
    assert [r.getMessage().split(" (")[0] for r in records if "--exclude" in r.getMessage()] == [
        "--exclude matched no node: 'typo_conv'"
    ]
