"""Calibrator classes against stand-in TensorRT modules, and the data feeder's error handling."""

from types import SimpleNamespace

import numpy as np
import pytest

from tests.trt.fakes import fake_trt
from trtq.errors import ConfigError, DataError, UsageError
from trtq.trt.calibrator import BatchFeeder, calibrator_base, fill_padding, make_cache_calibrator, normalize_algorithm

TRT86, TRT10, TRT11 = fake_trt("8.6.0"), fake_trt("10.3.0"), fake_trt("11.4.0")


@pytest.mark.parametrize(
    "name,expected",
    [
        ("EntropyCalibration2", "EntropyCalibration2"),
        ("entropy", "EntropyCalibration2"),
        ("max", "MinMaxCalibration"),
        ("minmaxcalibration", "MinMaxCalibration"),
    ],
)
def test_normalize_algorithm(name, expected):
    assert normalize_algorithm(name) == expected


def test_unknown_algorithm():
    with pytest.raises(ConfigError, match="no calibrator for algorithm 'percentile'"):
        normalize_algorithm("percentile")


@pytest.mark.parametrize("trt", [TRT86, TRT10])
@pytest.mark.parametrize(
    "algorithm,cls",
    [
        ("EntropyCalibration2", "IInt8EntropyCalibrator2"),
        ("MinMaxCalibration", "IInt8MinMaxCalibrator"),
        ("EntropyCalibration", "IInt8EntropyCalibrator"),
    ],
)
def test_cache_calibrator_subclasses_matching_class(trt, algorithm, cls):
    cal = make_cache_calibrator(trt, algorithm, b"TRT-8600-X\n", 4)
    assert isinstance(cal, getattr(trt, cls))
    assert cal.base_initialised  # the TensorRT base __init__ must run (pybind11 trampoline)
    assert cal.get_batch_size() == 4
    assert cal.get_batch(["x"]) is None  # never any data
    assert cal.read_calibration_cache() == b"TRT-8600-X\n"
    assert cal.cache_reads == 1


def test_no_calibrators_on_11():
    with pytest.raises(UsageError) as info:
        calibrator_base(TRT11, "entropy")
    assert "11.4.0" in info.value.message and "--mode explicit" in info.value.hint


def _cache_module():
    return pytest.importorskip("trtq.calib.cache")


@pytest.mark.parametrize(
    "version,header",
    [
        ("8.6.0", "TRT-8600-EntropyCalibration2"),
        ("10.3.0", "TRT-100300-EntropyCalibration2"),
    ],
)
def test_implicit_cache_is_rerendered_for_installed_tensorrt(version, header):
    """A cache written for one TensorRT reaches the calibrator with the installed one's header."""
    cache = _cache_module()
    table = cache.CalibrationTable(
        trt_version="10.16.0",
        algorithm="EntropyCalibration2",
        amax={"x": 1.0, "conv_out": 2.54},
        source_format="tensorrt",
    )
    trt = fake_trt(version)
    cal = make_cache_calibrator(trt, table.algorithm, cache.render_cache(table, trt.__version__), 1)
    lines = cal.read_calibration_cache().decode().splitlines()
    assert lines[0] == header
    # scale = amax / 127 as big-endian float32 hex (documented format): 1.0 -> 3c010204
    assert "x: 3c010204" in lines


def test_fill_padding_repeats_real_rows():
    a = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
    a[3:] = 0  # padding rows
    out = fill_padding(a, 3)
    assert np.array_equal(out[:3], a[:3])
    assert np.array_equal(out[3], a[0]) and np.array_equal(out[4], a[1])
    assert out.max() == a[:3].max()
    assert fill_padding(a, 5) is a


class _FailingBatcher:
    shapes = {"x": (2, 3)}

    def __iter__(self):
        yield SimpleNamespace(index=0, arrays={"y": np.zeros((2, 3), np.float32)}, valid=2)
        raise AssertionError("not reached")


def test_feeder_keeps_errors_out_of_tensorrt():
    feeder = BatchFeeder(_FailingBatcher(), buffers={"x": object()}, dtypes={"x": "float32"})
    assert feeder.next(["x"]) is None
    assert isinstance(feeder.error, DataError) and "input x" in feeder.error.message
    assert feeder.next(["x"]) is None and feeder.batches == 0


def test_feeder_stops_at_end_of_data():
    class Empty:
        shapes = {"x": (2, 3)}

        def __iter__(self):
            return iter(())

    feeder = BatchFeeder(Empty(), buffers={}, dtypes={})
    assert feeder.next(["x"]) is None and feeder.error is None
