"""Defect 7: SIGINT and SIGTERM at random points of every output-writing command: exit 130 / 143
with one line (or 0 when the run had already finished), the previous outputs intact or the new
ones complete, never a temporary file, never a traceback. A second signal stops at once. An
interrupt that a finalizer swallows is raised again at the next batch."""

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
    assert "did not stop within" not in err, err  # stopped by itself, not by the signal watchdog
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


def _interrupt(args, delay, sig, ready=None):
    """Run trtq with ``args``, send ``sig`` ``delay`` seconds after its early handlers are in place, or
    after the first stderr line that contains ``ready`` (a phase of the run, not a time that a loaded
    machine stretches), and wait for it to end. faulthandler on: a run that does not stop prints every
    thread's stack (trtq's signal watchdog dumps them before it stops the process; SIGABRT here)."""
    env = child_env({"PYTHONFAULTHANDLER": "1"})
    p = subprocess.Popen(trtq_cmd(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if ready is None:
            _handlers_installed(p.pid)
        else:
            line = p.stderr.readline()
            while line and ready not in line:
                line = p.stderr.readline()
            assert ready in line, f"trtq {args[0]} ended before {ready!r}"
        time.sleep(delay)
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)
            _, err = p.communicate(timeout=30)
            pytest.fail(
                f"trtq {args[0]} still running 60 s after {signal.Signals(sig).name} "
                f"(delay {delay:.3f} s); its threads:\n{err[-8000:]}"
            )
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
DELAYS = (0.0, 0.5)  # after the first progress line: the kernels' warm-up thread has just started / is loading


@pytest.mark.slow
@pytest.mark.parametrize("sig,i", CASES, ids=[f"{signal.Signals(s).name}-{i}" for s, i in CASES])
def test_calibrate_while_it_runs(kit, sig, i):
    """Signalled in pass 1 (the first progress line is printed after its first batch, right after the
    kernels' warm-up thread was started), not at a random time: a time that the start-up of a loaded
    machine can stretch past any point. The start-up itself: test_signal_while_starting_up, the
    import-time paths: test_signal_inside_an_import_is_raised_after_it."""
    big = _big_npy(kit)
    outputs = [kit.cache, kit.prov]
    before = {o: o.read_bytes() for o in outputs}
    p, err = _interrupt(
        [
            "calibrate",
            "--model",
            kit.model,
            "--data",
            big,
            "-o",
            kit.cache,
            "--batch-size",
            "1",
            "--method",
            "entropy",
            "--progress",
        ],
        DELAYS[i],
        sig,
        ready="pass 1/2",
    )
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
    p, err = _interrupt(
        ["calibrate", "--from-stats", kit.stats, "-o", kit.cache, "--method", "percentile"], rnd.uniform(0, 1.0), sig
    )
    _check_outcome(p, err, kit, sig, outputs, before, _valid_cache)


@pytest.mark.slow
def test_double_ctrl_c_stops_at_once_without_a_traceback(kit):
    big = _big_npy(kit)
    before = {o: o.read_bytes() for o in (kit.cache, kit.prov)}
    p = subprocess.Popen(
        trtq_cmd(
            ["calibrate", "--model", kit.model, "--data", big, "-o", kit.cache, "--batch-size", "1", "--progress"]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert "pass 1/1" in p.stderr.readline()  # the model is running (mse: one pass)
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
import os, signal, sys, weakref
import numpy as np
from trtq.cli.process import install_signal_handlers
from trtq.config import DataOptions, InputSource
from trtq.data.batcher import Batcher
from trtq.model import TensorSpec

install_signal_handlers()


class Finalized:
    pass


def _callback(_):  # a weakref callback (trtq defers signals in __del__, not in these)
    os.kill(os.getpid(), signal.SIGINT)  # the signal arrives while a finalizer runs
    for _ in range(100000):              # the handler runs in here: Python ignores its exception
        pass


_refs = []


def finalized():
    obj = Finalized()
    _refs.append(weakref.ref(obj, _callback))  # obj is dropped at once: the callback runs on this thread


opts = DataOptions(inputs={"x": InputSource(npy=(sys.argv[1],))}, batch_size=1, workers=0)
done = 0
try:
    for batch in Batcher(opts, [TensorSpec("x", ("N", 3, 8, 8), "float32")]):
        done += 1
        if done == 2:
            finalized()
except KeyboardInterrupt:
    print("interrupted at batch", done + 1)
    sys.exit(0)
print("never interrupted, batches:", done)
sys.exit(1)
"""


def test_interrupt_swallowed_by_a_finalizer_is_raised_at_the_next_batch(kit):
    """The cause of a flaky Ctrl-C test: finalizers run on the main thread (numba's did while its
    warm-up thread compiled); a SIGINT handled inside one is 'ignored' by Python."""
    p = subprocess.run(
        [sys.executable, "-c", _SWALLOW, str(kit.data)], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr  # trtq's hook took it
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "interrupted at batch 3"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_while_starting_up(sig):
    """Right after the early handlers of `python -m trtq` are in place (the CLI still importing)."""
    p = subprocess.Popen(
        trtq_cmd(["--version"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    _handlers_installed(p.pid)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    if p.returncode == 0:  # it had already finished
        assert out.startswith("trtq, version"), out
        return
    assert p.returncode == EXIT[sig], (p.returncode, err)
    assert err.strip().splitlines()[-1].startswith(f"trtq: {WORD[sig]}") and "Traceback" not in err, err


_SWALLOW_PASS2 = r"""
import os, signal, sys, weakref
from pathlib import Path
from trtq.cli.process import install_signal_handlers
from trtq.pipeline.calibrate import calibrate_with_onnxruntime
from trtq.config import load_config

install_signal_handlers()


class Finalized:
    pass


def _callback(_):  # a weakref callback: Python swallows the interrupt raised in it
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000):
        pass


_refs = []


def progress(p):
    if p.stage == "histogram" and p.batches_done == 2:
        obj = Finalized()  # the interrupt is swallowed inside pass 2 (batches replayed from disk, not the Batcher)
        _refs.append(weakref.ref(obj, _callback))
        del obj


model, data, out = sys.argv[1:4]
cfg = load_config(None, {"model": model, "data.inputs": {"x": {"images": data}}, "data.batch_size": 1,
                         "calibrate.output": out, "calibrate.method": "mse"}, environ={})
try:
    calibrate_with_onnxruntime(cfg, progress=progress)
except KeyboardInterrupt:
    print("interrupted; cache written:", Path(out).exists())
    sys.exit(0)
print("never interrupted")
sys.exit(1)
"""


def test_interrupt_swallowed_in_the_histogram_pass_is_raised_at_the_next_batch(kit):
    """Images: pass 2 replays the decoded batches from a temporary file (trtq.calib.collect.replay), so the
    check in the calibration loop itself is what catches it."""
    from tests.data.helpers import image_folder

    image_folder(kit.root / "imgs", 5, 8, 8)
    out = kit.root / "n.cache"
    p = subprocess.run(
        [sys.executable, "-c", _SWALLOW_PASS2, str(kit.model), str(kit.root / "imgs"), str(out)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr  # trtq's hook took it
    assert p.returncode == 0 and p.stdout.strip() == "interrupted; cache written: False", p.stdout + p.stderr


_SECOND_SIGNAL_WHILE_WRITING = r"""
import os, signal, sys
from trtq.cli.process import install_signal_handlers
from trtq.fileio import atomic_path

install_signal_handlers()


class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):
            pass


with atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half of the new")
    Finalized()  # first SIGINT, inside a finalizer: re-sent after it, while the second is being handled
    os.kill(os.getpid(), signal.SIGINT)  # second SIGINT: stop at once
    for _ in range(1000000):
        pass
print("still running")
"""


def test_second_signal_stops_at_once_and_removes_the_temporary_file(tmp_path):
    dest = tmp_path / "out.cache"
    dest.write_bytes(b"previous")
    p = subprocess.run(
        [sys.executable, "-c", _SECOND_SIGNAL_WHILE_WRITING, str(dest)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert p.returncode == 130, p.stdout + p.stderr
    assert "still running" not in p.stdout and "interrupted again; stopped at once" in p.stderr
    assert dest.read_bytes() == b"previous" and not temp_leftovers(tmp_path)


_SIGTERM_WHILE_WRITING = r"""
import os, signal, sys
from trtq.cli import main
from trtq.fileio import atomic_path, declare_outputs
import trtq.cli.process as process

# run a real command whose write is cut by SIGTERM: the console-script entry (trtq.cli:main) has no
# early handler of its own, so only trtq's handler stands between the signal and a leftover temp file
real = process.emit
def emit_while_writing(*args, **kwargs):
    declare_outputs([sys.argv[1]])  # as a command's guard would (trtq.outputs)
    with atomic_path(sys.argv[1]) as tmp:
        tmp.write_bytes(b"half of the new")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000000):
            pass
process.emit = emit_while_writing
main(["inspect-cache", sys.argv[2]])
"""


def test_sigterm_during_a_write_unwinds_like_ctrl_c(kit, tmp_path):
    dest = tmp_path / "out.txt"
    dest.write_bytes(b"previous")
    p = subprocess.run(
        [sys.executable, "-c", _SIGTERM_WHILE_WRITING, str(dest), str(kit.cache)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert p.returncode == 143, (p.returncode, p.stderr)
    assert p.stderr.strip().splitlines()[-1] == "trtq: terminated (SIGTERM); nothing was written", p.stderr
    assert "Traceback" not in p.stderr
    assert dest.read_bytes() == b"previous" and not temp_leftovers(tmp_path)


_SIGNAL_IN_IMPORT = r"""
import os, signal, sys
from trtq.cli.process import install_signal_handlers

install_signal_handlers()
sys.path.insert(0, sys.argv[1])
try:
    import slow_module  # sends itself SIGINT while it initialises
    print("after the import")
    import time
    deadline = time.monotonic() + 20  # the signal is re-sent by a polling thread: wait for it, not for a count
    while time.monotonic() < deadline:
        pass
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted; module complete:", getattr(sys.modules.get("slow_module"), "COMPLETE", False))
"""


def test_signal_inside_an_import_is_raised_after_it(tmp_path):
    """An exception thrown into a module's initialisation (onnx's C++ extension) crashed Python."""
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
        "for _ in range(200000):\n    pass\nCOMPLETE = True\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", _SIGNAL_IN_IMPORT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    # the re-sent signal may land inside print("after the import"), between the text and its newline
    assert p.stdout.rstrip("\n").endswith("interrupted; module complete: True"), p.stdout
    assert "not interrupted" not in p.stdout, p.stdout


def test_module_entry_catches_signals_before_importing_the_cli():
    code = (
        "import runpy, signal, sys\n"
        "sys.modules['trtq.cli'] = None  # stop right where __main__ imports the CLI\n"
        "try:\n    runpy.run_module('trtq', run_name='__main__')\nexcept ImportError:\n    pass\n"
        "print(signal.getsignal(signal.SIGINT).__name__, signal.getsignal(signal.SIGTERM).__name__)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60)
    assert p.stdout.split() == ["_early_exit", "_early_exit"], p.stdout + p.stderr


_ABANDONED = []


def test_temp_files_of_abandoned_writes_are_removed_when_the_command_ends(trtq, kit, tmp_path, monkeypatch):
    """A write whose context was left without its exit (a signal between the temporary file's creation
    and the with-block, its generator still referenced) still leaves no temporary file."""
    import trtq.cli.process as process
    from trtq.fileio import atomic_path, declare_outputs

    dest = tmp_path / "out.txt"

    def emit_then_interrupted(*args, **kwargs):
        declare_outputs([dest])  # as a command's guard would (trtq.outputs)
        cm = atomic_path(dest)
        _ABANDONED.append(cm)  # kept alive: garbage collection cannot clean it up either
        cm.__enter__().write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(process, "emit", emit_then_interrupted)
    r = trtq(["inspect-cache", kit.cache])
    assert r.code == 130 and "interrupted; nothing was written" in r.err, r
    assert not dest.exists() and not temp_leftovers(tmp_path)
    _ABANDONED.clear()


_SIGTERM_BETWEEN_CACHE_AND_PROVENANCE = r"""
import os, signal, sys
import trtq.calib.cache as cache_module
from trtq.cli import main

real = cache_module.write_cache
def write_cache_after_a_signal(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # the provenance JSON is in place, the cache not yet
    for _ in range(200000):
        pass
    return real(*args, **kwargs)
cache_module.write_cache = write_cache_after_a_signal
main(["calibrate", "--from-stats", sys.argv[1], "-o", sys.argv[2], "--method", "percentile", "-q"])
"""


def test_a_signal_between_the_cache_and_its_provenance_lets_both_finish(kit):
    """Seen in CI: SIGTERM after the new provenance JSON was written and before the cache: exit 143
    "nothing was written", yet the old cache now sat next to a new JSON. The pair is one step."""
    from trtq.calib.cache import read_provenance

    old_cache = kit.cache.read_bytes()
    p = subprocess.run(
        [sys.executable, "-c", _SIGTERM_BETWEEN_CACHE_AND_PROVENANCE, str(kit.stats), str(kit.cache)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert kit.cache.read_bytes() != old_cache  # percentile, not the kit's mse: a new cache
    prov = read_provenance(kit.cache)
    assert prov["method"]["name"] == "percentile"
    assert {k: round(v, 6) for k, v in read_cache(kit.cache).amax.items()} == {
        k: round(v, 6) for k, v in prov["amax"].items()
    }
    assert not temp_leftovers(kit.root)


_MAIN_THREAD_STUCK = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
import trtq.cli as cli
import trtq.cli.process as process

how, cache = sys.argv[2], sys.argv[3]


def hold_the_import_lock():
    import _imp
    _imp.acquire_lock()  # and never released
    threading.Event().wait()


def import_a_module_that_never_finishes():
    import never_finishes  # its body waits forever, its module lock stays taken


def report_when_waiting(main_id):
    # the main thread is in the import machinery (from there on a signal cannot stop it by itself)
    while not sys._current_frames()[main_id].f_code.co_filename.startswith("<frozen importlib"):
        time.sleep(0.01)
    sys.stderr.write("trtq-test: stuck\n")
    sys.stderr.flush()


def emit_while_stuck(*args, **kwargs):
    # the command's main thread waits for another thread that never lets go (a warm-up thread
    # stuck in an import, say): in a module lock (the handler defers a signal inside an import
    # until the import is over) or in the import lock itself (a C wait: no Python handler runs at all)
    threading.Thread(target=hold_the_import_lock if how == "import-lock" else import_a_module_that_never_finishes,
                     daemon=True).start()
    time.sleep(0.2)
    threading.Thread(target=report_when_waiting, args=(threading.get_ident(),), daemon=True).start()
    if how == "import-lock":
        import json.tool  # not imported yet: needs the import lock
    else:
        import never_finishes


process.emit = emit_while_stuck
sys.argv = ["trtq", "inspect-cache", cache]
cli.main()  # the console-script path: argv from sys.argv, the process leaves through os._exit
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("how", ["module-lock", "import-lock"])
def test_a_signal_stops_the_process_even_when_its_main_thread_is_stuck(kit, tmp_path, how, sig):
    """The hang of the Ctrl-C test: trtq still running 60 s after SIGINT. A main thread that waits for
    another thread forever never acts on the signal by itself (deferred inside an import, or no Python
    handler at all in a C wait); the watchdog stops the process TRTQ_SIGNAL_GRACE seconds later."""
    (tmp_path / "never_finishes.py").write_text("import threading\nthreading.Event().wait()\n")
    env = child_env({"TRTQ_SIGNAL_GRACE": "1", "PYTHONFAULTHANDLER": "1"})
    p = subprocess.Popen(
        [sys.executable, "-c", _MAIN_THREAD_STUCK, str(tmp_path), how, str(kit.cache)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert p.stderr.readline().strip() == "trtq-test: stuck"
        sent = time.monotonic()
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after {signal.Signals(sig).name} with its main thread stuck ({how})")
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == EXIT[sig], (p.returncode, err)
    assert f"trtq: {WORD[sig]}" in err and "did not stop within 1 s of the signal" in err, err
    assert "Current thread" in err or "Thread 0x" in err, err  # faulthandler on: every thread's stack
    assert took < 20, took
    assert not temp_leftovers(kit.root)


_SIGNAL_BEFORE_THE_COMMAND = r"""
import os, signal, sys
import trtq.cli as cli
import trtq.cli.process as process

SIG = signal.SIGINT if sys.argv[1] == "SIGINT" else signal.SIGTERM


def watchdog_start_cut_by_a_signal():  # the signal lands right after trtq's handlers are in place
    os.kill(os.getpid(), SIG)
    for _ in range(1000000):
        pass


process.start_signal_watchdog = watchdog_start_cut_by_a_signal
sys.argv = ["trtq", "--version"]
cli.main()
print("not interrupted")
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_between_the_handlers_and_the_command(sig):
    """Seen in a loaded run of this suite: SIGINT while the watchdog thread was being started (after
    trtq's handlers, before run's try) escaped main() as a traceback."""
    p = subprocess.run(
        [sys.executable, "-c", _SIGNAL_BEFORE_THE_COMMAND, signal.Signals(sig).name],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert p.returncode == EXIT[sig], (p.returncode, p.stderr)
    assert p.stderr.strip().splitlines()[-1].startswith(f"trtq: {WORD[sig]}") and "Traceback" not in p.stderr, p.stderr
    assert "not interrupted" not in p.stdout and "version" not in p.stdout


_FINALIZERS = {
    "__del__": "class Finalized:\n    def __del__(self):\n        busy()\n\nFinalized()",
    # not a __del__: the handler cannot tell from the frames that it runs in a finalizer
    "weakref callback": "class Finalized:\n    pass\n\nobj = Finalized()\n"
    "ref = weakref.ref(obj, lambda _: busy())\ndel obj",
    "weakref.finalize": "class Finalized:\n    pass\n\nobj = Finalized()\nweakref.finalize(obj, busy)\ndel obj",
    "gc callback": "gc.callbacks.append(lambda phase, info: busy() if phase == 'start' else None)\ngc.collect()",
}


@pytest.mark.parametrize("finalizer", sorted(_FINALIZERS))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_inside_a_finalizer_is_raised_after_it(finalizer, sig):
    """Seen in a loaded run of the fault suite: SIGTERM handled inside ZipFile.__del__ during
    calibrate --from-stats; Python printed "Exception ignored ... Terminated" and dropped it. Then,
    in the console-script stress runs, the same inside finalizers that are not a __del__ (once the
    traceback, once a signal lost until the watchdog stopped the run 10 s later)."""
    script = _SIGNAL_IN_FINALIZER.replace("THE_SIGNAL", f"signal.{sig.name}")
    script = script.replace("FINALIZER", _FINALIZERS[finalizer].replace("\n", "\n    "))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=child_env(), timeout=60)
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stdout.strip() == f"{type(_exception_for(sig)).__name__} after the finalizer", p.stdout + p.stderr


def _exception_for(sig):
    from trtq.interrupt import exception_for

    return exception_for(sig)


_SIGNAL_IN_FINALIZER = r"""
import gc, os, signal, sys, time, weakref
from trtq.cli.process import install_signal_handlers

install_signal_handlers()


def busy():  # the signal arrives inside the finalizer, and the handler runs in there
    os.kill(os.getpid(), THE_SIGNAL)
    for _ in range(200000):
        pass


try:
    FINALIZER
    deadline = time.monotonic() + 20  # no batch loop and no interrupt.check() here
    while time.monotonic() < deadline:
        pass
    print("not interrupted")
except KeyboardInterrupt as e:
    print(type(e).__name__, "after the finalizer")
"""


_SIGTERM_IN_MERGE_WRITE = r"""
import os, signal, sys, zipfile
from trtq.cli import main

real = zipfile._ZipWriteFile.__init__
calls = []
def member_opened_then_a_signal(self, *args, **kwargs):  # a member of the .npz opened for writing
    real(self, *args, **kwargs)
    calls.append(1)
    if len(calls) == 2:  # the second member: the ZipFile has an open writing handle
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(200000):
            pass
zipfile._ZipWriteFile.__init__ = member_opened_then_a_signal
main(["merge-stats", sys.argv[1], sys.argv[2], "-o", sys.argv[3]])
"""


def test_sigterm_while_merge_stats_writes_leaves_no_zipfile_traceback(kit, trtq):
    """A signal between a .npz member's opening and its writing handle: numpy's clean-up
    (ZipFile.close) failed with "Can't close the ZIP file while there is an open writing handle",
    which replaced the interrupt (an internal error), and ZipFile.__del__ failed again as the process
    ended ("Exception ignored in: <function ZipFile.__del__>" and a traceback)."""
    parts = []
    for i in range(2):
        parts.append(kit.root / f"h{i}.npz")
        assert (
            trtq(
                [
                    "calibrate",
                    "--model",
                    kit.model,
                    "--data",
                    kit.data,
                    "--shard",
                    f"{i}/2",
                    "--save-stats",
                    parts[-1],
                    "-q",
                ]
            ).code
            == 0
        )
    out = kit.root / "m.npz"
    out.write_bytes(b"previous")
    p = subprocess.run(
        [sys.executable, "-c", _SIGTERM_IN_MERGE_WRITE, *map(str, parts), str(out)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert p.returncode == 143, (p.returncode, p.stderr)
    assert p.stderr.strip().splitlines() == ["trtq: terminated (SIGTERM); nothing was written"], p.stderr
    assert out.read_bytes() == b"previous" and not temp_leftovers(kit.root)


def _lock_cleanup_group(interrupt: bool):
    import threading

    import click

    lock = threading.Lock()

    @click.group()
    def group():
        pass

    @group.command()
    def wait():
        # what threading.Condition.wait leaves when the signal lands while it re-acquires its lock:
        # the lock is not held, and the `with` around the wait releases it anyway
        with lock:
            lock.release()
            if interrupt:
                raise KeyboardInterrupt
            raise ValueError("a bug of its own")

    return group


@pytest.mark.parametrize("interrupt", [True, False])
def test_a_lock_error_on_the_way_out_of_ctrl_c_is_still_an_interrupt(interrupt, capsys):
    """Seen once in ~100 signalled calibrations: "internal error: RuntimeError: release unlocked
    lock" at exit 1 instead of "interrupted" at 130. A failure of its own stays an internal error."""
    from trtq.cli import process

    code = process.run(_lock_cleanup_group(interrupt), ["wait"], 0)
    err = capsys.readouterr().err.strip()
    if interrupt:
        assert code == 130 and err == "trtq: interrupted; nothing was written"
    else:
        assert code == 1 and "internal error: RuntimeError: release unlocked lock" in err
