"""Image -> one sample tensor, exactly as :class:`trtq.config.PreprocessOptions` describes.

Order: (decode and EXIF rotation happen in :mod:`trtq.data.sources`) color, resize, center crop,
to float32, ``x * scale``, ``(x - mean) / std`` per channel, layout, dtype.

Rules that are easy to get subtly wrong, written down once:

* Color. ``rgb``/``bgr`` give 3 channels, ``gray`` gives 1 (PIL's ITU-R 601-2 luma). Alpha is
  dropped (not composited); palette images use their palette; CMYK goes through PIL's CMYK->RGB.
  16-bit images (modes ``I;16*``, and 16-bit PNGs that older Pillow opens as ``I``) are mapped to the
  8-bit range by ``/ 257`` and kept as float, so no precision is lost; ``I`` and ``F`` images keep
  their values. 8-bit images are resized by PIL in 8 bits (as torchvision's PIL path does); float
  images are resized in float (PIL mode ``F``).
* ``mean`` and ``std`` are in the channel order the model receives (B, G, R for ``bgr``).
* Resize rounding. ``shorter s``: the shorter side becomes ``s`` and the longer side
  ``floor(long * s / short + 1/2)`` (round half up, computed in integers). ``longer s`` is the
  mirror image. ``letterbox (h, w)``: the image is scaled by ``r = min(h / H, w / W)``; the side that
  binds becomes exactly ``h`` or ``w``, the other ``floor(side * r + 1/2)`` (at least 1). The
  canvas is filled with ``pad_value`` (pixel units, i.e. before scale/mean/std); with anchor
  ``center`` the image sits at ``((h - nh) // 2, (w - nw) // 2)`` (an odd extra pixel of padding
  goes to the bottom/right), with ``top_left`` at ``(0, 0)``.
* Center crop. Offsets follow torchvision's ``CenterCrop``: ``top = round((H - h) / 2)`` and
  ``left = round((W - w) / 2)`` with Python's ``round`` (half to even). ``(s,)`` means ``(s, s)``.
* ``height (h, w)`` (PaddleOCR's text-line resize): the height becomes ``h`` and the width
  ``ceil(h * W / H)`` computed in float as PaddleOCR does, capped at ``w`` (a wider line is squashed
  to ``w``); the rest of the ``(h, w)`` canvas is ``pad_value``, at the right with anchor
  ``top_left`` (PaddleOCR's), split left/right with ``center``.
* ``exact``, ``letterbox`` and ``height`` accept ``size: [s]`` for a square ``(s, s)``.
* Interpolation ``opencv_linear`` is OpenCV's ``INTER_LINEAR`` (:mod:`trtq.data.opencv_resize`: no
  antialiasing when shrinking), for models whose deployment resizes with OpenCV (PaddleOCR,
  Ultralytics); the others are PIL's filters.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image

from trtq.config import PreprocessOptions
from trtq.data.opencv_resize import resize_linear
from trtq.errors import ConfigError, DataError

__all__ = [
    "FILTERS",
    "INTERPOLATIONS",
    "Preprocessor",
    "build_preprocess",
    "crop_offsets",
    "letterbox_size",
    "resized_size",
    "text_line_size",
]


def _filter(name: str) -> int:
    resampling = getattr(Image, "Resampling", Image)  # Pillow >= 9.1 has the enum
    return int(getattr(resampling, name))


FILTERS = {
    "nearest": _filter("NEAREST"),
    "bilinear": _filter("BILINEAR"),
    "bicubic": _filter("BICUBIC"),
    "lanczos": _filter("LANCZOS"),
    "box": _filter("BOX"),
    "hamming": _filter("HAMMING"),
}

INTERPOLATIONS = (*FILTERS, "opencv_linear")

# Modes PIL stores as one 16-bit unsigned channel.
_MODES_16BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def _round_half_up(num: int, den: int) -> int:
    """floor(num / den + 1/2) for positive integers, exactly."""
    return (2 * num + den) // (2 * den)


def resized_size(mode: str, size: tuple[int, ...], width: int, height: int) -> tuple[int, int]:
    """(width, height) after resize ``mode`` (letterbox: the size of the image inside the canvas)."""
    if mode == "none":
        return width, height
    if mode == "exact":
        h, w = _pair(size)
        return w, h
    if mode == "letterbox":
        return letterbox_size(_pair(size), width, height)
    if mode == "height":
        return text_line_size(_pair(size), width, height)
    s = size[0]
    if (mode == "shorter") == (width <= height):
        return s, max(1, _round_half_up(s * height, width))
    return max(1, _round_half_up(s * width, height)), s


def letterbox_size(target_hw: tuple[int, int], width: int, height: int) -> tuple[int, int]:
    """(width, height) of an image scaled to fit inside ``target_hw`` keeping its aspect ratio."""
    th, tw = target_hw
    if th * width <= tw * height:  # height binds: r = th / height
        return min(tw, max(1, _round_half_up(width * th, height))), th
    return tw, min(th, max(1, _round_half_up(height * tw, width)))


def text_line_size(target_hw: tuple[int, int], width: int, height: int) -> tuple[int, int]:
    """(width, height) of a text line resized to the target height, as PaddleOCR's rec/cls do."""
    th, tw = target_hw
    wide = math.ceil(th * (width / float(height)))
    return (tw if wide > tw else max(1, int(wide))), th


def crop_offsets(height: int, width: int, crop_hw: tuple[int, int]) -> tuple[int, int]:
    """(top, left) of a center crop, rounded like torchvision's CenterCrop."""
    ch, cw = crop_hw
    return int(round((height - ch) / 2.0)), int(round((width - cw) / 2.0))


def _pair(size: Sequence[int]) -> tuple[int, int]:
    return (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))


@dataclass(frozen=True)
class _Plan:
    """Geometry of one image: resize target, placement on the canvas, crop window."""

    resize_to: tuple[int, int]  # (w, h) of the resized image
    offset: tuple[int, int]  # (top, left) of the resized image on the canvas
    canvas: tuple[int, int]  # (h, w) before the crop
    crop: tuple[int, int, int, int]  # (top, left, h, w) window on the canvas


class Preprocessor:
    """Callable ``PIL.Image -> np.ndarray`` for one sample; build it with :func:`build_preprocess`.

    ``channels`` is 1 for gray, else 3. ``dtype`` is the numpy dtype of the result.
    """

    def __init__(self, options: PreprocessOptions, key: str = "preprocess"):
        self.options = options
        self.key = key
        self.channels = 1 if options.color == "gray" else 3
        self.dtype = np.dtype(options.dtype)
        self._check_options()
        r = options.resize
        self._filter = FILTERS.get(r.interpolation)  # None: OpenCV's bilinear
        c = self.channels
        self._scale = np.float32(options.scale)
        self._mean = np.zeros(c, np.float32) if not options.mean else self._per_channel("mean", options.mean)
        self._std = np.ones(c, np.float32) if not options.std else self._per_channel("std", options.std)
        self._normalize = bool(options.mean) or bool(options.std)
        # 8-bit input: one lookup table per channel holds every possible result, computed with the
        # same float32 operations as the float path, so both paths give identical values.
        self._lut = self._affine(np.arange(256, dtype=np.float32)[None, :]).astype(self.dtype)
        self._pad = self._affine(np.full((1, 1), r.pad_value, np.float32)).astype(self.dtype)[:, 0]
        self._lut_finite = bool(np.isfinite(self._lut).all() and np.isfinite(self._pad).all())
        # channel of the color-converted image that feeds each output channel
        self._source_channel = (2, 1, 0) if options.color == "bgr" else tuple(range(c))

    # ---------------------------------------------------------------- validation

    def _per_channel(self, field: str, values: Sequence[float]) -> np.ndarray:
        if len(values) not in (1, self.channels):
            raise ConfigError(
                f"{self.key}.{field} has {len(values)} values but color "
                f"'{self.options.color}' gives {self.channels} channel(s)",
                f"give 1 or {self.channels} values",
            )
        arr = np.asarray(values, np.float32)
        return np.broadcast_to(arr, (self.channels,)).copy()

    def _check_options(self) -> None:
        o, r, key = self.options, self.options.resize, self.key
        if o.color not in ("rgb", "bgr", "gray"):
            raise ConfigError(f"{key}.color must be rgb, bgr or gray, got {o.color!r}")
        if o.layout not in ("nchw", "nhwc"):
            raise ConfigError(f"{key}.layout must be nchw or nhwc, got {o.layout!r}")
        if o.dtype not in ("float32", "float16"):
            raise ConfigError(f"{key}.dtype must be float32 or float16, got {o.dtype!r}")
        if r.interpolation not in INTERPOLATIONS:
            raise ConfigError(
                f"{key}.resize.interpolation must be one of {', '.join(INTERPOLATIONS)}, got {r.interpolation!r}"
            )
        sizes = {"none": (0,), "exact": (1, 2), "letterbox": (1, 2), "height": (1, 2), "shorter": (1,), "longer": (1,)}
        if r.mode not in sizes:
            raise ConfigError(f"{key}.resize.mode must be one of {', '.join(sizes)}, got {r.mode!r}")
        if len(r.size) not in sizes[r.mode]:
            want = {
                "none": "no size",
                "exact": "[height, width]",
                "letterbox": "[height, width]",
                "height": "[height, width]",
                "shorter": "one size",
                "longer": "one size",
            }[r.mode]
            raise ConfigError(
                f"{key}.resize.size is {list(r.size)} but mode '{r.mode}' takes {want}",
                f"set {key}.resize.size accordingly",
            )
        if any(int(s) <= 0 for s in r.size):
            raise ConfigError(f"{key}.resize.size must be positive, got {list(r.size)}")
        if len(o.center_crop) > 2 or any(int(s) <= 0 for s in o.center_crop):
            raise ConfigError(
                f"{key}.center_crop must be [height, width] or [size] of positive ints, got {list(o.center_crop)}"
            )
        if r.anchor not in ("center", "top_left"):
            raise ConfigError(f"{key}.resize.anchor must be center or top_left, got {r.anchor!r}")
        checked = (("scale", (o.scale,)), ("mean", o.mean), ("std", o.std), ("resize.pad_value", (r.pad_value,)))
        for field, values in checked:
            if not all(np.isfinite(values)):
                raise ConfigError(f"{key}.{field} must be finite, got {list(values)}")
        if any(float(s) == 0.0 for s in o.std):
            raise ConfigError(f"{key}.std must not contain 0", "use 1 for no scaling")

    # ---------------------------------------------------------------- math

    def _affine(self, x: np.ndarray) -> np.ndarray:
        """x (1, n) float32 pixel values -> (C, n): x * scale, then (x - mean) / std, in float32."""
        y = np.broadcast_to(x * self._scale, (self.channels, x.shape[1])).copy()
        if self._normalize:
            y -= self._mean[:, None]
            y /= self._std[:, None]
        return y

    # ---------------------------------------------------------------- geometry

    def plan(self, width: int, height: int, where: str = "image") -> _Plan:
        r = self.options.resize
        rw, rh = resized_size(r.mode, tuple(r.size), width, height)
        if r.mode in ("letterbox", "height"):
            ch, cw = _pair(r.size)
            offset = (0, 0) if r.anchor == "top_left" else ((ch - rh) // 2, (cw - rw) // 2)
        else:
            ch, cw = rh, rw
            offset = (0, 0)
        if self.options.center_crop:
            kh, kw = _pair(self.options.center_crop)
            if kh > ch or kw > cw:
                raise DataError(
                    f"{where} is {cw}x{ch} (w x h) after resize, smaller than {self.key}.center_crop {kh}x{kw} (h x w)",
                    f"set {self.key}.resize so the image is at least the crop size, or lower center_crop",
                )
            top, left = crop_offsets(ch, cw, (kh, kw))
        else:
            kh, kw, top, left = ch, cw, 0, 0
        return _Plan((rw, rh), offset, (ch, cw), (top, left, kh, kw))

    # ---------------------------------------------------------------- the pipeline

    def _to_color(self, img: Image.Image, where: str) -> tuple[Image.Image, bool]:
        """Color conversion; returns (image, is_float). Float images are single-channel mode F."""
        mode = img.mode
        is16 = mode in _MODES_16BIT or (mode == "I" and getattr(img, "format", None) == "PNG")
        if is16 or mode in ("I", "F"):
            arr = np.asarray(img).astype(np.float32)
            if is16:
                arr /= np.float32(257.0)
            return Image.fromarray(arr), True  # 2-D float32 -> mode F
        want = "L" if self.channels == 1 else "RGB"
        if mode == want or mode == "L":
            return img, False  # gray for rgb/bgr: replicated after resize (same values, less work)
        if mode in ("LA", "La", "1"):
            want = "L"
        try:
            if want == "L" and mode not in ("1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBX", "RGBa"):
                img = img.convert("RGB")
            return img.convert(want), False
        except (ValueError, OSError) as e:
            raise DataError(
                f"cannot convert {where} from mode {mode} to {want}: {e}",
                "convert it to an 8-bit RGB or grayscale image, or pass --skip-bad",
            ) from None

    def __call__(self, img: Image.Image, where: str = "image") -> np.ndarray:
        img, is_float = self._to_color(img, where)
        p = self.plan(img.width, img.height, where)
        if p.resize_to != img.size:
            if self._filter is None:
                img = Image.fromarray(resize_linear(np.asarray(img), *p.resize_to))
            else:
                img = img.resize(p.resize_to, self._filter)
        # the part of the resized image that lies inside the crop window, in canvas coordinates
        top, left, kh, kw = p.crop
        oy, ox = p.offset
        y0, x0 = max(top, oy), max(left, ox)
        y1, x1 = min(top + kh, oy + img.height), min(left + kw, ox + img.width)
        c = self.channels
        nchw = self.options.layout == "nchw"
        out = np.empty((c, kh, kw) if nchw else (kh, kw, c), self.dtype)
        covered = y0 == top and x0 == left and y1 == top + kh and x1 == left + kw
        if not covered:
            for ci in range(c):
                (out[ci] if nchw else out[..., ci]).fill(self._pad[ci])
        if y1 > y0 and x1 > x0:
            box = (x0 - ox, y0 - oy, x1 - ox, y1 - oy)
            if box != (0, 0, img.width, img.height):
                img = img.crop(box)
            pix = np.asarray(img)
            ys, xs = slice(y0 - top, y1 - top), slice(x0 - left, x1 - left)
            for ci in range(c):
                dst = out[ci, ys, xs] if nchw else out[ys, xs, ci]
                src = pix if pix.ndim == 2 else pix[:, :, self._source_channel[ci]]
                if is_float:
                    x = src * self._scale
                    if self._normalize:
                        x -= self._mean[ci]
                        x /= self._std[ci]
                    dst[...] = x
                elif dst.flags.c_contiguous:
                    np.take(self._lut[ci], src, out=dst, mode="wrap")
                else:
                    dst[...] = self._lut[ci][src]
        if (is_float or not self._lut_finite) and not np.isfinite(out).all():
            raise DataError(
                f"{where} has NaN or Inf values after preprocessing",
                "fix or remove it, check the preprocess scale/mean/std, or pass --skip-bad",
            )
        return out


def build_preprocess(options: PreprocessOptions, key: str = "preprocess") -> Callable[..., np.ndarray]:
    """Validate ``options`` (ConfigError naming ``key``) and return the per-image function.

    The function takes a decoded, EXIF-rotated PIL image (and optionally ``where``, the name used
    in error messages) and returns one sample: CHW or HWC, dtype float32 or float16.
    """
    return Preprocessor(options, key)
