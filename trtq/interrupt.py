"""Interrupt state shared by the signal handlers (installed by the CLI) and the batch loops.

Python runs a signal handler between two bytecodes of the main thread. When that happens inside a
finalizer (``__del__``, a weakref callback: numba/llvmlite run many of those while its warm-up
thread compiles), the KeyboardInterrupt the handler raises is "ignored" by the interpreter and
the run would go on. So the handler also records the signal here, and every batch loop calls
:func:`check`, which raises again: an interrupt is never lost for more than one batch.
"""
import signal
from typing import Optional

_requested: Optional[int] = None
_raised = False  # an exception for the requested signal has been raised already


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds like Ctrl-C (temporary files removed), exits 143."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = signum


def request(signum: int) -> None:
    global _requested
    _requested = signum


def requested() -> Optional[int]:
    return _requested


def reset() -> None:
    global _requested, _raised
    _requested = None
    _raised = False


def raised() -> bool:
    return _raised


def raise_requested() -> None:
    """Raise the exception for the requested signal (the handler and :func:`check` use this)."""
    global _raised
    if _requested is None:
        return
    _raised = True
    raise exception_for(_requested)


def exception_for(signum: int) -> KeyboardInterrupt:
    return Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt()


def check() -> None:
    """Raise again when a signal arrived whose exception was swallowed somewhere."""
    raise_requested()
