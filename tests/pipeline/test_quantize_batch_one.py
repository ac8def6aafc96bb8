"""quantize's data steps on a model whose inputs fix a batch of 1: fed in batches of 8 where the
identity probe finds every activation they read unchanged (as calibrate does), with the same
levels and biases as the per-sample path, and the user's batch-1 declaration kept."""

import json
import logging

import numpy as np
import onnx
from onnx import numpy_helper

from trtq.input_override import override_input_shapes

STEPS = ["--bias-correction", "--weight-rounding", "gptq", "--float-layers", "1", "--samples", "8"]


def _initializers(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def test_batch_one_data_steps_run_batched_and_match_the_per_sample_path(
    trtq, sample_model, sample_images, tmp_path, caplog
):
    one = tmp_path / "b1.onnx"
    onnx.save(override_input_shapes(onnx.load(str(sample_model)), {"x": [1, 3, 224, 224]}, "m"), str(one))
    data = ["--data", sample_images, "--preprocess", "imagenet"]
    cache = tmp_path / "c.cache"
    assert trtq(["calibrate", "--model", one, *data, "--limit", "8", "-o", cache, "-q"]).code == 0
    with caplog.at_level(logging.INFO, logger="trtq"):
        r = trtq(
            [
                "quantize",
                "--model",
                one,
                "--cache",
                cache,
                *data,
                *STEPS,
                "-o",
                tmp_path / "batched.onnx",
                "--json",
                "-v",
            ]
        )
    assert r.code == 0, r
    assert "data steps on a batch-1 model: fed in batches of 8" in r.err, r.err[-2000:]
    # the same steps one sample per call (data.batch_size 1 keeps the model as it is)
    cfg = tmp_path / "one.yaml"
    cfg.write_text("data:\n  batch_size: 1\n")
    r1 = trtq(
        [
            "quantize",
            "--config",
            cfg,
            "--model",
            one,
            "--cache",
            cache,
            *data,
            *STEPS,
            "-o",
            tmp_path / "single.onnx",
            "--json",
            "-v",
        ]
    )
    assert r1.code == 0, r1
    assert "batches of 8" not in r1.err
    assert json.loads(r.out)["quantized"] == json.loads(r1.out)["quantized"]
    assert json.loads(r.out)["left_float"] == json.loads(r1.out)["left_float"]  # the same float layer chosen
    batched, single = _initializers(tmp_path / "batched.onnx"), _initializers(tmp_path / "single.onnx")
    assert batched.keys() == single.keys()
    changed = total = 0
    for name, value in batched.items():
        # the statistics sum the same samples in other groupings: float rounding moves a few of
        # gptq's near-tie choices, nothing else
        differs = ~np.isclose(value, single[name], rtol=1e-4, atol=1e-7)
        changed += int(differs.sum())
        total += value.size
    assert changed <= 0.01 * total, (changed, total)
    model = onnx.load(str(tmp_path / "batched.onnx"))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 224, 224]  # the user's declaration, not the widened one
