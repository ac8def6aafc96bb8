import pytest

from trtq.data.presets import PRESETS, layout_of, preset
from trtq.errors import ConfigError, DataError


def test_layout_detection():
    assert layout_of(["N", 3, 224, 224]) == ("nchw", 3, 224, 224)
    assert layout_of([1, 320, 640, 3]) == ("nhwc", 3, 320, 640)
    assert layout_of([8, 1, 28, 28]) == ("nchw", 1, 28, 28)
    with pytest.raises(DataError, match="dynamic height/width"):
        layout_of(["N", 3, "h", "w"])
    with pytest.raises(DataError, match="4-D"):
        layout_of(["N", 128])
    with pytest.raises(DataError, match="channel axis"):
        layout_of([1, 64, 64, 64])


def test_imagenet_preset_is_torchvision_eval():
    p = preset("imagenet", ["N", 3, 224, 224])
    assert p.resize.mode == "shorter" and p.resize.size == (256,)
    assert p.center_crop == (224, 224) and p.layout == "nchw" and p.color == "rgb"
    assert p.mean == (0.485, 0.456, 0.406) and p.std == (0.229, 0.224, 0.225)
    assert p.scale == pytest.approx(1 / 255)


def test_yolo_and_paddle_and_gray():
    y = preset("yolo", [1, 3, 640, 640])
    resize = (y.resize.mode, y.resize.size, y.resize.pad_value, y.resize.anchor)
    assert resize == ("letterbox", (640, 640), 114.0, "center")
    assert y.mean == () and y.std == ()
    p = preset("paddle", [1, 3, 48, 192])
    assert p.resize.anchor == "top_left" and p.resize.size == (48, 192) and p.mean == (0.5,) and p.std == (0.5,)
    # pad value 127.5 in pixel units becomes exactly 0 after (x/255 - 0.5) / 0.5
    assert (p.resize.pad_value * p.scale - 0.5) / 0.5 == 0.0
    g = preset("unit", [1, 28, 28, 1])
    assert g.color == "gray" and g.layout == "nhwc" and g.resize.size == (28, 28)
    assert preset("raw", [1, 3, 8, 8]).scale == 1.0


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preprocessing preset"):
        preset("vgg", [1, 3, 224, 224])
    assert set(PRESETS) >= {"imagenet", "yolo", "paddle"}


def test_cli_preset_choice_names_every_preset():
    from trtq.cli.flags import PRESET_CHOICE
    from trtq.data.presets import PRESETS

    assert list(PRESET_CHOICE.choices) == list(PRESETS)
