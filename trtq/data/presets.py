"""Named preprocessing recipes for ``--preprocess NAME``, sized from the model input.

A preset is only a starting point written out in full: ``trtq calibrate --dry-run --json`` shows the
options it expands to, which can be pasted into a YAML config and edited.
"""

from collections.abc import Sequence
from dataclasses import replace

from trtq.config import PreprocessOptions, ResizeOptions
from trtq.errors import ConfigError, DataError
from trtq.model import format_shape

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

PRESETS: dict[str, str] = {
    "imagenet": "torchvision ImageNet eval: resize shorter side to size/0.875, center crop, mean/std",
    "inception": "resize shorter side to size/0.875, center crop, scale to [-1, 1] (TF / EfficientNet-Lite)",
    "yolo": "Ultralytics LetterBox: OpenCV bilinear to fit the input size, centred, pad 114, RGB, [0, 1]",
    "paddle": "PaddleOCR/RapidOCR cls/rec: OpenCV bilinear to the input height, wide lines squashed to "
    "the input width, pad right, BGR, [-1, 1]",
    "unit": "resize to the input size (ignoring aspect ratio), scale to [0, 1]",
    "raw": "resize to the input size, pixel values 0..255 as float",
}


def layout_of(shape: Sequence) -> tuple[str, int, int, int]:
    """(layout, channels, height, width) of an image input shape [N, C, H, W] or [N, H, W, C]."""
    if len(shape) != 4:
        raise DataError(
            f"an image preset needs a 4-D input, the model input has shape {format_shape(shape)}",
            "use .npy data, or a config with explicit preprocessing",
        )
    _, a, b, c = shape
    if isinstance(a, int) and a in (1, 3) and not (isinstance(c, int) and c in (1, 3)):
        layout, ch, h, w = "nchw", a, b, c
    elif isinstance(c, int) and c in (1, 3):
        layout, ch, h, w = "nhwc", c, a, b
    else:
        raise DataError(
            f"cannot tell the channel axis of input shape {format_shape(shape)}",
            "write the preprocessing in a config file (data.inputs.<name>.preprocess)",
        )
    if not isinstance(h, int) or not isinstance(w, int):
        raise DataError(
            f"input shape {format_shape(shape)} has a dynamic height/width",
            "give the full input shape: --shape INPUT=NxCxHxW (or data.shapes.<input> in the config)",
        )
    return layout, ch, h, w


def preset(name: str, shape: Sequence) -> PreprocessOptions:
    if name not in PRESETS:
        raise ConfigError(f"unknown preprocessing preset '{name}'", "choose one of " + ", ".join(PRESETS))
    layout, ch, h, w = layout_of(shape)
    base = PreprocessOptions(color="gray" if ch == 1 else "rgb", layout=layout)
    crop_resize = ResizeOptions(mode="shorter", size=(int(round(min(h, w) / 0.875)),))
    if name == "imagenet":
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if ch == 3 else ((0.5,), (0.5,))
        return replace(base, resize=crop_resize, center_crop=(h, w), mean=mean, std=std)
    if name == "inception":
        return replace(base, resize=crop_resize, center_crop=(h, w), mean=(0.5,), std=(0.5,))
    if name == "yolo":
        return replace(
            base, resize=ResizeOptions(mode="letterbox", size=(h, w), pad_value=114.0, interpolation="opencv_linear")
        )
    if name == "paddle":  # RapidOCR reads images with OpenCV (BGR) and feeds them as they are
        return replace(
            base,
            color="gray" if ch == 1 else "bgr",
            resize=ResizeOptions(
                mode="height", size=(h, w), pad_value=127.5, anchor="top_left", interpolation="opencv_linear"
            ),
            mean=(0.5,),
            std=(0.5,),
        )
    if name == "unit":
        return replace(base, resize=ResizeOptions(mode="exact", size=(h, w)))
    return replace(base, resize=ResizeOptions(mode="exact", size=(h, w)), scale=1.0)
