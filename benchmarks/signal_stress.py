"""Stress `trtq calibrate` with SIGINT / SIGTERM at random times under CPU load (issue 11).

Not a test: a reproduction tool for rare signal races. Each run starts ``python -m trtq calibrate``
on a tiny model and ~40000 single-sample batches (about a minute when not interrupted), sends the
signal after a random delay from the start of the process (start-up, imports, ONNX Runtime session,
kernels' warm-up, batches), and records the outcome. A run still alive ``--stuck`` seconds after the
signal is a failure: its threads are dumped with py-spy (when installed) and with faulthandler
(SIGABRT; the child runs with PYTHONFAULTHANDLER=1), then it is killed.

    python benchmarks/signal_stress.py --runs 300 --load 2 --max-delay 3.0

``--entry script`` runs the installed ``trtq`` console script (the venv's bin/trtq) instead of
``python -m trtq``; each run is also judged as tests/reliability/test_console_script.py does: "ok"
(exit 130/143, one line on stderr), "interpreter start-up" (the signal came before any trtq code
ran: Python's own defaults apply), or LOST / WRONG; and the previous outputs must be intact:

    python benchmarks/signal_stress.py --entry script --runs 200 --max-delay 1.0 --sigterm --load 2
"""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _busy() -> None:  # pragma: no cover - background load
    while True:
        pass


def _make_kit(root: Path, rows: int) -> tuple[Path, Path]:
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from tests.reliability.conftest import make_model

    model = make_model(root / "m.onnx")
    x = np.random.default_rng(1).normal(0, 1, (6, 3, 8, 8)).astype(np.float32)
    np.save(root / "x.npy", x)
    data = root / "big.npy"
    np.save(data, np.tile(x, (rows // 6, 1, 1, 1)))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trtq",
            "calibrate",
            "--model",
            str(model),
            "--data",
            str(root / "x.npy"),
            "-o",
            str(root / "kit.cache"),
            "--save-stats",
            str(root / "s.npz"),
            "-q",
        ],
        check=True,
    )
    return model, data


def _command(what: str, work: Path, model: Path, data: Path, out: Path) -> list[str]:
    if what == "calibrate":
        return [
            "calibrate",
            "--model",
            str(model),
            "--data",
            str(data),
            "-o",
            str(out),
            "--batch-size",
            "1",
            "--method",
            "percentile",
        ]
    if what == "from-stats":
        return ["calibrate", "--from-stats", str(work / "s.npz"), "-o", str(out), "--method", "percentile"]
    if what == "quantize":
        return ["quantize", "--model", str(model), "--cache", str(work / "kit.cache"), "-o", str(out) + ".onnx"]
    raise SystemExit(f"unknown command {what}")


def _entry(kind: str) -> list[str]:
    if kind == "module":
        return [sys.executable, "-m", "trtq"]
    script = Path(sys.executable).parent / "trtq"
    if not script.is_file():
        raise SystemExit(f"no trtq console script beside {sys.executable}: pip install -e . first")
    return [str(script)]


def _handler_in_place(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _outputs_intact(out: Path) -> bool:
    """The previous outputs of a run that did not finish are byte for byte what was there."""
    return all(
        p.read_bytes() == b"previous " + p.name.encode()
        for p in (out, Path(f"{out}.json"), Path(f"{out}.onnx"))
        if p.exists()
    )


def _dump(pid: int) -> str:
    out = ""
    spy = shutil.which("py-spy")
    if spy:
        r = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        out += "py-spy:\n" + r.stdout + r.stderr
    return out


def _wait_for_handlers(pid: int, timeout: float = 60) -> None:
    """Until the child catches SIGTERM (trtq/__main__.py's early handlers), as the fault tests do."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.005)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--load", type=int, default=2, help="busy-loop processes in the background")
    ap.add_argument("--min-delay", type=float, default=0.0)
    ap.add_argument("--max-delay", type=float, default=3.0, help="seconds from the start of the process")
    ap.add_argument("--stuck", type=float, default=10.0, help="alive this long after the signal: a failure")
    ap.add_argument("--rows", type=int, default=40000)
    ap.add_argument(
        "--command",
        choices=["calibrate", "from-stats", "quantize", "mix"],
        default="calibrate",
        help="mix: the three in turn",
    )
    ap.add_argument("--sigterm", action="store_true", help="alternate SIGINT and SIGTERM")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--after-handlers",
        action="store_true",
        help="count the delay from the early handlers being in place (as the fault tests do)",
    )
    ap.add_argument("--log", type=Path, help="append one JSON line per run here")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the child (repeatable)")
    ap.add_argument(
        "--entry",
        choices=["module", "script"],
        default="module",
        help="python -m trtq, or the installed trtq console script",
    )
    a = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped from outside: still clean up below
    rnd = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="trtq-stress-"))
    model, data = _make_kit(work, a.rows)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTQ_")}
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(kv.split("=", 1) for kv in a.env)
    import multiprocessing

    load = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(a.load)]
    for p in load:
        p.start()
    outcomes: collections.Counter = collections.Counter()
    verdicts: collections.Counter = collections.Counter()
    stuck = intact = 0
    from tests.reliability.conftest import children_see_default_signals
    from tests.reliability.test_console_script import judge

    log = open(a.log, "a") if a.log else None  # noqa: SIM115 - closed in the finally below
    p = None
    try:
        for i in range(a.runs):
            sig = signal.SIGTERM if a.sigterm and i % 2 else signal.SIGINT
            out = work / f"c{i}.cache"
            delay = rnd.uniform(a.min_delay, a.max_delay)
            what = ["calibrate", "from-stats", "quantize"][i % 3] if a.command == "mix" else a.command
            for old in (out, Path(f"{out}.json"), Path(f"{out}.onnx")):
                old.write_bytes(b"previous " + old.name.encode())
            cmd = _entry(a.entry) + _command(what, work, model, data, out)
            run_env = dict(env)
            t0 = time.monotonic()
            with children_see_default_signals():  # started with `&` by a script, this process ignores SIGINT
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env)
            if a.after_handlers:
                _wait_for_handlers(p.pid)
                t0 = time.monotonic()
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            ready = _handler_in_place(p.pid)
            p.send_signal(sig)
            sent = time.monotonic()
            dump = ""
            try:
                _, err = p.communicate(timeout=a.stuck)
                kind = f"rc={p.returncode}"
            except subprocess.TimeoutExpired:
                stuck += 1
                kind = "STUCK"
                dump = _dump(p.pid)
                p.send_signal(signal.SIGABRT)
                try:
                    _, err = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    _, err = p.communicate()
            took = time.monotonic() - sent
            last = err.strip().splitlines()[-1] if err.strip() else ""
            if "Traceback" in err and kind != "STUCK":
                kind += "+traceback"
            outcomes[kind] += 1
            verdict = (
                "STUCK"
                if kind == "STUCK"
                else judge({"sig": sig, "code": p.returncode, "err": err, "ready": ready, "delay": delay})
            )
            verdicts[verdict] += 1
            kept = p.returncode == 0 or _outputs_intact(out)
            intact += kept
            rec = {
                "run": i,
                "command": what,
                "signal": signal.Signals(sig).name,
                "delay": round(delay, 3),
                "outcome": kind,
                "verdict": verdict,
                "outputs_intact": kept,
                "after_signal_s": round(took, 3),
                "last_line": last,
            }
            if kind == "STUCK" or "traceback" in kind:
                rec["stderr"] = err[-12000:]
                rec["dump"] = dump
                print(f"--- run {i}: {kind} (delay {delay:.3f} s)\n{dump}\n{err[-12000:]}", flush=True)
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
            print(
                f"{i:4d} {what:10s} {rec['signal']} delay {delay:5.3f} -> {kind:12s} {took:6.2f} s  {verdict:22s} "
                f"{last[:60]}",
                flush=True,
            )
            for f in work.glob(f"c{i}.cache*"):
                f.unlink()
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        for busy in load:
            busy.terminate()
        if log:
            log.close()
        shutil.rmtree(work, ignore_errors=True)
    print("outcomes:", dict(outcomes), f"stuck: {stuck} of {a.runs}")
    print("verdicts:", dict(verdicts), f"previous outputs intact: {intact} of {a.runs}")
    bad = sum(n for v, n in verdicts.items() if v.startswith(("LOST", "WRONG")))
    return 1 if stuck or bad or intact < a.runs else 0


if __name__ == "__main__":
    sys.exit(main())
