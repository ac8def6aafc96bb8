"""--shape and --override-input-shape take Polygraphy's NAME:DIMS beside NAME=DIMS; a name may hold
':' itself (TF-converted models: input:0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.errors import UsageError
from trtq.input_override import parse_override, split_shape_flag


def _model(path: Path, name: str) -> Path:
    """``name``[N,3,H,W] (H, W dynamic) -> Conv -> GlobalAveragePool -> y[N,4,1,1]."""
    w = np.random.default_rng(0).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", [name, "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["c"], ["y"], name="pool"),
        ],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 1, 1])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize(
    "item, reading",
    [
        ("x=2x3x24x40", ("x", (2, 3, 24, 40))),
        ("x:2x3x24x40", ("x", (2, 3, 24, 40))),
        ("x:2,3,24,40", ("x", (2, 3, 24, 40))),
        ("input:0:2x3x24x40", ("input:0", (2, 3, 24, 40))),
        ("input:0=2x3x24x40", ("input:0", (2, 3, 24, 40))),
        ("a=b:1x3", ("a=b", (1, 3))),  # the '=' reading's dims do not parse: the ':' one is taken
        ("2x3x24x40", None),
        ("input:0", None),  # a name with no dims (0 is not a size)
        ("x:2xax4", None),
        (":2x3", None),
    ],
)
def test_the_one_reading_of_a_shape_flag(item, reading):
    assert split_shape_flag(item) == reading


def test_override_takes_both_spellings():
    assert parse_override(["a:1x3x8x8", "b:0=1x3"]) == {"a": (1, 3, 8, 8), "b:0": (1, 3)}
    with pytest.raises(UsageError, match="INPUT=DIMS or INPUT:DIMS"):
        parse_override(["a:1xb"])


def _dry_run(trtq, model, data, shape):
    r = trtq(["calibrate", "--model", model, "--data", data, "--shape", shape, "--dry-run", "--json"])
    assert r.code == 0, r
    return json.loads(r.out)["batches"]


@pytest.mark.parametrize("name", ["x", "input:0"])
def test_shape_flag_spellings_give_the_same_batches(trtq, tmp_path, name):
    model = _model(tmp_path / "m.onnx", name)
    data = tmp_path / "d.npy"
    np.save(data, np.random.default_rng(1).normal(0, 1, (4, 3, 12, 20)).astype(np.float32))
    equals = _dry_run(trtq, model, data, f"{name}=2x3x12x20")
    colon = _dry_run(trtq, model, data, f"{name}:2x3x12x20")
    assert equals == colon and equals["inputs"][name]["shape"] == [2, 3, 12, 20]


def test_a_colon_name_that_is_no_input_is_refused(trtq, tmp_path):
    model = _model(tmp_path / "m.onnx", "input:0")
    r = trtq(["calibrate", "--model", model, "--data", tmp_path, "--shape", "input:1:2x3x12x20", "--dry-run"])
    assert r.code == 2 and "--shape names 'input:1', which is not a model input" in r.err, r
    r = trtq(["calibrate", "--model", model, "--data", tmp_path, "--shape", "input:0:2x3xhx20", "--dry-run"])
    assert r.code == 2 and "the dims must be positive integers" in r.err, r


def test_override_input_shape_with_a_colon_name(trtq, tmp_path):
    model = _model(tmp_path / "m.onnx", "input:0")
    data = tmp_path / "d.npy"
    np.save(data, np.random.default_rng(1).normal(0, 1, (4, 3, 12, 20)).astype(np.float32))
    r = trtq(
        ["calibrate", "--model", model, "--data", data, "--override-input-shape", "input:0:2x3x12x20"]
        + ["--dry-run", "--json"]
    )
    assert r.code == 0, r
    assert json.loads(r.out)["inputs"][0] == {"name": "input:0", "shape": [2, 3, 12, 20], "dtype": "float32"}
