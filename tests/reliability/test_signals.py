"""Defect 7: SIGINT and SIGTERM at random points of every output-writing command: exit 130 / 143
with one line (or 0 when the run had already finished), the previous outputs intact or the new
ones complete, never a temporary file, never a traceback. A second signal stops at once. An
interrupt that a finalizer swallows is raised again at the next batch."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.reliability.conftest import child_env, temp_leftovers, trtq_cmd
from trtq.calib.cache import read_cache

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
WORD = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _handlers_installed(pid: int, timeout: float = 60) -> None:
    """Wait until the child catches SIGTERM (trtq/__main__.py installs that before anything else
    of trtq runs): a signal before that would hit the bare interpreter."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return  # exited already (or no /proc: the delay below has to do)
        caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.005)


def _big_npy(kit, rows=40000):
    big = kit.root / "big.npy"
    np.save(big, np.tile(np.load(kit.data), (rows // 6, 1, 1, 1)))
    return big


def _check_outcome(p, err, kit, sig, outputs, before, valid):
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert not temp_leftovers(kit.root), temp_leftovers(kit.root)
    if p.returncode == 0:  # finished before the signal came: the new outputs are complete
        for o in outputs:
            valid(o)
        return "finished"
    assert p.returncode == EXIT[sig], (p.returncode, err)
    assert err.strip().splitlines()[-1].startswith(f"trtq: {WORD[sig]}"), err
    for o in outputs:
        assert o.read_bytes() == before[o], o  # the previous version, byte for byte
    return "interrupted"


def _interrupt(args, delay, sig):
    p = subprocess.Popen(trtq_cmd(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        _handlers_installed(p.pid)
        time.sleep(delay)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p, err


def _valid_cache(path):
    if path.name.endswith(".json"):
        import json

        json.loads(path.read_text())
    else:
        assert read_cache(path).amax


def _valid_model(path):
    onnx.checker.check_model(onnx.load(str(path)))


CASES = [(sig, i) for sig in (signal.SIGINT, signal.SIGTERM) for i in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("sig,i", CASES, ids=[f"{signal.Signals(s).name}-{i}" for s, i in CASES])
def test_calibrate_at_random_points(kit, sig, i):
    big = _big_npy(kit)
    outputs = [kit.cache, kit.prov]
    before = {o: o.read_bytes() for o in outputs}
    delay = random.Random(f"calibrate-{sig}-{i}").uniform(0.0, 1.5)
    p, err = _interrupt(["calibrate", "--model", kit.model, "--data", big, "-o", kit.cache, "--batch-size", "1",
                         "--method", "percentile"], delay, sig)
    assert _check_outcome(p, err, kit, sig, outputs, before, _valid_cache) == "interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("sig,i", CASES, ids=[f"{signal.Signals(s).name}-{i}" for s, i in CASES])
def test_quantize_and_from_stats_at_random_points(kit, sig, i):
    rnd = random.Random(f"quantize-{sig}-{i}")
    out = kit.root / "q.onnx"
    out.write_bytes(b"previous model")
    p, err = _interrupt(["quantize", "--model", kit.model, "--cache", kit.cache, "-o", out], rnd.uniform(0, 1.0), sig)
    _check_outcome(p, err, kit, sig, [out], {out: b"previous model"}, _valid_model)
    outputs = [kit.cache, kit.prov]
    before = {o: o.read_bytes() for o in outputs}
    p, err = _interrupt(["calibrate", "--from-stats", kit.stats, "-o", kit.cache, "--method", "percentile"],
                        rnd.uniform(0, 1.0), sig)
    _check_outcome(p, err, kit, sig, outputs, before, _valid_cache)


@pytest.mark.slow
def test_double_ctrl_c_stops_at_once_without_a_traceback(kit):
    big = _big_npy(kit)
    before = {o: o.read_bytes() for o in (kit.cache, kit.prov)}
    p = subprocess.Popen(trtq_cmd(["calibrate", "--model", kit.model, "--data", big, "-o", kit.cache,
                                   "--batch-size", "1", "--progress"]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        assert "pass 1/2" in p.stderr.readline()  # the model is running
        p.send_signal(signal.SIGINT)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err, err
    assert {o: o.read_bytes() for o in before} == before and not temp_leftovers(kit.root)


_SWALLOW = r"""
import os, signal, sys
import numpy as np
from trtq.cli import _install_signal_handlers
from trtq.config import DataOptions, InputSource
from trtq.data.batcher import Batcher
from trtq.model import TensorSpec

_install_signal_handlers()


class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the signal arrives while a finalizer runs
        for _ in range(100000):              # the handler runs in here: Python ignores its exception
            pass


opts = DataOptions(inputs={"x": InputSource(npy=(sys.argv[1],))}, batch_size=1, workers=0)
done = 0
try:
    for batch in Batcher(opts, [TensorSpec("x", ("N", 3, 8, 8), "float32")]):
        done += 1
        if done == 2:
            Finalized()  # dropped at once: __del__ runs on this thread
except KeyboardInterrupt:
    print("interrupted at batch", done + 1)
    sys.exit(0)
print("never interrupted, batches:", done)
sys.exit(1)
"""


def test_interrupt_swallowed_by_a_finalizer_is_raised_at_the_next_batch(kit):
    """The cause of the flaky Ctrl-C test: numba/llvmlite finalizers run on the main thread while
    the warm-up thread compiles; a SIGINT handled inside one is 'ignored' by Python."""
    p = subprocess.run([sys.executable, "-c", _SWALLOW, str(kit.data)], capture_output=True, text=True,
                       env=child_env(), timeout=60)
    assert "Exception ignored" in p.stderr and "KeyboardInterrupt" in p.stderr  # Python did swallow it
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "interrupted at batch 3"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_while_starting_up(sig):
    """Right after the early handlers of `python -m trtq` are in place (the CLI still importing)."""
    p = subprocess.Popen(trtq_cmd(["--version"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env())
    _handlers_installed(p.pid)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    if p.returncode == 0:  # it had already finished
        assert out.startswith("trtq, version"), out
        return
    assert p.returncode == EXIT[sig], (p.returncode, err)
    assert err.strip().splitlines()[-1].startswith(f"trtq: {WORD[sig]}") and "Traceback" not in err, err
