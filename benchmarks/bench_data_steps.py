"""quantize's data steps on a model with a fixed batch of 1, next to calibrating it (issue 28's goal:
each step at most 5x calibration).

The model: PP-OCRv4 rec from the installed rapidocr-onnxruntime package, its inputs re-declared
``[1, 3, 48, W]`` (a recogniser exported for one line at a time), or ``--model`` (an ONNX file with
a fixed batch of 1 and one float input). Data: ``--samples`` seeded uniform arrays at the input's
shape (``--width`` for a dynamic last dim); what is timed is feeding and statistics, not accuracy.
Each case runs in its own process (``python -m trtq``), in ``--rounds`` interleaved rounds; the
table gives the median wall time and its multiple of calibration's.

    python benchmarks/bench_data_steps.py [--rounds 3] [--samples 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import common
import numpy as np

CASES = {
    "calibrate": ["calibrate"],
    "gptq + bias correction": ["quantize", "--weight-rounding", "gptq", "--bias-correction"],
    "float layers 2": ["quantize", "--float-layers", "2"],
    "equalize": ["quantize", "--equalize"],
}
GOAL = 5.0


def rec_batch_one(work: Path) -> Path:
    import importlib.util

    import onnx

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench_data_steps: pip install --no-deps rapidocr-onnxruntime, or pass --model")
    source = Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    model = onnx.load(str(source))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for i, size in ((0, 1), (2, 48)):
        dims[i].ClearField("dim_param")
        dims[i].dim_value = size
    out = work / "rec_batch1.onnx"
    onnx.save(model, str(out))
    return out


def make_data(model_path: Path, work: Path, samples: int, width: int) -> Path:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    dims = [d.dim_value if d.dim_value > 0 else width for d in model.graph.input[0].type.tensor_type.shape.dim]
    if dims[0] != 1:
        sys.exit(f"bench_data_steps: {model_path} does not fix a batch of 1 ({dims})")
    data = work / "samples.npy"
    np.save(data, np.random.default_rng(0).uniform(-1, 1, (samples, *dims[1:])).astype(np.float32))
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--work", type=Path, default=common.DEFAULT_WORK / "data_steps")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--width", type=int, default=320, help="size of a dynamic last input dim")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    model = args.model or rec_batch_one(args.work)
    data = make_data(model, args.work, args.samples, args.width)
    cache = args.work / "calibration.cache"
    trtq = [sys.executable, "-m", "trtq"]
    first = common.run_measured(
        [*trtq, "calibrate", "--model", str(model), "--data", str(data), "-o", str(cache), "-q"],
        1800,
        env=common.repo_env(),
    )
    if first.status != "ok":
        sys.exit(f"bench_data_steps: calibrate failed: {first.stderr.strip()[-400:]}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    times: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for name in cases:
            verb, *flags = CASES[name]
            out = (
                ["-o", str(args.work / "round.cache")]
                if verb == "calibrate"
                else ["--cache", str(cache), "-o", str(args.work / "round.onnx")]
            )
            run = common.run_measured(
                [*trtq, verb, "--model", str(model), "--data", str(data), *flags, *out, "-q"],
                3600,
                env=common.repo_env(),
            )
            if run.status != "ok":
                sys.exit(f"bench_data_steps: {name} failed: {run.stderr.strip()[-400:]}")
            times[name].append(run.seconds)
    base = statistics.median(times["calibrate"]) if "calibrate" in times else None
    rows = []
    for name in cases:
        median = statistics.median(times[name])
        ratio = median / base if base else None
        rows.append(
            [
                name,
                f"{median:.1f} s",
                "-" if ratio is None else f"{ratio:.1f}x",
                "" if name == "calibrate" or ratio is None else f"<= {GOAL:g}x: {common.verdict(ratio <= GOAL)}",
                " ".join(f"{t:.1f}" for t in times[name]),
            ]
        )
    print(f"{model.name}, {args.samples} samples, {args.rounds} interleaved rounds")
    print(common.format_table(["step", "median wall", "x calibrate", "goal", "runs (s)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
