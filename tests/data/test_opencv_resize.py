"""OpenCV-style bilinear resize and the presets that use it, against the reference code.

The reference is the real thing where it is installed: OpenCV (``pip install --no-deps
opencv-python-headless``) for the resize, and RapidOCR's own ``resize_norm_img`` of its rec and cls
steps (``pip install --no-deps rapidocr-onnxruntime``; read from the installed file, as its package
import needs pyclipper and shapely) for the paddle preset. Tests that need them skip without them;
the hand-computed cases always run.
"""

import ast
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from tests.conftest import SAMPLE_IMAGES
from tests.doc_pages import font
from trtq.data.opencv_resize import resize_linear
from trtq.data.preprocess import Preprocessor, text_line_size
from trtq.data.presets import preset

PHOTOS = sorted(SAMPLE_IMAGES.glob("*_0.jpg"))[:4]
LEVEL = 1 / 127.5  # one grey level after (x / 255 - 0.5) / 0.5


def _cv2():
    try:
        import cv2
    except ImportError:
        pytest.skip("OpenCV is not installed (pip install --no-deps opencv-python-headless)")
    return cv2


def test_upscaling_follows_half_pixel_centres_and_clamps_at_the_border():
    row = np.array([[0, 255]], np.uint8)
    assert resize_linear(row, 4, 1).tolist() == [[0, 64, 191, 255]]  # 63.75 and 191.25 rounded
    assert resize_linear(row.astype(np.float32), 4, 1).tolist() == [[0.0, 63.75, 191.25, 255.0]]


def test_shrinking_reads_two_pixels_without_antialiasing():
    row = np.array([[0, 0, 255, 255]], np.uint8)
    assert resize_linear(row, 2, 1).tolist() == [[0, 255]]
    # PIL's bilinear widens its support when shrinking, so it blends the edge: not what OpenCV does
    assert np.asarray(Image.fromarray(row).resize((2, 1), Image.BILINEAR)).tolist() != [[0, 255]]


def test_channels_are_resized_alike():
    rgb = np.random.default_rng(0).integers(0, 256, (9, 13, 3), dtype=np.uint8)
    out = resize_linear(rgb, 20, 7)
    for c in range(3):
        assert np.array_equal(out[..., c], resize_linear(np.ascontiguousarray(rgb[..., c]), 20, 7))


@pytest.mark.parametrize("size", [(320, 48), (17, 5), (45, 18), (640, 640), (123, 48)])
def test_matches_opencv_inter_linear(size):
    cv2 = _cv2()
    images = [np.random.default_rng(1).integers(0, 256, (37, 91, 3), dtype=np.uint8)]
    images += [np.asarray(Image.open(p).convert("RGB")) for p in PHOTOS]
    for im in images:
        ref, ours = cv2.resize(im, size), resize_linear(im, *size)
        diff = np.abs(ref.astype(int) - ours.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.02, (im.shape, size, (diff > 0).mean())
        f_ref, f_ours = cv2.resize(im.astype(np.float32), size), resize_linear(im.astype(np.float32), *size)
        assert np.abs(f_ref - f_ours).max() <= 0.01


def _rapidocr_resize(step: str):
    """RapidOCR's own resize_norm_img of step 'rec' or 'cls', taken from the installed source."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    cv2 = _cv2()
    names = {"rec": ("ch_ppocr_rec", "text_recognize.py"), "cls": ("ch_ppocr_cls", "text_cls.py")}[step]
    source = (Path(spec.origin).parent / names[0] / names[1]).read_text(encoding="utf-8")
    found = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "resize_norm_img"]
    assert len(found) == 1, f"RapidOCR's {names[1]} changed: no single resize_norm_img"
    module = ast.Module(body=found, type_ignores=[])
    space = {"cv2": cv2, "np": np, "math": math}
    exec(compile(module, names[1], "exec"), space)  # the reference code as RapidOCR ships it
    return space["resize_norm_img"]


def _text_line(words: str, height: int) -> Image.Image:
    face = font(height - 8)
    width = int(face.getlength(words)) + 12
    img = Image.new("RGB", (width, height), (236, 232, 220))
    ImageDraw.Draw(img).text((6, 2), words, fill=(30, 20, 60), font=face)
    return img


def _lines() -> list[Image.Image]:
    """Real photos cut into strips of several aspect ratios, and rendered text lines."""
    out = []
    for i, path in enumerate(PHOTOS):
        photo = Image.open(path).convert("RGB")
        for ratio in (1.5, 4.0, 9.0):
            h = 24 + 9 * i
            out.append(photo.crop((0, 40, min(photo.width, int(h * ratio)), 40 + h)))
    out += [_text_line("total 12.50 paid", 40), _text_line("invoice number 2024 seven quick brown fox", 64)]
    return out


@pytest.mark.parametrize(("step", "shape"), [("rec", (3, 48, 320)), ("cls", (3, 48, 192))])
def test_paddle_preset_is_rapidocr_preprocessing(step, shape):
    reference = _rapidocr_resize(step)

    class Step:  # the attributes resize_norm_img reads from its object
        rec_image_shape = cls_image_shape = list(shape)

    ours = Preprocessor(preset("paddle", [1, *shape]))
    max_ratio = shape[2] / shape[1]  # RapidOCR batches lines and widens to the batch's widest; one line here
    squashed = 0
    for img in _lines():
        bgr = np.ascontiguousarray(np.asarray(img)[:, :, ::-1])  # RapidOCR reads with OpenCV: BGR
        ref = reference(Step(), bgr, max_ratio) if step == "rec" else reference(Step(), bgr)
        got = ours(img)
        assert got.shape == ref.shape == shape
        diff = np.abs(got - ref)
        assert diff.max() <= LEVEL + 1e-5 and (diff > 1e-5).mean() <= 0.02, (img.size, diff.max())
        squashed += text_line_size(shape[1:], *img.size)[0] == shape[2]
    assert squashed >= 3  # wide lines were squashed to the input width, as RapidOCR does


def test_text_line_size_caps_the_width_and_keeps_the_height():
    assert text_line_size((48, 320), 100, 20) == (240, 48)
    assert text_line_size((48, 320), 1000, 20) == (320, 48)  # squashed, not letterboxed to 9 px high
    assert text_line_size((48, 320), 101, 48) == (101, 48)


def _ultralytics_letterbox(cv2, im: np.ndarray, new_hw: tuple[int, int]) -> np.ndarray:
    """Ultralytics' LetterBox (auto=False, scaleup=True, centre) as its documentation describes it."""
    h, w = im.shape[:2]
    r = min(new_hw[0] / h, new_hw[1] / w)
    new_unpad = int(round(w * r)), int(round(h * r))
    dw, dh = (new_hw[1] - new_unpad[0]) / 2, (new_hw[0] - new_unpad[1]) / 2
    if (w, h) != new_unpad:
        im = cv2.resize(im, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    return cv2.copyMakeBorder(im, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114))


def test_yolo_preset_is_ultralytics_letterbox():
    cv2 = _cv2()
    ours = Preprocessor(preset("yolo", [1, 3, 320, 320]))
    for path in PHOTOS:
        img = Image.open(path).convert("RGB")
        ref = _ultralytics_letterbox(cv2, np.asarray(img), (320, 320)).astype(np.float32) / 255
        got = ours(img).transpose(1, 2, 0)  # RGB, as Ultralytics feeds the model after BGR -> RGB
        assert got.shape == ref.shape
        diff = np.abs(got - ref)
        assert diff.max() <= 1 / 255 + 1e-6 and (diff > 1e-6).mean() <= 0.02, path.name
