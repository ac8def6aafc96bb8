"""quantize --reconstruct next to trtq's other explicit options (issue 31): top-1 agreement and logit
SQNR of each Q/DQ model against FP32 in ONNX Runtime (Q/DQ semantics) on held-out photos, and the
wall and CPU time of each quantize.

The model: an EfficientNet-Lite0 export of benchmarks/models.py (``--model``), its config
benchmarks/efficientnet_lite0.yaml. Calibration: ``--cache`` (made with ``--method mse`` on the
calibration photos when not given). The data steps read the first ``--samples`` calibration
photos; ``compare`` the first ``--limit`` evaluation photos (never used in calibration).

    python benchmarks/bench_reconstruct.py --model .bench/efficientnet_lite0.onnx \\
        [--calib-images DIR] [--eval-images DIR] [--samples 128] [--iterations N] [--limit 500]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import common

CASES = {
    "mse": [],
    "gptq + bias correction": ["--weight-rounding", "gptq", "--bias-correction"],
    "reconstruct": ["--reconstruct"],
}


def _compare(trtq: list[str], config: Path, candidate: Path, limit: int) -> dict:
    cmd = [*trtq, "compare", "-c", str(config), "--candidate", str(candidate), "--limit", str(limit), "--json"]
    run = common.run_measured(cmd, 7200, env=common.repo_env())
    if run.status != "ok":
        sys.exit(f"bench_reconstruct: compare of {candidate.name} failed: {run.stderr.strip()[-400:]}")
    (out,) = json.loads(run.stdout)["outputs"]
    return out


def _cases(names: str) -> list[str]:
    cases = [c.strip() for c in names.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"bench_reconstruct: unknown case(s) {unknown}; choose from {list(CASES)}")
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=common.DEFAULT_WORK / "reconstruct")
    ap.add_argument("--cache", type=Path, help="calibration cache (default: mse on the calibration photos)")
    ap.add_argument("--calib-images", type=Path, help="default: benchmarks/photos.py's calibration set")
    ap.add_argument("--eval-images", type=Path, help="default: benchmarks/photos.py's evaluation set")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--iterations", type=int, help="--reconstruct's iterations (default: trtq's)")
    ap.add_argument("--limit", type=int, default=500, help="evaluation photos")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    args = ap.parse_args(argv)
    cases = _cases(args.cases)
    args.work.mkdir(parents=True, exist_ok=True)
    calib = args.calib_images or common.photo_set(args.work, "calibration", max(args.samples, 160))
    held_out = args.eval_images or common.photo_set(args.work, "evaluation", args.limit)
    calib_cfg = common.write_run_config(args.work / "calib.yaml", args.model, calib)
    eval_cfg = common.write_run_config(args.work / "eval.yaml", args.model, held_out)
    trtq = [sys.executable, "-m", "trtq"]
    cache = args.cache
    if cache is None:
        cache = args.work / "mse.cache"
        run = common.run_measured(
            [*trtq, "calibrate", "-c", str(calib_cfg), "--method", "mse", "-o", str(cache), "-q"],
            3600,
            env=common.repo_env(),
        )
        if run.status != "ok":
            sys.exit(f"bench_reconstruct: calibrate failed: {run.stderr.strip()[-400:]}")
    rows = []
    for name in cases:
        flags = list(CASES[name])
        if name == "reconstruct" and args.iterations:
            flags += ["--iterations", str(args.iterations)]
        out = args.work / f"{name.split()[0]}.qdq.onnx"
        cmd = [*trtq, "quantize", "-c", str(calib_cfg), "--cache", str(cache), "-o", str(out)]
        run = common.run_measured([*cmd, "--samples", str(args.samples), *flags, "-q"], 7200, env=common.repo_env())
        if run.status != "ok":
            sys.exit(f"bench_reconstruct: quantize {name} failed: {run.stderr.strip()[-400:]}")
        got = _compare(trtq, eval_cfg, out, args.limit)
        rows.append(
            [
                name,
                f"{got['top1_agreement']:.3f}",
                f"{got['sqnr_db']:.1f}",
                f"{run.seconds:.0f} s",
                f"{run.cpu_seconds:.0f} s",
            ]
        )
    print(f"{args.model.name}, {args.samples} samples, {args.limit} held-out photos, ONNX Runtime Q/DQ semantics")
    print(common.format_table(["quantize", "top-1 agreement", "logit SQNR dB", "wall", "CPU"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
