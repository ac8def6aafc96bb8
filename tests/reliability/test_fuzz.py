"""Property-based fuzzing (hypothesis) of the three parsers of user files: the calibration cache,
the YAML config and the .npy reader. Random bytes and mutated valid files give a clean trtq error
(exit 3 / 2 classes) or a valid result, never another exception, a hang or a half-written file."""

import io
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "hypothesis", reason="the fuzz tests need hypothesis (in the dev extra; not in the GPU test bundle)"
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import make_model, one_line_error, temp_leftovers
from trtq.calib.cache import INT8_MAX, read_cache, scale_problem
from trtq.calib.cache_inspect import load_for_inspection
from trtq.config import TrtqConfig, load_config
from trtq.data.sources import NpySource, SampleError
from trtq.errors import CacheError, ConfigError, DataError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
FUZZ_CLI = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))

VALID_CACHE = (
    b"TRT-100300-EntropyCalibration2\nx: 3c010204\nc: 3d8f5c29\nr: 3d8f5c29\nf: 3c23d70a\nname with: colon: 3c010204\n"
)
VALID_ORT = b"c 2.5\nf 0.25\nr 2.5\nx 1.0\n"
VALID_CONFIG = b"""model: m.onnx
data:
  inputs:
    x:
      images: imgs
      preprocess: {color: rgb, resize: {mode: exact, size: [8, 8]}, mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}
  batch_size: 4
  limit: 10
calibrate: {method: percentile, percentile: 99.9, tensors: [a, b]}
quantize: {exclude: [Softmax], fp16: true}
build: {tactic_sources: "A,B", profiles: {x: {min: [1, 3, 8, 8], opt: [4, 3, 8, 8], max: [8, 3, 8, 8]}}}
"""


def _valid_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8) / 100)
    return buf.getvalue()


VALID_NPY = _valid_npy()


@st.composite
def mutated(draw, original: bytes):
    """A valid file with a few bytes flipped, inserted, deleted, or cut short."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "duplicate"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 8))]
        elif op == "truncate":
            data = data[:pos]
        elif op == "duplicate" and data:
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 40))]
    return bytes(data)


def _write(data: bytes, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(name)


# ------------------------------------------------------------------------------------------------
# cache
# ------------------------------------------------------------------------------------------------


def _check_cache_bytes(data: bytes) -> None:
    path = _write(data, ".cache")
    try:
        try:
            table = read_cache(path)
        except CacheError as e:
            assert "\n" not in str(e)
        else:
            assert table.amax
            for name, amax in table.amax.items():
                assert name and "\n" not in name
                assert scale_problem(amax / INT8_MAX) is None, (name, amax)
        try:
            table = load_for_inspection(path)
        except CacheError as e:
            assert "\n" not in str(e)
        else:
            assert all(isinstance(a, float) and (math.isnan(a) or a >= 0) for a in table.amax.values())
    finally:
        path.unlink()


@FUZZ
@given(st.binary(max_size=300))
@example(b"\x1c")  # whitespace to str.strip, not to bytes.strip: was an IndexError
@example(b"TRT-100300-EntropyCalibration2\n")  # a header and no entries: was an empty table
def test_cache_parser_random_bytes(data):
    _check_cache_bytes(data)


@FUZZ
@given(st.one_of(mutated(VALID_CACHE), mutated(VALID_ORT)))
def test_cache_parser_mutated_files(data):
    _check_cache_bytes(data)


@FUZZ
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 2**32 - 1)), min_size=1, max_size=6))
def test_cache_parser_any_scale_bits(entries):
    """Every float32 bit pattern: usable scales read back, unusable ones are refused."""
    lines = [f"{n.replace(chr(10), ' ').replace(chr(13), ' ')}: {bits:08x}" for n, bits in entries]
    _check_cache_bytes(("TRT-8600-MinMaxCalibration\n" + "\n".join(lines) + "\n").encode("utf-8", "replace"))


@FUZZ_CLI
@given(st.one_of(mutated(VALID_CACHE), st.binary(max_size=120)))
@example(VALID_CACHE.replace(b"-Entropy", b"-\x1cntropy"))  # \x1c in the message: str.splitlines breaks there
def test_quantize_with_fuzzed_cache_writes_all_or_nothing(trtq, data):
    folder = Path(tempfile.mkdtemp())
    try:
        model = make_model(folder / "m.onnx") if not (MODEL_DIR / "m.onnx").exists() else MODEL_DIR / "m.onnx"
        cache = folder / "c.cache"
        cache.write_bytes(data)
        out = folder / "q.onnx"
        r = trtq(["quantize", "--model", model, "--cache", cache, "-o", out])
        assert r.code in (0, 3), r
        if r.code == 0:
            import onnx

            onnx.checker.check_model(onnx.load(str(out)))
        else:
            assert one_line_error(r) and not out.exists(), r
        assert not temp_leftovers(folder)
    finally:
        shutil.rmtree(folder)


MODEL_DIR = Path(tempfile.mkdtemp(prefix="trtq-fuzz-model-"))
make_model(MODEL_DIR / "m.onnx")


# ------------------------------------------------------------------------------------------------
# config
# ------------------------------------------------------------------------------------------------


def _check_config_bytes(data: bytes) -> None:
    path = _write(data, ".yaml")
    try:
        try:
            cfg = load_config(path, environ={})
        except ConfigError as e:
            assert "\n" not in str(e), str(e)
        else:
            assert isinstance(cfg, TrtqConfig)
    finally:
        path.unlink()


@FUZZ
@given(st.binary(max_size=200))
@example(b'model: a\n"x\\ny": 1\n')  # a key with a line break: was a two-line error
def test_config_loader_random_bytes(data):
    _check_config_bytes(data)


@FUZZ
@given(mutated(VALID_CONFIG))
def test_config_loader_mutated_files(data):
    _check_config_bytes(data)


yaml_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True), st.text(max_size=10)
)
yaml_trees = st.recursive(
    yaml_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "model",
                    "data",
                    "inputs",
                    "x",
                    "images",
                    "npy",
                    "calibrate",
                    "method",
                    "build",
                    "tactic_sources",
                    "batch_size",
                    "shapes",
                    "preprocess",
                    "resize",
                    "quantize",
                    "exclude",
                    "mean",
                ]
            )
            | st.text(max_size=6),
            children,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


@FUZZ
@given(yaml_trees)
def test_config_loader_random_structures(tree):
    import yaml

    _check_config_bytes(yaml.safe_dump(tree).encode("utf-8"))


# ------------------------------------------------------------------------------------------------
# .npy
# ------------------------------------------------------------------------------------------------


def _check_npy_bytes(data: bytes) -> None:
    path = _write(data, ".npy")
    try:
        try:
            src = NpySource("x", [path], (3, 8, 8), "float32", "data.inputs.x.npy")
        except DataError as e:
            assert "\n" not in str(e)
            return
        try:
            for i in range(len(src)):
                try:
                    x = src.load(i)
                except SampleError as e:
                    assert "\n" not in str(e)
                    continue
                assert x.shape == (3, 8, 8) and x.dtype == np.float32 and np.isfinite(x).all()
        finally:
            src.close()
    finally:
        path.unlink()


@FUZZ
@given(st.binary(max_size=200))
def test_npy_reader_random_bytes(data):
    _check_npy_bytes(b"\x93NUMPY" + data if data[:1] == b"\x01" else data)


@FUZZ
@given(mutated(VALID_NPY))
@example(b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (2,    \n" + b"\0" * 64)  # tokenize.TokenError
def test_npy_reader_mutated_files(data):
    _check_npy_bytes(data)


@FUZZ
@given(
    st.sampled_from(["<f4", "<f8", "<i4", "|u1", "|b1", ">f4", "<c8", "<f2", "|O", "<U3", "|V4", "<M8[s]"]),
    st.lists(st.integers(0, 12), min_size=0, max_size=5),
    st.booleans(),
)
def test_npy_reader_forged_headers(descr, shape, fortran):
    """A well-formed header of any dtype and shape over too little (or enough) data."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    data += bytes(range(256)) * 4
    _check_npy_bytes(data)


# ------------------------------------------------------------------------------------------------
# values typed on the command line (issue 29): digits of other scripts, huge numbers, junk
# ------------------------------------------------------------------------------------------------

NUMBER_FLAGS = [
    "--batch-size",
    "--limit",
    "--workers",
    "--seed",
    "--num-bins",
    "--hist-elements",
    "--percentile",
    "--max-memory",
    "--shape",
    "--override-input-shape",
    "--trt-version",
    "--shard",
]
typed = st.one_of(
    st.lists(
        st.sampled_from(
            list("0123456789") + ["²", "١", "５", "٣", "_", ".", "e", "-", "+", " ", "x", "G", "/", "9" * 40]
        ),
        max_size=12,
    ).map("".join),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["nan", "inf", "-0", "1e400", "0x10", "4/4", "0/1", "1/" + "0" * 30, "2/1e26"]),
)


@FUZZ_CLI
@given(st.sampled_from(NUMBER_FLAGS), typed)
@example("--shard", "1/" + "9" * 27)  # was accepted: shard 1 of 1e27 calibrated one sample
@example("--shape", "²x3x8x8")  # was an internal error
def test_calibrate_number_flags(trtq, flag, value):
    """Any value of a number-taking flag: a run (exit 0, the cache written) or one line with exit 2/3
    and nothing written; never an internal error or an out-of-memory exit 1."""
    folder = Path(tempfile.mkdtemp())
    try:
        out, stats = folder / "c.cache", folder / "s.npz"
        if flag in ("--shape", "--override-input-shape"):
            value = "x=" + value
        extra = ["--save-stats", stats] if flag == "--shard" else []
        r = trtq(
            [
                "calibrate",
                "--model",
                MODEL_DIR / "m.onnx",
                "--data",
                MODEL_DIR / "x.npy",
                "-o",
                out,
                flag,
                value,
                *extra,
            ]
        )
        assert r.code in (0, 2, 3), (flag, value, r)
        if r.code:
            assert one_line_error(r), (flag, value, r.err)
            assert sorted(p.name for p in folder.iterdir()) == [], (flag, value)
        else:
            assert stats.exists() if flag == "--shard" else out.exists(), (flag, value)
        assert not temp_leftovers(folder)
    finally:
        shutil.rmtree(folder)


np.save(MODEL_DIR / "x.npy", np.random.default_rng(1).normal(0, 1, (6, 3, 8, 8)).astype(np.float32))
