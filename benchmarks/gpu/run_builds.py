"""Run a list of trtq commands in one Python process, in order.

Every `trtq build` started as its own process spends most of a level-0 build loading TensorRT and
its kernels (on the GPU host, 45-60 s of a 60-80 s PP-OCRv4 det build against 15-20 s for the same
build inside `build --tune-placement`'s process). One process that runs the builds one after the
other keeps that cost to once, so a 10-minute device call holds several times more builds. Builds
still never run at the same time (concurrent builds scatter a table, benchmarks/README.md).

    python benchmarks/gpu/run_builds.py JOBS OUTDIR [--deadline S]

JOBS: one job per line, ``NAME ARG...`` (shell words): ``trtq ARG...`` runs with stdout in
OUTDIR/NAME.json and stderr in OUTDIR/NAME.log; a failed job is a line in OUTDIR/failures.txt.
--deadline: no job starts once that many seconds have passed (the rest are listed as skipped).
"""

import argparse
import contextlib
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's trtq, as python -m trtq from its root


def run_job(argv: list, out: Path, log: Path) -> int:
    from trtq.cli import main

    with open(out, "w") as o, open(log, "w") as e, contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            main(argv)
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jobs")
    ap.add_argument("outdir")
    ap.add_argument("--deadline", type=float, default=None)
    args = ap.parse_args()
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    failures = outdir / "failures.txt"
    t0 = time.monotonic()
    for line in Path(args.jobs).read_text().splitlines():
        words = shlex.split(line)
        if not words:
            continue
        name, argv = words[0], words[1:]
        if args.deadline is not None and time.monotonic() - t0 >= args.deadline:
            with open(failures, "a") as f:
                f.write(f"{name} skipped: deadline {args.deadline:g} s reached\n")
            continue
        start = time.monotonic()
        code = run_job(argv, outdir / f"{name}.json", outdir / f"{name}.log")
        took = time.monotonic() - start
        print(f"{name}: rc {code}, {took:.1f} s", flush=True)
        if code != 0:
            with open(failures, "a") as f:
                f.write(f"{name} rc {code}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
