"""Real models: the bundled orientation classifier and, when installed, RapidOCR's PP-OCR models."""

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.quantize.conftest import (
    activation_amax,
    cosine,
    nodes_of,
    page_rotations,
    photo_batch,
    run,
    text_page,
)
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model


@pytest.fixture(scope="module")
def calibrated(sample_fp32):
    """amax over one batch: a text page in 4 orientations and 8 real photos."""
    x = np.concatenate([page_rotations(seed=0), photo_batch("*_0.*")])
    return activation_amax(sample_fp32, [{"x": x}])


def _float_read_quantized(model):
    """(tensor, reader) for each quantized activation a node other than Shape reads directly."""
    inits = {i.name for i in model.graph.initializer}
    out = []
    for q in nodes_of(model, "QuantizeLinear"):
        if q.input[0] in inits:
            continue
        for n in model.graph.node:
            if n is not q and q.input[0] in n.input and n.op_type != "Shape":
                out.append((q.input[0], n.name))
    return out


def _is_gate(model, name):
    """Whether node ``name`` of ``model`` is a squeeze-excite gate ``Mul(x, Sigmoid|HardSigmoid(g))``."""
    producer = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == name)
    gates = [producer.get(i) for i in node.input]
    return node.op_type == "Mul" and any(
        g is not None and g.op_type in ("Sigmoid", "HardSigmoid") and g.input[0] not in node.input for g in gates
    )


@pytest.mark.parametrize("fp16, placement", [(False, "standard"), (True, "standard"), (False, "auto")])
def test_sample_model_quantizes_and_stays_close_to_fp32(sample_fp32, calibrated, fp16, placement):
    result = quantize_model(sample_fp32, calibrated, QuantizeOptions(fp16=fp16, placement=placement))
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    convs = [n.name for n in sample_fp32.graph.node if n.op_type == "Conv"]
    assert result.missing_amax == []
    assert [name for name, _ in result.left_float] == ["MatMul.0"]  # the 4-class head: N = 4
    if placement == "standard":
        assert result.quantized == convs  # every Conv, depthwise and squeeze-excite convs included
        assert len(nodes_of(q, "QuantizeLinear")) == result.qdq_pairs == 2 * len(convs)
    else:  # shared: every Conv, plus the pooling readers of its quantized tensors and their gate Muls
        ops = {n.name: n.op_type for n in sample_fp32.graph.node}
        extra = [n for n in result.quantized if n not in convs]
        assert [n for n in result.quantized if n in convs] == convs
        assert extra and {ops[n] for n in extra} <= {"GlobalAveragePool", "AveragePool", "MaxPool", "Mul"}, extra
        assert all(_is_gate(sample_fp32, n) for n in extra if ops[n] == "Mul")
    # the model's own task, on a page it was not calibrated on: same answers, nearly same scores
    pages = page_rotations(seed=1)
    ref, got = run(sample_fp32, {"x": pages})[0], run(q, {"x": pages})[0]
    assert list(ref.argmax(1)) == [0, 3, 2, 1] and ref.max(1).min() > 0.9  # FP32 reads the turns right
    assert list(got.argmax(1)) == [0, 3, 2, 1]
    if placement == "standard":
        assert cosine(ref, got) > 0.9999 and np.abs(ref - got).max() < 0.02
    else:  # shared's pair on the last pool's input (GlobalAveragePool.2 -> Conv.31) costs this; excluded, 0.99999
        assert 0.998 < cosine(ref, got) < 0.9999 and np.abs(ref - got).max() < 0.08
    # photos are off-task: FP32 is unsure there and INT8 moves the low scores more, within bounds
    photos = photo_batch("*_[12].*")
    ref, got = run(sample_fp32, {"x": photos})[0], run(q, {"x": photos})[0]
    assert cosine(ref, got) > 0.8


# ------------------------------------------------------------------------------------------------
# PP-OCR det / cls / rec from rapidocr-onnxruntime (pip install --no-deps rapidocr-onnxruntime)
# ------------------------------------------------------------------------------------------------


def _rapidocr_models() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime)")
    return Path(spec.origin).parent / "models"


def _ocr_input(kind: str) -> np.ndarray:
    from PIL import Image

    page = text_page(seed=2)
    if kind == "det":
        img = np.asarray(page.resize((384, 384), Image.BILINEAR), np.float32) / 255.0
        x = (img - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    else:  # one text line, 48 px high
        line = page.crop((8, 6, 330, 34)).resize((192 if kind == "cls" else 320, 48), Image.BILINEAR)
        x = (np.asarray(line, np.float32) / 255.0 - 0.5) / 0.5
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def _ctc_decode(scores: np.ndarray) -> list:
    best = scores[0].argmax(-1)
    return [int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1])]


def _edit_distance(a: list, b: list) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, filename, opset",
    [
        ("cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", 11),
        ("rec", "ch_PP-OCRv4_rec_infer.onnx", 12),
        ("det", "ch_PP-OCRv4_det_infer.onnx", 12),
    ],
)
def test_ppocr_models_from_rapidocr(kind, filename, opset):
    path = _rapidocr_models() / filename
    if not path.exists():
        pytest.skip(f"{filename} is not in this rapidocr-onnxruntime version")
    model = onnx.load(str(path))
    x = _ocr_input(kind)
    amax = activation_amax(model, [{"x": x}])
    result = quantize_model(model, amax, QuantizeOptions())
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    assert f"upgraded default-domain opset {opset} -> 13" in result.notes
    assert any("Constant nodes into initializers" in n for n in result.notes)
    assert not nodes_of(q, "Constant") or all(
        n.output[0] not in {i for c in nodes_of(q, "Conv") for i in c.input} for n in nodes_of(q, "Constant")
    )
    convs = nodes_of(q, "Conv")
    quantized_convs = [c for c in convs if c.name in result.quantized]
    assert len(quantized_convs) >= 0.9 * len(convs)
    for c in quantized_convs:  # per-channel weights from what were Constant nodes
        assert c.input[1].endswith("_DequantizeLinear_Output")
    assert result.missing_amax == []
    ref = run(model, {"x": x})[0]
    fp16 = quantize_model(model, amax, QuantizeOptions(fp16=True)).model
    onnx.checker.check_model(fp16, full_check=True)
    if kind == "rec":
        reasons = [r for _, r in result.left_float]
        assert sum(r.startswith("attention") for r in reasons) == 4  # 2 blocks x (QK^T, PV)
        # decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div), Softmax and activations read float tensors
        dq_outputs = {n.output[0] for n in nodes_of(q, "DequantizeLinear")}
        # (a squeeze-excite gate Mul reads INT8, D36)
        float_ops = ("ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Softmax", "Sigmoid", "Mul")
        readers = [n for n in q.graph.node if n.op_type in float_ops and dq_outputs & set(n.input)]
        assert readers and all(n.op_type == "Mul" and _is_gate(model, n.name) for n in readers)
    # one precision per tensor: no quantized activation is also read float by a compute op (its
    # producer could not take the Quantize; TensorRT would quantize in a layer of its own, D36)
    assert _float_read_quantized(q) == []
    for candidate in (q, fp16):  # INT8 with the rest in FP32, then in FP16
        got = run(candidate, {"x": x})[0]
        assert got.shape == ref.shape and got.dtype == np.float32
        if kind == "rec":  # greedy CTC decoding: a few characters differ at most
            a, b = _ctc_decode(ref), _ctc_decode(got)
            assert len(a) >= 10 and _edit_distance(a, b) <= 0.2 * len(a)
        elif kind == "cls":
            assert ref.argmax() == got.argmax() and cosine(ref, got) > 0.99
        else:  # det: probability map; max calibration leaves it coarser but the text mask holds
            assert ((ref > 0.3) == (got > 0.3)).mean() > 0.9


@pytest.mark.slow
def test_ppocr_rec_attention_int8():
    """quantize.attention int8 on PP-OCRv4 rec: its two attention blocks' four MatMuls get Q/DQ on
    both inputs (the Softmax outputs among them; shape inference cannot tell their key length, so
    the 512-key limit does not apply) and the line still decodes as FP32 decodes it."""
    path = _rapidocr_models() / "ch_PP-OCRv4_rec_infer.onnx"
    if not path.exists():
        pytest.skip("ch_PP-OCRv4_rec_infer.onnx is not in this rapidocr-onnxruntime version")
    model = onnx.load(str(path))
    x = _ocr_input("rec")
    amax = activation_amax(model, [{"x": x}])
    default = quantize_model(model, amax, QuantizeOptions())
    result = quantize_model(model, amax, QuantizeOptions(attention="int8"))
    q = result.model
    onnx.checker.check_model(q, full_check=True)
    attention = [name for name, why in default.left_float if why.startswith("attention")]
    assert len(attention) == 4 and set(result.quantized) - set(default.quantized) == set(attention)
    assert not any(why.startswith("attention") for _, why in result.left_float)
    producers = {o: n.op_type for n in q.graph.node for o in n.output}
    for name in attention:  # both inputs of all four MatMuls dequantized (Q x K^T and Softmax x V)
        matmul = next(n for n in q.graph.node if n.name == name)
        assert [producers.get(i) for i in matmul.input] == ["DequantizeLinear"] * 2, name
    ref, got = run(model, {"x": x})[0], run(q, {"x": x})[0]
    a, b = _ctc_decode(ref), _ctc_decode(got)
    assert len(a) >= 10 and _edit_distance(a, b) <= 0.2 * len(a)
