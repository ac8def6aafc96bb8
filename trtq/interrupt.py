"""Interrupt state shared by the signal handlers (installed by the CLI) and the batch loops.

Python runs a signal handler between two bytecodes of the main thread. When that happens inside a
finalizer (``__del__``, a weakref callback: a library's clean-up may run many of those), the
KeyboardInterrupt the handler raises is "ignored" by the interpreter and
the run would go on. So the handler also records the signal here, and every batch loop calls
:func:`check`, which raises again: an interrupt is never lost for more than one batch.
"""

import contextlib
import signal
from collections.abc import Iterator
from typing import Optional

_requested: Optional[int] = None
_raised = False  # an exception for the requested signal has been raised already
_holding = 0  # depth of held_for_outputs: a command's final outputs are being put in place
_committed = False  # they are: the command has done its work
_deferring = 0  # depth of deferred(): the main thread is in a C++ library that calls back into Python


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
    global _requested, _raised, _holding, _committed, _deferring
    _requested = None
    _raised = False
    _holding = 0
    _committed = False
    _deferring = 0


def holding() -> bool:
    return _holding > 0


def committed() -> bool:
    return _committed


@contextlib.contextmanager
def held_for_outputs() -> Iterator[None]:
    """Write a command's final outputs as one step (calibrate's cache and its provenance JSON).

    A SIGINT/SIGTERM that arrives meanwhile is recorded, not raised, so it cannot fall between two
    files of a pair; once they are all in place the command has done its work and the signal is
    dropped (exit 0, outputs complete). If writing fails, the failure stands. A second signal still
    stops at once (the CLI's handler removes the temporary files)."""
    global _holding, _committed
    _holding += 1
    try:
        yield
        if _holding == 1:
            _committed = True
    finally:
        _holding -= 1


def deferring() -> bool:
    return _deferring > 0


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run calls into a C++ library that calls back into Python (TensorRT's builder, its logger):
    a SIGINT/SIGTERM that arrives meanwhile is recorded, not raised, and raised when the block ends.

    Python runs the handler at the next callback, and an exception raised there crosses into C++:
    TensorRT 8.6.0 printed pybind11's traceback of it and went on building. The CLI's signal
    watchdog still stops a block that does not end within its grace (one line, exit 130/143)."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    check()


def raised() -> bool:
    return _raised


def swallowed() -> None:
    """The exception :func:`raise_requested` raised never reached the command (the interpreter
    dropped it in a finalizer): it is to be raised again."""
    global _raised
    _raised = False


def raise_requested() -> None:
    """Raise the exception for the requested signal (the handler and :func:`check` use this)."""
    global _raised
    if _requested is None or _committed:  # nothing asked, or the work is done (held_for_outputs)
        return
    _raised = True
    raise exception_for(_requested)


def exception_for(signum: int) -> KeyboardInterrupt:
    return Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt()


def check() -> None:
    """Raise again when a signal arrived whose exception was swallowed somewhere."""
    raise_requested()
