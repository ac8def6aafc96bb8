"""Real models: the bundled orientation classifier and, when installed, RapidOCR's PP-OCR models."""
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.quantize.conftest import activation_amax, cosine, imagenet_batch, nodes_of, run
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model


def _page_rotations(size=224) -> np.ndarray:
    """scikit-image's scanned page turned by 0/90/180/270 degrees: the classifier's own task."""
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image

    page = skdata.page()
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    out = []
    for k in range(4):
        img = Image.fromarray(np.ascontiguousarray(np.rot90(page, k))).convert("RGB")
        w, h = img.size
        s = 256 / min(w, h)
        img = img.resize((max(size, round(w * s)), max(size, round(h * s))), Image.BILINEAR)
        w, h = img.size
        img = img.crop(((w - size) // 2, (h - size) // 2, (w - size) // 2 + size, (h - size) // 2 + size))
        out.append(((np.asarray(img, np.float32) / 255.0 - mean) / std).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


@pytest.fixture(scope="module")
def sample_data():
    pages = _page_rotations()
    photos = imagenet_batch()
    return pages, photos


@pytest.fixture(scope="module")
def calibrated(sample_fp32, sample_data):
    pages, photos = sample_data
    return activation_amax(sample_fp32, [{"x": pages}, {"x": photos}])


@pytest.mark.parametrize("fp16", [False, True])
def test_sample_model_quantizes_and_stays_close_to_fp32(sample_fp32, sample_data, calibrated, fp16):
    result = quantize_model(sample_fp32, calibrated, QuantizeOptions(fp16=fp16))
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    convs = [n.name for n in sample_fp32.graph.node if n.op_type == "Conv"]
    assert result.quantized == convs  # every Conv, depthwise and SE convs included
    assert result.missing_amax == []
    assert [name for name, _ in result.left_float] == ["MatMul.0"]  # the 4-class head: N = 4
    assert len(nodes_of(q, "QuantizeLinear")) == result.qdq_pairs == 2 * len(convs)
    pages, photos = sample_data
    ref_pages, got_pages = run(sample_fp32, {"x": pages})[0], run(q, {"x": pages})[0]
    assert list(ref_pages.argmax(1)) == [0, 3, 2, 1]  # the FP32 model reads the rotations right
    assert list(got_pages.argmax(1)) == list(ref_pages.argmax(1))
    assert cosine(ref_pages, got_pages) > 0.999
    ref_photos, got_photos = run(sample_fp32, {"x": photos})[0], run(q, {"x": photos})[0]
    assert cosine(ref_photos, got_photos) > 0.95  # off-task inputs: low-confidence outputs move more


# ------------------------------------------------------------------------------------------------
# PP-OCR det / cls / rec from rapidocr-onnxruntime (pip install --no-deps rapidocr-onnxruntime)
# ------------------------------------------------------------------------------------------------

def _rapidocr_models() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    return Path(spec.origin).parent / "models"


def _ocr_input(kind: str) -> np.ndarray:
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image

    page = Image.fromarray(skdata.page()).convert("RGB")
    if kind == "det":
        img = np.asarray(page.resize((384, 192), Image.BILINEAR), np.float32) / 255.0
        x = (img - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    else:  # a text line, 48 px high
        line = page.crop((0, 20, 300, 60)).resize((192 if kind == "cls" else 320, 48), Image.BILINEAR)
        x = (np.asarray(line, np.float32) / 255.0 - 0.5) / 0.5
    return x.transpose(2, 0, 1)[None].astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, filename, opset",
    [
        ("cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", 11),
        ("rec", "ch_PP-OCRv4_rec_infer.onnx", 12),
        ("det", "ch_PP-OCRv4_det_infer.onnx", 12),
    ],
)
def test_ppocr_models_from_rapidocr(kind, filename, opset):
    path = _rapidocr_models() / filename
    if not path.exists():
        pytest.skip(f"{filename} is not in this rapidocr-onnxruntime version")
    model = onnx.load(str(path))
    x = _ocr_input(kind)
    amax = activation_amax(model, [{"x": x}])
    result = quantize_model(model, amax, QuantizeOptions())
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    assert f"upgraded default-domain opset {opset} -> 13" in result.notes
    assert any("Constant nodes into initializers" in n for n in result.notes)
    assert not nodes_of(q, "Constant") or all(n.output[0] not in {i for c in nodes_of(q, "Conv") for i in c.input}
                                              for n in nodes_of(q, "Constant"))
    convs = nodes_of(q, "Conv")
    quantized_convs = [c for c in convs if c.name in result.quantized]
    assert len(quantized_convs) >= 0.9 * len(convs)
    for c in quantized_convs:  # per-channel weights from what were Constant nodes
        assert c.input[1].endswith("_DequantizeLinear_Output")
    assert result.missing_amax == []
    ref, got = run(model, {"x": x})[0], run(q, {"x": x})[0]
    assert got.shape == ref.shape
    if kind == "rec":
        reasons = [r for _, r in result.left_float]
        assert sum(r.startswith("attention") for r in reasons) == 4  # 2 blocks x (QK^T, PV)
        assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.95  # CTC labels per time step
    elif kind == "cls":
        assert ref.argmax() == got.argmax() and cosine(ref, got) > 0.99
    else:  # det: probability map; max calibration leaves it coarser but the text mask holds
        assert ((ref > 0.3) == (got > 0.3)).mean() > 0.9
    fp16 = quantize_model(model, amax, QuantizeOptions(fp16=True)).model
    onnx.checker.check_model(fp16, full_check=True)
    assert cosine(run(fp16, {"x": x})[0], got) > 0.97
