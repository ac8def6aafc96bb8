"""TensorRT calibration cache format, version codes, ONNX Runtime tables and provenance.

The golden files under tests/golden/ were written by hand from the format rules; the hex digits
in them are checked here against struct, independently of trtq.calib.cache.
"""

import json
import math
import struct
from pathlib import Path

import pytest

from trtq.calib import cache as C
from trtq.errors import CacheError, ConfigError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def hex_of(amax: float) -> str:
    return struct.pack(">f", amax / 127.0).hex()


def f32(x: float) -> float:
    return struct.unpack(">f", struct.pack(">f", x))[0]


# amax values behind the golden files (what a human chose; hex derived with struct above)
GOLDEN_TABLES = {
    "trt8600_entropy2.cache": (
        "8.6.0",
        "EntropyCalibration2",
        {"x": 1.0, "/stem/conv/Conv_output_0": 12.7, "conv 1:0": 0.5, "a: b: c": 127.0},
    ),
    "trt100300_minmax.cache": (
        "10.3.0",
        "MinMaxCalibration",
        {"input": 6.0, "onnx::Conv_12": 2.54, "(Unnamed Layer* 93) [Constant]_output": 1e-3},
    ),
    "trt110400_entropy2.cache": ("11.4.0", "EntropyCalibration2", {"x": 1.0, "fetch_name_0": 300.0}),
}


# --------------------------------------------------------------------------------------------
# versions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,parsed,code",
    [
        ("8.6.0", (8, 6, 0), "8600"),
        ("8.6.1", (8, 6, 1), "8601"),
        ("8.4.3", (8, 4, 3), "8403"),
        ("10.3", (10, 3, 0), "100300"),
        ("10.16.0", (10, 16, 0), "101600"),
        ("10.13.3.9", (10, 13, 3), "101303"),
        ("11.4.0", (11, 4, 0), "110400"),
        ("8.6.1.post1", (8, 6, 1), "8601"),
    ],
)
def test_version_codes(text, parsed, code):
    assert C.parse_trt_version(text) == parsed
    assert C.version_code(text) == code
    assert C.decode_version_code(code) == "{}.{}.{}".format(*parsed)


@pytest.mark.parametrize("bad", ["", "garbage", "8", "8.x", "eight.six", "8.6.1 beta", "8.10.0", "10.3.100", "0.1"])
def test_parse_version_garbage(bad):
    with pytest.raises(ConfigError):
        C.parse_trt_version(bad)


@pytest.mark.parametrize("bad", ["12", "86000", "abc", "1234567", ""])
def test_decode_version_code_garbage(bad):
    with pytest.raises(ValueError):
        C.decode_version_code(bad)


def test_default_version_and_algorithms():
    assert C.version_code(C.DEFAULT_TRT_VERSION) == "101600"
    from trtq.calib.methods import METHODS, tensorrt_method

    assert {m.name: m.algorithm for m in METHODS.rows()} == {
        "max": "MinMaxCalibration",
        "entropy": "EntropyCalibration2",
        "percentile": "EntropyCalibration2",
        "mse": "EntropyCalibration2",
    }
    assert [m.name for m in METHODS.rows() if m.tensorrt] == ["max", "entropy"]  # --backend tensorrt
    assert [tensorrt_method(a) for a in ("MinMaxCalibration", "EntropyCalibration2", "EntropyCalibration")] == [
        "max",
        "entropy",
        "entropy",
    ]


def test_installed_trt_version_never_raises_and_does_not_import(monkeypatch):
    import sys

    before = "tensorrt" in sys.modules
    v = C.installed_trt_version()
    assert v is None or C.parse_trt_version(v)
    assert ("tensorrt" in sys.modules) == before
    import importlib.util

    def boom(name, *a, **k):
        raise RuntimeError("broken import system")

    monkeypatch.setattr(importlib.util, "find_spec", boom)
    assert C.installed_trt_version() is None


def _has_tensorrt_metadata() -> bool:
    import importlib.metadata as md

    try:
        md.version("tensorrt")
        return True
    except md.PackageNotFoundError:
        return False


@pytest.mark.skipif(_has_tensorrt_metadata(), reason="a real tensorrt distribution is installed")
def test_installed_trt_version_from_package_file(tmp_path, monkeypatch):
    pkg = tmp_path / "tensorrt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('import os\n__version__ = "10.3.0.26"\nraise ImportError("never import me")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.invalidate_caches()
    assert C.installed_trt_version() == "10.3.0"


# --------------------------------------------------------------------------------------------
# golden files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN_TABLES))
def test_golden_hex_is_what_struct_says(name):
    version, algorithm, amax = GOLDEN_TABLES[name]
    lines = (GOLDEN / name).read_text(encoding="utf-8").split("\n")
    assert lines[0] == f"TRT-{C.version_code(version)}-{algorithm}"
    assert lines[-1] == ""  # ends with a newline
    assert lines[1:-1] == [f"{n}: {hex_of(a)}" for n, a in amax.items()]


@pytest.mark.parametrize("name", sorted(GOLDEN_TABLES))
def test_golden_render_byte_for_byte(name):
    version, algorithm, amax = GOLDEN_TABLES[name]
    table = C.CalibrationTable(trt_version=version, algorithm=algorithm, amax=amax)
    assert C.render_cache(table) == (GOLDEN / name).read_bytes()


@pytest.mark.parametrize("name", sorted(GOLDEN_TABLES))
def test_golden_read_and_round_trip(name, tmp_path):
    version, algorithm, amax = GOLDEN_TABLES[name]
    path = GOLDEN / name
    table = C.read_cache(path)
    assert table.trt_version == version
    assert table.algorithm == algorithm
    assert table.source_format == "tensorrt"
    assert list(table.amax) == list(amax)
    for n, a in amax.items():
        assert table.scales[n] == f32(a / 127.0)
        # amax -> scale hex -> amax: within one float32 ulp
        assert abs(table.amax[n] - a) <= abs(a) * 2.0**-23
    assert C.render_cache(table) == path.read_bytes()
    out = tmp_path / "again.cache"
    C.write_cache(out, table)
    assert out.read_bytes() == path.read_bytes()


def test_render_for_another_version_changes_only_the_header():
    version, algorithm, amax = GOLDEN_TABLES["trt8600_entropy2.cache"]
    table = C.read_cache(GOLDEN / "trt8600_entropy2.cache")
    data = C.render_cache(table, trt_version="10.3.0")
    golden = (GOLDEN / "trt8600_entropy2.cache").read_bytes()
    assert data.split(b"\n", 1)[0] == b"TRT-100300-EntropyCalibration2"
    assert data.split(b"\n", 1)[1] == golden.split(b"\n", 1)[1]


def test_render_default_version_and_amax_one():
    table = C.CalibrationTable(trt_version=None, algorithm="MinMaxCalibration", amax={"t": 1.0})
    assert C.render_cache(table) == b"TRT-101600-MinMaxCalibration\nt: 3c010204\n"
    assert C.scale_hex(1.0) == "3c010204"


def test_tensorrt_quirks_short_hex_and_infinite_scale():
    path = GOLDEN / "trt101303_tensorrt_quirks.cache"  # zero written as "0", +inf as 7f800000
    with pytest.raises(CacheError) as e:
        C.read_cache(path)  # the zero scale ("0") comes first: it would quantize its tensor to 0
    assert "line 2" in str(e.value) and "'zero'" in str(e.value)
    table = C.read_cache(path, allow_nonfinite=True)
    assert table.trt_version == "10.13.3"
    assert table.amax["zero"] == 0.0
    assert math.isinf(table.amax["inf tensor"])
    assert table.amax["small"] == pytest.approx(1.0, rel=1e-7)


def test_render_rejects_bad_tables():
    for amax in ({"t": float("nan")}, {"t": -1.0}, {"t": float("inf")}, {"a\nb": 1.0}, {"": 1.0}):
        with pytest.raises(CacheError):
            C.render_cache(C.CalibrationTable("8.6.0", "EntropyCalibration2", amax))
    with pytest.raises(ConfigError):
        C.render_cache(C.CalibrationTable("8.6.0", "FooCalibration", {"t": 1.0}))


def test_write_cache_failure_leaves_old_file(tmp_path):
    out = tmp_path / "calibration.cache"
    out.write_bytes(b"old")
    with pytest.raises(CacheError):
        C.write_cache(out, C.CalibrationTable("8.6.0", "EntropyCalibration2", {"t": float("nan")}))
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.cache"]


def test_many_values_round_trip(tmp_path):
    import random

    rnd = random.Random(3)
    amax = {f"t{i}: {rnd.random():.3f}": math.exp(rnd.uniform(-20, 12)) for i in range(300)}
    table = C.CalibrationTable("10.3.0", "EntropyCalibration2", amax)
    path = tmp_path / "c.cache"
    C.write_cache(path, table)
    back = C.read_cache(path)
    assert list(back.amax) == list(amax)
    for n, a in amax.items():
        assert back.scales[n] == f32(a / 127.0)
        assert abs(back.amax[n] - a) <= abs(a) * 2.0**-23
    assert C.render_cache(back) == path.read_bytes()


# --------------------------------------------------------------------------------------------
# ONNX Runtime tables
# --------------------------------------------------------------------------------------------


def test_read_ort_golden():
    table = C.read_cache(GOLDEN / "ort_calibration.cache")
    assert table.source_format == "onnxruntime"
    assert table.trt_version is None and table.algorithm == C.UNKNOWN_ALGORITHM
    assert table.amax == {"conv 1:0": 0.5, "onnx::Add_12": 2.54, "x": 1.0, "y": 0.001}
    # and it converts to a TensorRT cache
    table.algorithm = "EntropyCalibration2"
    text = C.render_cache(table, "8.6.0").decode()
    assert text.splitlines()[1:] == [f"{n}: {hex_of(a)}" for n, a in table.amax.items()]


def test_read_table_written_by_onnxruntime(tmp_path):
    pytest.importorskip("flatbuffers")
    import numpy as np
    from onnxruntime.quantization.calibrate import TensorData
    from onnxruntime.quantization.quant_utils import write_calibration_table

    ranges = {"conv 1:0": 0.5, "x": 1.0, "onnx::Add_12": 2.54}
    try:  # ONNX Runtime >= 1.20 takes TensorData
        data = {n: TensorData(lowest=np.float32(-a), highest=np.float32(a)) for n, a in ranges.items()}
        write_calibration_table(data, dir=str(tmp_path))
    except TypeError:  # older releases (the GPU bundle's 1.19) take (min, max) pairs
        write_calibration_table(
            {n: (float(np.float32(-a)), float(np.float32(a))) for n, a in ranges.items()}, dir=str(tmp_path)
        )
    table = C.read_cache(tmp_path / "calibration.cache")
    assert table.source_format == "onnxruntime"
    assert sorted(table.amax) == sorted(ranges)
    for n, a in ranges.items():
        assert table.amax[n] == float(np.float32(a))


# --------------------------------------------------------------------------------------------
# bad caches
# --------------------------------------------------------------------------------------------

BAD = {
    "empty": (b"", "is empty"),
    "blank": (b"\n\n", "is empty"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
    "latin1": (b"TRT-8600-EntropyCalibration2\nx\xff: 3c010204\n", "binary"),
    "truncated line": (b"TRT-8600-EntropyCalibration2\nx: 3c010204\nconv1: 3c0", "line 3: truncated"),
    "truncated name": (b"TRT-8600-EntropyCalibration2\nx: 3c010204\nconv", "line 3: truncated"),
    "no colon": (b"TRT-8600-EntropyCalibration2\nx 3c010204\ny: 3c010204\n", "line 2: malformed"),
    "bad hex": (b"TRT-8600-EntropyCalibration2\nx: 3c01020g\n", "line 2: bad hex"),
    "long hex": (b"TRT-8600-EntropyCalibration2\nx: 3c0102041\n", "line 2: bad hex"),
    "unknown algorithm": (b"TRT-8600-FooCalibration\nx: 3c010204\n", "FooCalibration"),
    "bad version": (b"TRT-86-EntropyCalibration2\nx: 3c010204\n", "line 1: unknown TensorRT version code"),
    "bad header": (b"TRT-8600\nx: 3c010204\n", "line 1: malformed header"),
    "duplicate": (
        b"TRT-8600-EntropyCalibration2\nx: 3c010204\ny: 3c010204\nx: 3c010204\n",
        "line 4: duplicate tensor 'x' (first on line 2)",
    ),
    "negative": (b"TRT-8600-EntropyCalibration2\nx: bc010204\n", "line 2: scale of tensor 'x' is negative"),
    "nan": (b"TRT-8600-EntropyCalibration2\nx: 7fc00000\n", "line 2: scale of tensor 'x' is nan"),
    "no header": (b"x: 3c010204\n", "line 1: missing header"),
    "foreign text": (b"hello world, this is not a cache at all\n", "not a calibration cache"),
    "ort bad line": (b"x 1.0\ny one\n", "line 2: malformed"),
    "ort negative": (b"x -1.5\n", "line 1: amax of tensor 'x' is negative"),
    "ort inf": (b"x inf\n", "line 1: amax of tensor 'x' is inf"),
    "ort duplicate": (b"x 1.0\nx 2.0\n", "line 2: duplicate"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_caches(case, tmp_path):
    data, expected = BAD[case]
    path = tmp_path / "calibration.cache"
    path.write_bytes(data)
    with pytest.raises(CacheError) as e:
        C.read_cache(path)
    msg = str(e.value)
    assert expected in msg
    assert str(path) in msg
    assert "\n" not in msg
    assert e.value.hint


def test_unknown_algorithm_lists_known_ones(tmp_path):
    path = tmp_path / "c.cache"
    path.write_bytes(b"TRT-8600-FooCalibration\nx: 3c010204\n")
    with pytest.raises(CacheError) as e:
        C.read_cache(path)
    for known in C.ALGORITHMS:
        assert known in str(e.value)


def test_missing_and_folder(tmp_path):
    with pytest.raises(CacheError, match="not found"):
        C.read_cache(tmp_path / "nope.cache")
    with pytest.raises(CacheError, match="folder"):
        C.read_cache(tmp_path)


def test_tolerated_variants(tmp_path):
    path = tmp_path / "c.cache"
    path.write_bytes(b"TRT-8600-EntropyCalibration2\r\nx: 3C010204\r\n\r\ny: 3c010204")  # CRLF, caps, no final LF
    table = C.read_cache(path)
    assert table.amax == {"x": pytest.approx(1.0, rel=1e-7), "y": pytest.approx(1.0, rel=1e-7)}


# --------------------------------------------------------------------------------------------
# provenance
# --------------------------------------------------------------------------------------------


def test_provenance_round_trip(tmp_path):
    import numpy as np

    cache = tmp_path / "calibration.cache"
    amax = {"x": 0.1 + 0.2, "conv 1:0": 1 / 3, "tiny": 5e-324, "f32": np.float32(0.1)}
    data = {"model": {"sha256": "0" * 64}, "method": {"name": "entropy", "percentile": 99.99}, "amax": amax}
    out = C.write_provenance(cache, data)
    assert out == tmp_path / "calibration.cache.json"
    text = out.read_text()
    assert text.endswith("\n")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    back = C.read_provenance(cache)
    assert back["amax"]["x"] == 0.1 + 0.2  # bit-exact
    assert back["amax"]["conv 1:0"] == 1 / 3
    assert back["amax"]["tiny"] == 5e-324
    assert back["amax"]["f32"] == float(np.float32(0.1))
    assert back["method"] == data["method"]


def test_provenance_absent_corrupt_and_bad_data(tmp_path):
    cache = tmp_path / "calibration.cache"
    assert C.read_provenance(cache) is None
    (tmp_path / "calibration.cache.json").write_text("{not json")
    with pytest.raises(CacheError, match="corrupt"):
        C.read_provenance(cache)
    (tmp_path / "calibration.cache.json").write_text("[1, 2]")
    with pytest.raises(CacheError):
        C.read_provenance(cache)
    with pytest.raises(ValueError):
        C.write_provenance(cache, {"amax": {"x": float("nan")}})
    assert (tmp_path / "calibration.cache.json").read_text() == "[1, 2]"  # untouched
