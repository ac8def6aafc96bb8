"""Small stand-ins for the ``tensorrt`` module of each major version, made from the real bindings.

TensorRT 10 and 11 cannot run on the CI machine, so the compatibility decisions are checked
against objects that have exactly the names and enum values of each version's real Python
binding. Those come from ``tests/trt/surfaces/<version>.json``: the part of the binding surface
that the fakes imitate (``surface_snapshot.FAKED``), extracted by ``surface_snapshot.fake_surface``
from the introspection of the real binding (tests/trt/binding_harness.py). tests/trt/test_binding_conformance.py checks
that each snapshot equals the live introspection (when the binding is in the cache) and that no
fake offers a name, method or enum member its version's binding lacks.

The 10.x fake is the newest 10.x binding's surface (the version strings tests pass, such as
"10.3.0", only name the version in messages).
"""

import json
from types import SimpleNamespace
from typing import Optional

from tests.trt.surface_snapshot import FAKED, SURFACES, fake_surface  # noqa: F401  (FAKED, fake_surface: API)

CALIBRATORS = ("IInt8EntropyCalibrator2", "IInt8MinMaxCalibrator", "IInt8EntropyCalibrator", "IInt8LegacyCalibrator")


def snapshots() -> dict:
    """major version -> the committed snapshot of that major's binding."""
    out = {}
    for path in sorted(SURFACES.glob("*.json")):
        snap = json.loads(path.read_text(encoding="utf-8"))
        out[int(snap["version"].split(".")[0])] = snap
    return out


def snapshot_for(version: str) -> dict:
    major = int(str(version).split(".")[0])
    snaps = snapshots()
    if major not in snaps:
        raise KeyError(f"no binding snapshot for TensorRT {major}.x in {SURFACES}")
    return snaps[major]


class Member:
    def __init__(self, enum_name: str, name: str, value: int):
        self.name, self.value, self._enum = name, value, enum_name

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"{self._enum}.{self.name}"


def make_enum(enum_name: str, values: dict) -> type:
    short = enum_name.split(".")[-1]
    members = {n: Member(short, n, v) for n, v in values.items()}
    cls = type(short, (), dict(members))
    cls.__members__ = dict(members)
    return cls


_SEVERITY = snapshot_for(8)["enums"]["ILogger.Severity"]


class FakeILogger:
    """``trt.ILogger``: the severities (ILogger.ERROR ...) and a base ``__init__``."""

    Severity = make_enum("ILogger.Severity", _SEVERITY)

    def __init__(self):
        self.base_initialised = True


for _name, _member in FakeILogger.Severity.__members__.items():
    setattr(FakeILogger, _name, _member)  # exported like the binding's ILogger.ERROR


class _Calibrator:
    def __init__(self):
        self.base_initialised = True


def fake_trt(version: str, snapshot: Optional[dict] = None) -> SimpleNamespace:
    """A stand-in for ``tensorrt`` of ``version``'s major: enums with the real members and values,
    ``IBuilderConfig`` with the real subset of :data:`FAKED`'s members, the calibrator classes
    where the binding has them."""
    snap = snapshot or snapshot_for(version)
    trt = SimpleNamespace(__version__=version, ILogger=FakeILogger)
    for name, values in snap["enums"].items():
        if "." not in name:
            setattr(trt, name, make_enum(name, values))
    has = snap["members"]["IBuilderConfig"]
    placeholders = {
        "builder_optimization_level": 3,
        "set_memory_pool_limit": lambda self, *a: None,
        "int8_calibrator": None,
        "set_calibration_profile": lambda self, p: None,
    }
    trt.IBuilderConfig = type("IBuilderConfig", (), {k: v for k, v in placeholders.items() if has.get(k)})
    if snap["module"].get("IInt8Calibrator"):
        trt.IInt8Calibrator = type("IInt8Calibrator", (_Calibrator,), {})
        for name in CALIBRATORS:
            if snap["module"].get(name):
                setattr(trt, name, type(name, (trt.IInt8Calibrator,), {}))
    return trt


class RecordingConfig:
    """An IBuilderConfig stand-in recording what the compat layer sets on it."""

    RECORDS = ("calls", "flags", "timing_cache")  # the fake's own record, not TensorRT names

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
    """``ITimingCache`` stand-in: ``data`` is the fake's own record."""

    RECORDS = ("data",)

    def __init__(self, data):
        self.data = data

    def serialize(self):
        return b"HEADER" + self.data
