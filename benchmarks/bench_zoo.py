"""The model zoo through trtq, as a table: architecture x opset, nodes quantized, loads + runs,
task inferred (expected vs got), SQNR of Q/DQ vs FP32, calibrate seconds.

    python scripts/export_zoo.py                    # in a torch environment (scripts/zoo_env.sh)
    python benchmarks/bench_zoo.py                  # every file of .zoo/manifest.json
    python benchmarks/bench_zoo.py --fast --markdown zoo.md --json zoo.json

The steps and checks are tests/zoo/zoo_steps.py's (what tests/zoo/test_zoo.py asserts), run with
this checkout's trtq in a child process per command (``python -m trtq``): calibrate (mse, 3 shards
of 8 samples), quantize, then compare on 16 other samples, inferred and, where the manifest's
layout needs flags, given. SQNR is measured here with ONNX Runtime (Q/DQ pairs as written, basic
graph optimizations) over all compare samples; the "min" column is the worst output's.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, atomic_write_text, repo_env  # also puts the repository on sys.path

from tests.zoo import zoo_steps


class _Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


def run_cli(args: list) -> _Result:
    p = subprocess.run(
        [sys.executable, "-m", "trtq", *[str(a) for a in args]],
        capture_output=True,
        text=True,
        env=repo_env(),
        cwd=REPO,
        check=False,
    )
    return _Result(p.returncode, p.stdout, p.stderr)


def _db(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) and v > 0 else f"{v:.1f}"


def _task_cell(rows: list[dict]) -> str:
    """expected -> got per distinct pair (xN where several outputs share one), ok / WRONG."""
    groups: dict[tuple, int] = {}
    for r in rows:
        want = r["expected"] + (f"/{r['expected_layout']}" if r.get("expected_layout") else "")
        got = str(r["got"]) + (f"/{r['layout']}" if r.get("layout") else "")
        key = (want, got, "ok" if not r["problems"] else "WRONG")
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{w} -> {g} {ok}" + (f" x{n}" if n > 1 else "") for (w, g, ok), n in groups.items())


def summarize(res: zoo_steps.CaseResult) -> dict:
    e = res.entry
    failures = []
    for name in ("calibrate", "quantize", "compare", "compare_given"):
        if name in res.steps and res.steps[name].code != 0:
            failures.append(res.step_failed(name))
    if res.loads is False:
        failures.append(f"Q/DQ model does not load/run in ONNX Runtime: {res.load_error or 'no file'}")
    if res.weighted and res.loads and not res.quantized:
        failures.append("no Conv/Gemm/MatMul quantized")
    low = {n: v for n, v in res.sqnr.items() if v < zoo_steps.output_floor(e, n)}
    if low:
        failures.append("SQNR below the bound: " + ", ".join(f"{n} {_db(v)} dB" for n, v in low.items()))
    failures += [p for r in res.tasks for p in r["problems"]]
    failures += res.explicit or []
    if res.error:
        failures.append(f"bench crashed: {res.error}")
    sq = [v for v in res.sqnr.values()]
    return {
        "file": e["file"],
        "architecture": e["architecture"],
        "source": e["source"],
        "export": f"{e['exporter']}@{e['opset']}" + (" (fallback)" if e.get("fallback") else ""),
        "quantized": f"{res.quantized if res.quantized is not None else '-'}/{res.weighted}",
        "loads": {True: "yes", False: "NO", None: "-"}[res.loads],
        "task": _task_cell(res.tasks) if res.tasks else "-",
        "given": "-" if res.explicit is None else ("ok" if not res.explicit else "WRONG"),
        "sqnr_min": _db(min(sq) if sq else None),
        "sqnr": {n: (None if math.isinf(v) else round(v, 2)) for n, v in res.sqnr.items()},
        "calibrate_s": res.calibrate_seconds,
        "candidate": res.candidate,
        "failures": failures,
        "commands": {k: s.command() for k, s in res.steps.items()},
        "exit_codes": {k: s.code for k, s in res.steps.items()},
    }


COLUMNS = [
    ("file", "model file"),
    ("export", "exporter"),
    ("quantized", "quantized/weighted"),
    ("loads", "loads+runs"),
    ("task", "task: expected -> inferred"),
    ("given", "flags given"),
    ("sqnr_min", "SQNR dB (min)"),
    ("calibrate_s", "calib s"),
]


def markdown(rows: list[dict], seconds: float) -> str:
    out = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        out.append("| " + " | ".join(str(r[k] if r[k] is not None else "-") for k, _ in COLUMNS) + " |")
    bad = [r for r in rows if r["failures"]]
    out.append("")
    out.append(
        f"{len(rows)} files, {len(bad)} with failures, {seconds:.0f} s. SQNR bound: "
        f"{zoo_steps.SQNR_MIN_DB} dB unless the manifest states another for an output."
    )
    if bad:
        out += ["", "Failures:", ""]
        for r in bad:
            for f in r["failures"]:
                out.append(f"- `{r['file']}`: {f}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, default=zoo_steps.zoo_dir(), help="zoo folder (default .zoo or $TRTQ_ZOO)")
    ap.add_argument("--only", default="", help="comma-separated model names or file names")
    ap.add_argument("--fast", action="store_true", help="only the manifest's fast subset")
    ap.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)

    manifest = zoo_steps.load_manifest(args.zoo)
    if manifest is None:
        print(f"bench_zoo: no model zoo in {args.zoo}; run scripts/zoo_env.sh (or scripts/export_zoo.py)")
        return 2
    entries = manifest["models"]
    if args.fast:
        entries = [e for e in entries if e.get("fast")]
    if args.only:
        names = {n.strip() for n in args.only.split(",") if n.strip()}
        entries = [e for e in entries if e["name"] in names or e["file"] in names]
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trtq-zoo-") as tmp:
        for e in entries:
            t = time.perf_counter()
            res = zoo_steps.run_case(e, args.zoo, Path(tmp) / zoo_steps.case_id(e), run_cli)
            row = summarize(res)
            rows.append(row)
            status = "ok" if not row["failures"] else f"{len(row['failures'])} failure(s)"
            print(
                f"{row['file']:44s} {row['quantized']:>8s} loads {row['loads']:3s} SQNR {row['sqnr_min']:>5s} dB "
                f"calib {row['calibrate_s'] or '-'} s  {status}  ({time.perf_counter() - t:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    seconds = time.perf_counter() - t0
    text = markdown(rows, seconds)
    print(text)
    if args.markdown:
        atomic_write_text(args.markdown, text)
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
