"""Switch trtq.calib's kernels in a test: the compiled ones, numba's or numpy's (through the
environment variables trtq.calib.collect.compiled and trtq.calib.collect.kernels read)."""
import pytest

from trtq.calib.collect import kernels

_ENV = {"compiled": ("0", "0"), "numba": ("1", "0"), "numpy": ("1", "1")}  # TRTQ_NO_NATIVE, TRTQ_NO_NUMBA
_MISSING = {"compiled": "the compiled kernels were not built in this install (no C compiler)",
            "numba": "numba is not installed"}


def use_kernels(monkeypatch, name: str) -> bool:
    """Make ``name`` ("compiled", "numba", "numpy") the kernels trtq picks; False where this
    install does not have them (numpy is always there)."""
    no_native, no_numba = _ENV[name]
    monkeypatch.setenv("TRTQ_NO_NATIVE", no_native)
    monkeypatch.setenv("TRTQ_NO_NUMBA", no_numba)
    return kernels.implementation() == name


def require_kernels(monkeypatch, name: str) -> None:
    """:func:`use_kernels`, skipping the test where the install does not have them."""
    if not use_kernels(monkeypatch, name):
        pytest.skip(_MISSING[name])
