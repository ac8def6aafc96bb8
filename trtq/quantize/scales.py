"""Symmetric INT8 scales: activations from calibrated amax, weights from their own values."""

import math
from collections.abc import Mapping
from typing import Optional

import numpy as np

from trtq.errors import CacheError
from trtq.quantize.rules import QMAX, ZERO_SCALE


def check_amax(amax: Mapping[str, float]) -> None:
    """Every amax must be a finite number >= 0 (a scale of 0 or NaN breaks TensorRT)."""
    for name, value in amax.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise CacheError(f"amax for tensor '{name}' is not a number: {value!r}", "recalibrate") from None
        if not math.isfinite(v) or v < 0:
            raise CacheError(
                f"amax for tensor '{name}' is {v}, not a finite number >= 0",
                "recalibrate; check the data for NaN/Inf",
            )


def activation_scale(amax: float) -> np.ndarray:
    """Per-tensor scale, a float32 scalar: amax / 127 (``ZERO_SCALE`` when amax is 0)."""
    amax = float(amax)
    return np.array(amax / QMAX if amax > 0 else ZERO_SCALE, dtype=np.float32)


def weight_scale(weight: np.ndarray, axis: Optional[int]) -> np.ndarray:
    """max|W| / 127 per channel along ``axis`` (1-D float32), or for the whole tensor (scalar).

    A channel that is all zeros gets ``ZERO_SCALE``: any positive scale maps it back to zeros.
    """
    w = np.abs(np.asarray(weight, dtype=np.float64))
    if axis is None:
        peak = np.array(w.max() if w.size else 0.0)
    else:
        reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
        peak = w.max(axis=reduce_axes) if reduce_axes else w
    scale = peak / QMAX
    scale = np.where(peak > 0, scale, ZERO_SCALE).astype(np.float32)
    return scale if axis is not None else scale.reshape(())
