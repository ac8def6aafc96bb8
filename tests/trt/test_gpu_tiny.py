"""TensorRT builds, runtime, calibration and bench on tiny generated models (real TensorRT + GPU).

Tolerances (outputs compared with ONNX Runtime FP32 on the same inputs):
  * FP32 engine: max error <= 1e-2 of the output range. TensorRT uses TF32 for convs/GEMMs by
    default on Ampere+ (10-bit mantissa, ~1e-3 relative per layer).
  * FP16 engine: <= 2e-2 of the range (FP16 has an 11-bit significand; 4 layers).
  * INT8 engines: <= 5e-2 of the range and cosine >= 0.999. With max calibration on the same
    data every activation step is amax/127 (<= 0.4% of its range); ONNX Runtime running the same
    Q/DQ model is off by ~1% of the range, and TensorRT adds different rounding/accumulation.
"""

import json
import shutil

import numpy as np
import pytest

from tests.trt.models import (
    TACTICS,
    activation_amax,
    cosine,
    gpu_build_options,
    ort_run,
    read_trt_cache,
    rel_max_err,
    relu6_cnn,
    residual_cnn,
    unsupported_op_opset18,
    write_trt_cache,
)
from trtq.config import BenchOptions, BuildOptions, DataOptions, InputSource, ProfileShapes
from trtq.errors import DataError, ModelError

pytestmark = pytest.mark.gpu

BATCH = 4


opts = gpu_build_options


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Static-batch model, 3 batches of data, its ORT reference and a max|x| cache."""
    d = tmp_path_factory.mktemp("tiny")
    model = residual_cnn(d / "tiny.onnx", batch=BATCH, opset=13)
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32) for _ in range(3)]
    amax = activation_amax(model, [{"x": b} for b in batches])
    cache = write_trt_cache(d / "tiny.cache", amax, "MinMaxCalibration", "101600")
    x = batches[0]
    return {"dir": d, "model": model, "x": x, "ref": ort_run(model, {"x": x})["y"], "cache": cache, "amax": amax}


@pytest.fixture(scope="module")
def built(tiny):
    """One engine per precision/mode, built once for the module."""
    from trtq.pipeline.build import build_engine

    d = tiny["dir"]
    out = {}
    out["fp32"] = build_engine(tiny["model"], d / "fp32.plan", opts(precision="fp32"))
    out["fp16"] = build_engine(tiny["model"], d / "fp16.plan", opts(precision="fp16"))
    out["explicit"] = build_engine(tiny["model"], d / "explicit.plan", opts(), cache_path=tiny["cache"])
    out["implicit"] = build_engine(tiny["model"], d / "implicit.plan", opts(mode="implicit"), cache_path=tiny["cache"])
    return out


def run_plan(path, x):
    from trtq.trt.runtime import TrtRunner

    with TrtRunner(path) as r:
        return r.run({"x": x})["y"]


@pytest.mark.parametrize("kind,tol", [("fp32", 1e-2), ("fp16", 2e-2), ("explicit", 5e-2), ("implicit", 5e-2)])
def test_engine_matches_onnxruntime(tiny, built, kind, tol):
    y = run_plan(built[kind].plan_path, tiny["x"])
    assert y.shape == tiny["ref"].shape and y.dtype == np.float32
    err = rel_max_err(y, tiny["ref"])
    assert err <= tol, f"{kind}: max error {err:.4f} of the range"
    assert cosine(y, tiny["ref"]) >= 0.999


def test_plan_metadata(tiny, built):
    import tensorrt as trt

    from trtq.fileio import sha256_file

    md = json.loads((built["explicit"].plan_path.parent / "explicit.plan.json").read_text())
    assert md == built["explicit"].metadata
    assert md["tensorrt_version"] == trt.__version__
    assert md["precision"] == "int8" and md["mode"] == "explicit"
    assert md["model"]["sha256"] == sha256_file(tiny["model"])
    assert md["cache"]["sha256"] == sha256_file(tiny["cache"])
    assert md["quantize"]["quantized"] >= 3  # conv1, conv2, fc at least
    assert md["inputs"] == [{"name": "x", "shape": [BATCH, 3, 16, 16], "dtype": "float32"}]
    assert md["outputs"] == [{"name": "y", "shape": [BATCH, 16], "dtype": "float32"}]
    assert md["build_seconds"] > 0 and md["compute_capability"].count(".") == 1
    assert built["implicit"].metadata["mode"] == "implicit"
    assert built["fp16"].metadata["mode"] is None


def test_dynamic_batch_profile(tmp_path):
    from trtq.pipeline.build import build_engine
    from trtq.trt.runtime import TrtRunner

    model = residual_cnn(tmp_path / "dyn.onnx", batch="N", opset=17)
    prof = ProfileShapes((1, 3, 16, 16), (4, 3, 16, 16), (8, 3, 16, 16))
    res = build_engine(model, tmp_path / "dyn.plan", opts(precision="fp32", profiles={"x": prof}))
    assert res.metadata["inputs"][0]["profile"] == {"min": [1, 3, 16, 16], "opt": [4, 3, 16, 16], "max": [8, 3, 16, 16]}
    rng = np.random.default_rng(2)
    with TrtRunner(res.plan_path) as r:
        assert r.inputs[0].shape == (None, 3, 16, 16)
        for n in (3, 8, 1):
            x = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
            y = r.run({"x": x})["y"]
            assert y.shape == (n, 16)
            assert rel_max_err(y, ort_run(model, {"x": x})["y"]) <= 1e-2
        with pytest.raises(DataError, match="outside the engine's profile"):
            r.run({"x": np.zeros((9, 3, 16, 16), np.float32)})
        with pytest.raises(DataError, match="missing"):
            r.run({"z": np.zeros((1, 3, 16, 16), np.float32)})


def test_tensorrt_calibration_writes_a_cache_tensorrt_accepts(tmp_path):
    """calibrate --backend tensorrt: MinMax ranges equal max|x| from ONNX Runtime, the padded last
    batch is used, and an implicit build takes the cache."""
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model
    from trtq.pipeline.build import build_engine
    from trtq.pipeline.calibrate import calibrate_file_with_tensorrt as calibrate_with_tensorrt

    model = residual_cnn(tmp_path / "dyn.onnx", batch="N", opset=13)
    rng = np.random.default_rng(3)
    # sample i is scaled by (1 + i): the largest values sit in the padded last batch (10 = 4+4+2)
    data = np.stack([rng.standard_normal((3, 16, 16)) * (1 + i) for i in range(10)]).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    batcher = Batcher(
        DataOptions(inputs={"x": InputSource(npy=(str(tmp_path / "x.npy"),))}, batch_size=4),
        input_specs(load_model(model)),
    )
    out = tmp_path / "trt.cache"
    table = calibrate_with_tensorrt(
        model, batcher, "MinMaxCalibration", out, BuildOptions(tactic_sources=TACTICS, workspace_mb=512)
    )
    header, scales = read_trt_cache(out)
    assert header == "TRT-8600-MinMaxCalibration"
    ref = activation_amax(model, [{"x": data}])
    common = [n for n in ref if n in scales]
    assert "x" in common and "y" in common and len(common) >= len(ref) - 2
    for n in common:
        assert scales[n] == pytest.approx(ref[n], rel=1e-4), n
        assert table.amax[n] == pytest.approx(ref[n], rel=1e-4), n
    assert json.loads((tmp_path / "trt.cache.json").read_text())["amax"] == pytest.approx(table.amax)
    res = build_engine(
        model, tmp_path / "cal.plan", opts(mode="implicit"), cache_path=out, data_options=DataOptions(batch_size=4)
    )
    y = run_plan(res.plan_path, data[:4])
    assert rel_max_err(y, ort_run(model, {"x": data[:4]})["y"]) <= 5e-2


def test_runtime_refuses_mismatching_metadata(tiny, built, tmp_path):
    from trtq.trt.runtime import TrtRunner

    src = built["fp32"].plan_path
    for key, value, message in [
        ("tensorrt_version", "7.2.3", "built by TensorRT 7.2.3"),
        ("compute_capability", "5.0", "built for compute capability 5.0"),
        ("gpu_name", "Imaginary GPU", "built on Imaginary GPU"),
    ]:
        plan = tmp_path / f"{key}.plan"
        shutil.copy(src, plan)
        md = json.loads((src.parent / (src.name + ".json")).read_text())
        md[key] = value
        (tmp_path / f"{key}.plan.json").write_text(json.dumps(md))
        with pytest.raises(ModelError, match=message) as info:
            TrtRunner(plan)
        assert "trtq build" in info.value.hint
    with TrtRunner(tmp_path / "gpu_name.plan", check_metadata=False) as r:  # TensorRT itself is fine with it
        assert r.run({"x": tiny["x"]})["y"].shape == (BATCH, 16)


@pytest.mark.parametrize("content", ["random", "onnx"])
def test_runtime_refuses_non_plan(tiny, tmp_path, content):
    from trtq.trt.runtime import TrtRunner

    bad = tmp_path / "bad.plan"
    if content == "random":
        bad.write_bytes(np.random.default_rng(0).integers(0, 255, 4096, dtype=np.uint8).tobytes())
    else:
        shutil.copy(tiny["model"], bad)
    with pytest.raises(ModelError, match="is not a TensorRT"):
        TrtRunner(bad)


def test_parse_error_names_opset_and_leaves_no_file(tmp_path):
    from trtq.pipeline.build import build_engine

    model = unsupported_op_opset18(tmp_path / "bad18.onnx")
    out = tmp_path / "out"
    with pytest.raises(ModelError) as info:
        build_engine(model, out / "bad18.plan", opts(precision="fp32"))
    assert "cannot parse bad18.onnx at node #0 (NoSuchOp" in info.value.message
    assert "opset 18" in info.value.hint and "opset 17" in info.value.hint
    assert not out.exists() or list(out.iterdir()) == []


def test_timing_cache_corrupt_then_reused(tmp_path):
    """A garbage timing cache costs a warning, never the build; a saved one is valid and reused.

    TensorRT 8.5/8.6 refuse the timing cache they wrote themselves ("[myelinCache.h::
    deserializeFromBuffer] Myelin error from unknown graph ... The timing cache will not be used!",
    reported by KataGo and others, fixed in 10.x); seen here with 8.6.0 even for a convolutions-only
    model. There the second build must report exactly that refusal and still succeed.
    """
    import tensorrt as trt

    from trtq.pipeline.build import build_engine

    model = residual_cnn(tmp_path / "convs.onnx", batch=BATCH, head=False)
    tc = tmp_path / "convs.timing.cache"
    tc.write_bytes(b"this is not a timing cache" * 10)
    first = build_engine(model, tmp_path / "a.plan", opts(precision="fp32", timing_cache=str(tc)))
    assert first.metadata["timing_cache"]["loaded"] is False
    old_trt = int(trt.__version__.split(".")[0]) < 10
    problem = first.metadata["timing_cache"]["problem"]
    assert ("Magic tag does not match" in problem) if old_trt else bool(problem)  # 8.6.0's words
    data = tc.read_bytes()
    assert data and not data.startswith(b"this is not")
    second = build_engine(model, tmp_path / "b.plan", opts(precision="fp32", timing_cache=str(tc)))
    state = second.metadata["timing_cache"]
    if old_trt:
        assert state["loaded"] or "Myelin error from unknown graph" in state["problem"]
    else:
        assert state == {"path": str(tc), "loaded": True, "problem": None}
    assert second.plan_path.stat().st_size > 0


def test_bench_numbers_are_sane(built):
    from trtq.trt.bench import bench_plans, render_table

    plans = [built["fp32"].plan_path, built["explicit"].plan_path]
    results = bench_plans(plans, BenchOptions(iterations=40, warmup=0.05))
    for r in results:
        assert r.iterations == 40 and r.batch == BATCH
        assert 0 < r.min_ms <= r.median_ms <= r.p99_ms <= r.max_ms < 1000
        assert r.samples_per_s == pytest.approx(BATCH * r.inferences_per_s)
    assert results[0].speedup_vs_first == 1.0
    assert results[1].speedup_vs_first == pytest.approx(results[0].median_ms / results[1].median_ms)
    assert "explicit.plan" in render_table(results)
    (g,) = bench_plans([plans[0]], BenchOptions(duration=0.2, warmup=0.05, cuda_graph=True, include_copies=True))
    assert g.cuda_graph, g.notes
    assert g.iterations >= 5 and g.include_copies


def test_bench_layers_names_int8_and_float_layers(built):
    """bench --layers: every layer timed, shares add up, and the inspector's precisions tell the
    explicit INT8 engine (INT8 convolutions) from the FP32 one (none)."""
    from trtq.trt.layers import profile_layers, render_layers

    fp32, explicit = (profile_layers(built[k].plan_path, runs=10) for k in ("fp32", "explicit"))
    for p in (fp32, explicit):
        assert p.layers and p.runs == 10 and p.total_ms > 0
        assert sum(x.share for x in p.layers) == pytest.approx(1.0)
        assert all(x.mean_ms >= 0 for x in p.layers)
        assert [x.mean_ms for x in p.layers] == sorted((x.mean_ms for x in p.layers), reverse=True)
    assert any("int8" in x.precision for x in explicit.layers), [(x.name, x.precision) for x in explicit.layers]
    assert not any("int8" in x.precision for x in fp32.layers)
    assert all(x.precision for x in fp32.layers if x.kind == "Convolution"), "build keeps detailed layer info"
    text = render_layers([fp32, explicit], top=2)
    assert "fp32.plan" in text and "explicit.plan" in text and "more layers" in text


@pytest.mark.parametrize(
    "padded,forms",
    [
        # the depthwise and pooled outputs (not the expand output: the padded depthwise conv reads it)
        (False, {"a2": "fold", "f": "move"}),
        # --center-padded: the expand output too, through a border map after the depthwise conv (a
        # Sub: TensorRT 8.6.0's builder stops on the Add of a constant map, D42), the depthwise
        # output folded into that map
        (True, {"a1": "fold", "a2": "fold", "f": "move"}),
    ],
)
def test_centred_activations_engine_matches_its_qdq_model(tmp_path, padded, forms):
    """--center-activations in engine form (the activation folded into the quantizer's clamp, the
    pooled shift moved behind the pooling): the engine built from that Q/DQ file computes what ONNX
    Runtime computes on it, and ``build`` centres too on this TensorRT (its quantize report says so)."""
    import onnx

    from trtq.config import QuantizeOptions
    from trtq.pipeline.build import build_engine
    from trtq.quantize import quantize_model

    model = relu6_cnn(tmp_path / "r6.onnx", batch=BATCH)
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32) for _ in range(3)]
    amax = activation_amax(model, [{"x": b} for b in batches])
    cache = write_trt_cache(tmp_path / "r6.cache", amax, "MinMaxCalibration", "8600")
    qopts = QuantizeOptions(center_activations=True, center_padded=padded)
    result = quantize_model(onnx.load(str(model)), amax, qopts)
    assert {c["tensor"]: c["form"] for c in result.centred} == forms
    assert [n.op_type for n in result.model.graph.node].count("Sub") == int(padded)
    qdq = tmp_path / "r6.qdq.onnx"
    onnx.save(result.model, str(qdq))
    built = build_engine(qdq, tmp_path / "r6.plan", opts())
    x = batches[0]
    y = run_plan(built.plan_path, x)
    twin = ort_run(qdq, {"x": x})["y"]
    ref = ort_run(model, {"x": x})["y"]
    assert rel_max_err(y, twin) <= 5e-2 and cosine(y, twin) >= 0.999, (rel_max_err(y, twin), cosine(y, twin))
    assert cosine(y, ref) >= 0.995
    plain = build_engine(model, tmp_path / "r6b.plan", opts(), cache_path=cache, quantize_options=qopts)
    assert plain.metadata["quantize"]["centred"] == len(forms)
    y2 = run_plan(plain.plan_path, x)
    assert rel_max_err(y2, twin) <= 5e-2 and cosine(y2, twin) >= 0.999


def test_int8_quantizer_clamps_at_minus_128_inside_a_fused_conv(tmp_path):
    """The engine form of centring relies on QuantizeLinear clamping to [-128, 127] (ONNX, and
    TensorRT's documented IQuantizeLayer), also where TensorRT fuses it into the convolution that
    writes INT8. Channel 0 of conv1 is far below -128 steps, channel 1 far above 127, channel 2 in
    range; an identity 1x1 conv2 reads the levels back. A clamp at -127 would put channel 0 one
    step off."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtq.pipeline.build import build_engine

    C = 16
    s_x, s = 1 / 127, 0.05
    w1 = np.zeros((C, C, 1, 1), np.float32)
    for c in range(C):
        w1[c, c] = 1.0  # levels 127 at scale 1/127
    b1 = np.zeros(C, np.float32)
    b1[0::3], b1[1::3], b1[2::3] = -50 * s * 128 / 127 * 3, 50 * s * 3, 0.0  # below, above, inside
    w2 = w1.copy()
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in [
            (np.float32(s_x), "sx"),
            (np.float32(s), "s"),
            (np.int8(0), "zp"),
            (np.round(w1 * 127).astype(np.int8), "w1q"),
            (np.full(C, 1 / 127, np.float32), "sw"),
            (np.zeros(C, np.int8), "zw"),
            (b1, "b1"),
            (np.round(w2 * 127).astype(np.int8), "w2q"),
        ]
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zp"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zp"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1q", "sw", "zw"], ["w1d"], axis=0),
        helper.make_node("Conv", ["xd", "w1d", "b1"], ["c1"], name="conv1"),
        helper.make_node("QuantizeLinear", ["c1", "s", "zp"], ["c1q"]),
        helper.make_node("DequantizeLinear", ["c1q", "s", "zp"], ["c1d"]),
        helper.make_node("DequantizeLinear", ["w2q", "sw", "zw"], ["w2d"], axis=0),
        helper.make_node("Conv", ["c1d", "w2d"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes,
        "clamp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, C, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, C, 8, 8])],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = tmp_path / "clamp.onnx"
    onnx.save(m, str(path))
    x = (np.random.default_rng(3).integers(-20, 21, (BATCH, C, 8, 8)) * s_x).astype(np.float32)
    twin = ort_run(path, {"x": x})["y"]
    levels_twin = np.rint(twin / s)
    assert (levels_twin[:, 0::3] == -128).all() and (levels_twin[:, 1::3] == 127).all()
    built = build_engine(path, tmp_path / "clamp.plan", opts())
    y = run_plan(built.plan_path, x)
    levels = np.rint(y / s)
    assert (levels[:, 0::3] == -128).all(), np.unique(levels[:, 0::3])
    assert (levels[:, 1::3] == 127).all(), np.unique(levels[:, 1::3])
    assert np.abs(levels[:, 2::3] - levels_twin[:, 2::3]).max() <= 1
