"""Progress of the long steps on stderr, one facility for every layer.

The command line turns it on (:func:`configure`, from ``-q`` and whether stderr is a terminal);
a library caller that does not gets no output. A step reports through :func:`task` (units of work
with or without a known total), :func:`counted` (an iterable, one unit per item) or :func:`note`
(one line, e.g. a TensorRT build phase). On a terminal each task is one self-rewriting bar; on
anything else (a log, a pipe) each unit of work is one line, so that a CI log shows where a long
step is. A watcher thread adds a "still working" line for the innermost running task when
nothing at all was written for ``HEARTBEAT_S`` (one long unit of work: a batch of a large model,
a TensorRT build without phase reports). Nothing here ever writes to stdout.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Callable, TextIO

BAR = 24  # characters of a terminal bar
REDRAW_S = 0.1  # a terminal bar is redrawn at most this often (the last unit always)
# a task silent this long (one unit of work that takes long: a batch of a large model, a TensorRT
# build that reports no phases) gets a "still working" line from a watcher thread
HEARTBEAT_S = 3.5


class Line:
    """One line on ``stream``: rewritten in place on a terminal (``tty``), else a new line each
    time it is shown. ``final`` ends a terminal line."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream
        self.tty = _isatty(self.out) if tty is None else tty
        self.width = 0

    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def show(self, text: str, final: bool = False) -> None:
        out = self.out
        if self.tty:
            out.write("\r" + text.ljust(self.width))
            self.width = 0 if final else len(text)
            if final:
                out.write("\n")
        else:
            out.write(text + "\n")
        out.flush()

    def end(self) -> None:
        """End a terminal line left open (before a line of another kind)."""
        if self.tty and self.width:
            self.out.write("\n")
            self.out.flush()
            self.width = 0


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Sink:
    """Where progress goes: one line shared by every task (a terminal has one cursor), the time
    anything was last written, and the tasks running (innermost last)."""

    def __init__(self, enabled: bool, stream: TextIO | None, tty: bool | None):
        self.enabled = enabled
        self.line = Line(stream, tty)
        self.lock = threading.RLock()
        self.written = time.monotonic()
        self.running: list[Task] = []

    def show(self, text: str, final: bool = False) -> None:
        with self.lock:
            self.written = time.monotonic()
            self.line.show(text, final)


_sink = _Sink(False, None, None)


def configure(enabled: bool, stream: TextIO | None = None, tty: bool | None = None) -> None:
    """Turn progress on (``enabled``) or off for this process; ``stream`` default: sys.stderr at
    the time of writing; ``tty`` default: whether that stream is a terminal."""
    global _sink
    _sink = _Sink(enabled, stream, tty)


def enabled() -> bool:
    return _sink.enabled


def on_terminal() -> bool:
    return bool(_sink.line.tty)


def show(text: str, final: bool = False) -> None:
    """Draw ``text`` on the one progress line (a caller that formats its own, as calibrate's
    batch line; it decides itself whether to show): "still working" lines wait for it as for
    any other."""
    _sink.show(text, final)


def clock(seconds: float) -> str:
    """``m:ss`` of ``seconds`` (an ETA)."""
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


class Task:
    """A step's units of work (``total`` of them, or an unknown number when None)."""

    def __init__(self, label: str, total: int | None, sink: _Sink):
        self.label, self.total, self.sink = label, total, sink
        self.done = 0
        self.start = time.monotonic()
        self.last = 0.0
        if sink.enabled:
            _watch(self)

    def advance(self, n: int = 1, note: str = "") -> None:
        """``n`` more units done; ``note``: what the last one was (a layer's name)."""
        self.update(self.done + n, self.total, note)

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        """``done`` units of ``total`` (default: the task's) done."""
        self.done = done
        if total is not None:
            self.total = total
        if not self.sink.enabled:
            return
        now = time.monotonic()
        final = self.total is not None and self.done >= self.total
        if self.sink.line.tty and not final and now - self.last < REDRAW_S:
            return
        self.last = now
        self.sink.show(self._text(now, note), final)

    def heartbeat(self, now: float) -> None:
        """A "still working" line when nothing at all was written for ``HEARTBEAT_S`` (the
        watcher calls the innermost running task)."""
        if now - self.sink.written >= HEARTBEAT_S:
            self.sink.show(self._text(now, "still working"))

    def _text(self, now: float, note: str) -> str:
        elapsed = now - self.start
        if self.total is None and not self.done:
            return f"{self.label}: {note or 'running'} ({elapsed:.1f} s)"
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        if self.sink.line.tty and self.total:
            filled = int(BAR * min(self.done, self.total) / self.total)
            count = "[" + "#" * filled + "-" * (BAR - filled) + "] " + count
        eta = ""
        if self.total and 0 < self.done < self.total:
            eta = f", ETA {clock(elapsed / self.done * (self.total - self.done))}"
        shown = f"  {note}" if note else ""
        if len(shown) > 50:
            shown = shown[:47] + "..."
        return f"{self.label}: {count}{shown} ({elapsed:.1f} s{eta})"

    def finish(self) -> None:
        """End the task: a terminal bar that is not full gets its line ended."""
        with self.sink.lock:
            if self in self.sink.running:
                self.sink.running.remove(self)
            self.sink.line.end()


_watcher: list[threading.Thread] = []


def _watch(t: Task) -> None:
    with t.sink.lock:
        t.sink.running.append(t)
        if not _watcher:
            _watcher.append(threading.Thread(target=_watch_loop, name="trtq-progress", daemon=True))
            _watcher[0].start()


def _watch_loop() -> None:
    while True:
        time.sleep(0.25)
        sink = _sink
        with sink.lock:
            innermost = sink.running[-1] if sink.enabled and sink.running else None
            if innermost is not None:
                innermost.heartbeat(time.monotonic())


@contextmanager
def task(label: str, total: int | None = None) -> Iterator[Task]:
    """A step of ``total`` units (``with task("gptq rounding", len(layers)) as t: ... t.advance()``)."""
    t = Task(label, total, _sink)
    try:
        yield t
    finally:
        t.finish()


def counted(label: str, items: Iterable[Any], total: int | None = None) -> Iterator[Any]:
    """``items``, one unit of progress per item (``total`` default: ``len(items)`` where it has one)."""
    if not _sink.enabled:
        yield from items
        return
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with task(label, total) as t:
        for item in items:
            yield item
            t.advance()


def callback(t: Task) -> Callable[..., None]:
    """A ``(done, total, note)`` callback (as trtq.compare.sensitivity reports) that updates ``t``."""

    def report(done: int, total: int | None = None, note: Any = "") -> None:
        t.update(done, total, str(note) if note else "")

    return report


def note(text: str) -> None:
    """One line of progress (``label: what happened (elapsed)`` is the caller's to write)."""
    if not _sink.enabled:
        return
    with _sink.lock:
        _sink.line.end()
        _sink.show(text, final=True)


@contextmanager
def stage(label: str) -> Iterator[None]:
    """A step of one unit whose length is unknown: "still working" lines while it runs long, and
    a line when it ends (none when it fails: the error is the last line)."""
    if not _sink.enabled:
        yield
        return
    start = time.monotonic()
    with task(label):
        yield
    note(f"{label}: done ({time.monotonic() - start:.1f} s)")


# every line this module writes, and calibrate's batch line (trtq.cli.text.ProgressLine): what a
# reader of stderr (a test of the one-line error contract) may skip as progress
LINE = re.compile(r"^(pass \d+/\d+ \(.*\): \d+/\d+ batches, .*|.*\(\d+\.\d s(, ETA \d+:\d\d)?\))$")


def is_progress_line(line: str) -> bool:
    return LINE.match(line.strip("\r")) is not None
