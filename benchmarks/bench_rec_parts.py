"""Diagnostic: where a PP-OCRv4 rec Q/DQ model loses its lines (issue 13).

    pip install --no-deps rapidocr-onnxruntime cvttf-notosanscjk-regular
    python benchmarks/bench_rec_lines.py --setting "mse --weight-rounding gptq"   # writes the Q/DQ model
    python benchmarks/bench_rec_parts.py --qdq .bench/rec/mse___weight_rounding_gptq.qdq.onnx

Scores variants of one Q/DQ model on bench_rec_lines.py's 200 lines (sequence agreement with FP32,
ONNX Runtime with Q/DQ semantics), each made by editing the file, none a trtq option:

- weights only / activations only: the other kind's Q/DQ pairs bypassed (a weight that gptq
  rounded keeps its rounded values: "activations only" is then the whole model);
- activations float by reader (Conv, MatMul) and by producer op type;
- asymmetric one-sided activations: activations whose calibration-line minimum is above -10% of
  their maximum quantized over [min, amax] with a zero point, the value they take most often (a
  HardSwish's zeros after an affine) put on a level. TensorRT's INT8 is symmetric, so this is what
  a centring of those tensors could give at most; their readers pad with zeros, which a shift would
  have to turn into -c (a Pad layer of its own on TensorRT 8.6: 4.3x slower on EfficientNet-Lite0,
  trtq/quantize/centering.py).
"""

import argparse
import collections
import sys
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_rec_lines as lines
from bench_rec_lines import ROOT, scoring, wilson_interval


def _pairs(model):
    """(DQ node, Q node, is weight) for every Q -> DQ pair."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for n in model.graph.node:
        q = producer.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear":
            out.append((n, q, q.input[0] in inits))
    return out


def _bypass(model, chosen):
    """A copy whose readers of the chosen pairs' DQ read the float tensor instead."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    to_float = {dq.output[0]: q.input[0] for dq, q, _ in chosen}
    for node in m.graph.node:
        for i, name in enumerate(node.input):
            if name in to_float:
                node.input[i] = to_float[name]
    return m


def _asymmetric(model, chosen, low, mass):
    """A copy whose chosen activation pairs quantize [low, amax] with a zero point."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    targets = {q.output[0] for _, q, _ in chosen}
    for k, q in enumerate(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.output[0] in targets):
        tensor = q.input[0]
        amax = float(inits[q.input[1]]) * 127
        lo = min(low[tensor], 0.0)
        step = (amax - lo) / 255
        levels = round(abs(mass.get(tensor, 0.0)) / step)
        if levels >= 1:  # the most frequent value on a level
            step = abs(mass[tensor]) / levels
        zero = int(np.clip(-128 - round(lo / step), -128, 127))
        s_name, z_name = f"bench_asym_scale_{k}", f"bench_asym_zero_{k}"
        m.graph.initializer.extend(
            [
                numpy_helper.from_array(np.array(step, np.float32), s_name),
                numpy_helper.from_array(np.array(zero, np.int8), z_name),
            ]
        )
        for node in m.graph.node:
            if node is q or (node.op_type == "DequantizeLinear" and node.input[0] == q.output[0]):
                node.input[1] = s_name
                if len(node.input) > 2:
                    node.input[2] = z_name
                else:
                    node.input.append(z_name)
    return m


def _activation_stats(fp32_path: Path, tensors, calib: np.ndarray):
    """Per tensor on the calibration lines: minimum, maximum, and the most frequent value where it
    is over 1% of the first batch."""
    import onnx

    from trtq.calib.collect.exposed import OrtCollector

    collector = OrtCollector(onnx.load(str(fp32_path)), sorted(tensors))
    low, high, mass = {}, {}, {}
    for i in range(0, len(calib), 8):
        values = collector.run({collector.input_names[0]: calib[i : i + 8]})
        for name, v in values.items():
            low[name] = min(low.get(name, np.inf), float(v.min()))
            high[name] = max(high.get(name, -np.inf), float(v.max()))
            if i == 0:
                u, c = np.unique(v, return_counts=True)
                if c.max() > 0.01 * v.size:
                    mass[name] = float(u[c.argmax()])
    return low, high, mass


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--qdq", type=Path, required=True, help="a Q/DQ model of PP-OCRv4 rec (bench_rec_lines.py writes them)"
    )
    ap.add_argument("--work", type=Path, default=ROOT / ".bench" / "rec", help="where calib.npy is")
    ap.add_argument("--lines", type=int, default=200)
    a = ap.parse_args(argv)
    model_path = lines._package_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
    font = lines._package_file("cvttf_NotoSansCJK_Regular", "NotoSansCJKtc-Regular.otf")
    if model_path is None or font is None or not (a.work / "calib.npy").exists():
        print(
            "needs: pip install --no-deps rapidocr-onnxruntime cvttf-notosanscjk-regular, and a "
            "bench_rec_lines.py run first (its calib.npy)"
        )
        return 1
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(model_path), load_external_data=False).metadata_props}
    chars = [c for c in meta.get("character", "").split("\n") if len(c) == 1 and 0x4E00 <= ord(c) <= 0x9FFF]
    x = lines.render(chars, font, a.lines, seed=1)
    ref = lines.run(model_path, x)
    qdq = onnx.load(str(a.qdq))
    pairs = _pairs(qdq)
    acts = [p for p in pairs if not p[2]]
    fp32 = onnx.load(str(model_path), load_external_data=False)
    producer = {o: n.op_type for n in fp32.graph.node for o in n.output}
    readers = collections.defaultdict(set)
    for n in qdq.graph.node:
        for name in n.input:
            readers[name].add(n.op_type)

    def score(label: str, model) -> None:
        path = a.work / "parts.qdq.onnx"
        onnx.save(model, str(path))
        agree, cer = scoring.ctc_scores(ref, lines.run(path, x, qdq=True))
        lo, hi = wilson_interval(agree, a.lines)
        print(f"{label:50s} agreement {agree:.3f} ({lo:.3f}-{hi:.3f})  CER {cer:.4f}", flush=True)

    print(f"{a.qdq.name}: {len(pairs) - len(acts)} weight and {len(acts)} activation Q/DQ pairs")
    score("as it is", qdq)
    score("weights only (activations float)", _bypass(qdq, acts))
    score("activations only (weights float)", _bypass(qdq, [p for p in pairs if p[2]]))
    for op in sorted({r for dq, _, _ in acts for r in readers[dq.output[0]]}):
        chosen = [p for p in acts if op in readers[p[0].output[0]]]
        score(f"activations read by {op} float ({len(chosen)})", _bypass(qdq, chosen))
    for op in sorted({producer.get(q.input[0], "input") for _, q, _ in acts}):
        chosen = [p for p in acts if producer.get(p[1].input[0], "input") == op]
        score(f"activations made by {op} float ({len(chosen)})", _bypass(qdq, chosen))
    low, high, mass = _activation_stats(model_path, {q.input[0] for _, q, _ in acts}, np.load(a.work / "calib.npy"))
    one_sided = [p for p in acts if low[p[1].input[0]] > -0.1 * high[p[1].input[0]]]
    score(f"one-sided activations asymmetric ({len(one_sided)})", _asymmetric(qdq, one_sided, low, mass))
    return 0


if __name__ == "__main__":
    sys.exit(main())
