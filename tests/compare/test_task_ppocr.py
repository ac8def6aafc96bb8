"""compare's task metrics on the real PP-OCRv4 models of rapidocr-onnxruntime (pip install --no-deps
rapidocr-onnxruntime; skipped without it): rec (CTC, [N, T, 6625] from a Softmax) on text lines
rendered with PIL, det (a [N, 1, H, W] probability map) on rendered pages and bundled photos. The
candidate is trtq's own INT8 Q/DQ model (calibrate --method max, quantize); the task is inferred
and its metric equals an independent scoring (tests/compare/scoring.py) of the outputs that ONNX
Runtime gives here for the same arrays, the Q/DQ model run with Q/DQ semantics."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SAMPLE_IMAGES
from tests.doc_pages import font
from trtq.compare.onnx_runner import make_session

from . import scoring

WORDS = [
    "invoice",
    "total",
    "paid",
    "order",
    "number",
    "date",
    "amount",
    "seven",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "2024",
    "12.50",
    "tax",
]


def _model(name: str) -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    path = Path(spec.origin).parent / "models" / name
    if not path.exists():
        pytest.skip(f"{name} is not in this rapidocr-onnxruntime")
    return path


def text_lines(count: int, seed: int = 0) -> np.ndarray:
    """Rendered text lines as PaddleOCR feeds rec: 48 x 320, BGR, (x / 255 - 0.5) / 0.5, NCHW."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        img = Image.new("RGB", (320, 48), "white")
        ImageDraw.Draw(img).text((6, 8), " ".join(rng.choice(WORDS, 3)), fill="black", font=font(26))
        out.append(((np.asarray(img, np.float32)[:, :, ::-1] / 255.0 - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def det_inputs(size: int = 256) -> np.ndarray:
    """Two rendered pages of text and two bundled photos, resized, ImageNet-normalized (det's)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(1)
    images = []
    for _ in range(2):
        page = Image.new("RGB", (size, size), "white")
        for y in range(12, size - 30, 34):
            ImageDraw.Draw(page).text((10, y), " ".join(rng.choice(WORDS, 3)), fill="black", font=font(22))
        images.append(page)
    photos = sorted(SAMPLE_IMAGES.glob("*_0.jpg"))[:2]
    images += [Image.open(p).convert("RGB").resize((size, size), Image.BILINEAR) for p in photos]
    x = (np.stack([np.asarray(i, np.float32) / 255.0 for i in images]) - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    return x.transpose(0, 3, 1, 2).astype(np.float32)


def compare_int8(trtq, model: Path, x: np.ndarray, tmp: Path, *flags):
    """Calibrate (max) and quantize ``model`` on ``x`` with trtq, then ``trtq compare --json``:
    (the output's task entry, FP32 outputs, INT8 outputs run here with Q/DQ semantics)."""
    npy, cache, qdq = tmp / "x.npy", tmp / "c.cache", tmp / "m.qdq.onnx"
    np.save(npy, x)
    assert trtq(["calibrate", "--model", model, "--data", npy, "--method", "max", "-o", cache, "-q"]).code == 0
    assert trtq(["quantize", "--model", model, "--cache", cache, "-o", qdq, "-q"]).code == 0
    r = trtq(["compare", "--reference", model, "--candidate", qdq, "--data", npy, "--json", *flags])
    assert r.code == 0, r
    return json.loads(r.out)["outputs"][0]["task"], run(model, x), run(qdq, x, qdq=True)


def run(model: Path, x: np.ndarray, qdq: bool = False) -> np.ndarray:
    session = make_session(model, semantics="qdq", qdq=qdq)  # qdq: the Q/DQ semantics compare scores with
    return np.concatenate([session.run(None, {"x": x[i : i + 4]})[0] for i in range(0, len(x), 4)])


@pytest.mark.slow
def test_ctc_on_ppocr_rec(trtq, tmp_path):
    task, ref, cand = compare_int8(
        trtq, _model("ch_PP-OCRv4_rec_infer.onnx"), text_lines(10), tmp_path, "--batch-size", "4"
    )
    assert task["name"] == "ctc" and "Softmax" in task["how"], task
    assert min(len(line) for line in scoring.ctc_lines(ref)) >= 5  # FP32 reads every line
    agreement, cer = scoring.ctc_scores(ref, cand)
    m = task["metrics"]
    assert m["sequence_agreement"] == pytest.approx(agreement) and m["cer"] == pytest.approx(cer)
    assert m["reference_chars"] == sum(len(line) for line in scoring.ctc_lines(ref))


@pytest.mark.slow
def test_segment_on_ppocr_det(trtq, tmp_path):
    task, ref, cand = compare_int8(
        trtq, _model("ch_PP-OCRv4_det_infer.onnx"), det_inputs(), tmp_path, "--mask-threshold", "0.3"
    )
    assert task["name"] == "segment" and "probability map" in task["how"], task
    assert (ref[:2] > 0.3).mean() > 0.05  # the text pages have text pixels
    m = task["metrics"]
    assert m["iou"] == pytest.approx(scoring.mask_iou(ref, cand, 0.3), rel=1e-9)
    assert m["pixel_agreement"] == pytest.approx(float(((ref > 0.3) == (cand > 0.3)).mean()))
    assert m["reference_mask_fraction"] == pytest.approx(float((ref > 0.3).mean()))
