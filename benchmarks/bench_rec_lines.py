"""Benchmark: PP-OCRv4 rec INT8 on Chinese text lines, the model's own script (issue 13).

    pip install --no-deps rapidocr-onnxruntime cvttf-notosanscjk-regular
    python benchmarks/bench_rec_lines.py [--work .bench/rec] [--lines 200] [--calib 64] \
        [--setting "mse" --setting "mse --float-layers 4" ...]

Lines of 5-9 random CJK characters from the model's dictionary (its ``character`` metadata),
drawn with Noto Sans CJK (the cvttf-notosanscjk-regular wheel: the SIL OFL font, read from the
installed package) at 30 px on a 320 x 48 canvas, fed as RapidOCR feeds rec (BGR, (x/255 - 0.5) /
0.5). English lines rendered the same way are too fragile to measure INT8 on (FP32 itself changes
its spaces under +-1/255 of input noise); these are not: the first line printed is FP32 against
FP32 with that noise. Each setting is ``calibrate`` (the method, on --calib other lines) plus
``quantize`` (the rest of the setting's flags, which read the same lines), scored on ONNX Runtime
with Q/DQ semantics: sequence agreement with FP32 (and its 95% interval) and character error.
"""

import argparse
import importlib.util
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.compare import scoring  # noqa: E402
from trtq.compare.accuracy import wilson_interval  # noqa: E402


def _package_file(package: str, relative: str) -> Optional[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    base = (
        Path(next(iter(spec.submodule_search_locations)))
        if spec.submodule_search_locations
        else Path(spec.origin).parent
    )
    path = base / relative
    return path if path.exists() else None


def render(chars: list[str], font_path: Path, count: int, seed: int) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(str(font_path), 30)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        img = Image.new("RGB", (320, 48), "white")
        text = "".join(rng.choice(chars, int(rng.integers(5, 10))))
        ImageDraw.Draw(img).text((6, 4), text, fill="black", font=font)
        out.append(((np.asarray(img, np.float32)[:, :, ::-1] / 255.0 - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def run(model: Path, x: np.ndarray, qdq: bool = False) -> np.ndarray:
    from trtq.compare.onnx_runner import make_session

    session = make_session(model, semantics="qdq", qdq=qdq)
    return np.concatenate([session.run(None, {"x": x[i : i + 8]})[0] for i in range(0, len(x), 8)])


def _trtq(*args) -> None:
    r = subprocess.run([sys.executable, "-m", "trtq", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"trtq {' '.join(map(str, args[:1]))} failed: {r.stderr.strip()[-400:]}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / ".bench" / "rec")
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--setting", action="append", help="METHOD [quantize flags]; repeatable (default: mse)")
    a = ap.parse_args(argv)
    model = _package_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
    font = _package_file("cvttf_NotoSansCJK_Regular", "NotoSansCJKtc-Regular.otf")
    if model is None or font is None:
        print("needs: pip install --no-deps rapidocr-onnxruntime cvttf-notosanscjk-regular")
        return 1
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    chars = [c for c in meta.get("character", "").split("\n") if len(c) == 1 and 0x4E00 <= ord(c) <= 0x9FFF]
    a.work.mkdir(parents=True, exist_ok=True)
    x = render(chars, font, a.lines, seed=1)
    calib = a.work / "calib.npy"
    np.save(calib, render(chars, font, a.calib, seed=0))
    ref = run(model, x)
    noisy = x + np.random.default_rng(5).uniform(-1 / 255, 1 / 255, x.shape).astype(np.float32)
    agree, cer = scoring.ctc_scores(ref, run(model, noisy))
    print(
        f"{a.lines} lines ({np.mean([len(s) for s in scoring.ctc_lines(ref)]):.1f} characters on average), "
        f"{len(chars)} CJK characters of the dictionary"
    )
    print(f"{'FP32, input +-1/255 noise':40s} agreement {agree:.3f}  CER {cer:.4f}")
    for setting in a.setting or ["mse"]:
        method, *flags = shlex.split(setting)
        tag = "".join(ch if ch.isalnum() else "_" for ch in setting)
        cache, qdq = a.work / f"{tag}.cache", a.work / f"{tag}.qdq.onnx"
        t0 = time.perf_counter()
        _trtq("calibrate", "--model", model, "--data", calib, "--method", method, "-o", cache, "-q")
        extra = ["--data", calib] if flags else []
        _trtq("quantize", "--model", model, "--cache", cache, "-o", qdq, "-q", *flags, *extra)
        agree, cer = scoring.ctc_scores(ref, run(qdq, x, qdq=True))
        lo, hi = wilson_interval(agree, a.lines)
        print(
            f"{'INT8 ' + setting:40s} agreement {agree:.3f} ({lo:.3f}-{hi:.3f})  CER {cer:.4f}  "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
