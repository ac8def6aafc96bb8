"""The model zoo: the files scripts/export_zoo.py wrote into .zoo/ (or $TRTQ_ZOO), one test case
per file of its manifest. Without a zoo every zoo test skips with one reason; files outside the
manifest's fast subset are marked slow (``-m "not slow"`` leaves them out)."""

from __future__ import annotations

import pytest

from tests.zoo import zoo_steps

ZOO = zoo_steps.zoo_dir()  # read at import: tests/conftest.py hides TRTQ_* from the tests themselves
MANIFEST = zoo_steps.load_manifest(ZOO)
NO_ZOO = (
    f"no model zoo in {ZOO} (make one with scripts/zoo_env.sh, or scripts/export_zoo.py in a torch "
    "environment; TRTQ_ZOO names another folder)"
)


def _params(entries):
    return [
        pytest.param(e, id=zoo_steps.case_id(e), marks=() if e.get("fast") else (pytest.mark.slow,)) for e in entries
    ]


def pytest_generate_tests(metafunc):
    for name, pick in (
        ("zoo_entry", lambda e: True),
        ("zoo_flagged_entry", lambda e: zoo_steps.explicit_task_args(e) is not None),
    ):
        if name not in metafunc.fixturenames:
            continue
        if MANIFEST is None:
            metafunc.parametrize(name, [pytest.param(None, id="no-zoo", marks=pytest.mark.skip(reason=NO_ZOO))])
        else:
            metafunc.parametrize(name, _params([e for e in MANIFEST["models"] if pick(e)]))


_RESULTS: dict[str, zoo_steps.CaseResult] = {}


def _case(entry, trtq, tmp_path_factory) -> zoo_steps.CaseResult:
    """calibrate -> quantize -> compare of one zoo file, run once per session and shared by the
    tests that check its parts."""
    key = entry["file"]
    if key not in _RESULTS:
        work = tmp_path_factory.mktemp(zoo_steps.case_id(entry))
        _RESULTS[key] = zoo_steps.run_case(entry, ZOO, work, trtq)
    result = _RESULTS[key]
    assert not result.error, f"the zoo's own steps crashed on {key}: {result.error}"
    return result


@pytest.fixture
def zoo_case(zoo_entry, trtq, tmp_path_factory) -> zoo_steps.CaseResult:
    return _case(zoo_entry, trtq, tmp_path_factory)


@pytest.fixture
def zoo_flagged_case(zoo_flagged_entry, trtq, tmp_path_factory) -> zoo_steps.CaseResult:
    """A zoo file whose outputs need flags to state their layout (TNC, NHWC, split heads)."""
    return _case(zoo_flagged_entry, trtq, tmp_path_factory)
