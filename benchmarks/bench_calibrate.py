"""Benchmark: ``trtq calibrate`` against ONNX Runtime's own calibrators on EfficientNet-Lite0.

    python benchmarks/bench_calibrate.py [--work .bench] [--sizes 256,1024] [--cases all]

Every case runs alone in a fresh subprocess on the same first N calibration photos, batch 8:

  fp32              plain ONNX Runtime inference of the same batches (the floor)
  ort-minmax        onnxruntime.quantization create_calibrator(CalibrationMethod.MinMax)
  ort-entropy       ... CalibrationMethod.Entropy   (stock settings)
  ort-percentile    ... CalibrationMethod.Percentile (stock settings)
  trtq-max|entropy|percentile|mse
                    python -m trtq calibrate --config ... --method M --batch-size 8 --limit N -o ...

Wall time is the subprocess's (start-up and imports included, for every case alike); peak RSS
is its ru_maxrss from wait4. Each child runs under an address-space cap (--mem-cap-gb) and a wall
clock limit (--timeout): ONNX Runtime's histogram calibrators keep every activation of every batch
in memory and do not fit 1024 images here, which is reported as "killed (> N GB)".
The ONNX Runtime cases decode with this folder's own preprocessor (common.preprocess_image, same
config), two threads ahead of the model like trtq's loader, so they do not wait on JPEG decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import models

from trtq.fileio import atomic_write_text

ORT_CASES = ("fp32", "ort-minmax", "ort-entropy", "ort-percentile")
TRTQ_METHODS = ("max", "entropy", "percentile", "mse")
TRTQ_CASES = tuple(f"trtq-{m}" for m in TRTQ_METHODS)
ALL_CASES = ORT_CASES + TRTQ_CASES
REFERENCE = {
    "trtq-max": "ort-minmax",
    "trtq-entropy": "ort-entropy",
    "trtq-percentile": "ort-entropy",
    "trtq-mse": "ort-entropy",
}

# goals from the issue
RSS_LIMIT = 1.5 * common.GIB
RSS_GROWTH = 1.10
MAX_VS_MINMAX = 0.7
HIST_VS_ENTROPY = 0.2


# --------------------------------------------------------------------------------------------
# worker side: one ONNX Runtime case, run in its own process
# --------------------------------------------------------------------------------------------


def run_ort_case(case: str, model: Path, images: Path, limit: int, batch_size: int, out: Path) -> None:
    """Run one ONNX Runtime case; write {samples, seconds, amax} as JSON to ``out``."""
    import numpy as np
    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    input_name, pre = common.model_preprocess()
    paths = common.list_images(images)[:limit]
    if len(paths) != limit:
        raise SystemExit(f"{images} has {len(paths)} images, need {limit}")
    t0 = time.perf_counter()
    amax: dict[str, float] = {}
    if case == "fp32":
        sess = models.ort_session(model)
        for batch in common.prefetched_batches(paths, pre, batch_size):
            sess.run(None, {input_name: batch})
    else:

        class Reader(CalibrationDataReader):
            def __init__(self):
                self._it = common.prefetched_batches(paths, pre, batch_size)

            def get_next(self):
                batch = next(self._it, None)
                return None if batch is None else {input_name: batch}

        method = {
            "ort-minmax": CalibrationMethod.MinMax,
            "ort-entropy": CalibrationMethod.Entropy,
            "ort-percentile": CalibrationMethod.Percentile,
        }[case]
        calibrator = create_calibrator(
            str(model),
            augmented_model_path=str(out.with_suffix(".augmented.onnx")),
            calibrate_method=method,
        )
        calibrator.collect_data(Reader())
        ranges = calibrator.compute_data()
        for name, td in ranges.data.items():
            amax[name] = float(max(np.abs(np.asarray(v, dtype=np.float64)).max() for v in td.range_value))
    seconds = time.perf_counter() - t0
    atomic_write_text(out, json.dumps({"case": case, "samples": len(paths), "seconds": seconds, "amax": amax}))


# --------------------------------------------------------------------------------------------
# driver side
# --------------------------------------------------------------------------------------------


@dataclass
class CaseRow:
    case: str
    images: int
    status: str  # "ok" or a label such as "killed (> 20 GB)"
    seconds: float | None
    peak_rss: int | None
    detail: str = ""
    cpu_seconds: float | None = None  # user + system of the process tree

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stopped(self) -> bool:
        """Killed at the memory cap or the timeout: its time and RSS are lower bounds."""
        return self.status.startswith(("killed", "timeout"))


def compare(r: CaseRow, ref: CaseRow | None, attr: str) -> tuple[str, float | None, bool]:
    """(text, ratio, exact) of ``r.attr / ref.attr``. A stopped reference ran at least that long /
    that big, so the ratio is then an upper bound (printed "<0.12x")."""
    if ref is None or not r.ok or not getattr(ref, attr):
        return "-", None, False
    ratio = getattr(r, attr) / getattr(ref, attr)
    if ref.ok:
        return f"{ratio:.2f}x", ratio, True
    if ref.stopped:
        return f"<{ratio:.2f}x", ratio, False
    return "-", None, False


def read_trt_cache_amax(path: Path) -> dict[str, float]:
    """amax per tensor from a TensorRT calibration.cache (scale = amax / 127, big-endian hex)."""
    out = {}
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for line in lines[1:]:
        if not line.strip():
            continue
        name, _, hexval = line.rpartition(": ")
        out[name] = struct.unpack(">f", bytes.fromhex(hexval.strip()))[0] * 127.0
    return out


def case_command(case: str, model: Path, config: Path, images: Path, n: int, batch: int, out: Path) -> list[str]:
    if case in ORT_CASES:
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            case,
            "--model",
            str(model),
            "--images",
            str(images),
            "--limit",
            str(n),
            "--batch-size",
            str(batch),
            "--out",
            str(out),
        ]
    method = case[len("trtq-") :]
    return [
        sys.executable,
        "-m",
        "trtq",
        "calibrate",
        "--config",
        str(config),
        "--method",
        method,
        "--batch-size",
        str(batch),
        "--limit",
        str(n),
        "-o",
        str(out),
        "--json",
        "--no-progress",
    ]


def run_case(case: str, n: int, args, model: Path, config: Path, images: Path) -> CaseRow:
    out_dir = Path(args.work) / "calibrate"
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ".json" if case in ORT_CASES else ".cache"
    out = out_dir / f"{case}-{n}{suffix}"
    if out.exists():
        out.unlink()
    env = common.repo_env()
    cap = int(args.mem_cap_gb * common.GIB)
    runs = []
    for _ in range(max(1, args.repeat)):
        runs.append(
            common.run_measured(
                case_command(case, model, config, images, n, args.batch_size, out),
                timeout=args.timeout,
                mem_cap=cap,
                env=env,
                cwd=common.REPO,
            )
        )
        if runs[-1].status != "ok":
            break
    m = min(runs, key=lambda r: (r.status != "ok", r.seconds))  # fastest clean run; RSS barely varies
    status = m.label(cap, args.timeout)
    detail = ""
    if m.status == "ok":
        done = json.loads(out.read_text())["samples"] if case in ORT_CASES else json.loads(m.stdout)["samples"]
        if done != n:
            status, detail = "failed", f"used {done} samples, not {n}"
    elif m.status == "failed":
        tail = [ln for ln in m.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
        detail = tail[0][:160]
    return CaseRow(case, n, status, m.seconds, m.peak_rss, detail, m.cpu_seconds)


def report(rows: list[CaseRow], sizes: list[int]) -> str:
    by = {(r.case, r.images): r for r in rows}
    table = []
    notes: list[str] = []
    for n in sorted({r.images for r in rows}):  # the goal sizes and any --fit-size runs
        for r in [r for r in rows if r.images == n]:
            floor = by.get(("fp32", n))
            ref_name = REFERENCE.get(r.case)
            ref = by.get((ref_name, n)) if ref_name else None
            if r.detail:
                notes.append(f"{r.case} {n}: {r.detail}")
            more = ">" if r.stopped else ""  # a stopped case would have needed more
            table.append(
                [
                    r.case,
                    n,
                    r.status + (" *" if r.detail else ""),
                    f"{more}{r.seconds:.1f}" if r.ok or r.stopped else "-",
                    f"{'<' if more else ''}{n / r.seconds:.1f}" if r.ok or r.stopped else "-",
                    f"{more}{r.cpu_seconds:.0f}" if r.cpu_seconds is not None else "-",
                    f"{more}{r.peak_rss / common.MIB:.0f}" if r.peak_rss else "-",
                    compare(r, floor, "seconds")[0],
                    ref_name or "",
                    compare(r, ref, "seconds")[0],
                    compare(r, ref, "peak_rss")[0],
                ]
            )
    headers = [
        "case",
        "images",
        "status",
        "wall s",
        "img/s",
        "CPU s",
        "peak RSS MiB",
        "x floor",
        "reference",
        "time x ref",
        "RSS x ref",
    ]
    return "\n".join([common.format_table(headers, table)] + ["* " + n for n in notes])


def goals(rows: list[CaseRow], sizes: list[int]) -> list[str]:
    by = {(r.case, r.images): r for r in rows}
    lines = []
    lo, hi = min(sizes), max(sizes)

    def line(ok: bool | None, text: str, got: str) -> None:
        lines.append(f"[{common.verdict(ok)}] {text}: {got}")

    for case in TRTQ_CASES:
        big, small = by.get((case, hi)), by.get((case, lo))
        if big is None:
            continue
        ok = big.ok and big.peak_rss <= RSS_LIMIT
        line(
            ok,
            f"{case} peak RSS <= {RSS_LIMIT / common.GIB:.1f} GiB at {hi} images",
            f"{big.peak_rss / common.MIB:.0f} MiB ({big.status})",
        )
        if small is not None and small is not big and small.ok and big.ok:
            growth = big.peak_rss / small.peak_rss
            line(
                growth <= RSS_GROWTH,
                f"{case} RSS at {hi} within +{(RSS_GROWTH - 1) * 100:.0f}% of {lo}",
                f"{(growth - 1) * 100:+.1f}%",
            )

    def versus(case: str, ref_case: str, n: int, target: float) -> None:
        t, ref = by.get((case, n)), by.get((ref_case, n))
        if t is None or ref is None:
            return
        text, ratio, exact = compare(t, ref, "seconds")
        fit = fitted_reference(by, ref_case, n)
        if fit is not None and t.ok and not ref.ok:
            seconds, m = fit
            ratio, exact = t.seconds / seconds, True
            text = (
                f"{ratio:.2f}x of {seconds:.0f} s, ORT's time at {m} images scaled to {n} "
                f"(it {ref.status} at {n} after {ref.seconds:.0f} s)"
            )
        if ratio is None:
            ok, text = None, f"trtq {t.status}, ORT {ref.status}"
        elif exact:
            ok = ratio <= target
        else:  # reference stopped early: only an upper bound on the ratio is known
            ok = True if ratio <= target else None
            text += f" (ORT {ref.status} after {ref.seconds:.0f} s)"
        ref_label = {"ort-minmax": "ORT MinMax", "ort-entropy": "ORT Entropy"}[ref_case]
        line(ok, f"{case} wall <= {target}x {ref_label} at {n} images", text)

    for n in sizes:
        versus("trtq-max", "ort-minmax", n, MAX_VS_MINMAX)
    for case in ("trtq-entropy", "trtq-percentile", "trtq-mse"):
        versus(case, "ort-entropy", lo, HIST_VS_ENTROPY)
    if hi != lo:
        orts = [by[(c, hi)] for c in ("ort-entropy", "ort-percentile") if (c, hi) in by]
        trtqs = [by[(c, hi)] for c in ("trtq-entropy", "trtq-percentile", "trtq-mse") if (c, hi) in by]
        if orts and trtqs:
            ort_failed = [r for r in orts if not r.ok]
            ok = all(r.ok for r in trtqs) and bool(ort_failed)
            got = (
                "trtq: "
                + ", ".join(f"{r.case} {r.status}" for r in trtqs)
                + "; ORT: "
                + ", ".join(f"{r.case} {r.status}" for r in orts)
            )
            line(ok, f"histogram methods finish {hi} images where ORT cannot", got)
    return lines


def fitted_reference(by, ref_case: str, n: int) -> tuple[float, int] | None:
    """ORT's wall time at ``n`` images scaled linearly from the largest smaller size it finished
    (its histogram calibrators keep every activation, so its time per image does not fall with n)."""
    done = sorted(m for (c, m), r in by.items() if c == ref_case and m < n and r.ok)
    if not done:
        return None
    m = done[-1]
    return by[(ref_case, m)].seconds * n / m, m


def cross_check(work: Path, sizes: list[int]) -> list[str]:
    """trtq max vs ORT MinMax ranges on the same images: both are max|x| per tensor."""
    lines = []
    for n in sizes:
        cache = work / "calibrate" / f"trtq-max-{n}.cache"
        ort_json = work / "calibrate" / f"ort-minmax-{n}.json"
        if not (cache.exists() and ort_json.exists()):
            continue
        ours = read_trt_cache_amax(cache)
        theirs = json.loads(ort_json.read_text())["amax"]
        common_names = sorted(set(ours) & set(theirs))
        if not common_names:
            continue
        rel = [abs(ours[k] - theirs[k]) / max(abs(theirs[k]), 1e-12) for k in common_names]
        worst = max(range(len(rel)), key=rel.__getitem__)
        lines.append(
            f"check {n} images: trtq max vs ORT MinMax amax on {len(common_names)} shared tensors "
            f"(trtq {len(ours)}, ORT {len(theirs)}): median rel diff {sorted(rel)[len(rel) // 2]:.1e}, "
            f"max {rel[worst]:.1e} ({common_names[worst]})"
        )
    return lines


def print_results(rows: list[CaseRow], sizes: list[int], work: Path) -> None:
    print(report(rows, sizes))
    print()
    for line in goals(rows, sizes) + cross_check(work, sizes):
        print(line)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=common.DEFAULT_WORK, help="work folder (default .bench/)")
    ap.add_argument("--sizes", default="256,1024", help="image counts, comma-separated (default 256,1024)")
    ap.add_argument("--cases", default="all", help="comma-separated subset of: " + ", ".join(ALL_CASES))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=900.0, help="wall seconds per case (default 900)")
    ap.add_argument("--mem-cap-gb", type=float, default=20.0, help="address-space cap per case (default 20)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest is reported (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="photo set seed")
    ap.add_argument(
        "--fit-size",
        type=int,
        default=128,
        help="when ORT Entropy/Percentile die at the smallest size, also run them (and trtq) at "
        "this many images and scale ORT's time linearly (default 128; 0: off)",
    )
    ap.add_argument("--report-only", action="store_true", help="print the tables of the last run again (its JSON)")
    # internal: run one ONNX Runtime case in this process
    ap.add_argument("--worker", choices=ORT_CASES, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--images", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_ort_case(args.worker, args.model, args.images, args.limit, args.batch_size, args.out)
        return 0
    work = Path(args.work).resolve()
    if args.report_only:
        saved = json.loads((work / "bench_calibrate.json").read_text())
        rows = [CaseRow(**r) for r in saved["rows"]]
        print_results(rows, saved["sizes"], work)
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    cases = list(ALL_CASES) if args.cases == "all" else [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ALL_CASES]
    if unknown or not sizes:
        print(f"unknown case(s) {unknown}; choose from {', '.join(ALL_CASES)}", file=sys.stderr)
        return 2
    cases = [c for c in ALL_CASES if c in cases]  # floor and references first
    model = models.ensure_model(work)
    images = common.photo_set(work, "calibration", max(sizes), args.seed)
    config = common.write_run_config(work / "calibrate" / "run.yaml", model, images)

    print(
        f"model {model.name}, {max(sizes)} calibration photos in {images}, batch {args.batch_size}, "
        f"{os.cpu_count()} CPUs, cap {args.mem_cap_gb:g} GB / {args.timeout:.0f} s per case, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: list[CaseRow] = []
    for n in sizes:
        for case in cases:
            row = run_case(case, n, args, model, config, images)
            rows.append(row)
            rss = f"{row.peak_rss / common.MIB:.0f} MiB" if row.peak_rss else "-"
            print(
                f"  {case:16s} {n:5d} images  {row.status:18s} {row.seconds:7.1f} s  "
                f"CPU {row.cpu_seconds:7.1f} s  {rss}",
                file=sys.stderr,
                flush=True,
            )
    lo = min(sizes)
    hist_refs = [c for c in ("ort-entropy", "ort-percentile") if c in cases]
    if (
        args.fit_size
        and 0 < args.fit_size < lo
        and any(not r.ok for r in rows if r.case in hist_refs and r.images == lo)
    ):
        for case in [c for c in cases if c in hist_refs or c in TRTQ_CASES or c == "fp32"]:
            row = run_case(case, args.fit_size, args, model, config, images)
            rows.append(row)
            print(
                f"  {case:16s} {args.fit_size:5d} images  {row.status:18s} {row.seconds:7.1f} s  (fit)",
                file=sys.stderr,
                flush=True,
            )
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} (other work on the machine skews wall times)")
    print_results(rows, sizes, work)
    atomic_write_text(
        work / "bench_calibrate.json", json.dumps({"sizes": sizes, "rows": [asdict(r) for r in rows]}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
