"""Copy a photo folder at a 256-px shorter side (bicubic, JPEG quality 92) so it fits a transfer.

    python benchmarks/gpu/shrink_photos.py SRC DEST

The EfficientNet-Lite0 preprocessing resizes the shorter side to 256 first, so the files keep what
the model sees (up to the JPEG re-encoding, which every runtime in one bench run then shares)."""

import sys
from pathlib import Path

from PIL import Image


def main(src: Path, dest: Path, short: int = 256) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.iterdir()):
        if (dest / (path.stem + ".jpg")).exists():
            continue
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = short / min(w, h)
            im = im.resize((max(short, round(w * s)), max(short, round(h * s))), Image.BICUBIC)
            im.save(dest / (path.stem + ".jpg"), quality=92)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
