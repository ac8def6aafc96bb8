"""Switch trtq.calib.collect's kernels in a test: the compiled ones or numpy's (through the
environment variable trtq.calib.collect.compiled reads)."""

import pytest

from trtq.calib.collect import kernels


def use_kernels(monkeypatch, name: str) -> bool:
    """Make ``name`` ("compiled", "numpy") the kernels trtq picks; False where this install does
    not have them (numpy is always there)."""
    monkeypatch.setenv("TRTQ_NO_NATIVE", "0" if name == "compiled" else "1")
    return kernels.implementation() == name


def require_kernels(monkeypatch, name: str) -> None:
    """:func:`use_kernels`, skipping the test where the install does not have them."""
    if not use_kernels(monkeypatch, name):
        pytest.skip("the compiled kernels were not built in this install (no C compiler)")
