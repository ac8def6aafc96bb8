"""INT8 coverage from the engine inspector's layer list (no GPU): the classification of layers,
the fallbacks between INT8 layers, the shares, trtq build's lines and --require-int8.

``inspector/c2f_block.json`` is written in the engine inspector's documented JSON (the layer dicts
of ``get_engine_information(LayerInformationFormat.JSON)`` on a plan built with detailed
profiling, TensorRT 8.6 names): a YOLOv8 C2f block as trtq's placement left it, with the Split,
the residual Add and the Concat in float between INT8 convolutions, a float pre-processing Div
and a float Sigmoid head. The GPU test (test_gpu_coverage.py) runs the same function on real
engines.
"""

import json
from pathlib import Path

import pytest

from trtq.trt.coverage import datatype, int8_coverage, layer_kind

HERE = Path(__file__).parent
FALLBACKS = ["/model.2/Split", "/model.2/Split_1", "PWN(/model.2/m.0/Add)", "/model.2/Concat"]


@pytest.fixture
def c2f():
    return json.loads((HERE / "inspector" / "c2f_block.json").read_text())["Layers"]


def test_each_layer_gets_its_kind(c2f):
    kinds = {layer["Name"]: layer_kind(layer) for layer in c2f}
    assert kinds["/model.3/Constant_output_0"] == "other"
    assert kinds["PWN(/Div)"] == "float"
    assert kinds["/model.0/conv/_input_quantizer/QuantizeLinear"] == "conversion"
    assert kinds[next(n for n in kinds if n.startswith("Reformatting CopyNode for Input Tensor 0 to /model.0"))] == (
        "reformat"
    )
    assert kinds[next(n for n in kinds if n.startswith("/model.0/conv/Conv"))] == "int8"
    assert kinds[next(n for n in kinds if n.startswith("/model.1/conv/Conv"))] == "conversion"  # int8 -> fp32
    assert kinds["/model.3/conv/Conv"] == "conversion"  # int8 -> fp16
    assert kinds["PWN(/model.3/Sigmoid)"] == "float"


def test_coverage_counts_and_names_the_fallbacks(c2f):
    cov = int8_coverage(c2f)
    assert (cov.layers, cov.int8_layers, cov.other) == (17, 3, 1)
    assert cov.layer_share == pytest.approx(3 / 17)
    assert len(cov.conversions) == 6 and len(cov.reformats) == 2
    # float between INT8 layers; the pre-processing Div and the Sigmoid head are not fallbacks
    assert cov.fallbacks == FALLBACKS
    assert cov.time_share is None and cov.profiled_ms is None
    assert json.loads(json.dumps(cov.to_dict()))["fallbacks"] == FALLBACKS


def test_time_share_is_the_int8_layers_part_of_the_profiled_time(c2f):
    int8 = [layer["Name"] for layer in c2f if layer_kind(layer) == "int8"]
    times = {layer["Name"]: 0.01 for layer in c2f}
    times.update({int8[0]: 0.5, int8[1]: 0.25})
    times["{ForeignNode[/model.4/Reshape]}"] = 0.1  # reported by the profiler, absent from the inspector
    cov = int8_coverage(c2f, times)
    total = sum(times.values())
    assert cov.profiled_ms == pytest.approx(total)
    assert cov.time_share == pytest.approx((0.5 + 0.25 + 0.01) / total)
    assert cov.int8_copy_share == pytest.approx(2 * 0.01 / total)  # the two int8->int8 reformats


def test_int8_copies_are_counted_apart_from_conversions(c2f):
    """A reformat INT8 on both sides (a layout change, a Concat's copy) is INT8 data moved: its time
    is int8_copy_share, and build's line says so; a reformat that converts to float is not."""
    from trtq.cli.text import coverage_text

    copies = [layer["Name"] for layer in c2f if layer_kind(layer) == "reformat"]
    times = {layer["Name"]: 0.0 for layer in c2f}
    times[copies[0]] = 0.3
    times[next(layer["Name"] for layer in c2f if layer_kind(layer) == "conversion")] = 0.7
    cov = int8_coverage(c2f, times)
    assert cov.int8_copy_share == pytest.approx(0.3) and cov.time_share == 0.0
    assert "(+30.0% in INT8 copies / layout changes)" in coverage_text(cov)
    for entry in next(layer for layer in c2f if layer["Name"] == copies[0])["Outputs"]:
        entry["Format/Datatype"] = "Row major linear FP32 format"
    assert int8_coverage(c2f, times).int8_copy_share == 0.0


def test_slowest_names_the_hot_spots_with_their_kind(c2f):
    """The profiled layers that took longest, largest first, with their kind; a layer the profiler
    reported and the inspector did not gets kind ''; no times, no list."""
    times = {layer["Name"]: 0.001 for layer in c2f}
    quantize = "/model.0/conv/_input_quantizer/QuantizeLinear"
    times[quantize] = 0.141
    times["{ForeignNode[/model.4/Reshape]}"] = 0.05
    cov = int8_coverage(c2f, times)
    assert cov.slowest[:2] == [[quantize, 0.141, "conversion"], ["{ForeignNode[/model.4/Reshape]}", 0.05, ""]]
    assert len(cov.slowest) == 5 and all(row[1] == 0.001 for row in cov.slowest[2:])
    assert json.loads(json.dumps(cov.to_dict()))["slowest"][0] == [quantize, 0.141, "conversion"]
    assert int8_coverage(c2f).slowest == []


def test_an_int8_island_without_float_between_has_no_fallback(c2f):
    """The same block with the Split, Add and Concat in INT8 (what a fusion-aware placement gives):
    no fallback, and the layer share rises."""
    for layer in c2f:
        if layer["Name"] in FALLBACKS:
            for entry in layer["Inputs"] + layer["Outputs"]:
                entry["Format/Datatype"] = "Thirty-two wide channel vectorized row major Int8 format"
    cov = int8_coverage(c2f)
    assert cov.fallbacks == [] and cov.int8_layers == 7


def test_short_datatypes_without_an_execution_context():
    """Without an execution context the inspector writes short types ('Int8', 'Float', 'Half')."""
    layers = [
        {"Name": "a", "Inputs": [{"Name": "x", "Format/Datatype": "Int8"}], "Outputs": [{"Name": "t"}]},
        {
            "Name": "b",
            "LayerType": "CaskConvolution",
            "Inputs": [{"Name": "x", "Format/Datatype": "Int8"}],
            "Outputs": [{"Name": "u", "Format/Datatype": "Float"}],
        },
        {
            "Name": "c",
            "Inputs": [{"Name": "u", "Format/Datatype": "Float"}],
            "Outputs": [{"Name": "v", "Format/Datatype": "Half"}],
        },
        {
            "Name": "d",
            "Inputs": [{"Name": "v", "Format/Datatype": "Half"}],
            "Outputs": [{"Name": "w", "Format/Datatype": "Int8"}],
        },
    ]
    assert [datatype(e) for e in (layers[1]["Inputs"][0], layers[1]["Outputs"][0], layers[2]["Outputs"][0])] == [
        "int8",
        "fp32",
        "fp16",
    ]
    cov = int8_coverage(layers)
    assert cov.int8_layers == 1 and cov.conversions == ["b", "d"] and cov.fallbacks == ["c"]


def test_names_only_or_empty_lists_give_no_coverage():
    assert int8_coverage(["conv1 + relu", "pool"]) is None
    assert int8_coverage([]) is None


def test_build_text_lines(c2f):
    from trtq.cli.text import coverage_text

    cov = int8_coverage(c2f, {layer["Name"]: 1.0 for layer in c2f})
    lines = coverage_text(cov).splitlines()
    assert lines[0].startswith("int8       3/17 layers int8->int8 (17.6%), 16.7% of profiled time")
    assert "6 int8/float conversions, 2 reformats" in lines[0]
    assert lines[1] == "fallback   4 float between INT8: " + ", ".join(FALLBACKS)
    assert coverage_text(None) == ""


def test_build_result_lines_carry_coverage_and_lowering(c2f):
    from types import SimpleNamespace

    from trtq.cli.text import build_text

    md = {"precision": "int8", "mode": "explicit", "quantize": {"source": "model", "lowered": ["opset 19 -> 17 (x)"]}}
    result = SimpleNamespace(metadata=md, seconds=1.0, coverage=int8_coverage(c2f))
    lines = build_text(result, "m.plan").splitlines()
    assert "lowered    opset 19 -> 17 (x)" in lines
    assert [line.split()[0] for line in lines[-4:]] == ["tensorrt", "int8", "fallback", "metadata"]


def test_require_int8_names_the_fallbacks(c2f, tmp_path, monkeypatch):
    """checked_coverage on the fixture (engine_coverage needs a GPU: its inspector list is the
    fixture's): without --require-int8 the coverage comes back, with it exit 1 naming the layers."""
    from trtq.errors import TrtqError
    from trtq.pipeline.build import checked_coverage
    from trtq.trt import layers
    from trtq.trt.format_guard import check_layouts

    monkeypatch.setattr(layers, "engine_coverage", lambda plan: int8_coverage(c2f))
    assert checked_coverage(tmp_path / "m.plan", False).fallbacks == FALLBACKS
    with pytest.raises(TrtqError) as info:
        checked_coverage(tmp_path / "m.plan", True)
    assert info.value.exit_code == 1
    assert (
        str(info.value)
        .splitlines()[0]
        .startswith("--require-int8: 4 layer(s) of m.plan fell back to float between INT8 layers: /model.2/Split, ")
    )
    monkeypatch.setattr(layers, "engine_coverage", lambda plan: None)
    assert checked_coverage(tmp_path / "m.plan", False) is None
    # the layout check's profile of the same engine is used where build hands it on: no second load
    measured = check_layouts(c2f, {layer["Name"]: 1.0 for layer in c2f})
    assert checked_coverage(tmp_path / "m.plan", False, measured) == int8_coverage(c2f, measured.times)
    assert checked_coverage(tmp_path / "m.plan", False, measured).time_share == pytest.approx(1 / 6)
    with pytest.raises(TrtqError, match="cannot read the INT8 coverage"):
        checked_coverage(tmp_path / "m.plan", True)


def test_require_int8_on_a_float_build_is_a_usage_error(tmp_path, trtq):
    from tests.trt.models import residual_cnn

    model = residual_cnn(tmp_path / "m.onnx")
    res = trtq(["build", "-m", model, "--precision", "fp16", "--require-int8"])
    assert res.code == 2, res
    assert "--require-int8 checks an INT8 engine" in res.err
