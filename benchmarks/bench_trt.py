"""TensorRT benchmark: FP32, FP16, trtq explicit INT8 and implicit INT8 (TensorRT's own
EntropyCalibration2) engines of one image classifier (made for EfficientNet-Lite0, batch 64).

For each engine: cold build time (empty timing cache) and rebuild time (the saved timing cache),
CUDA-event latency (median, p99), images/s and speed-up over FP32, and top-1 agreement with the
FP32 model on ONNX Runtime over real photos. The trtq Q/DQ model on ONNX Runtime is scored too,
so the INT8 engine can be told apart from the quantization it was given.

    /opt/trtq-rig/bin/python benchmarks/bench_trt.py \\
        --model .bench/efficientnet_lite0.onnx --cache .bench/calib/efficientnet.cache \\
        --data .bench/photos/calibration-s0 --eval-data .bench/photos/evaluation-s0 --out .bench/trt

Prints one table on stdout and writes OUT/bench_trt.json. Needs TensorRT, cuda-python and a GPU.
``--tactic-sources EDGE_MASK_CONVOLUTIONS,JIT_CONVOLUTIONS`` is the default because the GPU test
bundle's cuBLAS/cuDNN are stubs; pass ``--tactic-sources default`` on a full TensorRT install.
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

from trtq.config import BenchOptions, BuildOptions, DataOptions, InputSource, ProfileShapes, QuantizeOptions
from trtq.errors import TrtqError
from trtq.fileio import atomic_write_text

log = logging.getLogger("bench_trt")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, type=Path, help="FP32 ONNX classifier (one image input, logits output)")
    p.add_argument("--cache", required=True, type=Path, help="trtq calibration cache for the explicit INT8 engine")
    p.add_argument("--data", required=True, type=Path, help="image folder: TensorRT's own calibration data")
    p.add_argument("--eval-data", type=Path, help="image folder for top-1 agreement (default: --data)")
    p.add_argument("--out", required=True, type=Path, help="folder for plans, timing caches and bench_trt.json")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calib-images", type=int, default=512, help="images for TensorRT's calibration")
    p.add_argument("--eval-images", type=int, default=512, help="images for top-1 agreement")
    p.add_argument("--preset", default="inception", help="trtq preprocessing preset (EfficientNet-Lite: inception)")
    p.add_argument("--opt-level", type=int, default=3, help="builder optimization level (TensorRT default 3)")
    p.add_argument("--workspace-mb", type=int, default=4096)
    p.add_argument(
        "--tactic-sources",
        default="EDGE_MASK_CONVOLUTIONS,JIT_CONVOLUTIONS",
        help="comma-separated TensorRT tactic sources, or 'default'",
    )
    p.add_argument("--no-fp16-fallback", action="store_true", help="INT8 engines: keep float layers in FP32")
    p.add_argument("--no-rebuild", action="store_true", help="skip the timed rebuild with the saved timing cache")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of timed inference per engine")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument(
        "--rebuild-engines",
        default="all",
        help="engines to rebuild with their saved timing cache (comma-separated; default all)",
    )
    p.add_argument(
        "--reuse-plans",
        action="store_true",
        help="take engines an earlier run built into --out as they are (build times from then)",
    )
    p.add_argument(
        "--trt-cache",
        type=Path,
        help="int8-implicit: a cache TensorRT's EntropyCalibration2 already wrote for this model "
        "(trtq calibrate --backend tensorrt), instead of calibrating again",
    )
    p.add_argument(
        "--only",
        default="fp32,fp16,int8-explicit,int8-implicit",
        help="engines to include "
        "(also: int8-gptq, explicit INT8 quantized with --weight-rounding gptq --bias-correction "
        "--float-layers N on the first 128 --data images; int8-centred, the same with "
        "--center-activations)",
    )
    p.add_argument(
        "--float-layers",
        type=int,
        default=0,
        help="int8-gptq: layers left float (default 0; on TensorRT 8 build also leaves float the "
        "INT8 layers a float depthwise conv feeds, see docs/commands.md)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def data_options(folder: Path, input_name: str, shape, preset_name: str, batch: int, limit: int) -> DataOptions:
    from trtq.data.presets import preset

    pre = preset(preset_name, shape)
    return DataOptions(
        inputs={input_name: InputSource(images=str(folder), preprocess=pre)},
        batch_size=batch,
        limit=limit,
        last_batch="pad",
    )


def build_twice(
    name: str, model: Path, out: Path, options: BuildOptions, rebuild: bool, reuse: bool = False, **kw
) -> dict[str, Any]:
    """Cold build with an empty timing cache, then (optionally) a rebuild that loads it.

    With ``reuse``, a plan built by an earlier run into the same folder (its row saved beside it)
    is taken as it is: builds can be spread over several calls and all engines timed in one."""
    from trtq.pipeline.build import build_engine

    saved = out / f"{name}.row.json"
    if reuse and saved.exists() and (out / f"{name}.plan").exists():
        log.info("reusing %s from an earlier run (%s)", name, saved)
        return json.loads(saved.read_text())
    tc = out / f"{name}.timing.cache"
    if tc.exists():
        tc.unlink()
    plan = out / f"{name}.plan"
    opts = _replace(options, timing_cache=str(tc))
    log.info("building %s (cold)", name)
    cold = build_engine(model, plan, opts, **kw)
    row = {"engine": name, "plan": str(plan), "build_s": cold.seconds, "rebuild_s": None}
    if rebuild:
        log.info("rebuilding %s with the saved timing cache", name)
        warm = build_engine(model, plan, opts, **kw)
        row["rebuild_s"] = warm.seconds
        tc_meta = warm.metadata.get("timing_cache") or {}
        row["timing_cache_loaded"] = bool(tc_meta.get("loaded"))
        row["timing_cache_problem"] = tc_meta.get("problem")
    atomic_write_text(saved, json.dumps(row))
    return row


def _replace(options: BuildOptions, **kw) -> BuildOptions:
    import dataclasses

    return dataclasses.replace(options, **kw)


def warm_up(out: Path, options: BuildOptions) -> None:
    """Build a one-layer engine first, so the first timed build does not also pay for loading
    TensorRT's libraries and creating the CUDA context."""
    import onnx
    from onnx import TensorProto, helper

    from trtq.pipeline.build import build_engine

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "warmup",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(out / "warmup.onnx"))
    build_engine(out / "warmup.onnx", out / "warmup.plan", _replace(options, precision="fp32", profiles={}))


def predictions_onnxruntime(model_path: Path, batcher, input_name: str) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    out = []
    for b in batcher:
        logits = sess.run(None, {input_name: b.arrays[input_name]})[0]
        out.append(logits[: b.valid].argmax(axis=1))
    return np.concatenate(out)


def predictions_engine(plan: Path, batcher, input_name: str) -> np.ndarray:
    from trtq.trt.runtime import TrtRunner

    out = []
    with TrtRunner(plan) as r:
        name = r.outputs[0].name
        for b in batcher:
            logits = r.run({input_name: b.arrays[input_name]})[name]
            out.append(logits[: b.valid].argmax(axis=1))
    return np.concatenate(out)


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = ["engine", "build s", "rebuild s", "cache used", "median ms", "p99 ms", "img/s", "vs fp32", "top-1 agree"]

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = []
    for r in rows:
        lines.append(
            [
                r["engine"],
                fmt(r.get("build_s"), ".1f"),
                fmt(r.get("rebuild_s"), ".1f"),
                "-" if "timing_cache_loaded" not in r else ("yes" if r["timing_cache_loaded"] else "no"),
                fmt(r.get("median_ms"), ".3f"),
                fmt(r.get("p99_ms"), ".3f"),
                fmt(r.get("samples_per_s"), ",.0f"),
                fmt(r.get("speedup_vs_fp32"), ".2f") + ("x" if r.get("speedup_vs_fp32") else ""),
                fmt(r.get("top1_agreement"), ".4f"),
            ]
        )
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]

    def fmt_line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    text = [fmt_line(head), fmt_line(["-" * w for w in widths])] + [fmt_line(x) for x in lines]
    text.append(
        f"({meta['model']}, batch {meta['batch']}, {meta['gpu']}, TensorRT {meta['tensorrt']}; "
        f"top-1 agreement with FP32 ONNX Runtime on {meta['eval_images']} images; "
        f"INT8 float rest in {'FP32' if meta['no_fp16_fallback'] else 'FP16'}; opt level {meta['opt_level']})"
    )
    refused = sorted({r["timing_cache_problem"] for r in rows if r.get("timing_cache_problem")})
    for why in refused:
        text.append(f"note: saved timing cache not used on rebuild: {why}")
    return "\n".join(text)


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s: %(message)s",
    )
    from trtq.trt.module_loading import prefer_eager

    prefer_eager()  # the builds below load CUDA's modules as `trtq build` does (docs/decisions.md D39)
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model
    from trtq.pipeline.calibrate import calibrate_file_with_tensorrt as calibrate_with_tensorrt
    from trtq.trt import cuda
    from trtq.trt.bench import bench_plans

    wanted = [s.strip() for s in a.only.split(",") if s.strip()]
    a.out.mkdir(parents=True, exist_ok=True)
    specs = input_specs(load_model(a.model))
    if len(specs) != 1:
        raise TrtqError(f"{a.model.name} has {len(specs)} inputs; this benchmark takes one image input")
    spec = specs[0]
    fixed = tuple([a.batch] + [int(d) for d in spec.shape[1:]])
    tactics = None if a.tactic_sources == "default" else tuple(a.tactic_sources.split(","))
    base = BuildOptions(
        optimization_level=a.opt_level,
        workspace_mb=a.workspace_mb,
        tactic_sources=tactics,
        profiles={spec.name: ProfileShapes(fixed, fixed, fixed)} if spec.is_dynamic else {},
    )
    fp16_rest = not a.no_fp16_fallback
    rebuild_names = set(wanted if a.rebuild_engines == "all" else a.rebuild_engines.split(","))
    rebuild = {n: (not a.no_rebuild and n in rebuild_names) for n in wanted}
    rows: list[dict[str, Any]] = []

    warm_up(a.out, base)
    if "fp32" in wanted:
        rows.append(
            build_twice("fp32", a.model, a.out, _replace(base, precision="fp32"), rebuild["fp32"], a.reuse_plans)
        )
    if "fp16" in wanted:
        rows.append(
            build_twice("fp16", a.model, a.out, _replace(base, precision="fp16"), rebuild["fp16"], a.reuse_plans)
        )
    if "int8-explicit" in wanted:
        rows.append(
            build_twice(
                "int8-explicit",
                a.model,
                a.out,
                _replace(base, precision="int8", fp16=fp16_rest),
                rebuild["int8-explicit"],
                a.reuse_plans,
                cache_path=a.cache,
            )
        )
    gptq_options = QuantizeOptions(weight_rounding="gptq", bias_correction=True, float_layers=a.float_layers)
    if "int8-gptq" in wanted:
        rows.append(
            build_twice(
                "int8-gptq",
                a.model,
                a.out,
                _replace(base, precision="int8", fp16=fp16_rest),
                rebuild["int8-gptq"],
                a.reuse_plans,
                cache_path=a.cache,
                quantize_options=gptq_options,
                data_options=data_options(a.data, spec.name, spec.shape, a.preset, a.batch, gptq_options.samples),
            )
        )
    centred_options = dataclasses.replace(gptq_options, center_activations=True)
    if "int8-centred" in wanted:
        rows.append(
            build_twice(
                "int8-centred",
                a.model,
                a.out,
                _replace(base, precision="int8", fp16=fp16_rest),
                rebuild["int8-centred"],
                a.reuse_plans,
                cache_path=a.cache,
                quantize_options=centred_options,
                data_options=data_options(a.data, spec.name, spec.shape, a.preset, a.batch, centred_options.samples),
            )
        )
    if "int8-implicit" in wanted:
        trt_cache = a.trt_cache or a.out / "tensorrt-entropy2.cache"
        calib_s = None
        implicit_row = a.out / "int8-implicit.row.json"
        if a.trt_cache is None and not (a.reuse_plans and implicit_row.exists()):
            calib = Batcher(data_options(a.data, spec.name, spec.shape, a.preset, a.batch, a.calib_images), specs)
            log.info("TensorRT EntropyCalibration2 on %d images", calib.num_samples)
            t0 = time.perf_counter()
            calibrate_with_tensorrt(
                a.model, calib, "EntropyCalibration2", trt_cache, _replace(base, optimization_level=0)
            )
            calib_s = time.perf_counter() - t0
        row = build_twice(
            "int8-implicit",
            a.model,
            a.out,
            _replace(base, precision="int8", mode="implicit", fp16=fp16_rest),
            rebuild["int8-implicit"],
            a.reuse_plans,
            cache_path=trt_cache,
        )
        if calib_s is not None:
            row["calibration_s"] = calib_s
            atomic_write_text(implicit_row, json.dumps(row))
        rows.append(row)

    log.info("timing %d engines", len(rows))
    results = bench_plans([Path(r["plan"]) for r in rows], BenchOptions(duration=a.duration, warmup=a.warmup))
    fp32_median = next((res.median_ms for r, res in zip(rows, results) if r["engine"] == "fp32"), None)
    for r, res in zip(rows, results):
        r.update({k: getattr(res, k) for k in ("median_ms", "mean_ms", "p99_ms", "samples_per_s", "iterations")})
        r["speedup_vs_fp32"] = fp32_median / res.median_ms if fp32_median else None

    ev = Batcher(data_options(a.eval_data or a.data, spec.name, spec.shape, a.preset, a.batch, a.eval_images), specs)
    log.info("top-1 agreement on %d images", ev.num_samples)
    ref = predictions_onnxruntime(a.model, ev, spec.name)
    for r in rows:
        r["top1_agreement"] = float((predictions_engine(Path(r["plan"]), ev, spec.name) == ref).mean())
    # the Q/DQ models the explicit engines were built from, on ONNX Runtime (same images)
    for engine, qopts in (
        ("int8-explicit", QuantizeOptions()),
        ("int8-gptq", gptq_options),
        ("int8-centred", centred_options),
    ):
        if engine not in wanted:
            continue
        import onnx

        from trtq.calib.cache import read_cache
        from trtq.pipeline.quantize import quantize_for
        from trtq.trt import compat

        fp32 = load_model(a.model)
        data = data_options(a.data, spec.name, spec.shape, a.preset, a.batch, qopts.samples)
        # the same Q/DQ model build made the engine from (TensorRT 8: float grouped-conv consumers)
        qdq = quantize_for(
            fp32, read_cache(a.cache).amax, qopts, data, str(compat.version_of(compat.import_tensorrt()))
        ).model
        qdq_path = a.out / f"{engine}.qdq.onnx"
        onnx.save(qdq, str(qdq_path))
        rows.append(
            {
                "engine": f"{engine} on onnxruntime",
                "top1_agreement": float((predictions_onnxruntime(qdq_path, ev, spec.name) == ref).mean()),
            }
        )

    import tensorrt

    gpu, cc = cuda.device_info()
    meta = {
        "model": a.model.name,
        "batch": a.batch,
        "gpu": gpu,
        "compute_capability": cc,
        "tensorrt": tensorrt.__version__,
        "eval_images": int(ref.size),
        "opt_level": a.opt_level,
        "tactic_sources": tactics,
        "no_fp16_fallback": a.no_fp16_fallback,
        "cache": str(a.cache),
    }
    atomic_write_text(a.out / "bench_trt.json", json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(render(rows, meta))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TrtqError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 1))
