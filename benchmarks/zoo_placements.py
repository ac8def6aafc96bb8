"""Q/DQ vs FP32 output SQNR (the worst output, ONNX Runtime, Q/DQ semantics) of every zoo file with
the standard and the shared placement, from one trtq cache per file (the zoo test's own data and
steps, tests/zoo/zoo_steps.py), one line per file and the spread of the difference:

    python benchmarks/zoo_placements.py [--only SUBSTRING]   (needs the zoo: scripts/zoo_env.sh)
"""

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import CliResult
from tests.zoo import zoo_steps
from trtq.cli import main as trtq_main


def run(args):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            trtq_main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue())


def worst(sqnr: dict) -> float:
    return min(sqnr.values()) if sqnr else float("nan")


def zoo_entries(doc: str) -> tuple[Path, list[dict]]:
    """(the zoo folder, its manifest entries whose file name contains --only) for a benchmark
    script whose docstring is ``doc``; exits when there is no zoo."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--only", default="", help="files whose name contains this")
    a = ap.parse_args()
    zoo = zoo_steps.zoo_dir()
    manifest = zoo_steps.load_manifest(zoo)
    if manifest is None:
        sys.exit(f"no zoo in {zoo}: make one with scripts/zoo_env.sh")
    return zoo, [e for e in manifest["models"] if a.only in e["file"]]


def main() -> None:
    zoo, entries = zoo_entries(__doc__)
    diffs = []
    print(f"{'file':45s} {'standard dB':>12s} {'shared dB':>10s} {'diff':>7s}")
    for entry in entries:
        with tempfile.TemporaryDirectory() as work:
            case = zoo_steps.run_case(entry, zoo, Path(work), run)
            # both named: the case's own quantize uses the default, which is shared since D31
            _, problem_std, sqnr_std = zoo_steps.placement_check(case, "standard", run)
            _, problem, sqnr = zoo_steps.placement_check(case, "shared", run)
            standard, shared = worst(sqnr_std), worst(sqnr)
        note = "".join(f"  ({p})" for p in (problem_std, problem) if p)
        if np.isfinite(standard) and np.isfinite(shared):
            diffs.append(shared - standard)
        print(f"{entry['file']:45s} {standard:12.2f} {shared:10.2f} {shared - standard:7.2f}{note}", flush=True)
    if diffs:
        d = np.array(diffs)
        print(f"shared - standard: median {np.median(d):.2f} dB, min {d.min():.2f}, max {d.max():.2f}, {len(d)} files")


if __name__ == "__main__":
    main()
