"""trtq.calibrate from data in memory: one-line errors for bad data and bad options."""

from __future__ import annotations

import numpy as np
import pytest

import trtq as api
from tests.api.tiny import two_input_model
from trtq.errors import ConfigError, DataError, UsageError


def one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text and "; " in text, text  # "<message>; <hint>"
    assert error.value.exit_code == 3
    return text


GOOD = {"a": np.zeros((2, 4, 16), np.float32), "b": np.zeros((2, 4, 16), np.float32)}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([{"a": np.zeros((2, 4, 7)), "b": np.zeros((2, 4, 7))}], "the model takes a [?, 4, 16]"),
        ([{"a": np.zeros((4, 16)), "b": np.zeros((4, 16))}], "batches of rank 2"),
        ([GOOD, {"a": np.zeros((2, 4, 5)), "b": np.zeros((2, 4, 5))}], "batch 1, input a: samples of shape [4, 5]"),
        ([{"a": np.zeros((2, 4, 16), np.complex64), "b": GOOD["b"]}], "complex64, which cannot be cast to float32"),
        ([{"a": np.full((2, 4, 16), "x"), "b": GOOD["b"]}], "which is not numeric"),
        ([{**GOOD, "c": GOOD["a"]}], "batch 0 names a, b, c; the model's inputs are a, b"),
        ([{"a": GOOD["a"]}], "batch 0 names a; the model's inputs are a, b"),
        ([GOOD["a"]], "batch 0 is one array but the model has 2 inputs"),
        ([(GOOD["a"],)], "batch 0 holds 1 arrays for the model's 2 inputs"),
        ([{"a": GOOD["a"], "b": np.zeros((3, 4, 16))}], "the inputs hold different numbers of samples (2, 3)"),
        ([{"a": np.full((2, 4, 16), np.nan), "b": GOOD["b"]}], "batch 0, input a has NaN or Inf values"),
        ([], "the data holds no batch"),
        ((x for x in ()), "the data holds no batch"),
        ([{"a": np.zeros((0, 4, 16)), "b": np.zeros((0, 4, 16))}], "the data holds no samples"),
        (0.5, "data is of type float, not an iterable of batches"),
        ("images/", "data is of type str, not an iterable of batches"),
    ],
)
def test_bad_data_is_one_line_naming_what_is_wrong(tmp_path, data, words):
    model = two_input_model(tmp_path / "m.onnx")
    with pytest.raises(DataError) as e:
        api.calibrate(model, data)
    assert words in one_line(e)


def test_bad_options_are_one_line(tmp_path):
    model = two_input_model(tmp_path / "m.onnx")
    with pytest.raises(ConfigError, match="calibrate.method") as e:
        api.calibrate(model, [GOOD], method="medium")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    with pytest.raises(UsageError, match=r"trtq.calibrate\(\) has no option 'output'"):
        api.calibrate(model, [GOOD], output="x.cache")
    with pytest.raises(ConfigError, match="calibrate.num_bins"):
        api.calibrate(model, [GOOD], num_bins="many")
    with pytest.raises(UsageError, match="the model must be the path of an ONNX file"):
        api.calibrate(object(), [GOOD])


def test_integer_data_is_cast_with_a_warning(tmp_path, caplog):
    model = two_input_model(tmp_path / "m.onnx")
    cal = api.calibrate(model, [{"a": np.full((2, 4, 16), 3, np.uint8), "b": np.ones((2, 4, 16), np.int64)}])
    assert cal.amax["a"] == pytest.approx(3.0)
    assert "uint8 data cast to float32 as it is" in caplog.text


def test_compare_options_are_checked_before_any_run(tmp_path):
    model = two_input_model(tmp_path / "m.onnx")
    with pytest.raises(UsageError, match="per_layer needs the calibration"):
        api.compare(model, model, [GOOD], per_layer="only")
    with pytest.raises(UsageError, match="per_layer must be 'only' or 'leave-one-out'"):
        api.compare(model, model, [GOOD], per_layer="all")
    with pytest.raises(ConfigError, match="compare.task"):
        api.compare(model, model, [GOOD], task="caption")
