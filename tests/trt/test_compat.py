"""TensorRT 8.6 / 10 / 11 decisions of trtq.trt.compat, checked against per-version stand-ins."""

import subprocess
import sys
import types

import pytest

from tests.trt.fakes import FakeILogger, Member, RecordingConfig, fake_trt
from trtq.errors import ConfigError, EnvironmentMissing, UsageError
from trtq.trt import compat

TRT86, TRT10, TRT11 = fake_trt("8.6.0"), fake_trt("10.3.0.26"), fake_trt("11.4.0")


# -- versions and imports ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("8.6.0", (8, 6, 0)),
        ("10.3.0.26", (10, 3, 0)),
        ("11.4", (11, 4, 0)),
        (" 8.6.1.6 ", (8, 6, 1)),
    ],
)
def test_version_parse(text, expected):
    v = compat.TrtVersion.parse(text)
    assert (v.major, v.minor, v.patch) == expected
    assert str(v) == ".".join(str(p) for p in expected)


def test_version_parse_rejects_garbage():
    with pytest.raises(ConfigError, match="not a TensorRT version"):
        compat.TrtVersion.parse("latest")


def test_versions_order():
    assert compat.TrtVersion.parse("8.6.1") < compat.TrtVersion.parse("10.0.0") < compat.TrtVersion.parse("11.0")


def test_missing_tensorrt_is_exit_4(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` raise ImportError
    with pytest.raises(EnvironmentMissing) as info:
        compat.import_tensorrt()
    assert info.value.exit_code == 4
    assert "pip install tensorrt cuda-python" in str(info.value)


def test_unloadable_tensorrt_is_exit_4():
    def importer(name):
        raise OSError("libnvinfer.so.8: cannot open shared object file")

    with pytest.raises(EnvironmentMissing, match="cannot be loaded.*libnvinfer"):
        compat.import_tensorrt(importer)


def test_cudart_prefers_cuda_bindings():
    mods = {"cuda.bindings.runtime": types.ModuleType("runtime"), "cuda.cudart": types.ModuleType("cudart")}
    assert compat.import_cudart(lambda n: mods[n]) is mods["cuda.bindings.runtime"]


def test_cudart_falls_back_to_cuda_cudart():
    legacy = types.ModuleType("cudart")

    def importer(name):
        if name == "cuda.bindings.runtime":
            raise ModuleNotFoundError("No module named 'cuda.bindings'")
        return legacy

    assert compat.import_cudart(importer) is legacy


def test_cudriver_prefers_cuda_bindings_and_falls_back():
    mods = {"cuda.bindings.driver": types.ModuleType("driver"), "cuda.cuda": types.ModuleType("cuda")}
    assert compat.import_cudriver(lambda n: mods[n]) is mods["cuda.bindings.driver"]

    def importer(name):
        if name == "cuda.bindings.driver":
            raise ModuleNotFoundError("No module named 'cuda.bindings'")
        return mods[name]

    assert compat.import_cudriver(importer) is mods["cuda.cuda"]


def test_missing_cuda_python_is_exit_4(monkeypatch):
    # every module import_cudart tries, also where cuda-python is installed and imported already
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(EnvironmentMissing) as info:
        compat.import_cudart()
    assert info.value.exit_code == 4 and "cuda-python" in info.value.message


def test_trt_modules_import_without_tensorrt():
    code = (
        "import sys; sys.modules['tensorrt'] = None; sys.modules['cuda'] = None\n"
        "import trtq.trt, trtq.trt.compat, trtq.trt.build, trtq.trt.calibrator, trtq.trt.runtime, "
        "trtq.trt.bench, trtq.trt.cuda, trtq.trt.metadata\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- capabilities ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trt,weak,implicit,strong_flag,explicit_batch",
    [
        (TRT86, True, True, False, True),
        (TRT10, True, True, True, False),
        (TRT11, False, False, True, False),
    ],
)
def test_capabilities(trt, weak, implicit, strong_flag, explicit_batch):
    assert compat.has_weak_typing(trt) is weak
    assert compat.has_implicit_int8(trt) is implicit
    assert compat.can_request_strong_typing(trt) is strong_flag
    assert compat.needs_explicit_batch_flag(trt) is explicit_batch


def test_enum_names_lists_members():
    assert compat.enum_names(TRT11.TacticSource) == ["EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS"]


# -- build recipes -----------------------------------------------------------------------------


def test_recipe_86_explicit_int8_uses_int8_flag_and_explicit_batch():
    r = compat.plan_build(TRT86, "int8", "explicit", fp16=True)
    assert r.creation_flags == ("EXPLICIT_BATCH",)
    assert r.builder_flags == ("INT8", "FP16")
    assert r.quantize and not r.strongly_typed and not r.quantizer_fp16 and not r.calibrator


def test_recipe_10_explicit_int8_is_strongly_typed_without_precision_flags():
    r = compat.plan_build(TRT10, "int8", "explicit", fp16=True)
    assert r.creation_flags == ("STRONGLY_TYPED",)
    assert r.builder_flags == ()
    assert r.strongly_typed and r.quantize
    assert r.quantizer_fp16  # FP16 for the float rest has to come from the ONNX


def test_recipe_11_explicit_int8_needs_no_flags():
    r = compat.plan_build(TRT11, "int8", "explicit", fp16=False)
    assert r.creation_flags == () and r.builder_flags == ()
    assert r.strongly_typed and r.quantize and not r.quantizer_fp16


@pytest.mark.parametrize("trt,creation", [(TRT86, ("EXPLICIT_BATCH",)), (TRT10, ())])
def test_recipe_implicit_int8_uses_calibrator(trt, creation):
    r = compat.plan_build(trt, "int8", "implicit", fp16=False)
    assert r.calibrator and not r.quantize and not r.strongly_typed
    assert r.builder_flags == ("INT8",)
    assert r.creation_flags == creation


def test_recipe_implicit_on_11_is_a_clear_error():
    with pytest.raises(UsageError) as info:
        compat.plan_build(TRT11, "int8", "implicit")
    assert "11.4.0" in info.value.message and "--mode explicit" in info.value.hint


@pytest.mark.parametrize("trt", [TRT86, TRT10])
def test_recipe_fp16_uses_flag_before_11(trt):
    assert compat.plan_build(trt, "fp16").builder_flags == ("FP16",)


def test_recipe_fp16_on_11_explains_strong_typing():
    with pytest.raises(UsageError, match="no FP16 builder flag"):
        compat.plan_build(TRT11, "fp16")


@pytest.mark.parametrize("trt,strong", [(TRT86, False), (TRT10, False), (TRT11, True)])
def test_recipe_fp32(trt, strong):
    r = compat.plan_build(trt, "fp32")
    assert r.builder_flags == () and not r.quantize and r.strongly_typed is strong


@pytest.mark.parametrize("trt,flags,cast", [(TRT86, ("FP16",), False), (TRT10, ("FP16",), False), (TRT11, (), True)])
def test_float_reference_recipe(trt, flags, cast):
    # build --tune-placement's FP16 reference: the FP16 flag where it exists, an FP16-cast model on 11
    recipe, needs_cast = compat.float_reference_recipe(trt)
    assert recipe.builder_flags == flags and needs_cast is cast
    assert not recipe.quantize and not recipe.calibrator and recipe.strongly_typed is cast


def test_recipe_rejects_unknown_values():
    with pytest.raises(ConfigError):
        compat.plan_build(TRT86, "int4")
    with pytest.raises(ConfigError):
        compat.plan_build(TRT86, "int8", "sideways")


# -- masks come from the installed enum's members ---------------------------------------------


def test_creation_mask_uses_each_versions_bit():
    assert compat.creation_mask(TRT86, ["EXPLICIT_BATCH"]) == 1
    assert compat.creation_mask(TRT10, ["STRONGLY_TYPED"]) == 2  # value 1 in 10.x
    assert compat.creation_mask(TRT11, ["STRONGLY_TYPED"]) == 1  # renumbered to 0 in 11.x
    assert compat.creation_mask(TRT10, []) == 0


def test_tactic_source_mask_by_name():
    mask = compat.tactic_source_mask(TRT86, ["edge_mask_convolutions", " JIT_CONVOLUTIONS"])
    assert mask == (1 << 3) | (1 << 4)
    assert compat.tactic_source_mask(TRT11, ["JIT_CONVOLUTIONS"]) == 1 << 1


def test_tactic_source_unknown_name_lists_choices():
    with pytest.raises(ConfigError) as info:
        compat.tactic_source_mask(TRT11, ["CUDNN"])
    assert "CUDNN" in info.value.message and "11.4.0" in info.value.message
    assert "EDGE_MASK_CONVOLUTIONS, JIT_CONVOLUTIONS" in info.value.hint


def test_builder_flags_set_by_name():
    cfg = RecordingConfig()
    compat.set_builder_flags(TRT86, cfg, ("INT8", "FP16"))
    assert cfg.flags == ["INT8", "FP16"]


# -- config settings ---------------------------------------------------------------------------


def test_workspace_uses_memory_pool_limit():
    cfg = RecordingConfig()
    compat.set_workspace(TRT86, cfg, 512)
    assert cfg.calls == [("pool", "WORKSPACE", 512 * 1024 * 1024)]
    with pytest.raises(ConfigError):
        compat.set_workspace(TRT86, cfg, 0)


def test_optimization_level():
    cfg = RecordingConfig()
    assert compat.set_optimization_level(cfg, 0) is True and cfg.builder_optimization_level == 0
    assert compat.set_optimization_level(RecordingConfig(has_level=False), 1) is False
    with pytest.raises(ConfigError, match="0..5"):
        compat.set_optimization_level(cfg, 6)


def test_calibration_profile_only_where_it_exists():
    calls = []

    class Cfg:
        def set_calibration_profile(self, p):
            calls.append(p)

    assert compat.set_calibration_profile(Cfg(), "p") is True and calls == ["p"]
    assert compat.set_calibration_profile(object(), "p") is False


def test_timing_cache_good_data_is_used():
    cfg = RecordingConfig()
    cache, usable, why = compat.load_timing_cache(cfg, b"TIMING")
    assert usable and why == "" and cfg.timing_cache.data == b"TIMING"


@pytest.mark.parametrize(
    "cfg,why",
    [
        (RecordingConfig(timing_raises=True), "cannot read it (corrupt timing cache)"),  # TensorRT raises
        (RecordingConfig(timing_accepts=False), "another TensorRT version or GPU"),  # set_timing_cache refuses
        (RecordingConfig(timing_ignores=True), "loaded nothing"),  # accepted, nothing loaded (8.6 + garbage)
    ],
)
def test_timing_cache_corrupt_or_foreign_gives_fresh_cache(cfg, why):
    cache, usable, reason = compat.load_timing_cache(cfg, b"\x00garbage")
    assert not usable and why in reason
    assert cfg.timing_cache.data == b""  # an empty cache is attached instead


def test_timing_cache_rejected_when_tensorrt_logs_an_error():
    cfg = RecordingConfig()
    logger = compat.make_logger(TRT86)
    real_create = cfg.create_timing_cache

    def create(data):
        if data:
            logger.log(FakeILogger.ERROR, "timing cache is corrupted")
        return real_create(data)

    cfg.create_timing_cache = create
    _, usable, reason = compat.load_timing_cache(cfg, b"TIMING", logger)
    assert not usable and cfg.timing_cache.data == b""
    assert reason == "TensorRT refused it: timing cache is corrupted"
    assert logger.errors == []  # not left behind to be reported as a build error


def test_timing_cache_absent():
    cfg = RecordingConfig()
    _, usable, _ = compat.load_timing_cache(cfg, None)
    assert not usable and cfg.timing_cache.data == b""


# -- I/O tensors -------------------------------------------------------------------------------


def test_dtype_names():
    dt = TRT86.DataType
    assert compat.dtype_name(dt.FLOAT) == "float32"
    assert compat.dtype_name(dt.HALF) == "float16"
    assert compat.dtype_name(dt.INT8) == "int8"
    assert compat.dtype_name(dt.FP8) == "trt:FP8"
    assert not hasattr(dt, "BF16")  # TensorRT 8.6.0's DataType has no BF16 (10.x has)
    assert compat.dtype_name(TRT10.DataType.BF16) == "trt:BF16"


def test_io_tensors_from_name_api():
    trt = TRT86

    class Engine:
        num_io_tensors = 2
        _t = {
            "x": (trt.TensorIOMode.INPUT, (-1, 3, 8, 8), trt.DataType.FLOAT),
            "y": (trt.TensorIOMode.OUTPUT, (-1, 4), trt.DataType.HALF),
        }

        def get_tensor_name(self, i):
            return ["x", "y"][i]

        def get_tensor_mode(self, n):
            return self._t[n][0]

        def get_tensor_shape(self, n):
            return self._t[n][1]

        def get_tensor_dtype(self, n):
            return self._t[n][2]

    io = compat.io_tensors(trt, Engine())
    assert [(t.name, t.is_input, t.shape, t.dtype) for t in io] == [
        ("x", True, (-1, 3, 8, 8), "float32"),
        ("y", False, (-1, 4), "float16"),
    ]


# -- logger ------------------------------------------------------------------------------------


def test_logger_keeps_errors_by_severity_name():
    logger = compat.make_logger(TRT86)
    assert isinstance(logger, FakeILogger) and logger.base_initialised
    logger.log(FakeILogger.ERROR, "parse failed")
    logger.log(FakeILogger.WARNING, "missing scale")
    logger.log(FakeILogger.INFO, "hello")
    logger.log(Member("Severity", "INTERNAL_ERROR", 7), "assertion")  # value irrelevant
    assert logger.errors == ["parse failed", "assertion"]
    assert logger.warnings == ["missing scale"]
    assert logger.take_errors() == ["parse failed", "assertion"] and logger.errors == []


def test_centring_is_on_in_engines_only_where_measured():
    """8.6: measured exact and free in engine form; other versions: not measured, and say why."""
    assert compat.centring_in_engines(TRT86) is None
    for trt in (TRT10, TRT11):
        why = compat.centring_in_engines(trt)
        assert why.startswith(f"centred engines have not been measured on TensorRT {compat.version_of(trt)}")


def test_a_signal_inside_the_logger_callback_does_not_raise_into_tensorrt(monkeypatch):
    """Ctrl-C handled while TensorRT calls the logger from C++ (a build): on TensorRT 8.6.0 the
    KeyboardInterrupt crossed into TensorRT, which printed pybind11's traceback and built on. The
    logger keeps it out; the recorded signal is raised once the TensorRT call returns."""
    import signal

    from trtq import interrupt

    class Interrupting:  # the signal handler runs in the middle of the callback's logging call
        def info(self, *args):
            interrupt.request(signal.SIGINT)
            raise KeyboardInterrupt

        debug = info

    logger = compat.make_logger(TRT86)
    monkeypatch.setattr(compat, "log", Interrupting())
    interrupt.reset()
    try:
        logger.log(FakeILogger.WARNING, "some TensorRT warning")  # must not raise
        assert logger.warnings == ["some TensorRT warning"]
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()  # what trt.build does when build_serialized_network returns
    finally:
        interrupt.reset()
