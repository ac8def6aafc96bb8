"""The part of a binding surface the fakes of :mod:`tests.trt.fakes` are made from.

``tests/trt/surfaces/<version>.json`` holds it per version; ``python -m tests.trt.binding_harness
--write-snapshots`` writes it from the cached real bindings.
"""

from pathlib import Path

SURFACES = Path(__file__).with_name("surfaces")

# what the fakes imitate: the enums (all members, real values), module names, and class members
FAKED = {
    "enums": (
        "NetworkDefinitionCreationFlag",
        "BuilderFlag",
        "TacticSource",
        "MemoryPoolType",
        "TensorIOMode",
        "DataType",
        "ILogger.Severity",
    ),
    "module": (
        "ILogger",
        "IBuilderConfig",
        "ITimingCache",
        "IInt8Calibrator",
        "IInt8EntropyCalibrator2",
        "IInt8MinMaxCalibrator",
        "IInt8EntropyCalibrator",
        "IInt8LegacyCalibrator",
    ),
    "members": {
        "IBuilderConfig": (
            "builder_optimization_level",
            "set_memory_pool_limit",
            "int8_calibrator",
            "set_calibration_profile",
            "set_flag",
            "create_timing_cache",
            "set_timing_cache",
        ),
        "ITimingCache": ("serialize",),
        "ILogger": ("INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE", "Severity", "log"),
    },
}


def fake_surface(doc: dict) -> dict:
    """The :data:`FAKED` part of an introspected binding (binding_introspect's JSON)."""
    module = doc["module"]

    def cls(path):
        parts = path.split(".")
        e = module.get(parts[0])
        for p in parts[1:]:
            e = (e or {}).get("members", {}).get(p)
        return e if e and e.get("kind") == "class" else None

    return {
        "version": doc["version"],
        "enums": {
            name: dict(sorted(cls(name)["enum"].items()))
            for name in FAKED["enums"]
            if cls(name) and "enum" in cls(name)
        },
        "module": {name: name in module for name in FAKED["module"]},
        "members": {
            c: {m: bool(cls(c)) and m in cls(c)["members"] for m in names} for c, names in FAKED["members"].items()
        },
    }


def fake_extras(trt, snap: dict) -> list:
    """What the fake module ``trt`` (and the fake classes of tests.trt.fakes) offers that the
    binding described by ``snap`` (a :func:`fake_surface`) lacks, or that :data:`FAKED` does not
    cover (so it could not be checked); [] when the fakes are true to the binding."""
    from tests.trt import fakes

    out = []
    enums, module, members = snap["enums"], snap["module"], snap["members"]

    def enum_check(label, cls, real):
        if real is None:
            out.append(f"{label}: the binding has no such enum")
            return
        got = {n: int(m) for n, m in getattr(cls, "__members__", {}).items()}
        for n, v in sorted(got.items()):
            if n not in real:
                out.append(f"{label}.{n}: not a member in the binding")
            elif real[n] != v:
                out.append(f"{label}.{n}: value {v}, the binding's is {real[n]}")

    def public(obj):
        return sorted(
            n for n in vars(obj) if not n.startswith("_") and n != "RECORDS" and n not in getattr(obj, "RECORDS", ())
        )

    for name, value in sorted(vars(trt).items()):
        if name == "__version__":
            continue
        if name in FAKED["enums"]:
            enum_check(name, value, enums.get(name))
        elif name in FAKED["module"]:
            if not module.get(name):
                out.append(f"trt.{name}: not in the binding")
        else:
            out.append(f"trt.{name}: not covered by FAKED")
    config = getattr(trt, "IBuilderConfig", None)
    recording = fakes.RecordingConfig()
    for label, objs, real in (
        ("IBuilderConfig", [config, fakes.RecordingConfig, recording], members["IBuilderConfig"]),
        ("ITimingCache", [fakes.FakeTimingCache, fakes.FakeTimingCache(b"")], members["ITimingCache"]),
        ("ILogger", [fakes.FakeILogger], members["ILogger"]),
    ):
        for obj in objs:
            if obj is None:
                continue
            for n in public(obj):
                if n not in real:
                    out.append(
                        f"{label}.{n} ({type(obj).__name__ if not isinstance(obj, type) else obj.__name__}): "
                        "not covered by FAKED"
                    )
                elif not real[n]:
                    out.append(f"{label}.{n}: not in the binding")
    enum_check("ILogger.Severity", fakes.FakeILogger.Severity, enums.get("ILogger.Severity"))
    return sorted(set(out))
