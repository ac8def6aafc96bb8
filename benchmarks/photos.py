"""Folders of real-photo JPEG/PNG files for benchmarks and accuracy checks.

The pictures are random crops of the photographs that scikit-image and scikit-learn ship with their
wheels, re-sized to the sizes phone and web photos usually have (300-640 px on the longer side) and
saved mostly as JPEG (quality 90) with some PNG. No network is needed.

``calibration`` and ``evaluation`` sets are cut from disjoint source photographs, so a model can be
calibrated on one and evaluated on content it has never seen. Everything is a pure function of
``(sources, seed, index)``, and files that already exist are kept, so a folder is a cache: asking for
10 000 files after 1 000 only writes the 9 000 new ones.

Needs ``pip install scikit-image scikit-learn`` (only for their data files).
"""

import argparse
import functools
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
from trtq.fileio import atomic_path

# Photographs only (no synthetic test patterns, no single-channel microscopy), split by content.
SOURCE_PHOTOS = {
    "calibration": (
        ("skimage", "astronaut.png"),
        ("skimage", "coffee.png"),
        ("skimage", "motorcycle_left.png"),
        ("skimage", "motorcycle_right.png"),  # a stereo pair: both halves stay on one side
        ("skimage", "hubble_deep_field.jpg"),
        ("sklearn", "china.jpg"),
    ),
    "evaluation": (
        ("skimage", "chelsea.png"),
        ("skimage", "rocket.jpg"),
        ("skimage", "retina.jpg"),
        ("skimage", "ihc.png"),
        ("sklearn", "flower.jpg"),
    ),
}
_SET_ID = {"calibration": 1, "evaluation": 2}
PNG_FRACTION = 0.15
JPEG_QUALITY = 90
LONG_SIDE = (300, 640)


def _package_dir(package: str) -> Path:
    if package == "skimage":
        import skimage.data

        return Path(skimage.data.__file__).parent
    import sklearn.datasets

    return Path(sklearn.datasets.__file__).parent / "images"


@functools.cache
def _load_source(package: str, name: str) -> Image.Image:
    path = _package_dir(package) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: pip install scikit-image scikit-learn")
    with Image.open(path) as im:
        return im.convert("RGB")


def _plan(rng: np.random.Generator, size: tuple[int, int]) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
    """A random crop box (scale 25-100 % of the area, aspect 3:4..4:3) and its output size."""
    w, h = size
    for _ in range(20):
        area = w * h * rng.uniform(0.25, 1.0)
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        cw = int(round(np.sqrt(area * aspect)))
        ch = int(round(np.sqrt(area / aspect)))
        if 16 <= cw <= w and 16 <= ch <= h:
            break
    else:
        cw, ch = min(w, h), min(w, h)
    x0 = int(rng.integers(0, w - cw + 1))
    y0 = int(rng.integers(0, h - ch + 1))
    long_side = int(rng.integers(LONG_SIDE[0], LONG_SIDE[1] + 1))
    if cw >= ch:
        out = (long_side, max(1, int(round(long_side * ch / cw))))
    else:
        out = (max(1, int(round(long_side * cw / ch))), long_side)
    return (x0, y0, x0 + cw, y0 + ch), out


def photo_name(index: int, seed: int) -> str:
    rng = np.random.default_rng([seed, index, 99])
    ext = "png" if rng.random() < PNG_FRACTION else "jpg"
    return f"photo_{index:06d}.{ext}"


def make_photo(dest: Path, index: int, seed: int, sources: str) -> Path:
    """Write photo ``index`` of a set into ``dest`` (kept if it is already there)."""
    path = dest / photo_name(index, seed)
    if path.exists():
        return path
    photos = SOURCE_PHOTOS[sources]
    rng = np.random.default_rng([seed, index, _SET_ID[sources]])
    src = _load_source(*photos[int(rng.integers(0, len(photos)))])
    box, out_size = _plan(rng, src.size)
    img = src.resize(out_size, Image.Resampling.LANCZOS, box=box)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    with atomic_path(path) as tmp:
        if path.suffix == ".png":
            img.save(tmp, format="PNG")
        else:
            img.save(tmp, format="JPEG", quality=JPEG_QUALITY)
    return path


def make_photo_set(dest: Path, count: int, seed: int, sources: str = "calibration") -> list[Path]:
    """Make sure ``dest`` holds photos 0..count-1 of the set; return their paths in order."""
    if sources not in SOURCE_PHOTOS:
        raise ValueError(f"sources must be one of {sorted(SOURCE_PHOTOS)}, not {sources!r}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    missing = [i for i in range(count) if not (dest / photo_name(i, seed)).exists()]
    if len(missing) > 64 and (os.cpu_count() or 1) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor() as pool:
            list(pool.map(_make_one, [(dest, i, seed, sources) for i in missing], chunksize=32))
    else:
        for i in missing:
            make_photo(dest, i, seed, sources)
    return [dest / photo_name(i, seed) for i in range(count)]


def _make_one(args) -> None:
    make_photo(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources", choices=sorted(SOURCE_PHOTOS), default="calibration")
    args = ap.parse_args()
    paths = make_photo_set(args.dest, args.count, args.seed, args.sources)
    print(f"{len(paths)} photos in {args.dest}")


if __name__ == "__main__":
    main()
