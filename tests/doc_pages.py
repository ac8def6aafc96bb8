"""Document pages rendered with PIL, for layout detectors (YOLOv8n DocLayNet): a portrait page with a
running header, a title, section headers, paragraphs, bullet lists, a photo (the bundled samples)
or a ruled table, each with a caption, in one or two columns, and a page number as footer.

Deterministic for a seed; text is drawn with Pillow's own scalable font (``load_default(size)``),
so no system fonts are needed. ``write_pages`` saves PNGs for ``--data FOLDER --preprocess yolo``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "sample_data" / "images"

WORDS = (
    "the",
    "model",
    "calibration",
    "engine",
    "tensor",
    "layer",
    "input",
    "output",
    "batch",
    "scale",
    "range",
    "data",
    "image",
    "quantized",
    "precision",
    "latency",
    "accuracy",
    "network",
    "graph",
    "node",
    "weight",
    "activation",
    "histogram",
    "cache",
    "result",
    "table",
    "figure",
    "method",
    "sample",
    "value",
    "error",
    "kernel",
    "build",
    "section",
    "report",
    "runtime",
    "memory",
    "device",
    "shape",
    "channel",
    "feature",
    "detection",
    "page",
    "document",
    "text",
    "line",
)


def font(size: int):
    """Pillow's own scalable font at ``size`` px (the tests' text needs no system font); the small
    bitmap font on Pillow < 10.1."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one small bitmap font
        return ImageFont.load_default()


def _sentence(rng, n: int) -> str:
    s = " ".join(rng.choice(WORDS, n))
    return s[0].upper() + s[1:]


def _wrap(draw, text: str, face, width: int) -> list[str]:
    lines, line = [], ""
    for w in text.split():
        trial = f"{line} {w}".strip()
        if line and draw.textlength(trial, font=face) > width:
            lines.append(line)
            line = w
        else:
            line = trial
    return lines + ([line] if line else [])


class _Column:
    def __init__(self, draw, x: int, width: int, y: int, bottom: int):
        self.draw, self.x, self.width, self.y, self.bottom = draw, x, width, y, bottom

    def room(self, h: int) -> bool:
        return self.y + h <= self.bottom

    def text(
        self, text: str, size: int, indent: int = 0, gap: int = 4, bold: bool = False, fill: str = "black"
    ) -> bool:
        face = font(size)
        lines = _wrap(self.draw, text, face, self.width - indent)
        step = int(size * 1.25)
        if not self.room(step * len(lines)):
            return False
        for line in lines:
            for dx in (0, 1) if bold else (0,):
                self.draw.text((self.x + indent + dx, self.y), line, fill=fill, font=face)
            self.y += step
        self.y += gap
        return True


def _photo(page, col: _Column, rng) -> bool:
    from PIL import Image

    files = sorted(PHOTOS.glob("*.jpg"))
    with Image.open(files[int(rng.integers(len(files)))]) as im:
        im = im.convert("RGB")
        w = int(col.width * rng.uniform(0.6, 1.0))
        h = int(w * im.height / im.width)
        if not col.room(h + 30):
            return False
        page.paste(im.resize((w, h), Image.BILINEAR), (col.x + (col.width - w) // 2, col.y))
    col.y += h + 6
    return col.text(f"Figure {rng.integers(1, 9)}: {_sentence(rng, int(rng.integers(5, 10)))}.", 12, gap=14)


def _table(col: _Column, rng) -> bool:
    rows, cols = int(rng.integers(4, 8)), int(rng.integers(3, 5))
    rh, cw = 22, col.width // cols
    if not col.room(rows * rh + 50):
        return False
    col.text(f"Table {rng.integers(1, 9)}: {_sentence(rng, int(rng.integers(4, 8)))}.", 12, gap=6)
    face = font(12)
    top = col.y
    for r in range(rows + 1):
        col.draw.line([(col.x, top + r * rh), (col.x + cols * cw, top + r * rh)], fill="black", width=1)
    for c in range(cols + 1):
        col.draw.line([(col.x + c * cw, top), (col.x + c * cw, top + rows * rh)], fill="black", width=1)
    for r in range(rows):
        for c in range(cols):
            cell = str(rng.choice(WORDS)) if r == 0 or c == 0 else f"{rng.uniform(0, 100):.2f}"
            col.draw.text((col.x + c * cw + 4, top + r * rh + 4), cell, fill="black", font=face)
    col.y = top + rows * rh + 14
    return True


def _item(col: _Column, text: str) -> bool:
    """A bullet (a drawn dot: the bundled font has no bullet glyph) and its indented text."""
    y = col.y
    if not col.text(text, 14, indent=18, gap=3):
        return False
    col.draw.ellipse([col.x + 4, y + 6, col.x + 10, y + 12], fill="black")
    return True


def _body(page, col: _Column, rng) -> None:
    while True:
        kind = rng.choice(["para", "para", "para", "section", "list", "photo", "table"])
        if kind == "para":
            ok = col.text(_sentence(rng, int(rng.integers(25, 70))) + ".", 14, gap=10)
        elif kind == "section":
            ok = col.text(f"{rng.integers(1, 9)}. {_sentence(rng, int(rng.integers(2, 5)))}", 19, bold=True, gap=8)
        elif kind == "list":
            ok = all(_item(col, _sentence(rng, int(rng.integers(6, 16)))) for _ in range(int(rng.integers(2, 5))))
        elif kind == "photo":
            ok = _photo(page, col, rng)
        else:
            ok = _table(col, rng)
        if not ok:
            return


def render_page(seed: int, width: int = 724, height: int = 1024):
    """One page as a PIL RGB image (A4 proportions at 1024 px high by default)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    margin = 56
    header = _Column(draw, margin, width - 2 * margin, 22, 60)
    header.text(_sentence(rng, 4), 11, fill="#444444")
    main = _Column(draw, margin, width - 2 * margin, 70, height - 60)
    main.text(_sentence(rng, int(rng.integers(3, 8))), 30, bold=True, gap=16)
    if rng.random() < 0.5:
        _body(page, main, rng)
    else:
        main.text(_sentence(rng, 40) + ".", 14, gap=14)  # an abstract across the page
        half = (width - 2 * margin - 24) // 2
        for x in (margin, margin + half + 24):
            _body(page, _Column(draw, x, half, main.y, height - 60), rng)
    footer = _Column(draw, width // 2 - 10, 40, height - 40, height)
    footer.text(str(seed + 1), 12)
    return page


def write_pages(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` pages as PNG files in ``folder`` (created); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        render_page(seed + i).save(folder / f"page_{seed + i:04d}.png")
    return folder
