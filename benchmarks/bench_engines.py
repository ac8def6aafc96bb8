"""INT8 accuracy on the engine next to ONNX Runtime, and latency, for Q/DQ models of one classifier.

For each Q/DQ model given with ``--qdq NAME=PATH`` (made on any machine with ``trtq quantize``):
the TensorRT engine ``trtq build --model PATH`` makes of it (INT8 explicit, FP16 rest), scored on
the evaluation photos against the FP32 model on ONNX Runtime, next to the same Q/DQ file on ONNX
Runtime with Q/DQ semantics (basic graph optimizations: what ``trtq compare`` reports) and with
ONNX Runtime's int8 kernels (all optimizations). Reference rows: the FP16 engine of the FP32
model and the implicit INT8 engine TensorRT calibrates itself (EntropyCalibration2, FP16 rest).
All engines are timed in the same bench runs (CUDA events, ``--repeats`` runs: the spread is the
run-to-run noise).

    /opt/trtq-rig/bin/python benchmarks/bench_engines.py --model efficientnet_lite0.onnx \\
        --config benchmarks/efficientnet_lite0.yaml --calib photos/calib --eval photos/eval \\
        --qdq mse=m.mse.qdq.onnx --qdq mse+c+gptq+bc=m.best.qdq.onnx --out out/engines

Prints one table and the goal checks; writes OUT/bench_engines.json. Needs TensorRT, cuda-python,
a GPU. ``--tactic-sources`` defaults to the GPU test bundle's (its cuBLAS/cuDNN are stubs).
"""

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from trtq.config import BenchOptions, BuildOptions, ProfileShapes, load_config
from trtq.fileio import atomic_write_text

log = logging.getLogger("bench_engines")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, type=Path, help="FP32 ONNX classifier (one image input, logits output)")
    p.add_argument("--config", required=True, type=Path, help="trtq config whose data.inputs give the preprocessing")
    p.add_argument("--calib", required=True, type=Path, help="image folder for TensorRT's own calibration")
    p.add_argument("--eval", required=True, type=Path, help="image folder for top-1 agreement")
    p.add_argument("--qdq", action="append", default=[], metavar="NAME=PATH", help="Q/DQ model (repeat)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calib-images", type=int, default=256)
    p.add_argument("--eval-images", type=int, default=320)
    p.add_argument("--opt-level", type=int, default=3, help="builder optimization level (TensorRT's default 3)")
    p.add_argument("--workspace-mb", type=int, default=4096)
    p.add_argument("--tactic-sources", default="EDGE_MASK_CONVOLUTIONS,JIT_CONVOLUTIONS")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of timed inference per engine and run")
    p.add_argument("--repeats", type=int, default=2, help="bench runs over all engines (noise = their spread)")
    p.add_argument("--no-reference", action="store_true", help="skip the fp16 and implicit INT8 engines")
    p.add_argument("--no-fp16", action="store_true", help="skip the fp16 engine (keep the implicit INT8 one)")
    p.add_argument("--reuse", action="store_true", help="take plans already in --out")
    p.add_argument(
        "--ort-float-rest",
        choices=["fp16", "fp32"],
        default="fp16",
        help="the Q/DQ files' float rest on ONNX Runtime: fp16 (default; the explicit engines here are built "
        "with fp16, D41) or fp32 (as written)",
    )
    p.add_argument("--timing-cache", type=Path, help="TensorRT timing cache shared by every build (read and updated)")
    p.add_argument(
        "--no-int8-kernels",
        action="store_true",
        help="skip the column of each Q/DQ model on ONNX Runtime's int8 kernels (all optimizations)",
    )
    p.add_argument(
        "--build-only",
        action="store_true",
        help="build the plans and stop (split long builds over several calls, then bench with --reuse)",
    )
    return p.parse_args(argv)


def data_options(cfg, folder: Path, batch: int, limit: int):
    ((name, source),) = cfg.data.inputs.items()
    inputs = {name: dataclasses.replace(source, images=str(folder), files=None, npy=None)}
    return dataclasses.replace(cfg.data, inputs=inputs, batch_size=batch, limit=limit, last_batch="pad", shuffle=False)


def logits_onnxruntime(
    model: Path, batches: list[np.ndarray], name: str, int8_kernels: bool = False, float_rest: str = "fp32"
) -> np.ndarray:
    """The first output on ONNX Runtime, through compare's runner (Q/DQ semantics, or its int8 kernels),
    the float rest in ``float_rest`` (fp16: as the engines built here with fp16 run it, D41)."""
    from trtq.pipeline.open_runner import open_runner

    with open_runner(model, semantics="onnxruntime" if int8_kernels else "qdq", float_rest=float_rest) as r:
        out = r.outputs[0].name
        return np.concatenate([r.run({name: b})[out] for b in batches])


def logits_engine(plan: Path, batches: list[np.ndarray], name: str) -> np.ndarray:
    from trtq.trt.runtime import TrtRunner

    with TrtRunner(plan) as r:
        out = r.outputs[0].name
        return np.concatenate([r.run({name: b})[out] for b in batches])


def scores(ref: np.ndarray, got: np.ndarray, n: int) -> dict[str, float]:
    ref, got = ref[:n].astype(np.float64), got[:n].astype(np.float64)
    err = ((ref - got) ** 2).sum()
    return {
        "top1": float((ref.argmax(1) == got.argmax(1)).mean()),
        "sqnr_db": float(10 * np.log10((ref**2).sum() / err)) if err > 0 else float("inf"),
    }


def flip_noise(ref: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> dict[str, float]:
    """How far apart two runtimes' top-1 agreements can be by chance: ``flips`` is the share of
    samples whose top-1 differs between ``a`` and ``b``; each flip moves the agreement difference by
    +-1/n, so with f flips it is noise of about sqrt(f)/n (one sigma)."""
    top_a, top_b = a[:n].argmax(1), b[:n].argmax(1)
    f = int((top_a != top_b).sum())
    return {"flips": f / n, "gap_sigma": float(np.sqrt(f)) / n}


def build(name: str, model: Path, out: Path, options: BuildOptions, reuse: bool, **kw) -> tuple[Path, Optional[float]]:
    from trtq.pipeline.build import build_engine

    plan = out / f"{name}.plan"
    if reuse and plan.exists():
        return plan, None
    log.info("building %s", name)
    return plan, build_engine(model, plan, options, **kw).seconds


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = [
        "engine",
        "engine top-1",
        "engine dB",
        "ORT Q/DQ top-1",
        "ORT Q/DQ dB",
        "gap",
        "ORT int8-kernels top-1",
        "flips",
        "gap 1 sigma",
        "median ms",
        "spread ms",
        "vs implicit",
        "build s",
    ]
    lines = []
    for r in rows:
        gap = None if r.get("ort_top1") is None else abs(r["engine_top1"] - r["ort_top1"])
        lines.append(
            [
                r["name"],
                fmt(r["engine_top1"], ".3f"),
                fmt(r["engine_sqnr_db"], ".1f"),
                fmt(r.get("ort_top1"), ".3f"),
                fmt(r.get("ort_sqnr_db"), ".1f"),
                fmt(gap, ".3f"),
                fmt(r.get("ort_int8_top1"), ".3f"),
                fmt(r.get("flips"), ".3f"),
                fmt(r.get("gap_sigma"), ".3f"),
                fmt(r["median_ms"], ".3f"),
                fmt(r["spread_ms"], ".3f"),
                fmt(r.get("vs_implicit"), ".3f"),
                fmt(r.get("build_s"), ".1f"),
            ]
        )
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    text = [line(head), line(["-" * w for w in widths])] + [line(x) for x in lines]
    text.append(
        f"({meta['model']}, batch {meta['batch']}, {meta['gpu']}, TensorRT {meta['tensorrt']}, onnxruntime "
        f"{meta['onnxruntime']}; top-1 agreement and logit SQNR vs FP32 ONNX Runtime on {meta['eval_images']} "
        f"photos; median of {meta['repeats']} bench runs of {meta['duration']} s, spread = max - min of their "
        f"medians; opt level {meta['opt_level']}; ONNX Runtime float rest {meta.get('ort_float_rest', 'fp32')})"
    )
    return "\n".join(text)


def goals(rows: list[dict[str, Any]]) -> list[str]:
    implicit = next((r for r in rows if r["name"] == "int8-implicit"), None)
    explicit = [r for r in rows if r.get("ort_top1") is not None]
    out = []
    if implicit and explicit:
        fast = [r for r in explicit if r["median_ms"] <= implicit["median_ms"] + implicit["spread_ms"]]
        best = max(fast or explicit, key=lambda r: r["engine_top1"])
        ok = bool(fast) and best["engine_top1"] >= 0.95
        out.append(
            f"[{'PASS' if ok else 'FAIL'}] best explicit engine within the implicit engine's latency (+ its "
            f"noise): {best['name']} {best['engine_top1']:.3f} top-1 at {best['median_ms']:.3f} ms "
            f"(implicit {implicit['median_ms']:.3f} ms, {implicit['engine_top1']:.3f}); goal >= 0.95"
        )
    for r in explicit:
        gap = abs(r["engine_top1"] - r["ort_top1"])
        noise = (
            f"; top-1 differs on {r['flips']:.3f} of the samples, chance gap 1 sigma {r['gap_sigma']:.3f}"
            if r.get("flips") is not None
            else ""
        )
        out.append(
            f"[{'PASS' if gap <= 0.01 + 1e-9 else 'FAIL'}] {r['name']}: ONNX Runtime Q/DQ semantics "
            f"{r['ort_top1']:.3f} vs engine {r['engine_top1']:.3f} (gap {gap:.3f}, goal <= 0.01{noise})"
        )
    return out


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from trtq.trt.module_loading import prefer_eager

    prefer_eager()  # the builds below load CUDA's modules as `trtq build` does (docs/decisions.md D39)
    import onnxruntime
    import tensorrt

    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model
    from trtq.pipeline.calibrate import calibrate_file_with_tensorrt as calibrate_with_tensorrt
    from trtq.trt import cuda
    from trtq.trt.bench import bench_plans

    a.out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(a.config, {}, {})
    specs = input_specs(load_model(a.model))
    spec = specs[0]
    fixed = tuple([a.batch] + [int(d) for d in spec.shape[1:]])
    base = BuildOptions(
        optimization_level=a.opt_level,
        workspace_mb=a.workspace_mb,
        tactic_sources=tuple(a.tactic_sources.split(",")),
        profiles={spec.name: ProfileShapes(fixed, fixed, fixed)} if spec.is_dynamic else {},
        timing_cache=str(a.timing_cache) if a.timing_cache else None,
    )
    plans: list[tuple[str, Path, Optional[float], Optional[Path]]] = []  # name, plan, build s, Q/DQ source
    if not a.no_reference:
        if not a.no_fp16:
            plan, s = build("fp16", a.model, a.out, dataclasses.replace(base, precision="fp16"), a.reuse)
            plans.append(("fp16", plan, s, None))
        trt_cache = a.out / "tensorrt-entropy2.cache"
        if not (a.reuse and trt_cache.exists()):
            calib = Batcher(data_options(cfg, a.calib, a.batch, a.calib_images), specs)
            t0 = time.perf_counter()
            calibrate_with_tensorrt(
                a.model, calib, "EntropyCalibration2", trt_cache, dataclasses.replace(base, optimization_level=0)
            )
            log.info("TensorRT calibration: %.1f s", time.perf_counter() - t0)
        plan, s = build(
            "int8-implicit",
            a.model,
            a.out,
            dataclasses.replace(base, mode="implicit", fp16=True),
            a.reuse,
            cache_path=trt_cache,
        )
        plans.append(("int8-implicit", plan, s, None))
    for item in a.qdq:
        name, _, path = item.partition("=")
        plan, s = build(name, Path(path), a.out, dataclasses.replace(base, fp16=True), a.reuse)
        plans.append((name, plan, s, Path(path)))

    if a.build_only:
        for name, plan, seconds, _ in plans:
            print(f"{name}: {plan} ({'reused' if seconds is None else f'{seconds:.1f} s'})")
        return 0
    medians: dict[str, list[float]] = {name: [] for name, *_ in plans}
    for i in range(a.repeats):
        log.info("bench run %d of %d", i + 1, a.repeats)
        for (name, *_), res in zip(
            plans, bench_plans([p for _, p, _, _ in plans], BenchOptions(duration=a.duration, warmup=0.5))
        ):
            medians[name].append(res.median_ms)

    ev = Batcher(data_options(cfg, a.eval, a.batch, a.eval_images), specs)
    batches = [b.arrays[spec.name] for b in ev]
    n = ev.num_samples
    ref = logits_onnxruntime(a.model, batches, spec.name)
    rows: list[dict[str, Any]] = []
    for name, plan, seconds, qdq in plans:
        row = {
            "name": name,
            "plan": str(plan),
            "build_s": seconds,
            "median_ms": float(np.median(medians[name])),
            "spread_ms": float(max(medians[name]) - min(medians[name])),
            "medians_ms": medians[name],
        }
        got = logits_engine(plan, batches, spec.name)
        e = scores(ref, got, n)
        row.update(engine_top1=e["top1"], engine_sqnr_db=e["sqnr_db"])
        if qdq is not None:
            ort_logits = logits_onnxruntime(qdq, batches, spec.name, float_rest=a.ort_float_rest)
            o = scores(ref, ort_logits, n)
            row.update(flip_noise(ref, got, ort_logits, n))
            row.update(qdq=str(qdq), ort_top1=o["top1"], ort_sqnr_db=o["sqnr_db"])
            if not a.no_int8_kernels:
                k = scores(ref, logits_onnxruntime(qdq, batches, spec.name, True, a.ort_float_rest), n)
                row.update(ort_int8_top1=k["top1"], ort_int8_sqnr_db=k["sqnr_db"])
        rows.append(row)
    implicit = next((r for r in rows if r["name"] == "int8-implicit"), None)
    for r in rows:
        r["vs_implicit"] = r["median_ms"] / implicit["median_ms"] if implicit else None
    gpu, cc = cuda.device_info()
    meta = {
        "model": a.model.name,
        "batch": a.batch,
        "gpu": gpu,
        "compute_capability": cc,
        "tensorrt": tensorrt.__version__,
        "onnxruntime": onnxruntime.__version__,
        "eval_images": n,
        "repeats": a.repeats,
        "duration": a.duration,
        "opt_level": a.opt_level,
        "ort_float_rest": a.ort_float_rest,
    }
    checks = goals(rows)
    report = json.dumps({"meta": meta, "rows": rows, "goals": checks}, indent=1)
    atomic_write_text(a.out / "bench_engines.json", report + "\n")
    print(render(rows, meta))
    print("\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
