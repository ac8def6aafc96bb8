"""Padded layouts of real engines (TensorRT + GPU): the inspector's format texts are read (every
vectorized one gets its width), trtq build's layout check agrees with the inspector's list, and a
build either has no tensor padded to 8x its size or says in its metadata that it rebuilt and
what is left.

Models: the residual CNN of tests/trt/models.py quantized by trtq and the bundled sample
classifier built from a cache, both with a 3-channel input (what TensorRT may store 32 wide)."""

import pytest

from tests.trt.models import build_residual_and_sample
from trtq.trt.format_guard import MIN_SHARE, padded_tensors, vector_width

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from trtq.trt.layers import measure_layers

    built = build_residual_and_sample(tmp_path_factory.mktemp("layouts"), seed=5)
    return {name: (res, measure_layers(res.plan_path, 2)[1]) for name, res in built.items()}


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
    check = padded_layouts(res.plan_path)
    assert [p.tensor for p in check.padded] == [p.tensor for p in padded_tensors(inspected)]
    # build's coverage came from the kept engine's own layout check, not another engine's
    assert [layer["Name"] for layer in res.measured.inspected] == [layer["Name"] for layer in inspected]
    assert res.coverage is not None and res.coverage.layers > 0
    record = res.metadata.get("layout_rebuilds")
    if record is None:
        assert check.padded == []
    else:
        assert [p["tensor"] for p in record["padded"]] == [p.tensor for p in check.padded]
        assert 0 <= record["rebuilds"] <= 2 and 0.0 <= record["share"] <= 1.0
        # a padded tensor is left only after a rebuild chose it again (or the last one), or where a
        # rebuild could not pay
        assert not record["padded"] or record["rebuilds"] >= 1 or record["share"] < MIN_SHARE
    print(name, sorted(formats), record, f"share now {check.share:.4f}")
