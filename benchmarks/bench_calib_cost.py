"""Benchmark: what calibration costs next to plain inference, on real third-party models (issue 13).

    python benchmarks/bench_calib_cost.py [--work .bench/cost] [--samples 32] [--methods mse,entropy,max]

For each model that is installed (PP-OCRv4 det and rec and PP-OCR cls from rapidocr-onnxruntime,
`pip install --no-deps rapidocr-onnxruntime`; EfficientNet-Lite0 from `benchmarks/models.py` when
`--work/../efficientnet_lite0.onnx` exists) the same .npy samples (the bundled sample photos,
resized to the model's input) are run, each case alone in a fresh subprocess:

  inference        a plain ONNX Runtime session over the samples (batch as trtq picks it), the floor
  trtq-METHOD      python -m trtq calibrate --model M --data x.npy --method METHOD

and the table prints wall time and peak RSS next to the goals of issue 13: calibrate's mse wall time
<= 3x inference, its peak RSS <= 1.5x inference's plus the histogram state (tensors x 2048 bins x 8
bytes, printed). Start-up and imports are inside every case alike.
"""
import argparse
import sys
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ROOT = Path(__file__).resolve().parents[1]
BINS = 2048


def rapidocr_models() -> list[tuple[str, Path, tuple[int, int, int]]]:
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "models"
    wanted = [("pp-ocrv4-det", "ch_PP-OCRv4_det_infer.onnx", (3, 320, 320)),
              ("pp-ocrv4-rec", "ch_PP-OCRv4_rec_infer.onnx", (3, 48, 320)),
              ("pp-ocr-cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192))]
    return [(name, folder / f, shape) for name, f, shape in wanted if (folder / f).exists()]


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


def tensor_count(model: Path) -> int:
    import onnx

    from trtq.model import calibratable_tensors

    return len(calibratable_tensors(onnx.load(str(model))))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / ".bench" / "cost")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--methods", default="mse,entropy,max")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--only", help="run the models whose name contains this")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    cases = rapidocr_models()
    eff = a.work.parent / "efficientnet_lite0.onnx"
    if eff.exists():
        cases.append(("efficientnet-lite0", eff, (3, 224, 224)))
    cases = [c for c in cases if not a.only or a.only in c[0]]
    if not cases:
        print("no model installed: pip install --no-deps rapidocr-onnxruntime")
        return 1
    print(f"{'model':20s} {'tensors':>7s} {'case':16s} {'wall s':>7s} {'x infer':>8s} {'peak MB':>8s} "
          f"{'RSS goal MB':>11s}  goal")
    worst = 0
    for name, model, shape in cases:
        data = photos_as_npy(a.work / f"{name}.npy", shape, a.samples)
        n_tensors = tensor_count(model)
        hist_mb = n_tensors * BINS * 8 / 2**20
        base = common.run_measured([sys.executable, "-c", _INFER, str(model), str(data), str(a.batch)], a.timeout)
        print(f"{name:20s} {n_tensors:7d} {'inference':16s} {base.seconds:7.1f} {1.0:8.2f} "
              f"{base.peak_rss / 2**20:8.0f} {'':>11s}  {base.label(None, a.timeout)}", flush=True)
        rss_goal = 1.5 * base.peak_rss / 2**20 + hist_mb
        for method in a.methods.split(","):
            out = a.work / f"{name}.{method}.cache"
            m = common.run_measured([sys.executable, "-m", "trtq", "calibrate", "--model", str(model),
                                     "--data", str(data), "--method", method, "--batch-size", str(a.batch),
                                     "-o", str(out), "-q"], a.timeout)
            ratio = m.seconds / base.seconds if base.seconds else float("nan")
            verdict = m.label(None, a.timeout)
            if m.status == "ok" and method == "mse":
                ok = ratio <= 3.0 and m.peak_rss / 2**20 <= rss_goal
                verdict = f"{'PASS' if ok else 'FAIL'} (<= 3x wall, <= {rss_goal:.0f} MB)"
                worst = max(worst, 0 if ok else 1)
            print(f"{'':20s} {'':7s} {'trtq-' + method:16s} {m.seconds:7.1f} {ratio:8.2f} {m.peak_rss / 2**20:8.0f} "
                  f"{rss_goal:11.0f}  {verdict}", flush=True)
    setup = f"{a.samples} samples of the bundled photos per model, batch {a.batch}"
    print(f"({setup}, {common.machine_line()})" if hasattr(common, "machine_line") else f"({setup})")
    return worst


if __name__ == "__main__":
    sys.exit(main())
