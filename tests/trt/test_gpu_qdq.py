"""Q/DQ models built as they are (real TensorRT + GPU): trtq's own quantize output, ONNX Runtime's
quantize_static QDQ (symmetric int8) and a QAT-style export, each checked against the same model on
ONNX Runtime with Q/DQ semantics (basic graph optimizations), on the Python API and the CLI.

Tolerance as for the INT8 engines of test_gpu_tiny: <= 5e-2 of the output range, cosine >= 0.999
(same Q/DQ model on both sides; TensorRT accumulates and rounds differently).
"""

import json

import numpy as np
import onnx
import pytest

from tests.conftest import cli_runner
from tests.trt.models import (
    TACTICS,
    activation_amax,
    cosine,
    gpu_build_options,
    ort_quantize_static,
    ort_run,
    qat_style_cnn,
    rel_max_err,
    residual_cnn,
)

pytestmark = pytest.mark.gpu
BATCH = 4


opts = gpu_build_options


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{kind: Q/DQ model path}, the FP32 model they come from and an input batch."""
    from trtq.quantize import quantize_model

    d = tmp_path_factory.mktemp("qdq")
    fp32 = residual_cnn(d / "fp32.onnx", batch=BATCH, opset=13)
    rng = np.random.default_rng(5)
    batches = [{"x": rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    own = quantize_model(onnx.load(str(fp32)), activation_amax(fp32, batches)).model
    onnx.save(own, str(d / "trtq.qdq.onnx"))
    out = {
        "trtq": d / "trtq.qdq.onnx",
        "onnxruntime": ort_quantize_static(fp32, d / "ort.qdq.onnx", batches, symmetric=True),
        "qat": qat_style_cnn(d / "qat.onnx", batch=BATCH),
        "qat-initializers": qat_style_cnn(d / "qat_init.onnx", batch=BATCH, scales_in_constants=False),
    }
    return {"dir": d, "fp32": fp32, "paths": out, "x": batches[0]["x"]}


def run_plan(path, x):
    from trtq.trt.runtime import TrtRunner

    with TrtRunner(path) as r:
        return r.run({"x": x})["y"]


@pytest.mark.parametrize("kind", ["trtq", "onnxruntime", "qat", "qat-initializers"])
def test_qdq_model_builds_as_it_is_and_matches_its_qdq_semantics(models, kind):
    from trtq.pipeline.build import build_engine

    path = models["paths"][kind]
    res = build_engine(path, models["dir"] / f"{kind}.plan", opts())
    q = res.metadata["quantize"]
    assert res.metadata["precision"] == "int8" and res.metadata["mode"] == "explicit"
    assert q["source"] == "model" and q["activations"] >= 3 and q["weights"] == 3
    assert res.metadata["cache"] is None
    y = run_plan(res.plan_path, models["x"])
    twin = ort_run(path, {"x": models["x"]})["y"]
    err, cos = rel_max_err(y, twin), cosine(y, twin)
    assert err <= 5e-2 and cos >= 0.999, (kind, err, cos)


def test_qdq_model_with_fp16_rest(models):
    from trtq.pipeline.build import build_engine

    path = models["paths"]["qat"]
    res = build_engine(path, models["dir"] / "qat16.plan", opts(fp16=True))
    assert res.metadata["fp16"] is True
    y = run_plan(res.plan_path, models["x"])
    twin = ort_run(path, {"x": models["x"]})["y"]
    assert rel_max_err(y, twin) <= 5e-2 and cosine(y, twin) >= 0.999


def test_cli_build_and_compare_a_qdq_model(models, tmp_path):
    """The README pipeline's last steps: build the Q/DQ file, compare the engine with the FP32 model."""
    from trtq.cli import cli

    np.save(tmp_path / "x.npy", np.random.default_rng(9).standard_normal((8, 3, 16, 16)).astype(np.float32))
    plan = tmp_path / "trtq.plan"
    r = cli_runner().invoke(
        cli,
        [
            "build",
            "--model",
            str(models["paths"]["trtq"]),
            "-o",
            str(plan),
            "--optimization-level",
            "0",
            "--tactic-sources",
            ",".join(TACTICS),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metadata"]["quantize"]["source"] == "model"
    r = cli_runner().invoke(
        cli,
        [
            "compare",
            "--reference",
            str(models["fp32"]),
            "--candidate",
            str(plan),
            "--data",
            f"x={tmp_path / 'x.npy'}",
            "--batch-size",
            str(BATCH),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["outputs"][0]
    assert out["samples"] == 8 and out["cosine_mean"] > 0.99
