"""The build's progress lines: TensorRT >= 10's IProgressMonitor phases (through
trtq.trt.compat.attach_progress_monitor) and, where there is none, start/finish lines."""

from __future__ import annotations

import io
import types

import pytest

from trtq import progress
from trtq.trt import compat
from trtq.trt.build import BuildProgress


class _Monitor:
    def __init__(self) -> None:
        pass


def _trt(version: str, monitor: bool = True):
    mod = types.SimpleNamespace(__version__=version)
    if monitor:
        mod.IProgressMonitor = _Monitor
    return mod


class _Config:
    progress_monitor = None


@pytest.fixture
def lines():
    out = io.StringIO()
    progress.configure(True, out, tty=False)
    yield out
    progress.configure(False)


def test_tensorrt_10_phases_become_lines(lines):
    shown, config = BuildProgress(), _Config()
    monitor = compat.attach_progress_monitor(_trt("10.16.1"), config, shown.start, shown.step, shown.finish)
    assert monitor is not None and config.progress_monitor is monitor
    monitor.phase_start("Building engine", None, 3)
    monitor.phase_start("Tactic selection", "Building engine", 40)
    assert monitor.step_complete("Tactic selection", 0) is True  # the build goes on
    monitor.phase_finish("Tactic selection")
    monitor.phase_finish("Building engine")
    text = [ln.rsplit(" (", 1)[0] for ln in lines.getvalue().splitlines()]
    assert text == [
        "build:   Building engine: 3 steps ...",
        "build:     Tactic selection: 40 steps ...",
        "build:     Tactic selection: done in 0.0 s",
        "build:   Building engine: done in 0.0 s",
    ]
    assert all(progress.is_progress_line(ln) for ln in lines.getvalue().splitlines())


def test_a_failing_progress_callback_never_stops_the_build(lines):
    def boom(*_):
        raise RuntimeError("x")

    monitor = compat.attach_progress_monitor(_trt("10.0.1"), _Config(), boom, boom, boom)
    monitor.phase_start("p", None, 1)
    assert monitor.step_complete("p", 0) is True
    monitor.phase_finish("p")


@pytest.mark.parametrize("trt", [_trt("8.6.0"), _trt("10.16.1", monitor=False)])
def test_no_monitor_where_tensorrt_has_none(trt):
    config = _Config()
    assert compat.attach_progress_monitor(trt, config, print, print, print) is None
    assert config.progress_monitor is None
