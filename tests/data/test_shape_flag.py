"""--shape for inputs with dynamic dims (issue 13): presets are sized from it, .npy data brings its
own shape, and bad --shape values are usage errors."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image


def _dynamic_hw_model(path: Path) -> Path:
    """x[N,3,H,W] (H, W dynamic) -> Conv -> GlobalAveragePool -> y[N,16,1,1]."""
    w = np.random.default_rng(0).normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["c"], ["y"], name="pool"),
        ],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 1, 1])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir()
    for i in range(n):
        pixels = np.random.default_rng(i).integers(0, 255, (30 + i, 50, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return folder


def _batch_shape(r) -> list:
    return json.loads(r.out)["batches"]["inputs"]["x"]["shape"]


def test_a_preset_on_dynamic_hw_needs_and_takes_the_shape(trtq, tmp_path):
    model, imgs = _dynamic_hw_model(tmp_path / "m.onnx"), _images(tmp_path / "imgs")
    r = trtq(["calibrate", "--model", model, "--data", imgs, "--preprocess", "yolo", "--dry-run"])
    assert r.code == 3 and "--shape INPUT=NxCxHxW" in r.err and "[?, 3, ?, ?]" in r.err, r
    r = trtq(
        [
            "calibrate",
            "--model",
            model,
            "--data",
            imgs,
            "--preprocess",
            "yolo",
            "--shape",
            "x=2x3x24x40",
            "--dry-run",
            "--json",
        ]
    )
    assert r.code == 0, r
    assert _batch_shape(r) == [2, 3, 24, 40]
    resize = json.loads(r.out)["batches"]["inputs"]["x"]["source"]["preprocess"]["resize"]
    assert resize["mode"] == "letterbox" and resize["size"] == [24, 40]  # the preset is sized from --shape
    out = tmp_path / "c.cache"
    assert (
        trtq(
            [
                "calibrate",
                "--model",
                model,
                "--data",
                imgs,
                "--preprocess",
                "yolo",
                "--shape",
                "2,3,24,40",
                "-o",
                out,
                "-q",
            ]
        ).code
        == 0
        and out.exists()
    )


def test_npy_data_gives_the_dynamic_dims(trtq, tmp_path):
    model = _dynamic_hw_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).normal(0, 1, (5, 3, 12, 20)).astype(np.float32))
    r = trtq(["calibrate", "--model", model, "--data", tmp_path / "x.npy", "--batch-size", "4", "--dry-run", "--json"])
    assert r.code == 0, r
    assert _batch_shape(r) == [4, 3, 12, 20]


def test_the_dynamic_dim_error_says_how_to_set_the_shape(trtq, tmp_path):
    model = _dynamic_hw_model(tmp_path / "m.onnx")
    files = tmp_path / "list.txt"
    imgs = _images(tmp_path / "imgs")
    files.write_text("\n".join(str(p) for p in sorted(imgs.iterdir())))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model: {model}\ndata:\n  inputs:\n    x:\n      images: {imgs}\n"
        "      preprocess: {resize: {mode: exact, size: [8, 8]}}\n"
    )
    r = trtq(["calibrate", "--config", cfg, "--dry-run"])
    assert r.code == 3 and "--shape x=Nx3x?x?" in r.err and "data.shapes.x" in r.err, r
    r = trtq(["calibrate", "--config", cfg, "--shape", "x=1x3x8x8", "--dry-run", "--json"])
    assert r.code == 0 and _batch_shape(r) == [1, 3, 8, 8], r


@pytest.mark.parametrize(
    "flag,message",
    [
        ("y=1x3x8x8", "--shape names 'y', which is not a model input"),
        ("x=1x3xAx8", "the dims must be positive integers"),
        ("x=1x3x0x8", "the dims must be positive integers"),
    ],
)
def test_bad_shape_flags_are_usage_errors(trtq, tmp_path, flag, message):
    model = _dynamic_hw_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 8, 8), np.float32))
    r = trtq(["calibrate", "--model", model, "--data", tmp_path / "x.npy", "--shape", flag, "--dry-run"])
    assert r.code == 2 and message in r.err, r
    r = trtq(
        [
            "calibrate",
            "--model",
            model,
            "--data",
            tmp_path / "x.npy",
            "--shape",
            "x=1x3x8x8",
            "--shape",
            "x=2x3x8x8",
            "--dry-run",
        ]
    )
    assert r.code == 2 and "--shape gives input 'x' twice" in r.err, r


def test_paddle_rec_model_with_a_shape(trtq, tmp_path):
    """A real dynamic-H/W model: PP-OCRv4 rec from rapidocr-onnxruntime (installed with --no-deps)."""
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    model = Path(next(iter(spec.submodule_search_locations))) / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    if not model.exists():
        pytest.skip(f"{model.name} is not in this rapidocr-onnxruntime")
    imgs = _images(tmp_path / "imgs")
    r = trtq(["calibrate", "--model", model, "--data", imgs, "--preprocess", "paddle", "--dry-run"])
    assert r.code == 3 and "--shape" in r.err, r
    r = trtq(
        [
            "calibrate",
            "--model",
            model,
            "--data",
            imgs,
            "--preprocess",
            "paddle",
            "--shape",
            "x=3x3x48x320",
            "--dry-run",
            "--json",
        ]
    )
    assert r.code == 0 and _batch_shape(r) == [3, 3, 48, 320], r
