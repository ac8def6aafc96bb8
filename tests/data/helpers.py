"""Small real files for the data-pipeline tests (made with PIL / numpy in tmp_path)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from trtq.config import DataOptions, InputSource, PreprocessOptions, ResizeOptions
from trtq.model import TensorSpec


def noise_rgb(width: int, height: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def save_rgb(path: Path, width: int = 20, height: int = 16, seed: int = 0, fmt: Optional[str] = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(noise_rgb(width, height, seed)).save(path, format=fmt)
    return path


def image_folder(root: Path, count: int, width: int = 20, height: int = 16) -> list[Path]:
    """``count`` distinct noise PNGs named img_000.png ... (lossless, so values are exact)."""
    return [save_rgb(root / f"img_{i:03d}.png", width, height, seed=i) for i in range(count)]


SMALL = PreprocessOptions(resize=ResizeOptions(mode="exact", size=(8, 8)), scale=1.0 / 255.0)


def spec(name: str = "x", shape: Sequence = ("N", 3, 8, 8), dtype: str = "float32") -> TensorSpec:
    return TensorSpec(name, tuple(shape), dtype)


def folder_options(folder: Path, name: str = "x", preprocess: PreprocessOptions = SMALL, **kw) -> DataOptions:
    return DataOptions(inputs={name: InputSource(images=str(folder), preprocess=preprocess)}, **kw)


def npy_options(paths: Sequence, name: str = "x", **kw) -> DataOptions:
    return DataOptions(inputs={name: InputSource(npy=tuple(str(p) for p in paths))}, **kw)


def collect(batcher):
    """All batches of one pass as (index, {name: bytes}, valid, {name: shape})."""
    return [
        (b.index, {k: v.tobytes() for k, v in b.arrays.items()}, b.valid, {k: v.shape for k, v in b.arrays.items()})
        for b in batcher
    ]
