"""Build logic that needs no GPU: optimization profiles and the errors raised before TensorRT runs."""

import contextlib
import logging
import sys

import pytest

from trtq.config import BuildOptions, ProfileShapes
from trtq.errors import ConfigError, EnvironmentMissing, UsageError
from trtq.model import TensorSpec
from trtq.pipeline.build import build_engine
from trtq.trt.build import resolve_profiles

X_DYN = TensorSpec("x", ("N", 3, 224, 224), "float32")
X_STATIC = TensorSpec("x", (2, 3, 8, 8), "float32")
TOKENS = TensorSpec("ids", ("N", "T"), "int64")


def test_static_inputs_need_no_profile():
    assert resolve_profiles([X_STATIC], {}, {}, None) == {}


def test_profile_from_build_options():
    p = resolve_profiles([X_DYN], {"x": ProfileShapes((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))}, {}, 4)
    assert p == {"x": ((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))}


def test_partial_profile_is_completed_from_opt():
    p = resolve_profiles([X_DYN], {"x": ProfileShapes(opt=(8, 3, 224, 224), max=(16, 3, 224, 224))}, {}, None)
    assert p["x"] == ((8, 3, 224, 224), (8, 3, 224, 224), (16, 3, 224, 224))


def test_fixed_shape_from_data_shapes_then_batch_size_then_cache_then_default():
    assert resolve_profiles([X_DYN], {}, {"x": (5, 3, 224, 224)}, 4)["x"][1] == (5, 3, 224, 224)
    assert resolve_profiles([X_DYN], {}, {}, 4)["x"] == ((4, 3, 224, 224),) * 3
    assert resolve_profiles([X_DYN], {}, {}, None, {"x": [6, 3, 224, 224]})["x"][0] == (6, 3, 224, 224)
    assert resolve_profiles([X_DYN], {}, {}, None)["x"][2] == (8, 3, 224, 224)


def test_dynamic_non_batch_dim_needs_a_shape():
    with pytest.raises(ConfigError) as info:
        resolve_profiles([TOKENS], {}, {}, 4)
    assert "dynamic dim 1" in info.value.message and "build.profiles.ids" in info.value.hint
    assert resolve_profiles([TOKENS], {}, {}, 4, {"ids": [4, 128]})["ids"][1] == (4, 128)


@pytest.mark.parametrize(
    "profile,match",
    [
        (ProfileShapes((1, 3, 224), (8, 3, 224), (9, 3, 224)), "rank 3"),
        (ProfileShapes((1, 3, 224, 224), (8, 3, 224, 224), (4, 3, 224, 224)), "min <= opt <= max"),
        (ProfileShapes((1, 1, 224, 224), (8, 1, 224, 224), (9, 1, 224, 224)), "model fixes it to 3"),
        (ProfileShapes((0, 3, 224, 224), (8, 3, 224, 224), (9, 3, 224, 224)), "must be positive"),
    ],
)
def test_bad_profiles(profile, match):
    with pytest.raises(ConfigError, match=match):
        resolve_profiles([X_DYN], {"x": profile}, {}, None)


def test_profile_for_unknown_input():
    with pytest.raises(ConfigError, match="'y', which is not a model input"):
        resolve_profiles([X_DYN], {"y": ProfileShapes(opt=(1,))}, {}, None)


def test_int8_build_without_cache_is_usage_error(tmp_path, sample_model):
    with pytest.raises(UsageError, match="needs a calibration cache"):
        build_engine(sample_model, tmp_path / "m.plan", BuildOptions())
    assert list(tmp_path.iterdir()) == []


def test_build_refuses_to_overwrite_the_model(tmp_path, sample_model):
    with pytest.raises(UsageError, match="refusing"):
        build_engine(sample_model, sample_model, BuildOptions(precision="fp32"))


def test_build_without_tensorrt_is_exit_4_and_writes_nothing(tmp_path, sample_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(EnvironmentMissing) as info:
        build_engine(sample_model, tmp_path / "out" / "m.plan", BuildOptions(precision="fp32"))
    assert info.value.exit_code == 4
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@contextlib.contextmanager
def build_warnings(logger_name: str = "trtq.pipeline.build"):
    """The build logger's (or ``logger_name``'s) warning records, read directly (the CLI tests may have stopped trtq's
    loggers propagating to caplog, and a CLI test run with -q leaves the trtq logger at ERROR)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize(
    "qopts,named",
    [
        (
            {"center_activations": True, "bias_correction": True},
            "quantize.bias_correction, quantize.center_activations",
        ),
        ({}, None),
    ],
)
def test_implicit_build_says_which_quantize_settings_it_ignores(tmp_path, sample_model, monkeypatch, qopts, named):
    from trtq.config import QuantizeOptions

    cache = pytest.importorskip("trtq.calib.cache")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # stops the build right after the warning
    path = tmp_path / "calibration.cache"
    cache.write_cache(path, cache.CalibrationTable("8.6.0", "EntropyCalibration2", {"x": 2.0}), "8.6.0")
    with build_warnings() as records, pytest.raises(EnvironmentMissing):
        build_engine(
            sample_model,
            tmp_path / "m.plan",
            BuildOptions(mode="implicit"),
            cache_path=path,
            quantize_options=QuantizeOptions(**qopts),
        )
    said = [r.getMessage() for r in records if "build.mode implicit" in r.getMessage()]
    assert said[0].split(": ", 1)[1].startswith(named) if named else said == [], said


def test_stale_cache_is_refused_before_tensorrt_is_needed(tmp_path, sample_model, monkeypatch):
    cache = pytest.importorskip("trtq.calib.cache")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # the check must come first
    path = tmp_path / "calibration.cache"
    cache.write_cache(path, cache.CalibrationTable("8.6.0", "MinMaxCalibration", {"x": 2.0}), "8.6.0")
    cache.write_provenance(path, {"model": {"sha256": "0" * 64}, "amax": {"x": 2.0}})
    from trtq.errors import CacheError

    with pytest.raises(CacheError, match="calibrated for a different model"):
        build_engine(sample_model, tmp_path / "m.plan", BuildOptions(), cache_path=path)
    assert not (tmp_path / "m.plan").exists()


def test_conv_kernel_shape_added_for_qdq_weights(tmp_path):
    """TensorRT's parser needs kernel_shape when Conv weights come through DequantizeLinear."""
    import numpy as np
    import onnx

    from tests.trt.models import activation_amax, ort_run, residual_cnn
    from trtq.config import QuantizeOptions
    from trtq.quantize import quantize_model
    from trtq.trt.network import add_conv_kernel_shapes

    path = residual_cnn(tmp_path / "m.onnx", batch=2)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    model = quantize_model(onnx.load(str(path)), activation_amax(path, [{"x": x}]), QuantizeOptions()).model
    onnx.save(model, str(tmp_path / "q.onnx"))
    add_conv_kernel_shapes(model)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2
    for n in convs:
        assert [list(a.ints) for a in n.attribute if a.name == "kernel_shape"] == [[3, 3]]
    onnx.save(model, str(tmp_path / "q2.onnx"))
    assert np.array_equal(ort_run(tmp_path / "q.onnx", {"x": x})["y"], ort_run(tmp_path / "q2.onnx", {"x": x})["y"])
    assert add_conv_kernel_shapes(model) == 0  # idempotent


class _ParserError:
    def __init__(self, desc, node):
        self._desc, self._node = desc, node

    def desc(self):
        return self._desc

    def node(self):
        return self._node


class _Parser:
    def __init__(self, errors):
        self.errors = errors
        self.num_errors = len(errors)

    def get_error(self, i):
        return self.errors[i]


def _one_node_model(opset):
    from onnx import TensorProto, helper

    node = helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery", domain="trtq.test")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "version,opset,hint",
    [
        ("8.6.0", 18, "TensorRT 8.6.0 reads ONNX opset <= 17 and this model is opset 18: re-export with opset 17"),
        ("8.6.0", 13, "TensorRT 8.6.0 reads ONNX opset <= 17; check that every op is supported"),
        ("10.3.0", 18, "check that every op is supported by TensorRT 10.3.0"),
    ],
)
def test_parser_error_names_the_onnx_node(tmp_path, version, opset, hint):
    from tests.trt.fakes import fake_trt
    from trtq.errors import ModelError
    from trtq.trt import compat
    from trtq.trt.network import parser_error

    trt = fake_trt(version)
    parser = _Parser([_ParserError("Plugin not found", 0), _ParserError("second", 0)])
    err = parser_error(trt, parser, compat.make_logger(trt), tmp_path / "m.onnx", _one_node_model(opset))
    assert isinstance(err, ModelError)
    assert err.message == (
        f"TensorRT {version} cannot parse m.onnx at node #0 (NoSuchOp 'mystery'): Plugin not found (+1 more)"
    )
    assert err.hint.startswith(hint)


def _depthwise_pair_model():
    """x -> depthwise 3x3 Conv (group 16) -> Relu -> 1x1 Conv: both convs quantizable."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(16, 1, 3, 3)).astype(np.float32), "wd"),
        numpy_helper.from_array(rng.normal(size=(16, 16, 1, 1)).astype(np.float32), "wp"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "wd"], ["d"], name="dw", group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["d"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "wp"], ["y"], name="pw", kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize(
    "version,excluded,extra",
    [
        ("8.6.0", "dw", ["pw"]),  # measured: wrong engines on TensorRT 8.6.0 unless the consumer is float too
        ("10.3.0", "dw", []),  # not seen there
        ("8.6.0", "pw", []),  # a plain conv left float was fine
    ],
)
def test_float_depthwise_conv_takes_its_consumer_float_on_tensorrt_8(version, excluded, extra):
    from tests.trt.fakes import fake_trt
    from trtq.config import QuantizeOptions
    from trtq.pipeline.quantize import warn_float_grouped_convs
    from trtq.quantize import quantize_model
    from trtq.trt import compat

    trt = fake_trt(version)
    result = quantize_model(
        _depthwise_pair_model(),
        {"x": 3.0, "r": 5.0},
        QuantizeOptions(exclude=(f"^{excluded}$",)),
        float_grouped_consumers=compat.float_grouped_conv_is_unsafe(trt),
    )
    assert ("pw" in dict(result.left_float)) == (excluded == "pw" or bool(extra))
    with build_warnings("trtq.pipeline.quantize") as records:
        assert (warn_float_grouped_convs(version, result) if compat.float_grouped_conv_is_unsafe(trt) else []) == extra
    assert any("also leaving float pw" in r.getMessage() for r in records) == bool(extra)


@pytest.mark.parametrize(
    "excluded,reader,warned",
    [
        ("^(dw|pw)$", "pw", False),  # the float depthwise conv feeds a float conv: the pair that built right
        ("^dw$", "pw", True),  # it feeds an INT8 conv the caller did not leave float: the pair built wrongly
        ("^dw$", "flatten", True),  # a reader the check cannot follow: check the engine
    ],
)
def test_a_float_depthwise_conv_is_flagged_only_where_an_int8_reader_may_follow(excluded, reader, warned):
    """A float depthwise conv whose readers are float layers too (--tune-placement's guided
    candidate leaves such groups float) gets no "check this engine" warning; one feeding an op the
    check cannot follow keeps it."""
    from onnx import helper

    from trtq.config import QuantizeOptions
    from trtq.pipeline.quantize import warn_float_grouped_convs
    from trtq.quantize import quantize_model

    model = _depthwise_pair_model()
    if reader == "flatten":  # relu -> Flatten -> the graph output, instead of the 1x1 conv
        del model.graph.node[-1]
        model.graph.node.append(helper.make_node("Flatten", ["r"], ["y"], name="flat"))
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", 1, None))
    result = quantize_model(model, {"x": 3.0, "r": 5.0}, QuantizeOptions(exclude=(excluded,)))
    with build_warnings("trtq.pipeline.quantize") as records:
        assert warn_float_grouped_convs("8.6.0", result) == []
    assert any("check this engine" in r.getMessage() for r in records) == warned


# ------------------------------------------------------------------------------------------------
# a model that already has Q/DQ nodes: checked before TensorRT is needed
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def qat_model(tmp_path):
    from tests.trt.models import qat_style_cnn

    return qat_style_cnn(tmp_path / "qat.onnx")


def test_qdq_model_needs_no_cache(tmp_path, qat_model, monkeypatch):
    """Without TensorRT the build gets as far as importing it: the Q/DQ model passed every check."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(EnvironmentMissing):
        build_engine(qat_model, tmp_path / "out" / "q.plan", BuildOptions())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options,cache,match",
    [
        (BuildOptions(), True, "already has Q/DQ nodes: its scales come from the model"),
        (BuildOptions(precision="fp16"), False, "builds as INT8 only"),
        (BuildOptions(mode="implicit"), False, "nothing to calibrate"),
    ],
)
def test_qdq_model_refuses_what_cannot_apply(tmp_path, qat_model, options, cache, match):
    cache_path = tmp_path / "c.cache"
    cache_path.write_text("TRT-8600-EntropyCalibration2\nx: 3c010204\n")
    with pytest.raises(UsageError, match=match) as e:
        build_engine(qat_model, tmp_path / "out" / "q.plan", options, cache_path=cache_path if cache else None)
    assert e.value.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_asymmetric_qdq_model_is_invalid_input(tmp_path):
    import numpy as np

    from tests.trt.models import ort_quantize_static, residual_cnn
    from trtq.errors import ModelError

    fp32 = residual_cnn(tmp_path / "fp32.onnx")
    rng = np.random.default_rng(0)
    model = ort_quantize_static(
        fp32, tmp_path / "asym.onnx", [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}], symmetric=False
    )
    with pytest.raises(ModelError, match="zero point") as e:
        build_engine(model, tmp_path / "out" / "a.plan", BuildOptions())
    assert e.value.exit_code == 3 and not (tmp_path / "out").exists()


def test_cli_build_qdq_model_with_cache_is_one_line_exit_2(tmp_path, qat_model, trtq):
    cache = tmp_path / "c.cache"
    cache.write_text("TRT-8600-EntropyCalibration2\nx: 3c010204\n")
    r = trtq(["build", "--model", qat_model, "--cache", cache, "-o", tmp_path / "q.plan"])
    assert r.code == 2, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "already has Q/DQ nodes" in lines[0] and "drop --cache" in lines[0]
    assert not (tmp_path / "q.plan").exists()


def test_explicit_build_reports_what_its_data_steps_did(tmp_path, sample_config, trtq):
    """build runs quantize's data steps itself (quantize.equalize, float layers): their notes go to
    the engine metadata's quantize section (and the build's text), as trtq quantize prints them.
    TensorRT itself is not needed for this part: a stand-in with 8.6's names."""
    import dataclasses

    import onnx

    from tests.trt.fakes import fake_trt
    from trtq.config import QuantizeOptions, load_config
    from trtq.pipeline.build import _quantized_network_model, _read_cache
    from trtq.trt import compat

    cache = tmp_path / "c.cache"
    r = trtq(["calibrate", "--config", sample_config, "--limit", "16", "-o", cache, "-q"])
    assert r.code == 0, r
    cfg = load_config(sample_config)
    data = dataclasses.replace(cfg.data, limit=16)
    trt = fake_trt("8.6.0")
    table, _ = _read_cache(cache, cfg.model, False)

    def summary(options):
        return _quantized_network_model(
            trt, onnx.load(str(cfg.model)), table, compat.plan_build(trt, "int8", "explicit"), options, data, cache
        )[1]

    steps = summary(QuantizeOptions(equalize=True, float_layers=2))["steps"]
    assert [s.split(":")[0].split(" ")[:2] for s in steps] == [["equalized", "channels"], ["float", "layers"]], steps
    plain = summary(QuantizeOptions())
    assert "steps" not in plain and plain["quantized"] > 0


@pytest.mark.parametrize(
    "error",
    [  # first errors of TensorRT 8.6.0 builds (benchmarks/README.md: sixth, thirteenth, fourteenth sessions)
        "2: [pointWiseV2Builder.cpp::toExpr::309] Error Code 2: Internal Error "
        "(Assertion outScales.size() == 1 failed. )",
        "2: [graphOptimizer.cpp::binaryExprCount::...] Error Code 2: Internal Error "
        "(Assertion x == y || x == 1 || y == 1 failed. )",
    ],
)
def test_an_internal_assertion_points_at_the_graph_not_the_workspace(error):
    from trtq.trt.build import build_failure_hint

    hint = build_failure_hint(error)
    assert "workspace" not in hint and "--exclude" in hint and "-v" in hint


def test_other_build_failures_keep_the_workspace_hint():
    from trtq.trt.build import build_failure_hint

    hint = build_failure_hint(
        "10: [optimizer.cpp::computeCosts::3873] Error Code 10: Internal Error "
        "(Could not find any implementation for node conv.)"
    )
    assert "--workspace-mb" in hint
