"""Preprocessing: every option against straightforward numpy / PIL reference computations."""

import math

import numpy as np
import pytest
from PIL import Image

from trtq.config import PreprocessOptions, ResizeOptions, load_config
from trtq.data.preprocess import build_preprocess, crop_offsets, letterbox_size, resized_size
from trtq.errors import ConfigError, DataError

from .helpers import noise_rgb

PIL_FILTERS = {
    "nearest": Image.NEAREST,
    "bilinear": Image.BILINEAR,
    "bicubic": Image.BICUBIC,
    "lanczos": Image.LANCZOS,
    "box": Image.BOX,
    "hamming": Image.HAMMING,
}
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def from_yaml(tmp_path, text: str) -> PreprocessOptions:
    """The preprocess section of a config file, loaded the way trtq loads configs."""
    path = tmp_path / "trtq.yaml"
    path.write_text(text)
    return load_config(path, environ={}).data.inputs["x"].preprocess


TORCHVISION_YAML = """
data:
  inputs:
    x:
      images: imgs
      preprocess:
        color: rgb
        resize: {mode: shorter, size: 256, interpolation: bilinear}
        center_crop: 224
        scale: 0.00392156862745098
        mean: [0.485, 0.456, 0.406]
        std: [0.229, 0.224, 0.225]
        layout: nchw
"""

PADDLEOCR_YAML = """
data:
  inputs:
    x:
      images: imgs
      preprocess:
        color: COLOR
        resize: {mode: letterbox, size: [48, 192], pad_value: 127.5, anchor: top_left}
        scale: 0.00392156862745098
        mean: [0.5]
        std: [0.5]
"""

YOLO_YAML = """
data:
  inputs:
    x:
      images: imgs
      preprocess:
        color: rgb
        resize: {mode: letterbox, size: [640, 640], pad_value: 114}
        scale: 0.00392156862745098
"""


def rgb(width, height, seed=0):
    return Image.fromarray(noise_rgb(width, height, seed))


def half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


# ------------------------------------------------------------------------------------ geometry


def test_shorter_side_rounds_half_up():
    # 4x6 image, shorter side -> 3: the long side is 6 * 3 / 4 = 4.5 -> 5 (not 4 as truncation or
    # round-half-even would give)
    assert resized_size("shorter", (3,), 4, 6) == (3, 5)
    assert resized_size("shorter", (3,), 6, 4) == (5, 3)
    assert resized_size("longer", (3,), 6, 4) == (3, 2)  # 4 * 3 / 6 = 2
    assert resized_size("longer", (4,), 6, 9) == (3, 4)  # 6 * 4 / 9 = 2.67 -> 3
    assert resized_size("longer", (5,), 2, 4) == (3, 5)  # 2 * 5 / 4 = 2.5 -> 3
    assert resized_size("exact", (7, 9), 100, 50) == (9, 7)
    assert resized_size("none", (), 13, 11) == (13, 11)


def test_letterbox_size_keeps_aspect():
    assert letterbox_size((640, 640), 320, 200) == (640, 400)
    assert letterbox_size((48, 192), 100, 30) == (160, 48)
    assert letterbox_size((48, 192), 300, 30) == (192, 19)  # 30 * 192 / 300 = 19.2
    assert letterbox_size((10, 10), 4, 20) == (2, 10)
    assert letterbox_size((10, 10), 1, 1000) == (1, 10)  # never 0 wide


def test_crop_offsets_like_torchvision():
    assert crop_offsets(256, 341, (224, 224)) == (16, 58)  # (341 - 224) / 2 = 58.5 -> 58 (half to even)
    assert crop_offsets(256, 343, (224, 224)) == (16, 60)  # 59.5 -> 60
    assert crop_offsets(10, 10, (10, 10)) == (0, 0)


# ------------------------------------------------------------------------------------ three real recipes


def test_torchvision_imagenet_recipe(tmp_path):
    opts = from_yaml(tmp_path, TORCHVISION_YAML)
    for w, h in ((301, 200), (200, 343), (256, 256)):
        img = rgb(w, h, seed=w)
        got = build_preprocess(opts)(img)
        short, long_ = min(w, h), max(w, h)
        new_long = half_up(long_ * 256 / short)
        nw, nh = (256, new_long) if w <= h else (new_long, 256)
        ref = np.asarray(img.resize((nw, nh), Image.BILINEAR)).astype(np.float64)
        top, left = int(round((nh - 224) / 2)), int(round((nw - 224) / 2))
        ref = ref[top : top + 224, left : left + 224]
        ref = ((ref / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
        assert got.shape == (3, 224, 224) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, atol=2e-6)


@pytest.mark.parametrize("color", ["rgb", "bgr"])
@pytest.mark.parametrize("size", [(100, 30), (300, 30)])
def test_paddleocr_recipe(tmp_path, color, size):
    """Fixed height, keep aspect, pad right (pad 127.5 px = 0 after normalizing), scale to [-1, 1]."""
    opts = from_yaml(tmp_path, PADDLEOCR_YAML.replace("COLOR", color))
    w, h = size
    img = rgb(w, h, seed=3)
    got = build_preprocess(opts)(img)
    ratio = min(48 / h, 192 / w)
    nw, nh = min(192, half_up(w * ratio)), min(48, half_up(h * ratio))
    canvas = np.full((48, 192, 3), 127.5)
    canvas[:nh, :nw] = np.asarray(img.resize((nw, nh), Image.BILINEAR))
    if color == "bgr":
        canvas = canvas[:, :, ::-1]
    ref = ((canvas / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    np.testing.assert_allclose(got, ref, atol=2e-6)
    assert np.all(got[:, :, nw:] == 0.0) and np.all(got[:, nh:, :] == 0.0)


def test_yolo_recipe(tmp_path):
    opts = from_yaml(tmp_path, YOLO_YAML)
    img = rgb(320, 200, seed=5)
    got = build_preprocess(opts)(img)
    canvas = np.full((640, 640, 3), 114.0)
    top = (640 - 400) // 2
    canvas[top : top + 400, :] = np.asarray(img.resize((640, 400), Image.BILINEAR))
    ref = (canvas / 255.0).transpose(2, 0, 1)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    assert got.shape == (3, 640, 640)
    np.testing.assert_allclose(got[:, 0, 0], 114 / 255, rtol=1e-6)


# ------------------------------------------------------------------------------------ single options


@pytest.mark.parametrize("name", sorted(PIL_FILTERS))
@pytest.mark.parametrize("mode", ["exact", "shorter", "longer"])
def test_resize_modes_and_filters(name, mode):
    img = rgb(23, 17, seed=11)
    size = (9, 13) if mode == "exact" else (10,)
    opts = PreprocessOptions(resize=ResizeOptions(mode=mode, size=size, interpolation=name), scale=1.0, layout="nhwc")
    got = build_preprocess(opts)(img)
    if mode == "exact":
        nw, nh = 13, 9
    elif mode == "shorter":
        nw, nh = half_up(23 * 10 / 17), 10
    else:
        nw, nh = 10, half_up(17 * 10 / 23)
    ref = np.asarray(img.resize((nw, nh), PIL_FILTERS[name])).astype(np.float32)
    assert got.shape == (nh, nw, 3)
    np.testing.assert_array_equal(got, ref)


def test_resize_none_scale_and_layouts():
    img = rgb(7, 5, seed=2)
    arr = np.asarray(img).astype(np.float64)
    hwc = build_preprocess(PreprocessOptions(scale=0.5, layout="nhwc"))(img)
    chw = build_preprocess(PreprocessOptions(scale=0.5, layout="nchw"))(img)
    np.testing.assert_allclose(hwc, arr * 0.5)
    np.testing.assert_allclose(chw, (arr * 0.5).transpose(2, 0, 1))
    assert chw.flags.c_contiguous


def test_mean_std_single_value_and_per_channel():
    img = rgb(6, 4, seed=9)
    arr = np.asarray(img).astype(np.float64)
    one = build_preprocess(PreprocessOptions(scale=1 / 255, mean=(0.5,), std=(0.25,), layout="nhwc"))(img)
    np.testing.assert_allclose(one, (arr / 255 - 0.5) / 0.25, atol=2e-6)
    per = build_preprocess(PreprocessOptions(scale=2.0, mean=(1, 2, 3), std=(4, 5, 6), layout="nhwc"))(img)
    np.testing.assert_allclose(per, (arr * 2.0 - [1, 2, 3]) / [4, 5, 6], rtol=1e-6)


def test_mean_wrong_length_is_config_error():
    with pytest.raises(ConfigError, match=r"preprocess\.mean has 2 values.*3 channel"):
        build_preprocess(PreprocessOptions(mean=(0.1, 0.2)))
    with pytest.raises(ConfigError, match=r"std has 3 values.*1 channel"):
        build_preprocess(PreprocessOptions(color="gray", std=(1, 1, 1)))
    with pytest.raises(ConfigError, match="std must not contain 0"):
        build_preprocess(PreprocessOptions(std=(0.0,)))


def test_bad_resize_options_are_config_errors():
    with pytest.raises(ConfigError, match="takes one size"):
        build_preprocess(PreprocessOptions(resize=ResizeOptions(mode="shorter", size=(1, 2))))
    with pytest.raises(ConfigError, match=r"\[height, width\]"):
        build_preprocess(PreprocessOptions(resize=ResizeOptions(mode="letterbox", size=())))
    with pytest.raises(ConfigError, match="positive"):
        build_preprocess(PreprocessOptions(resize=ResizeOptions(mode="exact", size=(0, 4))))


def test_bgr_reverses_channels_and_mean_follows_model_order():
    img = rgb(5, 5, seed=4)
    arr = np.asarray(img).astype(np.float64)
    got = build_preprocess(PreprocessOptions(color="bgr", scale=1.0, mean=(10, 20, 30), layout="nhwc"))(img)
    np.testing.assert_allclose(got, arr[:, :, ::-1] - [10, 20, 30])


def test_gray_is_one_channel_luma():
    img = rgb(9, 6, seed=8)
    arr = np.asarray(img).astype(np.float64)
    got = build_preprocess(PreprocessOptions(color="gray", scale=1.0))(img)
    luma = arr[..., 0] * 0.299 + arr[..., 1] * 0.587 + arr[..., 2] * 0.114  # ITU-R 601-2
    assert got.shape == (1, 6, 9)
    np.testing.assert_allclose(got[0], luma, atol=1.0)


def test_center_crop_pair_and_square():
    img = rgb(11, 9, seed=1)
    arr = np.asarray(img).astype(np.float32)
    got = build_preprocess(PreprocessOptions(center_crop=(4, 6), scale=1.0, layout="nhwc"))(img)
    np.testing.assert_array_equal(got, arr[2:6, 2:8])  # top round(2.5)=2, left round(2.5)=2
    sq = build_preprocess(PreprocessOptions(center_crop=(5,), scale=1.0, layout="nhwc"))(img)
    np.testing.assert_array_equal(sq, arr[2:7, 3:8])


def test_crop_larger_than_image_says_what_to_change():
    with pytest.raises(
        DataError,
        match=r"image x.png is 11x9 .*smaller than preprocess\.center_crop 10x10"
        r".*set preprocess\.resize",
    ):
        build_preprocess(PreprocessOptions(center_crop=(10,)))(rgb(11, 9), "image x.png")


def test_letterbox_then_center_crop_cuts_padding():
    img = rgb(8, 4, seed=6)
    opts = PreprocessOptions(
        resize=ResizeOptions(mode="letterbox", size=(8, 8), pad_value=7.0), center_crop=(6, 6), scale=1.0, layout="nhwc"
    )
    got = build_preprocess(opts)(img)
    canvas = np.full((8, 8, 3), 7.0)
    canvas[2:6, :] = np.asarray(img)  # no resize needed: 8 wide already fits
    np.testing.assert_array_equal(got, canvas[1:7, 1:7])


def test_float16_output():
    img = rgb(6, 6, seed=7)
    got = build_preprocess(PreprocessOptions(dtype="float16", scale=1 / 255, mean=(0.5,), std=(0.5,)))(img)
    assert got.dtype == np.float16
    ref = ((np.asarray(img).astype(np.float64) / 255 - 0.5) / 0.5).transpose(2, 0, 1)
    np.testing.assert_allclose(got.astype(np.float64), ref, atol=1e-3)


def test_16bit_gray_keeps_precision_and_resizes_in_float():
    values = (np.arange(12 * 10, dtype=np.uint16).reshape(10, 12) * 541).astype(np.uint16)
    img = Image.fromarray(values)
    assert img.mode == "I;16"
    got = build_preprocess(PreprocessOptions(color="gray", scale=1.0))(img)
    np.testing.assert_allclose(got[0], values / 257.0, rtol=1e-6)
    assert not np.allclose(got, np.round(got))  # not quantized to 8 bits
    opts = PreprocessOptions(color="rgb", scale=1.0, resize=ResizeOptions(mode="exact", size=(5, 6)))
    got = build_preprocess(opts)(img)
    ref = np.asarray(Image.fromarray((values / 257.0).astype(np.float32)).resize((6, 5), Image.BILINEAR))
    assert got.shape == (3, 5, 6)
    for c in range(3):
        np.testing.assert_allclose(got[c], ref, rtol=1e-6)


def test_float_image_with_nan_is_rejected():
    arr = np.ones((4, 4), np.float32)
    arr[1, 2] = np.nan
    with pytest.raises(DataError, match="image f.tif has NaN or Inf"):
        build_preprocess(PreprocessOptions(color="gray"))(Image.fromarray(arr), "image f.tif")
