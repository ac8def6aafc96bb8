"""Ctrl-C / SIGTERM while TensorRT builds: never raised inside TensorRT's callbacks.

On the GPU host (TensorRT 8.6.0, H100) a SIGINT 2 s into `trtq build` was handled by Python at a
callback from TensorRT's C++ (the Builder's logger): the KeyboardInterrupt crossed into C++,
pybind11 printed its traceback ("At: ... build_plan ...") and TensorRT went on building until the
signal watchdog stopped the process. ``interrupt.deferred`` records such a signal and raises it
when the TensorRT calls return. These tests run the CLI's real handler on fake TensorRT modules.
"""

import signal
from pathlib import Path

import pytest

from tests.trt.fakes import fake_trt
from trtq import interrupt
from trtq.cli import process
from trtq.config import BuildOptions
from trtq.trt import compat
from trtq.trt.build import build_plan


@pytest.fixture(autouse=True)
def clean_interrupt_state():
    process.reset()  # what earlier in-process CLI runs left
    interrupt.reset()
    yield
    interrupt.reset()


def test_a_signal_inside_a_deferred_block_is_raised_when_it_ends():
    with pytest.raises(KeyboardInterrupt), interrupt.deferred():
        process.on_signal(signal.SIGINT, None)  # Python runs the handler at a callback from C++
        reached = True  # nothing raised inside the block
    assert reached and interrupt.requested() == signal.SIGINT


def test_sigterm_inside_a_deferred_block_ends_as_terminated():
    with pytest.raises(interrupt.Terminated), interrupt.deferred():
        process.on_signal(signal.SIGTERM, None)


def test_outside_a_deferred_block_the_handler_raises_at_once():
    with pytest.raises(KeyboardInterrupt):
        process.on_signal(signal.SIGINT, None)


def test_build_plan_defers_signals_while_tensorrt_runs(tmp_path: Path):
    trt = fake_trt("8.6.0")
    seen = {}

    class Builder:  # TensorRT's Builder calls the logger from C++ while it starts: the handler runs there
        def __init__(self, logger):
            try:
                process.on_signal(signal.SIGINT, None)
                seen["raised_inside"] = False
            except KeyboardInterrupt:
                seen["raised_inside"] = True

        def create_network(self, flags):
            raise RuntimeError("the fake stops here")

    trt.Builder = Builder
    recipe = compat.plan_build(trt, "fp32")
    with pytest.raises(RuntimeError, match="the fake stops here"):
        build_plan(trt, recipe, None, tmp_path / "m.onnx", tmp_path / "m.plan", BuildOptions(precision="fp32"), {})
    assert seen == {"raised_inside": False}
    assert interrupt.requested() == signal.SIGINT  # recorded; raised when TensorRT returns
    assert not (tmp_path / "m.plan").exists()
