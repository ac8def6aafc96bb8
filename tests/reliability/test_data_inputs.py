"""Defects 4 and 8 (data side): unreadable sub-folders, --data NAME=PATH mistakes, repeated inputs,
integer .npy data."""

import json
import os

import numpy as np

from tests.data.helpers import image_folder
from tests.reliability.conftest import one_line_error, run_child


def _images_with_locked_subfolder(root):
    image_folder(root / "imgs", 3, 12, 12)
    image_folder(root / "imgs" / "locked", 2, 12, 12)
    os.chmod(root, 0o755)
    os.chmod(root / "imgs", 0o755)
    os.chmod(root / "imgs" / "locked", 0)
    return root / "imgs"


def test_unreadable_subfolder_is_an_error_naming_it(kit, unprivileged):
    imgs = _images_with_locked_subfolder(kit.root)
    out = kit.root / "new.cache"
    try:
        r = run_child(
            ["calibrate", "--model", kit.model, "--data", imgs, "--preprocess", "unit", "-o", out], unprivileged
        )
    finally:
        os.chmod(imgs / "locked", 0o755)
    assert r.code == 3, r
    assert one_line_error(r) and "locked" in r.err and "--skip-bad" in r.err, r.err
    assert not out.exists()


def test_unreadable_subfolder_skipped_and_counted_with_skip_bad(kit, unprivileged):
    imgs = _images_with_locked_subfolder(kit.root)
    out = kit.root / "new.cache"
    try:
        r = run_child(
            [
                "calibrate",
                "--model",
                kit.model,
                "--data",
                imgs,
                "--preprocess",
                "unit",
                "-o",
                out,
                "--skip-bad",
                "--json",
            ],
            unprivileged,
        )
    finally:
        os.chmod(imgs / "locked", 0o755)
    assert r.code == 0, r
    data = json.loads(r.out)
    assert data["samples"] == 3
    assert [s["path"].rstrip("/").endswith("locked") for s in data["skipped"]] == [True]
    assert "folder not readable" in data["skipped"][0]["reason"]


def test_data_name_that_is_not_an_input(trtq, kit):
    r = trtq(["calibrate", "--model", kit.model, "--data", f"wrong={kit.data}", "-o", kit.root / "n.cache"])
    assert r.code == 2 and one_line_error(r), r
    assert "the model has no input 'wrong'; inputs: x" in r.err


def test_data_path_with_an_equals_sign_still_works(trtq, kit):
    odd = kit.root / "a=b.npy"
    odd.write_bytes(kit.data.read_bytes())
    r = trtq(["calibrate", "--model", kit.model, "--data", odd, "-o", kit.root / "n.cache", "--method", "max"])
    assert r.code == 0, r


def test_repeated_data_input_is_refused(trtq, kit):
    r = trtq(
        [
            "calibrate",
            "--model",
            kit.model,
            "--data",
            f"x={kit.data}",
            "--data",
            f"x={kit.data}",
            "-o",
            kit.root / "n.cache",
        ]
    )
    assert r.code == 2 and one_line_error(r) and "input 'x' twice" in r.err, r
    assert not (kit.root / "n.cache").exists()


def test_integer_npy_data_is_cast_with_a_note(trtq, kit):
    ints = kit.root / "ints.npy"
    np.save(ints, np.random.default_rng(0).integers(0, 255, (4, 3, 8, 8), dtype=np.uint8))
    r = trtq(["calibrate", "--model", kit.model, "--data", ints, "-o", kit.root / "n.cache", "--method", "max"])
    assert r.code == 0, r
    assert "ints.npy holds uint8 data: cast to float32" in r.err and "no scaling" in r.err
    r = trtq(["calibrate", "--model", kit.model, "--data", kit.data, "-o", kit.root / "m.cache", "--method", "max"])
    assert r.code == 0 and "cast to" not in r.err, r


def test_special_files_as_inputs_do_not_hang(trtq, kit):
    """A FIFO opened for reading waits for a writer forever: every input reader refuses it."""
    fifo = kit.root / "pipe"
    os.mkfifo(fifo)
    out = kit.root / "n.cache"
    cases = [
        (["calibrate", "--model", fifo, "--data", kit.data, "-o", out], 3, "not a regular file"),
        (["quantize", "--model", kit.model, "--cache", fifo, "-o", kit.root / "q.onnx"], 3, "not a regular file"),
        (["calibrate", "--config", fifo], 2, "not a regular file"),
        (["calibrate", "--model", kit.model, "--data", f"x={fifo}.npy", "-o", out], 3, None),
        (
            ["calibrate", "--model", kit.model, "--data", kit.root / "list.txt", "--preprocess", "unit", "-o", out],
            3,
            "not a regular file",
        ),
    ]
    os.symlink(fifo, kit.root / "list.txt")
    os.symlink(fifo, kit.root / "pipe.npy")
    for args, code, words in cases:
        r = run_child(args, timeout=60)
        assert r.code == code and one_line_error(r), (args, r)
        assert words is None or words in r.err, r.err
    assert not out.exists()


def test_fifo_in_an_image_folder_is_a_bad_sample(kit):
    imgs = kit.root / "imgs"
    image_folder(imgs, 2, 12, 12)
    os.mkfifo(imgs / "z.png")
    base = ["calibrate", "--model", kit.model, "--data", imgs, "--preprocess", "unit", "-o", kit.root / "n.cache"]
    r = run_child(base, timeout=60)
    assert r.code == 3 and one_line_error(r) and "z.png" in r.err and "FIFO" in r.err, r
    r = run_child(base + ["--skip-bad", "--method", "max"], timeout=60)
    assert r.code == 0 and "skipped     1 bad samples" in r.out, r
