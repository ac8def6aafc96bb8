"""Defect 1: an output path that is an input (by any name) or another output is refused with exit 2
before anything is written."""
import os

import pytest

from tests.reliability.conftest import one_line_error


def _refused(trtq, kit, args, *words):
    before = kit.snapshot()
    r = trtq(args)
    assert r.code == 2, r
    assert one_line_error(r), r.err
    for w in words:
        assert w in r.err, r.err
    assert kit.snapshot() == before  # nothing written, nothing replaced
    return r


def test_quantize_output_onto_the_model(trtq, kit):
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.model],
             "the output model", "is the model", "another output path")


def test_quantize_output_onto_the_cache_and_its_provenance(trtq, kit):
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.cache], "is the cache")
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.prov], "provenance")


def test_quantize_output_through_a_symlink_and_a_hard_link(trtq, kit):
    link = kit.root / "link.onnx"
    link.symlink_to(kit.model)
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", link], "is the model")
    hard = kit.root / "hard.onnx"
    os.link(kit.model, hard)
    _refused(trtq, kit, ["quantize", "--model", hard, "--cache", kit.cache, "-o", kit.model], "is the model")
    # through a path with .. in it
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache,
                         "-o", kit.root / "sub" / ".." / "m.onnx"], "is the model")


@pytest.mark.parametrize("target", ["model", "data", "stats_out"])
def test_calibrate_output_onto_an_input_or_the_other_output(trtq, kit, target):
    base = ["calibrate", "--model", kit.model, "--data", kit.data]
    if target == "model":
        args = base + ["-o", kit.model]
    elif target == "data":
        args = base + ["-o", kit.data]
    else:
        args = base + ["-o", kit.cache, "--save-stats", kit.cache]
    _refused(trtq, kit, args, "same file")


def test_calibrate_outputs_onto_the_config_and_the_stats_input(trtq, kit):
    cfg = kit.root / "cfg.yaml"
    cfg.write_text("model: m.onnx\ndata:\n  inputs:\n    x:\n      npy: [x.npy]\n")
    _refused(trtq, kit, ["calibrate", "--config", cfg, "-o", cfg], "config file")
    _refused(trtq, kit, ["calibrate", "--from-stats", kit.stats, "-o", kit.stats], "statistics file")
    _refused(trtq, kit, ["calibrate", "--from-stats", kit.stats, "--model", kit.model, "-o", kit.model], "is the model")
    # the provenance JSON is an output too: -o X where X.json is the model
    odd = kit.root / "odd.onnx.json"
    os.link(kit.model, odd)
    _refused(trtq, kit, ["calibrate", "--model", kit.model, "--data", kit.data, "-o", kit.root / "odd.onnx"],
             "provenance file")


def test_build_outputs_checked_before_tensorrt(trtq, kit):
    base = ["build", "--model", kit.model, "--cache", kit.cache]
    _refused(trtq, kit, base + ["-o", kit.model], "the engine", "is the model")
    _refused(trtq, kit, base + ["-o", kit.root / "e.plan", "--timing-cache", kit.cache], "timing cache")


def test_a_fresh_output_still_works(trtq, kit):
    out = kit.root / "q.onnx"
    r = trtq(["quantize", "--model", kit.model, "--cache", kit.cache, "-o", out])
    assert r.code == 0, r
    assert out.stat().st_size > 0
