"""--equalize on real TensorRT: the engine of an equalized Q/DQ model computes what ONNX Runtime
computes on it (Q/DQ semantics), and ``build`` equalizes from the FP32 model, its cache and data.

The model (tests.quantize.test_equalize._model) has a Conv input whose channels span 0.01 to 6 behind
a learnable affine (Mul, Add), read by a depthwise Conv; equalized, the narrow channels get their
own INT8 levels, so the engine must also be closer to FP32 than the plain INT8 engine.
"""

import numpy as np
import onnx
import pytest

from tests.quantize.test_equalize import _batches, _model
from tests.trt.models import TACTICS, activation_amax, cosine, gpu_build_options, ort_run, rel_max_err, write_trt_cache
from trtq.config import DataOptions, InputSource, ProfileShapes, QuantizeOptions

pytestmark = pytest.mark.gpu


def _sqnr(ref, out):
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - out).astype(np.float64) ** 2))


def test_equalized_engine_matches_its_qdq_model_and_beats_the_plain_one(tmp_path, trtq):
    from trtq.pipeline.build import build_engine
    from trtq.quantize import quantize_model
    from trtq.quantize.equalize import Remeasure, equalize_model
    from trtq.trt.runtime import TrtRunner

    fp32 = _model("affine", "depthwise")
    path = tmp_path / "m.onnx"
    onnx.save(fp32, str(path))
    batches = _batches(4)
    amax = activation_amax(path, [b.arrays for b in batches])
    cache = write_trt_cache(tmp_path / "m.cache", amax, "MinMaxCalibration", "8600")
    eq_model, eq_amax, _ = equalize_model(fp32, amax, batches, Remeasure("max"))
    qdq = tmp_path / "eq.qdq.onnx"
    onnx.save(quantize_model(eq_model, eq_amax, QuantizeOptions()).model, str(qdq))
    prof = {"x": ProfileShapes((4, 4, 12, 12), (4, 4, 12, 12), (4, 4, 12, 12))}
    opts = gpu_build_options(profiles=prof)
    eq_plan = build_engine(qdq, tmp_path / "eq.plan", opts).plan_path
    plain_plan = build_engine(path, tmp_path / "plain.plan", opts, cache_path=cache).plan_path
    np.save(tmp_path / "x.npy", np.concatenate([b.arrays["x"] for b in batches]))
    data = DataOptions(inputs={"x": InputSource(npy=(str(tmp_path / "x.npy"),))}, batch_size=4)
    result = build_engine(
        path,
        tmp_path / "built.plan",
        opts,
        cache_path=cache,
        quantize_options=QuantizeOptions(equalize=True),
        data_options=data,
    )
    built = result.plan_path
    assert [s for s in result.metadata["quantize"]["steps"] if s.startswith("equalized channels")], result.metadata
    x = _batches(1, seed=9)[0].arrays["x"]
    ref = ort_run(path, {"x": x})["out"]
    twin = ort_run(qdq, {"x": x})["out"]
    with TrtRunner(eq_plan) as r:
        y = r.run({"x": x})["out"]
    with TrtRunner(plain_plan) as r:
        y_plain = r.run({"x": x})["out"]
    with TrtRunner(built) as r:
        y_built = r.run({"x": x})["out"]
    assert rel_max_err(y, twin) <= 5e-2 and cosine(y, twin) >= 0.999, (rel_max_err(y, twin), cosine(y, twin))
    assert _sqnr(ref, y) > _sqnr(ref, y_plain) + 3.0, (_sqnr(ref, y), _sqnr(ref, y_plain))
    assert rel_max_err(y_built, twin) <= 5e-2 and cosine(y_built, twin) >= 0.999
    # the CLI says what the data step did, from a config's quantize: section
    config = tmp_path / "eq.yaml"
    config.write_text(
        f"model: {path}\ndata:\n  inputs:\n    x:\n      npy: [{tmp_path / 'x.npy'}]\n"
        "  batch_size: 4\nquantize:\n  equalize: true\n"
    )
    r = trtq(
        [
            "build",
            "--config",
            config,
            "--cache",
            cache,
            "-o",
            tmp_path / "cli.plan",
            "--opt-level",
            "0",
            "--workspace-mb",
            "512",
            "--tactic-sources",
            ",".join(TACTICS),
        ]
    )
    assert r.code == 0, r
    assert "steps      equalized channels" in r.out, r.out
