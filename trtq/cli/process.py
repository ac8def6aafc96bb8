"""The trtq process around a command: only the result reaches stdout, one line and an exit code for
every failure, and SIGINT / SIGTERM handled so that no partial output is left.

Public for the tests (and the entry points): :data:`stdout_guard` and :func:`emit` (the result
goes to the saved stdout), :func:`install_signal_handlers` / :func:`on_signal`,
:func:`start_signal_watchdog`, :func:`main` (run a click group as the ``trtq`` process). Imports
nothing else of trtq.cli: trtq.cli.main hands it the command group.

Exit codes: 0 ok, 1 operation failed, 2 usage/config error, 3 invalid input (data, model, cache),
4 environment missing (TensorRT, GPU), 130 interrupted, 143 terminated.

``--json``: stdout holds exactly one JSON object, whatever happens: the result (:func:`emit`), or,
for a command that fails before it has one, ``{"error": "<the one-line message>", "exit_code": N}``
(:func:`run`), so that ``trtq CMD --json > out.json`` always leaves valid JSON. A command that
fails after its result (a failed ``compare`` gate) keeps the result; the exit code tells.
"""

import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

import click

from trtq.errors import TrtqError

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


class StdoutGuard:
    """While a command runs, only its result reaches stdout.

    Libraries print to stdout (ONNX Runtime's Python layer prints its provider fallback banner,
    C++ code writes to file descriptor 1): that would break ``--json`` and pipes. So during the
    command ``sys.stdout`` is stderr and fd 1 points at fd 2; :func:`emit` writes the result to
    the saved stdout.
    """

    def __init__(self) -> None:
        self.saved_stdout = sys.stdout
        self.result = sys.stdout
        self.saved_fd: Optional[int] = None
        self.own = None
        self.engaged = False

    def engage(self) -> None:
        if self.engaged:
            return
        self.engaged = True
        self.saved_stdout = self.result = sys.stdout
        try:
            sys.stdout.flush()
            uses_fd1 = sys.stdout.fileno() == 1
        except (AttributeError, OSError, ValueError):
            uses_fd1 = False
        try:
            self.saved_fd = os.dup(1)
            os.dup2(2, 1)
        except OSError:
            self.saved_fd = None
        if uses_fd1 and self.saved_fd is not None:
            # the saved stdout outlives this call: closed by restore(), not by a with-block
            encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
            errors = getattr(sys.stdout, "errors", None) or "strict"
            self.own = open(os.dup(self.saved_fd), "w", encoding=encoding, errors=errors)  # noqa: SIM115
            self.result = self.own
        sys.stdout = sys.stderr

    def restore(self) -> None:
        if not self.engaged:
            return
        self.engaged = False
        try:
            if self.own is not None:
                self.own.flush()
        finally:
            sys.stdout = self.saved_stdout
            if self.saved_fd is not None:
                os.dup2(self.saved_fd, 1)
                os.close(self.saved_fd)
                self.saved_fd = None
            if self.own is not None:
                with contextlib.suppress(OSError):
                    self.own.close()
                self.own = None


stdout_guard = StdoutGuard()
_outcome: dict[str, Any] = {"emitted": False, "message": None}  # this run's result emitted; its error line


def emit(st: Any, data: Any, text: str) -> None:
    """A command's result on the saved stdout: ``data`` as JSON when ``st.json`` (--json), else ``text``."""
    if st.json:
        click.echo(json.dumps(data, indent=2, sort_keys=False, default=str), file=stdout_guard.result)
    else:
        click.echo(text, file=stdout_guard.result)
    stdout_guard.result.flush()
    _outcome["emitted"] = True


def json_requested(args: Sequence[str]) -> bool:
    """``--json`` among the options (before a ``--`` that ends them)."""
    return "--json" in (list(args)[: list(args).index("--")] if "--" in args else args)


def emit_failure(args: Sequence[str], code: int) -> None:
    """With ``--json``, a failed command that printed no result prints its error as JSON on stdout."""
    if code == 0 or _outcome["emitted"] or not json_requested(args):
        return
    stdout_guard.restore()  # normally done already, when the command's context closed
    message = _outcome["message"] or f"exit code {code}"
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(json.dumps({"error": message, "exit_code": code}) + "\n")
        sys.stdout.flush()


def on_signal(signum, frame) -> None:
    """SIGINT / SIGTERM: unwind (temporary files removed by trtq.fileio); a second one exits at once.

    Inside an import the exception is not raised: an exception thrown into the initialisation of a
    C extension (onnx's pybind11 module) crashed the interpreter (SIGSEGV). Inside a finalizer
    (``__del__``) neither: Python would print it as "Exception ignored" and drop it (zipfile's
    ``ZipFile.__del__`` while --from-stats reads its .npz: exit 0 and a traceback on stderr). The signal
    is sent again once the main thread has left the import machinery or the finalizer.
    """
    from trtq import interrupt

    global _redelivering, _stopping
    again = _redelivering
    _redelivering = False
    if _finishing or interrupt.committed() or _stopping:  # the command is over (or its outputs are in place),
        return  # or a second signal is stopping the process: that stands
    if interrupt.requested() is not None and not again:
        _stopping = True  # a re-sent signal that lands in here must not raise into the clean-up below
        from trtq.fileio import remove_pending_temp_files

        remove_pending_temp_files()
        try:
            what = b"terminated" if signum == signal.SIGTERM else b"interrupted"
            os.write(2, b"trtq: " + what + b" again; stopped at once, nothing was written\n")
        except OSError:
            pass
        os._exit(EXIT_TERMINATED if interrupt.requested() == signal.SIGTERM else EXIT_INTERRUPTED)
    if again and interrupt.raised():
        return  # a batch loop's interrupt.check() raised it while the signal was being re-sent
    interrupt.request(signum)
    if interrupt.holding():  # final outputs being written together: let them finish (see held_for_outputs)
        return
    if interrupt.deferring():  # inside TensorRT's C++: raised when it returns (see interrupt.deferred)
        return
    if _in_import(frame) or _in_finalizer(frame):
        import threading

        threading.Thread(target=_redeliver_after_import, args=(signum,), name="trtq-signal", daemon=True).start()
        return
    interrupt.raise_requested()


_redelivering = False
_finishing = False
_stopping = False


def reset() -> None:
    """Forget what an earlier in-process run left (tests): a command over, a signal being re-sent,
    a second signal stopping the process."""
    global _redelivering, _finishing, _stopping
    _redelivering = _finishing = _stopping = False


def _in_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _in_finalizer(frame) -> bool:
    """A ``__del__`` (or :func:`on_unraisable`, which runs right after a finalizer) is running."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code is on_unraisable.__code__:
            return True
        frame = frame.f_back
    return False


def _redeliver_after_import(signum: int) -> None:
    global _redelivering
    import threading

    main_id = threading.main_thread().ident
    while True:
        frame = sys._current_frames().get(main_id)
        if frame is None or not (_in_import(frame) or _in_finalizer(frame)):
            break
        time.sleep(0.005)
        del frame
    _redelivering = True
    os.kill(os.getpid(), signum)


SIGNAL_GRACE_S = 10.0  # a signalled process that has not stopped by itself this long after it is stopped


def signal_grace() -> float:
    try:
        return max(0.0, float(os.environ.get("TRTQ_SIGNAL_GRACE", SIGNAL_GRACE_S)))
    except ValueError:
        return SIGNAL_GRACE_S


def start_signal_watchdog() -> None:
    """The real process always ends after SIGINT / SIGTERM, even when its main thread cannot.

    The Python handler (:func:`on_signal`) runs only on the main thread, between two bytecodes. A
    main thread blocked in C (waiting for the import lock or a module lock that another thread
    holds, in a library call) never runs it, and a signal that arrives inside an import is deferred
    until the import is over, which is never when the import waits for a thread that is stuck. The
    C-level handler writes every signal to the wakeup fd, whatever the main thread does; this thread
    reads it and, if the command is still running ``TRTQ_SIGNAL_GRACE`` seconds (default 10) later
    and is not putting its final outputs in place, stops the process as a second signal would:
    temporary files removed, one line, exit 130 / 143 (every thread's stack first when faulthandler
    is on, e.g. PYTHONFAULTHANDLER=1)."""
    import threading

    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError):  # not the main thread, or no pipe left: the handlers alone
        return
    threading.Thread(target=_watchdog, args=(r, signal_grace()), name="trtq-signal-watchdog", daemon=True).start()


def _watchdog(fd: int, grace: float) -> None:
    import faulthandler  # imported now: when it fires, the import lock may be what is stuck

    from trtq import interrupt

    data = b""
    while not data:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline or _finishing or interrupt.holding() or interrupt.committed():
        time.sleep(0.05)  # the command is over, or its outputs are being put in place: it ends by itself
    signum = interrupt.requested() or data[0]
    try:
        what = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
        os.write(
            2,
            b"trtq: " + what + b"; the command did not stop within %.0f s of the signal, stopped it; "
            b"nothing was written\n" % grace,
        )
        if faulthandler.is_enabled():
            faulthandler.dump_traceback(all_threads=True)
    except OSError:
        pass
    for module, clean_up in (
        ("trtq.fileio", "remove_pending_temp_files"),
        ("trtq.input_override", "remove_temp_models"),
    ):
        loaded = sys.modules.get(module)  # not imported here: the import lock may be what is stuck
        if loaded is not None:
            getattr(loaded, clean_up)()
    os._exit(EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED)


def install_signal_handlers(previous: Optional[dict[int, Any]] = None) -> dict[int, Any]:
    """:func:`on_signal` for SIGINT and SIGTERM, and :func:`on_unraisable` as ``sys.unraisablehook``
    (``previous`` gets the handlers replaced, by signal number, and the hook, under "unraisablehook")."""
    previous = {} if previous is None else previous  # filled as it goes: a signal may cut it short
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    except ValueError:  # not the main thread: leave signals alone
        return previous
    global _previous_unraisablehook
    if sys.unraisablehook is not on_unraisable:
        previous["unraisablehook"] = _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = on_unraisable
    return previous


def restore_signal_handlers(previous: dict[Any, Any]) -> None:
    """Undo :func:`install_signal_handlers` (an in-process caller gets its own handling back)."""
    for key, handler in previous.items():
        if key == "unraisablehook":
            sys.unraisablehook = handler
        else:
            signal.signal(key, handler)


def on_unraisable(unraisable) -> None:
    """An interrupt raised by :func:`on_signal` that the interpreter swallowed: the handler ran inside
    a finalizer that is not a ``__del__`` (a weakref callback, a gc callback: Python cannot raise
    out of those), and Python would print it as "Exception ignored" and drop it. It is not printed;
    the signal is sent again once the main thread has left the finalizer. Anything else goes to the
    hook that was in place before."""
    from trtq import interrupt

    if isinstance(unraisable.exc_value, KeyboardInterrupt) and interrupt.requested() is not None:
        if not (_finishing or _stopping or interrupt.committed()):
            import threading

            interrupt.swallowed()
            threading.Thread(
                target=_redeliver_after_import, args=(interrupt.requested(),), name="trtq-signal", daemon=True
            ).start()
        return
    (_previous_unraisablehook or sys.__unraisablehook__)(unraisable)


_previous_unraisablehook = None


def main(group: click.Group, argv: Optional[Sequence[str]] = None) -> None:
    """Run ``group`` as the trtq process (``argv`` None: the real process, its command line): every
    failure one line and an exit code, the signal handlers in place around the command."""
    from trtq import interrupt

    args = list(sys.argv[1:] if argv is None else argv)
    verbose = sum(
        a.count("v") for a in args if a.startswith("-") and not a.startswith("--") and set(a[1:]) <= {"v", "q"}
    )
    verbose += args.count("--verbose")
    interrupt.reset()
    previous: dict[int, Any] = {}
    code = 0
    try:
        try:
            install_signal_handlers(previous)
            if argv is None:  # the real process (in-process callers keep their own signal handling)
                start_signal_watchdog()
            code = run(group, args, verbose)
        except KeyboardInterrupt as e:  # a signal once the handlers were in place, before run's own handling
            code = interrupted(e)
    finally:
        stdout_guard.restore()
        if argv is not None:  # called in-process (tests): give the caller its handlers back
            restore_signal_handlers(previous)
    if argv is None:
        # the command is over: leave without the interpreter's shutdown (tearing down numpy, onnx,
        # ONNX Runtime takes a while, during which Python has reset the signal handlers:
        # a Ctrl-C there killed the process and lost its exit code)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def run(group: click.Group, args: list[str], verbose: int) -> int:
    """``group`` on ``args``: the exit code, every failure one line on stderr (and, with ``--json``,
    one JSON object on stdout)."""
    _outcome.update(emitted=False, message=None)
    code = _run(group, args, verbose)
    emit_failure(args, code)
    return code


def _run(group: click.Group, args: list[str], verbose: int) -> int:
    global _finishing
    _finishing = False
    from trtq.fileio import only_declared_outputs

    try:
        try:
            with only_declared_outputs():  # a command writes only what its guard checked (trtq.outputs)
                rv = group.main(args=args, prog_name="trtq", standalone_mode=False)
        finally:
            _finishing = True
            # backstop: a write that a signal cut off between its steps leaves no temporary file
            from trtq.fileio import remove_pending_temp_files
            from trtq.input_override import remove_temp_models

            remove_pending_temp_files()
            remove_temp_models()
    except TrtqError as e:
        return fail(e, str(e), e.exit_code, verbose)
    except click.exceptions.Abort as e:  # click turns KeyboardInterrupt (Terminated too) into Abort
        return interrupted(e.__cause__ if isinstance(e.__cause__, KeyboardInterrupt) else KeyboardInterrupt())
    except click.exceptions.ClickException as e:
        return click_error(e)
    except KeyboardInterrupt as e:  # Terminated included
        return interrupted(e)
    except MemoryError:
        return fail(None, "out of memory; lower --batch-size or --workers", 1, verbose)
    except BrokenPipeError:
        return 1
    except ImportError as e:  # a dependency is missing or broken: the environment, not trtq (exit 4)
        name = getattr(e, "name", None) or "a dependency"
        return fail(
            e,
            f"cannot import {name} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            f"install it (pip install -e . installs all of trtq's dependencies)",
            4,
            verbose,
        )
    except OSError as e:  # an operating-system failure that no library turned into a TrtqError
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        return fail(
            e,
            f"system error{where}: {e.strerror or type(e).__name__}; check the path, its "
            "permissions and the free disk space",
            1,
            verbose,
        )
    except Exception as e:  # a bug: still one line, the traceback only with -vv
        signal_exc = _interrupt_behind(e)
        if signal_exc is not None:  # cleanup failed on the way out of a signal: still the signal's exit
            return interrupted(signal_exc)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return fail(
            e,
            f"internal error: {type(e).__name__}: {msg} (run with -vv for the traceback; please report it)",
            1,
            verbose,
        )
    return rv if isinstance(rv, int) else 0


def click_error(e: click.exceptions.ClickException) -> int:
    """click's own errors (unknown flag or command, a value its type refuses) as the one line every
    trtq error is, exit 2 for usage errors."""
    message = " ".join(e.format_message().split()).rstrip(".")
    if not isinstance(e, click.exceptions.UsageError):
        return say(message, e.exit_code)
    ctx = e.ctx
    where = ctx.command_path if ctx is not None and ctx.command_path else "trtq"
    return say(f"{message}; see '{where} --help'", 2)


def _interrupt_behind(e: BaseException) -> Optional[KeyboardInterrupt]:
    """The KeyboardInterrupt (Terminated included) that ``e`` was raised while handling, if any.

    A signal that lands while the main thread waits in a ``threading.Condition`` (a queue's get)
    can interrupt the wait's re-acquisition of its lock; the ``with`` block around it then releases
    a lock it does not hold and raises "RuntimeError: release unlocked lock" over the interrupt
    (seen once in about 100 signalled calibrations). The user pressed Ctrl-C: that is the outcome."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return e
        e = e.__cause__ or e.__context__
    return None


def interrupted(e: KeyboardInterrupt) -> int:
    from trtq.interrupt import Terminated

    if isinstance(e, Terminated):
        return say("terminated (SIGTERM); nothing was written", EXIT_TERMINATED, prefix="trtq: ")
    return say("interrupted; nothing was written", EXIT_INTERRUPTED, prefix="trtq: ")


def fail(exc: Optional[BaseException], message: str, code: int, verbose: int) -> int:
    if exc is not None and verbose > 1:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return say(message, code)


def say(message: str, code: int, prefix: str = "trtq: error: ") -> int:
    """The failure's one line on stderr (kept for ``--json``); returns ``code``."""
    _outcome["message"] = message
    click.echo(f"{prefix}{message}", err=True)
    return code
