"""trtq's TensorRT uses and the fakes, checked against the real 8.6.0 / 10.x / 11.4 Python bindings.

Each ``*_conformance`` test has one case per supported version; a case skips when its binding is
not in the cache (``python scripts/fetch_trt_bindings.py``). The binding is imported on stub
libraries in a subprocess (tests/trt/binding_harness.py) and described; the static scan of
``trtq/trt/`` (tests/trt/binding_scan.py) lists every TensorRT name, call and enum member trtq
uses, and tests/trt/binding_check.py checks them against that description.
"""

import json

import pytest

from tests.trt import binding_harness as harness
from tests.trt.binding_check import Surface, check
from tests.trt.binding_exercise import exercise
from tests.trt.binding_scan import scan_package
from tests.trt.fakes import fake_trt, snapshots
from tests.trt.surface_snapshot import fake_extras, fake_surface

REPO = harness.REPO


@pytest.fixture(scope="module")
def scanned():
    return scan_package(REPO / "trtq" / "trt", outside=REPO / "trtq")


def _described(case):
    why = harness.skip_reason(case)
    if why:
        pytest.skip(why)
    return harness.describe(case)


def _decision_problems(doc):
    """Recipes that failed on the real module other than with trtq's own UsageError."""
    out = []
    for key, r in sorted(doc["exercised"]["recipes"].items()):
        if "error" in r and r["error"] != "UsageError":
            out.append(f"plan_build {key} on the real module: {r['error']}: {r['message']}")
    return out


@pytest.mark.parametrize("case", harness.CASES)
def test_tensorrt_uses_conformance(case, scanned):
    """Every TensorRT name, call signature and enum member trtq/trt uses exists in the binding and
    takes what trtq passes (in the versions the use applies to)."""
    doc = _described(case)
    report = check(scanned.uses, Surface(doc))
    problems = [f"unseen: {u}" for u in scanned.unseen] + report.problems + _decision_problems(doc)
    assert not problems, report.summary() + "\n" + "\n".join(problems)
    assert len(report.names) > 40 and len(report.calls) > 30, report.summary()
    print(report.summary())


@pytest.mark.parametrize("case", harness.CASES)
def test_stub_libraries_conformance(case, tmp_path):
    """The stubs export exactly the TensorRT symbols the binding imports, one library per NEEDED."""
    _described(case)
    b = harness.find_binding(case)
    plan = harness.build_stubs(b.so, tmp_path)
    trt_needed = [lib for lib in harness.needed(b.so) if not harness.SYSTEM_LIBS.match(lib)]
    assert sorted(plan) == sorted(trt_needed)
    assert any(plan.values())
    for lib, names in plan.items():
        assert harness.exported(tmp_path / lib) == names, lib
    assert "createInferBuilder_INTERNAL" in plan[next(x for x in plan if x.startswith("libnvinfer.so"))]


@pytest.mark.parametrize("case", harness.CASES)
def test_fakes_conformance(case):
    """The committed snapshot the fakes are made from is the binding's; the fakes offer nothing the
    binding lacks; and trtq's decisions come out the same on the fake and on the real module."""
    doc = _described(case)
    live = fake_surface(doc)
    major = int(doc["version"].split(".")[0])
    committed = snapshots().get(major)
    assert committed is not None, (
        f"no committed snapshot for TensorRT {major}.x: run python -m tests.trt.binding_harness --write-snapshots"
    )
    fake = fake_trt(doc["version"])
    assert fake_extras(fake, live) == []
    if committed["version"] == doc["version"]:
        assert committed == json.loads(json.dumps(live)), "snapshot differs from the binding: rewrite it"
    real = doc["exercised"]
    mine = json.loads(json.dumps(exercise(fake)))
    keys = [
        "predicates",
        "recipes",
        "recipe_fields",
        "tactic_sources",
        "tactic_masks",
        "tactic_unknown",
        "dtypes",
        "severities",
        "logger",
        "centring",
    ]
    if isinstance(real["calibrators"], dict):
        keys.append("calibrators")  # the binding's Python has numpy
    for key in keys:
        assert mine[key] == real[key], key


def test_fakes_hold_only_snapshot_names():
    """Without any binding: each fake offers only what its committed snapshot says the binding has."""
    snaps = snapshots()
    assert sorted(snaps) == [8, 10, 11]
    for snap in snaps.values():
        assert fake_extras(fake_trt(snap["version"]), snap) == []


def test_fake_check_finds_what_a_binding_lacks():
    snap = json.loads(json.dumps(snapshots()[11]))
    fake = fake_trt("11.4.0", snap)
    fake.BuilderFlag.INT8 = None  # a member 11 removed, as a hand-written fake might keep it
    fake.BuilderFlag.__members__ = dict(fake.BuilderFlag.__members__, INT8=type("M", (), {"__int__": lambda s: 1})())
    fake.IInt8Calibrator = object
    snap["enums"]["TacticSource"]["JIT_CONVOLUTIONS"] = 7
    snap["members"]["IBuilderConfig"]["set_flag"] = False
    found = fake_extras(fake, snap)
    assert "BuilderFlag.INT8: not a member in the binding" in found
    assert "trt.IInt8Calibrator: not in the binding" in found
    assert "TacticSource.JIT_CONVOLUTIONS: value 1, the binding's is 7" in found
    assert "IBuilderConfig.set_flag: not in the binding" in found


def _from_module(t):
    """The symbolic type starts at the tensorrt module (not at a conventional name)."""
    while t and t[0] in ("attr", "call"):
        t = t[1]
    if t and t[0] == "union":
        return any(_from_module(x) for x in t[1])
    return t == ("mod",)


def test_no_tensorrt_uses_outside_trtq_trt():
    """Only trtq/trt touches TensorRT names (the other packages hand the module to compat)."""
    folders = [REPO / "trtq"] + sorted(
        p for p in (REPO / "trtq").iterdir() if p.is_dir() and p.name not in ("trt", "__pycache__")
    )
    seen = 0
    for folder in folders:
        package = "trtq" if folder.name == "trtq" else f"trtq.{folder.name}"
        result = scan_package(folder, package)
        seen += len(result.functions)
        touching = [u.label() for u in result.uses if _from_module(u.recv)]
        assert touching == [], package
    assert seen > 200  # the scan read the other packages


def test_dtype_names_are_real_datatype_members():
    """compat's DataType table names only members some supported binding has (from the committed
    snapshots, so this runs without the bindings)."""
    from trtq.trt import compat

    real = set().union(*(snap["enums"]["DataType"] for snap in snapshots().values()))
    assert sorted(set(compat._DTYPES) - real) == []
