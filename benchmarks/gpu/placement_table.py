"""One row per engine of benchmarks/gpu/placement.sh or engines.sh: INT8 coverage from its ``trtq build --json``
and the median latency from one ``trtq bench --json`` run of all plans, then the median over
builds per model and placement.

    python benchmarks/gpu/placement_table.py OUT BENCH_JSON PLAN...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def hot_spot(cov: dict) -> str:
    """The build's slowest profiled layer and its time (builds of one file differ here), or ''."""
    top = (cov.get("slowest") or [None])[0]
    return f"{top[0][:48]} ({top[1] * 1000:.0f})" if top else ""


def main(argv: list[str]) -> int:
    out, bench_json, plans = Path(argv[0]), Path(argv[1]), argv[2:]
    medians: dict[str, float] = {}
    if bench_json.is_file() and bench_json.stat().st_size:
        for r in json.loads(bench_json.read_text()):
            medians[Path(r["plan"]).name] = float(r["median_ms"])
    print(
        f"{'engine':40s} {'layers':>7} {'int8 layers':>11} {'int8 time':>9} {'conv':>4} {'refmt':>5} "
        f"{'fallb':>5} {'median ms':>9}  slowest layer (us)"
    )
    groups: dict[str, list[tuple[float, float]]] = {}
    for plan in plans:
        name = Path(plan).name
        build = out / (name[: -len(".plan")] + ".build.json")
        cov = None
        if build.is_file() and build.stat().st_size:
            cov = json.loads(build.read_text()).get("int8_coverage")
        ms = medians.get(name)
        key = name.rsplit(".", 2)[0]  # MODEL.PLACEMENT, or VARIANT (engines.sh)
        if cov is None:  # an FP16 engine, or a failed build
            print(f"{name:40s} (no INT8 coverage: see {build.name[:-5]}.log)  median {ms}")
            groups.setdefault(key, []).append((ms, None))
            continue
        share = cov.get("time_share")
        print(
            f"{name:40s} {cov['layers']:7d} {cov['layer_share']:11.1%} "
            f"{'-' if share is None else format(share, '.1%'):>9} {len(cov['conversions']):4d} "
            f"{len(cov['reformats']):5d} {len(cov['fallbacks']):5d} {'-' if ms is None else format(ms, '.3f'):>9}"
            f"  {hot_spot(cov)}"
        )
        groups.setdefault(key, []).append((ms, share or 0.0))
    print("\nmedian over builds:")
    for key, rows in groups.items():
        timed = [r[0] for r in rows if r[0] is not None]
        latency = f"{statistics.median(timed):.3f} ms" if timed else "- ms"
        shares = [r[1] for r in rows if r[1] is not None]
        share = f"{statistics.median(shares):.1%}" if shares else "-"
        each = ", ".join(f"{t:.3f}" for t in timed)
        print(f"{key:40s} median {latency} ({each})  int8 time {share}  ({len(rows)} builds, {len(timed)} timed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
