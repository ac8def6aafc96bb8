"""Regenerate sample_data/images/ from public-domain / CC0 photos shipped with scikit-image.

    pip install scikit-image && python scripts/make_sample_images.py

Deterministic: fixed crop boxes from a seeded generator. Licences: sample_data/LICENSES.md.
"""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

# (skimage file, licence) -- photographs only
PHOTOS = [
    ("astronaut.png", "public domain (NASA)"),
    ("coffee.png", "CC0 (Rachel Michetti)"),
    ("chelsea.png", "CC0 (Stefan van der Walt)"),
    ("rocket.jpg", "public domain (SpaceX)"),
    ("camera.png", "CC0 (Lav Varshney)"),
    ("hubble_deep_field.jpg", "public domain (NASA)"),
    ("retina.jpg", "CC0 (Wikimedia Commons)"),
    ("text.png", "public domain"),
]
PER_PHOTO = 4  # crops per photo; text.png also gets its 4 rotations (document orientation model)


def main(out: Path) -> None:
    import skimage

    src = Path(skimage.__file__).parent / "data"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    for fname, _ in PHOTOS:
        img = Image.open(src / fname)
        img.load()
        stem = Path(fname).stem
        w, h = img.size
        for k in range(PER_PHOTO):
            side = int(min(w, h) * rng.uniform(0.45, 0.9))
            x0 = int(rng.integers(0, w - side + 1))
            y0 = int(rng.integers(0, h - side + 1))
            crop = img.crop((x0, y0, x0 + side, y0 + side))
            size = int(rng.integers(240, 321))
            crop = crop.resize((size, int(size * rng.uniform(0.75, 1.33))), Image.BICUBIC)
            if stem == "text":
                crop = crop.rotate(90 * k, expand=True)
            if crop.mode not in ("RGB", "L"):
                crop = crop.convert("RGB")
            if k == 3 and stem in ("coffee", "chelsea"):
                crop.save(out / f"{stem}_{k}.png", optimize=True)
            else:
                crop.save(out / f"{stem}_{k}.jpg", quality=88)
    print(f"wrote {len(list(out.iterdir()))} images to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "sample_data" / "images")
