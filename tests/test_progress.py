"""Progress of the long steps (trtq.progress): a line per unit of work where stderr is not a
terminal, a bar on one, nothing with -q or for a library caller, and never a change to stdout,
--json or the files a command writes."""

from __future__ import annotations

import io
import json
import re

import pytest

from tests.conftest import SAMPLE_CONFIG, SAMPLE_MODEL
from trtq import progress


@pytest.fixture
def stream():
    out = io.StringIO()
    yield out
    progress.configure(False)


def test_a_task_writes_one_line_per_unit_where_stderr_is_no_terminal(stream):
    progress.configure(True, stream, tty=False)
    with progress.task("gptq rounding: solving layers", 3) as t:
        for name in ("Conv.0", "Conv.1", "Conv.2"):
            t.advance(note=name)
    lines = stream.getvalue().splitlines()
    assert [re.sub(r" \(.*\)$", "", ln) for ln in lines] == [
        "gptq rounding: solving layers: 1/3  Conv.0",
        "gptq rounding: solving layers: 2/3  Conv.1",
        "gptq rounding: solving layers: 3/3  Conv.2",
    ]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]


def test_counted_and_stage_lines(stream):
    progress.configure(True, stream, tty=False)
    assert list(progress.counted("pass", iter("abcd"), 4)) == list("abcd")
    with progress.stage("report: writing the page"):
        pass
    with pytest.raises(KeyError), progress.stage("report: failing"):
        raise KeyError("x")
    lines = stream.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in lines[:4]] == [f"pass: {i}/4" for i in range(1, 5)]
    assert len(lines) == 5 and lines[4].startswith("report: writing the page: done (")  # none for the failure
    assert all(progress.is_progress_line(ln) for ln in lines)


def test_a_terminal_gets_one_bar_rewritten_in_place(stream):
    progress.configure(True, stream, tty=True)
    with progress.task("per-layer (only): layers", 2) as t:
        t.advance(note="Conv.0")
        t.advance(note="Conv.1")
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and text.startswith("\r")
    assert "[" + "#" * progress.BAR + "] 2/2  Conv.1" in text


def test_an_unfinished_bar_still_ends_its_line(stream):
    progress.configure(True, stream, tty=True)
    with progress.task("compare: batches", 10) as t:
        t.advance()
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1


def test_off_by_default_and_when_turned_off(stream):
    progress.configure(False, stream, tty=False)
    with progress.task("x", 2) as t:
        t.advance()
    assert list(progress.counted("y", [1, 2])) == [1, 2]
    progress.note("z")
    with progress.stage("w"):
        pass
    assert stream.getvalue() == ""


def _quantize(trtq, tmp_path, *extra):
    cache = tmp_path / "c.cache"
    if not cache.exists():
        r = trtq(["calibrate", "-c", SAMPLE_CONFIG, "-o", cache, "-q"])
        assert r.code == 0, r
    out = tmp_path / "m.qdq.onnx"
    r = trtq(["quantize", "-c", SAMPLE_CONFIG, "--cache", cache, "-o", out, "--bias-correction", *extra])
    assert r.code == 0, r
    return r, out.read_bytes()


def test_quantize_shows_its_data_pass_batch_by_batch_and_q_silences_it(trtq, tmp_path):
    shown, model = _quantize(trtq, tmp_path, "--json")
    quiet, quiet_model = _quantize(trtq, tmp_path, "--json", "-q")
    batches = 4  # 32 sample images in batches of 8
    lines = [
        ln
        for ln in shown.err.splitlines()
        if ln.startswith("bias correction: reading activations: ") and "still" not in ln
    ]
    assert [ln.split(": ")[2].split(" ")[0] for ln in lines] == [f"{i}/{batches}" for i in range(1, batches + 1)]
    assert quiet.err == ""
    # the results are the same bytes with and without progress
    assert shown.out == quiet.out and model == quiet_model
    assert json.loads(shown.out)["quantized"]
    text, _ = _quantize(trtq, tmp_path)
    assert "reading activations" not in text.out and text.out.startswith("quantized ")


def test_compare_per_layer_shows_one_line_per_layer(trtq, tmp_path):
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "-c", SAMPLE_CONFIG, "-o", cache, "-q"]).code == 0
    args = ["compare", "-c", SAMPLE_CONFIG, "--candidate", SAMPLE_MODEL, "--per-layer", "--cache", cache]
    args += ["--limit", "8", "--json"]
    r = trtq(args)
    assert r.code == 0, r
    layers = [ln for ln in r.err.splitlines() if ln.startswith("per-layer (only): layers: ") and "still" not in ln]
    quantized = len(
        json.loads(
            trtq(["quantize", "-c", SAMPLE_CONFIG, "--cache", cache, "-o", tmp_path / "q.onnx", "--json", "-q"]).out
        )["quantized"]
    )
    assert [ln.split(": ")[2].split(" ")[0] for ln in layers] == [f"{i}/{quantized}" for i in range(1, quantized + 1)]
    assert [ln for ln in r.err.splitlines() if ln.startswith("compare: batches: ")][-1].startswith(
        "compare: batches: 1/1  8 samples"
    )
    quiet = trtq([*args, "-q"])
    assert quiet.err == "" and json.loads(quiet.out) == json.loads(r.out)


def test_calibrate_shows_progress_without_a_terminal_unless_quiet(trtq, tmp_path):
    r = trtq(["calibrate", "-c", SAMPLE_CONFIG, "-o", tmp_path / "a.cache"])
    assert r.code == 0 and "pass 1/1 (" in r.err and "4/4 batches" in r.err
    q = trtq(["calibrate", "-c", SAMPLE_CONFIG, "-o", tmp_path / "b.cache", "-q"])
    assert q.err == "" and (tmp_path / "a.cache").read_bytes() == (tmp_path / "b.cache").read_bytes()
    off = trtq(["calibrate", "-c", SAMPLE_CONFIG, "-o", tmp_path / "c.cache", "--no-progress"])
    assert off.code == 0 and off.err == "", off


def test_a_long_unit_of_work_gets_still_working_lines(stream, monkeypatch):
    import time

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)
    progress.configure(True, stream, tty=False)
    with progress.task("build: building the engine"):
        time.sleep(1.6)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all(ln.startswith("build: building the engine: still working (") for ln in lines)
    assert all(progress.is_progress_line(ln) for ln in lines)
    assert progress._sink.running == []  # a finished task is no longer watched


def test_the_progress_line_pattern_knows_calibrates_line_and_not_errors():
    assert progress.is_progress_line("pass 1/2 (max): 3/16 batches, 24 samples, 7.0 samples/s  ETA 0:03")
    assert progress.is_progress_line("build: Building engine: done in 3.2 s (9.1 s)")
    assert not progress.is_progress_line("trtq: error: cannot read statistics file s.npz; check its permissions")
    assert not progress.is_progress_line("trtq: WARNING: 3 tensors (2.5 s)x")
