"""Padded layouts read from the engine inspector (trtq.trt.format_guard) and build's rebuild while
one is left (trtq.pipeline.build.rebuilt_while_padded), without a GPU.

``inspector/det_stem_layouts.json`` holds real inspector entries: the first two layers of two
builds of one PP-OCRv4 det Q/DQ file (TensorRT 8.6.0, H100); in the slow build the input Quantize
writes the 3-channel image 32 channels wide (137-145 us against 12-35 us, benchmarks/README.md).
test_gpu_layouts.py reads real engines."""

import json
from pathlib import Path

import pytest

from trtq.config import BuildOptions
from trtq.trt.format_guard import check_layouts, padded_share, padded_tensors, padding_ratio, vector_width

HERE = Path(__file__).parent
STEM = json.loads((HERE / "inspector" / "det_stem_layouts.json").read_text())
CONV = "conv2d_0.w_0 + conv2d_0.w_0_QuantizeLinear + p2o.Conv.0"


def profile(quantize_ms: float) -> dict:
    """A det profile by layer name (ms): the input Quantize (144.6 us in the slow build measured,
    benchmarks/README.md ninth session), the stem conv and the rest of the engine as one layer."""
    return {"x_QuantizeLinear": quantize_ms, CONV: 0.03, "the other layers": 1.23}


# what the GPU's layout check finds per build: the slow build's layouts with its time, the same
# layouts where the padded layers take little time, and the fast build
ELSEWHERE = json.loads(json.dumps(STEM["slow"]).replace("x_QuantizeLinear_Output", "x_copy_Output"))
CHECKS = {
    "slow": (STEM["slow"], profile(0.1446)),
    "elsewhere": (ELSEWHERE, profile(0.1446)),  # another tensor padded: a different choice, worth a try
    "cheap": (STEM["slow"], {"x_QuantizeLinear": 0.004, CONV: 0.002, "the other layers": 1.4}),
    "fast": (STEM["fast"], profile(0.015)),
}


def test_vector_width_from_the_inspectors_format_text():
    assert vector_width("Thirty-two wide channel vectorized row major Int8 format") == 32
    assert vector_width("Four wide channel vectorized row major Int8 format") == 4
    assert vector_width("Channel major FP16 format where channel % 8 == 0") == 8
    assert vector_width("Row major Int8 format") == 1
    assert vector_width("Row major linear FP32") == 1
    assert vector_width("") == 1


def test_padding_ratio_is_stored_over_real_channels():
    assert padding_ratio((1, 3, 640, 640), 32) == pytest.approx(32 / 3)
    assert padding_ratio((1, 3, 640, 640), 4) == pytest.approx(4 / 3)
    assert padding_ratio((1, 16, 320, 320), 32) == 2.0
    assert padding_ratio((1, 64, 8, 8), 32) == 1.0
    assert padding_ratio((1, -1, 8, 8), 32) == 1.0  # dynamic: not judged
    assert padding_ratio((3,), 32) == 1.0


def test_the_slow_det_build_is_found_and_the_fast_one_is_not():
    (found,) = padded_tensors(STEM["slow"])
    assert (found.layer, found.tensor, found.dims) == ("x_QuantizeLinear", "x_QuantizeLinear_Output", (1, 3, 640, 640))
    assert found.ratio == pytest.approx(32 / 3) and found.format.startswith("Thirty-two wide")
    assert found.to_dict()["ratio"] == 10.67
    assert padded_tensors(STEM["fast"]) == []
    assert padded_tensors(["x_QuantizeLinear", "conv"]) == []  # names only: nothing to read


def test_the_padded_share_is_the_time_of_the_layers_that_write_or_read_it():
    padded = padded_tensors(STEM["slow"])
    assert padded_share(STEM["slow"], profile(0.1446), padded) == pytest.approx(0.1746 / 1.4046)
    assert padded_share(STEM["slow"], {}, padded) == 0.0
    assert padded_share(STEM["slow"], profile(0.1446), []) == 0.0
    slow, cheap, fast = (check_layouts(*CHECKS[k]) for k in ("slow", "cheap", "fast"))
    assert slow.worth_rebuilding() and slow.share == pytest.approx(0.1243, abs=1e-4)
    assert cheap.padded == slow.padded and cheap.share < 0.005 and not cheap.worth_rebuilding()
    assert fast.padded == [] and fast.share == 0.0 and not fast.worth_rebuilding()
    assert slow.record(1) == {"rebuilds": 1, "padded": [p.to_dict() for p in slow.padded], "share": 0.1243}
    assert slow.times == CHECKS["slow"][1] and slow.inspected == STEM["slow"]


def test_a_build_hands_on_the_layers_its_check_profiled(tmp_path):
    """The tune reads a candidate's layers from its build (BuildResult.layers): the layout check's
    profile, not a second load of the engine (the plan here is not an engine and is never read)."""
    from trtq.trt.build import BuildResult

    check = check_layouts(*CHECKS["slow"])
    result = BuildResult(tmp_path / "not-an-engine.plan", {}, 1.0, measured=check)
    times, inspected = result.layers()
    assert times == CHECKS["slow"][1] and inspected == STEM["slow"]


class Builds:
    """What build_engine hands rebuilt_while_padded: a build function (here: the plan written again
    with a count in its metadata) and, per build, what the layout check of the GPU would find."""

    def __init__(self, tmp_path, found):
        from trtq.trt.build import _META_ORDER, BuildResult, write_plan

        self.plan = tmp_path / "m.plan"
        self.found = list(found)
        self.checked = 0
        self.builds = 0
        self.fail_at, self.fail_with = None, None  # the build that raises, and what
        self.result_type, self.write_plan, self.keys = BuildResult, write_plan, _META_ORDER

    def build(self):
        self.builds += 1
        if self.fail_at == self.builds:
            raise self.fail_with
        meta = {**dict.fromkeys(self.keys), "format": "trtq-plan/1", "build": self.builds}
        self.write_plan(self.plan, b"plan", meta)
        return self.result_type(self.plan, meta, 1.0)

    def check(self, plan):
        self.checked += 1
        item = self.found.pop(0)
        if isinstance(item, Exception):
            raise item
        return check_layouts(*CHECKS[item])


@pytest.mark.parametrize(
    "found,limit,builds,record",
    [
        (["fast"], 2, 1, None),  # nothing padded: no rebuild, no record
        (["slow", "fast"], 2, 2, {"rebuilds": 1, "padded": [], "share": 0.0}),
        (["slow", "slow"], 2, 2, {"rebuilds": 1, "padded": ["x_QuantizeLinear_Output"], "share": 0.1243}),  # again
        (["slow", "elsewhere", "elsewhere"], 2, 3, {"rebuilds": 2, "padded": ["x_copy_Output"], "share": 0.1243}),
        (["slow"], 0, 1, {"rebuilds": 0, "padded": ["x_QuantizeLinear_Output"], "share": 0.1243}),
        (["cheap"], 2, 1, {"rebuilds": 0, "padded": ["x_QuantizeLinear_Output"], "share": 0.0043}),  # cannot pay
        (["slow", "cheap"], 2, 2, {"rebuilds": 1, "padded": ["x_QuantizeLinear_Output"], "share": 0.0043}),
    ],
)
def test_build_again_while_a_tensor_is_padded(tmp_path, monkeypatch, found, limit, builds, record):
    from tests.trt.test_build_cpu import build_warnings
    from trtq.pipeline.build import rebuilt_while_padded
    from trtq.trt import layers
    from trtq.trt.metadata import read_metadata

    b = Builds(tmp_path, found)
    monkeypatch.setattr(layers, "padded_layouts", b.check)
    with build_warnings() as warned:
        result = rebuilt_while_padded(b.build(), b.build, BuildOptions(layout_rebuilds=limit))
    assert b.builds == builds and b.checked == builds and not b.found
    on_disk = read_metadata(b.plan)
    assert on_disk["build"] == builds
    got = result.metadata.get("layout_rebuilds")
    if record is None:
        assert got is None and "layout_rebuilds" not in on_disk
    else:
        assert {**got, "padded": [p["tensor"] for p in got["padded"]]} == record
        assert on_disk["layout_rebuilds"] == got
    said = [r.getMessage() for r in warned]
    assert len(said) == builds - 1
    assert all("(1x3x640x640) at 10.7x its size" in line and "12.4% of its time" in line for line in said)
    assert not said or "x_QuantizeLinear_Output" in said[0]
    assert result.measured is not None and result.measured.times == CHECKS[found[builds - 1]][1]


def test_a_layout_check_that_fails_keeps_the_engine(tmp_path, monkeypatch):
    from tests.trt.test_build_cpu import build_warnings
    from trtq.errors import TrtqError
    from trtq.pipeline.build import rebuilt_while_padded
    from trtq.trt import layers

    for error in (TrtqError("no GPU"), RuntimeError("cudaErrorLaunchFailure")):
        b = Builds(tmp_path, [error])
        monkeypatch.setattr(layers, "padded_layouts", b.check)
        with build_warnings() as warned:
            result = rebuilt_while_padded(b.build(), b.build, BuildOptions())
        assert b.builds == 1 and "layout_rebuilds" not in result.metadata
        assert [r.getMessage() for r in warned] == [f"layouts of m.plan not checked: {error}"]


def test_layout_rebuilds_from_config_and_flag(tmp_path, trtq):
    from trtq.config import load_config

    assert load_config(None, environ={}).build.layout_rebuilds == 2
    assert load_config(None, {"build.layout_rebuilds": 0}, environ={}).build.layout_rebuilds == 0
    res = trtq(["build", "-m", tmp_path / "missing.onnx", "--layout-rebuilds", "0"])
    assert res.code == 3 and "missing.onnx" in res.err, res  # the flag is taken; the missing model is the error
    res = trtq(["build", "-m", tmp_path / "missing.onnx", "--layout-rebuilds", "-1"])
    assert res.code == 2, res


def test_build_text_says_what_the_rebuilds_left():
    from trtq.cli.text import layouts_text

    assert layouts_text(None) == ""
    assert layouts_text({"rebuilds": 1, "padded": []}) == "layouts    1 rebuild(s); no padded tensor left\n"
    left = [p.to_dict() for p in padded_tensors(STEM["slow"])]
    assert layouts_text({"rebuilds": 2, "padded": left}) == (
        "layouts    2 rebuild(s); padded left: x_QuantizeLinear_Output 10.67x\n"
    )
    assert layouts_text({"rebuilds": 0, "padded": left, "share": 0.0043}) == (
        "layouts    0 rebuild(s); padded left: x_QuantizeLinear_Output 10.67x (0.4% of the profiled time)\n"
    )
    # a build under lazy module loading (D39) says how to build under eager loading; eager says nothing more
    lazy = layouts_text({"rebuilds": 2, "padded": left}, "lazy")
    assert lazy.startswith("layouts    2 rebuild(s); padded left: x_QuantizeLinear_Output 10.67x\n")
    assert "lazy CUDA module loading" in lazy and "CUDA_MODULE_LOADING=EAGER" in lazy and lazy.endswith("\n")
    assert layouts_text({"rebuilds": 1, "padded": []}, "eager") == "layouts    1 rebuild(s); no padded tensor left\n"
    assert layouts_text(None, "lazy") == ""


def test_every_build_goes_through_the_layout_check(tmp_path, monkeypatch):
    """build_network (what build_engine and the tune's candidate, guide and FP16 builds call) builds
    again when the first engine is padded."""
    from types import SimpleNamespace

    from trtq.pipeline import build as pipeline_build
    from trtq.trt import layers

    b = Builds(tmp_path, ["slow", "fast"])
    monkeypatch.setattr(layers, "padded_layouts", b.check)
    monkeypatch.setattr(pipeline_build, "build_plan", lambda *a, **k: b.build())
    blank = SimpleNamespace(trt=None, recipe=None, model_path=None, profiles=None, table=None, cache_path=None)
    result = pipeline_build.build_network(blank, SimpleNamespace(model=None, info=None), b.plan, BuildOptions())
    assert b.builds == 2 and result.metadata["layout_rebuilds"] == {"rebuilds": 1, "padded": [], "share": 0.0}


def test_a_failed_rebuild_keeps_the_engine_built_before(tmp_path, monkeypatch):
    """TensorRT failing on the second build must not turn a built, valid engine into an error: the
    first plan stays (build_plan writes nothing when it fails) and the metadata says it is padded."""
    from tests.trt.test_build_cpu import build_warnings
    from trtq.errors import TrtqError
    from trtq.pipeline.build import rebuilt_while_padded
    from trtq.trt import layers
    from trtq.trt.metadata import read_metadata

    b = Builds(tmp_path, ["slow"])
    b.fail_at, b.fail_with = 2, TrtqError("TensorRT 8.6.0 could not build m.onnx")
    monkeypatch.setattr(layers, "padded_layouts", b.check)
    with build_warnings() as warned:
        result = rebuilt_while_padded(b.build(), b.build, BuildOptions())
    assert b.builds == 2 and b.checked == 1
    assert result.metadata["build"] == 1 and read_metadata(b.plan)["build"] == 1
    record = result.metadata["layout_rebuilds"]
    assert record["rebuilds"] == 0 and [p["tensor"] for p in record["padded"]] == ["x_QuantizeLinear_Output"]
    assert read_metadata(b.plan)["layout_rebuilds"] == record
    said = [r.getMessage() for r in warned]
    assert len(said) == 2 and "building again failed (TensorRT 8.6.0 could not build m.onnx)" in said[1]
