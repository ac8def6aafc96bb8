"""Sharded calibration with Ray: one ``ray.remote`` task per shard, merged on the driver.

    pip install -e ".[ray]"   # from the trtq checkout
    python examples/ray_shards.py -c calib.yaml --shards 8 --method entropy -o calibration.cache

Each task runs ``trtq calibrate --shard I/N`` in a temporary folder on whichever node Ray picks and
returns the statistics file's bytes, so only the model and the data must be reachable from the
workers (same paths, or a config that points at shared storage); the driver writes the shard
files, merges them (``trtq merge-stats``) and writes the cache (mse / percentile: one pass per
shard; entropy / max: two, merged between them). ``ray.init()``
joins a running cluster (``RAY_ADDRESS``) or starts a local one.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

try:
    import ray
except ImportError:  # an optional extra: one line and exit 4 (environment missing), as trtq does
    print(
        'ray_shards.py: error: Ray is not installed; pip install -e ".[ray]" in the trtq checkout',
        file=sys.stderr,
    )
    sys.exit(4)


def trtq(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "trtq", *args, "-q"], check=True)


@ray.remote
def calibrate_shard(index: int, count: int, config: str, method: str, ranges: Optional[bytes] = None) -> bytes:
    """One shard of one pass; returns the --save-stats file's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"part-{index}.npz"
        extra = ["--method", method]
        if ranges is not None:
            (Path(tmp) / "ranges.npz").write_bytes(ranges)
            extra += ["--ranges", str(Path(tmp) / "ranges.npz")]
        trtq("calibrate", "-c", config, "--shard", f"{index}/{count}", "--save-stats", str(out), *extra)
        return out.read_bytes()


def run_pass(work: Path, name: str, count: int, config: str, method: str, ranges: Optional[Path] = None) -> Path:
    blob = ranges.read_bytes() if ranges else None
    parts = ray.get([calibrate_shard.remote(i, count, config, method, blob) for i in range(count)])
    paths = []
    for i, data in enumerate(parts):
        paths.append(work / f"{name}-{i}.npz")
        paths[-1].write_bytes(data)
    merged = work / f"{name}.npz"
    trtq("merge-stats", *map(str, paths), "-o", str(merged))
    return merged


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", required=True, help="trtq config with model: and data:")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--method", default="entropy")
    ap.add_argument("-o", "--output", default="calibration.cache")
    ap.add_argument("--work", default="shards", help="folder for the shard and merged statistics")
    args = ap.parse_args()
    config = str(Path(args.config).resolve())
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ray.init()
    if args.method in ("mse", "percentile"):  # one pass: each shard's histograms, merged
        stats = run_pass(work, "stats", args.shards, config, args.method)
    else:  # entropy / max: pass 1 max|x| per shard, pass 2 histograms over the merged ranges
        ranges = run_pass(work, "ranges", args.shards, config, args.method)
        stats = run_pass(work, "stats", args.shards, config, args.method, ranges=ranges)
    trtq("calibrate", "-c", config, "--from-stats", str(stats), "--method", args.method, "-o", args.output)


if __name__ == "__main__":
    main()
