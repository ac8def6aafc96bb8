"""Small stand-ins for the ``tensorrt`` module of each major version (attribute sets only).

TensorRT 10 and 11 cannot run on the CI machine, so the compatibility decisions are checked
against objects that have exactly the names each version documents. Member *values* are set as
in the real releases where they matter (NetworkDefinitionCreationFlag: EXPLICIT_BATCH=0 and
STRONGLY_TYPED=1 in 10.x, STRONGLY_TYPED=0 in 11.x) so tests notice a decision made on values.
"""
from types import SimpleNamespace
from typing import Optional


class Member:
    def __init__(self, enum_name: str, name: str, value: int):
        self.name, self.value, self._enum = name, value, enum_name

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"{self._enum}.{self.name}"


def make_enum(enum_name: str, names: list[str], values: Optional[dict[str, int]] = None) -> type:
    members = {n: Member(enum_name, n, (values or {}).get(n, i)) for i, n in enumerate(names)}
    cls = type(enum_name, (), dict(members))
    cls.__members__ = dict(members)
    return cls


class FakeILogger:
    INTERNAL_ERROR = Member("Severity", "INTERNAL_ERROR", 0)
    ERROR = Member("Severity", "ERROR", 1)
    WARNING = Member("Severity", "WARNING", 2)
    INFO = Member("Severity", "INFO", 3)
    VERBOSE = Member("Severity", "VERBOSE", 4)

    def __init__(self):
        self.base_initialised = True


class _Calibrator:
    def __init__(self):
        self.base_initialised = True


def fake_trt(version: str) -> SimpleNamespace:
    major = int(version.split(".")[0])
    trt = SimpleNamespace(__version__=version, ILogger=FakeILogger)
    tactics = ["CUBLAS", "CUBLAS_LT", "CUDNN", "EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS"]
    if major <= 8:
        trt.NetworkDefinitionCreationFlag = make_enum(
            "NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "EXPLICIT_PRECISION"])
        flags = ["FP16", "INT8", "DEBUG", "GPU_FALLBACK", "STRICT_TYPES", "REFIT", "TF32", "FP8"]
    elif major == 10:
        trt.NetworkDefinitionCreationFlag = make_enum(
            "NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED"],
            {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1})
        flags = ["FP16", "INT8", "DEBUG", "GPU_FALLBACK", "REFIT", "TF32", "BF16", "FP8"]
    else:
        trt.NetworkDefinitionCreationFlag = make_enum(
            "NetworkDefinitionCreationFlag", ["STRONGLY_TYPED"], {"STRONGLY_TYPED": 0})
        flags = ["DEBUG", "GPU_FALLBACK", "REFIT", "TF32"]
        tactics = ["EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS"]
    trt.BuilderFlag = make_enum("BuilderFlag", flags)
    trt.TacticSource = make_enum("TacticSource", tactics)
    trt.MemoryPoolType = make_enum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM"])
    trt.TensorIOMode = make_enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    trt.DataType = make_enum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "BF16", "INT64"])

    config_attrs = {"builder_optimization_level": 3, "set_memory_pool_limit": lambda self, *a: None}
    if major <= 10:
        config_attrs.update(int8_calibrator=None, set_calibration_profile=lambda self, p: None)
        trt.IInt8Calibrator = type("IInt8Calibrator", (_Calibrator,), {})
        for name in ("IInt8EntropyCalibrator2", "IInt8MinMaxCalibrator", "IInt8EntropyCalibrator",
                     "IInt8LegacyCalibrator"):
            setattr(trt, name, type(name, (trt.IInt8Calibrator,), {}))
    trt.IBuilderConfig = type("IBuilderConfig", (), config_attrs)
    return trt


class RecordingConfig:
    """An IBuilderConfig stand-in recording what the compat layer sets on it."""

    def __init__(self, timing_accepts=True, timing_raises=False, has_level=True, timing_ignores=False):
        self.calls = []
        self.flags = []
        self._timing_accepts = timing_accepts
        self._timing_raises = timing_raises
        self._timing_ignores = timing_ignores  # TensorRT 8.6: garbage in, empty cache out
        if has_level:
            self.builder_optimization_level = 3
        self.timing_cache = None

    def set_flag(self, flag):
        self.flags.append(flag.name)

    def set_memory_pool_limit(self, pool, nbytes):
        self.calls.append(("pool", pool.name, nbytes))

    def create_timing_cache(self, data):
        if data and self._timing_raises:
            raise RuntimeError("corrupt timing cache")
        return FakeTimingCache(b"" if self._timing_ignores else bytes(data))

    def set_timing_cache(self, cache, ignore_mismatch):
        self.calls.append(("timing", cache.data, ignore_mismatch))
        if cache.data and not self._timing_accepts:
            return False
        self.timing_cache = cache
        return True


class FakeTimingCache:
    def __init__(self, data):
        self.data = data

    def serialize(self):
        return b"HEADER" + self.data
