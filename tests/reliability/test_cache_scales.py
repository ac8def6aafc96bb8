"""Defect 3: caches whose scales cannot quantize anything (zero, denormal, huge, short hex, NaN/Inf)
are refused where they are read (exit 3 naming the tensor); inspect-cache does not call them
complete, and inspect-cache --model exits 3 on such a cache or on another model's cache."""

import json

import pytest

from tests.reliability.conftest import make_model, one_line_error

# the tensors the tiny model's quantizer needs: x (Conv input) and f (Gemm input); r too
GOOD = {"x": "3c010204", "c": "3c010204", "r": "3c010204", "p": "3c010204", "f": "3c010204", "y": "3c010204"}
BAD_SCALES = {
    "zero": "00000000",
    "denormal": "00000001",  # 1.4e-45
    "huge": "7f61e9a2",  # 3e38
    "short hex": "3c",
    "nan": "7fc00000",
    "inf": "7f800000",
    "negative": "bc010204",
}
WHY = {
    "zero": "every value would quantize to 0",
    "denormal": "a denormal float32",
    "huge": "above",
    "short hex": "not 8 hex digits",
    "nan": "not finite",
    "inf": "not finite",
    "negative": "negative",
}


def _cache(path, bad_tensor="r", bad_hex=None):
    entries = dict(GOOD)
    if bad_hex is not None:
        entries[bad_tensor] = bad_hex
    path.write_text("TRT-100300-EntropyCalibration2\n" + "".join(f"{n}: {h}\n" for n, h in entries.items()))
    return path


@pytest.mark.parametrize("kind", sorted(BAD_SCALES))
def test_quantize_refuses_unusable_scales(trtq, tmp_path, kind):
    model = make_model(tmp_path / "m.onnx")
    cache = _cache(tmp_path / "bad.cache", "r", BAD_SCALES[kind])
    out = tmp_path / "q.onnx"
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", out])
    assert r.code == 3, r
    assert one_line_error(r) and "tensor 'r'" in r.err and "line 4" in r.err, r.err
    assert WHY[kind] in r.err, r.err  # the message says what is wrong with that scale
    assert not out.exists()


def test_short_hex_message_names_the_digits(trtq, tmp_path):
    model = make_model(tmp_path / "m.onnx")
    r = trtq(["quantize", "--model", model, "--cache", _cache(tmp_path / "c.cache", "r", "3c"), "-o", tmp_path / "q"])
    assert r.code == 3 and "not 8 hex digits" in r.err, r


@pytest.mark.parametrize("value", ["0", "1e-44", "4e40", "1e-12"])
def test_onnxruntime_table_with_unusable_amax(trtq, tmp_path, value):
    model = make_model(tmp_path / "m.onnx")
    cache = tmp_path / "ort.cache"
    cache.write_text("".join(f"{n} {value if n == 'r' else 1.0}\n" for n in sorted(GOOD)))
    r = trtq(["quantize", "--model", model, "--cache", cache, "-o", tmp_path / "q.onnx"])
    assert r.code == 3 and one_line_error(r) and "tensor 'r'" in r.err, r


def test_a_good_cache_still_quantizes(trtq, tmp_path):
    model = make_model(tmp_path / "m.onnx")
    r = trtq(["quantize", "--model", model, "--cache", _cache(tmp_path / "c.cache"), "-o", tmp_path / "q.onnx"])
    assert r.code == 0, r


@pytest.mark.parametrize("kind", sorted(BAD_SCALES))
def test_inspect_cache_is_not_complete_and_gates(trtq, tmp_path, kind):
    model = make_model(tmp_path / "m.onnx")
    cache = _cache(tmp_path / "bad.cache", "r", BAD_SCALES[kind])
    r = trtq(["inspect-cache", cache])  # no model: a report, with the entry listed as unusable
    if kind == "negative":  # not even a scale: refused outright
        assert r.code == 3 and one_line_error(r) and "negative" in r.err, r
        return
    assert r.code == 0, r
    assert "unusable   1" in r.out and "complete" not in r.out
    r = trtq(["inspect-cache", cache, "--model", model, "--json"])
    assert r.code == 3, r
    data = json.loads(r.out)  # the report still comes out on stdout, then the gate fails
    assert data["model_check"]["verdict"] == "unusable" and data["model_check"]["unusable"] == ["r"]
    assert one_line_error(r) and "unusable" in r.err


def test_inspect_cache_gates_on_another_models_cache(trtq, tmp_path):
    model = make_model(tmp_path / "m.onnx")
    other = tmp_path / "other.cache"
    other.write_text("TRT-100300-EntropyCalibration2\nfoo: 3c010204\nbar: 3c010204\n")
    r = trtq(["inspect-cache", other, "--model", model])
    assert r.code == 3 and one_line_error(r) and "no-match" in r.err, r
    r = trtq(["inspect-cache", _cache(tmp_path / "ok.cache"), "--model", model])
    assert r.code == 0 and "verdict    complete" in r.out, r
