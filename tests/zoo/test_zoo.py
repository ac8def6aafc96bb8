"""Issue 28's model zoo through the real CLI: for every file, ``trtq calibrate`` and ``trtq quantize``
write a Q/DQ model that loads and runs in ONNX Runtime, quantizes the model's Conv/Gemm/MatMul
nodes and stays within SQNR_MIN_DB of FP32; ``trtq compare --json`` infers each output's task as
the manifest states it (and its metric matches plain scoring in the model's real layout within
0.01), or says raw with a reason where nothing in the graph tells."""

from __future__ import annotations

import math

from tests.zoo import zoo_steps


def _where(case) -> str:
    e = case.entry
    return f"{e['file']} ({e['architecture']}, {e['exporter']} opset {e['opset']})"


def _require(case, *steps):
    for name in steps:
        failed = case.step_failed(name)
        assert failed is None, f"{_where(case)}: {failed}"


def _assert_within_bound(case, sqnr: dict, what: str) -> None:
    """Every output's SQNR against FP32 at or above the file's bound."""
    floor = {n: zoo_steps.output_floor(case.entry, n) for n in sqnr}
    low = {n: v for n, v in sqnr.items() if not (v >= floor[n] or (math.isinf(v) and v > 0))}
    assert not low, f"{_where(case)}: {what} vs FP32 SQNR below its bound: " + ", ".join(
        f"{n} {v:.1f} dB < {floor[n]:g} dB" for n, v in low.items()
    )


def test_qdq_model_loads_and_runs(zoo_case):
    _require(zoo_case, "calibrate", "quantize")
    assert zoo_case.loads, (
        f"{_where(zoo_case)}: quantize exited 0 but its model does not load and run in "
        f"ONNX Runtime: {zoo_case.load_error or 'no file written'}"
    )
    if zoo_case.weighted:
        assert zoo_case.quantized, (
            f"{_where(zoo_case)}: none of its {zoo_case.weighted} Conv/Gemm/MatMul nodes has Q/DQ on its inputs"
        )


def test_qdq_output_within_sqnr_bound(zoo_case):
    _require(zoo_case, "calibrate", "quantize")
    assert zoo_case.loads, f"{_where(zoo_case)}: no loadable Q/DQ model to measure ({zoo_case.load_error})"
    assert set(zoo_case.sqnr) == {o["name"] for o in zoo_case.entry["outputs"]}
    _assert_within_bound(zoo_case, zoo_case.sqnr, "Q/DQ")


def test_shared_placement_loads_runs_and_stays_within_the_bound(zoo_case, trtq):
    """`quantize --placement shared` (one Q/DQ pair per tensor, every reader sharing it; what
    build --tune-placement kept on three of four engines) from the same cache: its model loads and
    runs in ONNX Runtime and stays within the SQNR bound of the default placement's, on every file."""
    _require(zoo_case, "calibrate", "quantize")
    step, load_error, sqnr = zoo_steps.placement_check(zoo_case, "shared", trtq)
    assert step.code == 0, f"{_where(zoo_case)}: `{step.command()}` exited {step.code}: {step.line}"
    assert not load_error, f"{_where(zoo_case)}: the shared Q/DQ model does not load and run: {load_error}"
    _assert_within_bound(zoo_case, sqnr, "shared Q/DQ")


def test_compare_infers_the_task(zoo_case):
    _require(zoo_case, "compare")
    assert len(zoo_case.tasks) == len(zoo_case.entry["outputs"])
    problems = [p for row in zoo_case.tasks for p in row["problems"]]
    assert not problems, f"{_where(zoo_case)}, candidate {zoo_case.candidate}: " + "; ".join(problems)


def test_compare_with_the_task_given(zoo_flagged_case):
    """Given the flags that state the manifest's task and layout (--task ctc --layout TNC, --task
    segment --layout NHWC, --task detect --scores ... --boxes ... --box-format dfl), compare scores
    every output as that task, with the metric plain scoring computes."""
    case = zoo_flagged_case
    _require(case, "compare_given")
    assert not case.explicit, f"{_where(case)}, candidate {case.candidate}: " + "; ".join(case.explicit)


def test_attention_int8_loads_runs_and_stays_within_the_bound(zoo_case, trtq):
    """`quantize --attention int8` (D34) on the files with attention cores: every attention MatMul
    the default leaves float gets its pairs, and the model loads, runs and stays within the bound."""
    import pytest

    _require(zoo_case, "calibrate", "quantize")
    report = zoo_case.steps["quantize"].report or {}
    attention = [x["node"] for x in report.get("left_float") or [] if str(x.get("reason", "")).startswith("attention")]
    if not attention:
        pytest.skip("no attention core: --attention int8 writes the default file")
    step, load_error, sqnr = zoo_steps.placement_check(zoo_case, "shared", trtq, ("--attention", "int8"))
    assert step.code == 0, f"{_where(zoo_case)}: `{step.command()}` exited {step.code}: {step.line}"
    assert set(attention) <= set(step.report["quantized"]), f"{_where(zoo_case)}: attention MatMuls left float"
    assert not load_error, f"{_where(zoo_case)}: the --attention int8 model does not load and run: {load_error}"
    _assert_within_bound(zoo_case, sqnr, "--attention int8")


def test_centred_models_load_run_and_stay_within_the_bound(zoo_case, trtq):
    """`quantize --center-activations`, then with `--center-padded` (D42: zero Pads folded into their
    Conv, border maps behind the padded readers) on every file: each model loads, runs and stays
    within the bound, and the padded form centres at least what the plain one does (in the fast
    zoo it centres more on mnist_cnn and mobilenet_v3_small, both exports)."""
    _require(zoo_case, "calibrate", "quantize")
    centred = []
    for extra in (("--center-activations",), ("--center-activations", "--center-padded")):
        step, load_error, sqnr = zoo_steps.placement_check(zoo_case, "standard", trtq, extra)
        what = " ".join(extra)
        assert step.code == 0, f"{_where(zoo_case)}: `{step.command()}` exited {step.code}: {step.line}"
        assert not load_error, f"{_where(zoo_case)}: the {what} model does not load and run: {load_error}"
        _assert_within_bound(zoo_case, sqnr, what)
        centred.append({c["tensor"] for c in step.report["centred"]})
    assert centred[0] <= centred[1], f"{_where(zoo_case)}: --center-padded dropped {sorted(centred[0] - centred[1])}"
