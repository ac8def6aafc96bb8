"""FP32 accuracy of PP-OCR's text-direction classifier (rapidocr-onnxruntime's cls model) on rendered
text lines, half of them rotated 180 degrees, fed with the old paddle preset (letterbox to the input
with PIL, RGB) and with today's (RapidOCR's preprocessing: OpenCV bilinear to the input height, wide
lines squashed, BGR), side by side. Issue 13 measured 0.67 with the old preset, 0.98 with Paddle's.

    pip install --no-deps rapidocr-onnxruntime
    python benchmarks/bench_paddle_preset.py [--lines 200]
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from trtq.config import PreprocessOptions, ResizeOptions
from trtq.data.preprocess import Preprocessor
from trtq.data.presets import preset

WORDS = [
    "invoice",
    "total",
    "paid",
    "order",
    "number",
    "date",
    "amount",
    "seven",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "2024",
    "12.50",
    "tax",
    "receipt",
    "customer",
    "address",
    "phone",
]
OLD_PADDLE = PreprocessOptions(
    resize=ResizeOptions(mode="letterbox", size=(48, 192), pad_value=127.5, anchor="top_left"),
    mean=(0.5,),
    std=(0.5,),
)


def lines(count: int) -> tuple[list[Image.Image], np.ndarray]:
    """Rendered lines of 1-6 words at 18-39 px, every second one rotated 180 degrees (label 1)."""
    rng = np.random.default_rng(0)
    images, labels = [], []
    for i in range(count):
        size = int(rng.integers(18, 40))
        font = ImageFont.load_default(size=size)
        text = " ".join(rng.choice(WORDS, int(rng.integers(1, 7))))
        img = Image.new("RGB", (int(font.getlength(text)) + 10, size + 10), (245, 245, 240))
        ImageDraw.Draw(img).text((5, 3), text, fill=(20, 20, 20), font=font)
        images.append(img.rotate(180) if i % 2 else img)
        labels.append(i % 2)
    return images, np.array(labels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200)
    args = parser.parse_args()
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        print("rapidocr-onnxruntime is not installed: pip install --no-deps rapidocr-onnxruntime")
        return 1
    import onnxruntime as ort

    model = Path(spec.origin).parent / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    images, labels = lines(args.lines)
    cases = [
        ("old paddle preset (letterbox, PIL, RGB)", OLD_PADDLE),
        ("paddle preset (RapidOCR's)", preset("paddle", [1, 3, 48, 192])),
    ]
    for label, options in cases:
        prep = Preprocessor(options)
        x = np.stack([prep(img) for img in images])
        pred = np.concatenate([session.run(None, {name: x[i : i + 16]})[0].argmax(1) for i in range(0, len(x), 16)])
        print(f"{label:42s} FP32 cls accuracy {np.mean(pred == labels):.3f} ({len(images)} lines, half rotated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
