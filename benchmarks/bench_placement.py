"""Standard vs fused Q/DQ placement (``quantize.placement``) on CPU: a static predictor of what
TensorRT will run in INT8, and the accuracy cost, per model.

    python benchmarks/bench_placement.py --zoo                 # every architecture of .zoo (one slot each)
    python benchmarks/bench_placement.py --stats a.onnx b.onnx  # the counts of given Q/DQ files

Counts, per Q/DQ file: Q/DQ pairs (QuantizeLinear nodes), Adds whose two computed inputs both come
from DequantizeLinear, Concats whose inputs all come from DequantizeLinear at one scale, and float
islands: groups of connected float nodes that read a quantized layer's output and write into a
QuantizeLinear (TensorRT's int8->fp32 layer + fp32->int8 reformat). A quantized layer is a node
that reads a DequantizeLinear output, with its pointwise epilogue (BatchNorm, activations, SiLU's
Sigmoid/Mul, a bias Add) absorbed, as TensorRT fuses it. Zoo accuracy: amax = max|x| over 4
random FP32 runs, SQNR (dB, worst output) of each Q/DQ model vs FP32 on 4 other random inputs,
with ONNX Runtime (basic optimizations: the Q/DQ pairs computed as written).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import onnx
from common import REPO  # also puts the repository on sys.path

from tests.quantize.conftest import activation_amax, session
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model

_EPILOGUE = frozenset(
    {"Relu", "Sigmoid", "Mul", "HardSwish", "HardSigmoid", "Clip", "LeakyRelu", "BatchNormalization", "Gelu"}
    | {"Tanh", "Elu", "Selu", "Softplus", "PRelu", "Mish", "Add", "Identity"}
)


def _static(graph: onnx.GraphProto) -> set[str]:
    known = {i.name for i in graph.initializer}
    for n in graph.node:
        ins = [i for i in n.input if i]
        if n.op_type == "Constant" or (ins and all(i in known for i in ins)):
            known.update(o for o in n.output if o)
    return known


def _scale(graph: onnx.GraphProto, dq: onnx.NodeProto) -> float | None:
    init = {i.name: i for i in graph.initializer}
    t = init.get(dq.input[1])
    return None if t is None else float(onnx.numpy_helper.to_array(t).reshape(-1)[0])


def placement_stats(model: onnx.ModelProto) -> dict:
    g = model.graph
    static = _static(g)
    dq = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    computed = [n for n in g.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear", "Constant")]
    computed = [n for n in computed if not all(o in static for o in n.output if o)]
    layer_out: set[str] = set()  # outputs of quantized layers and their fused epilogues
    floats: list[onnx.NodeProto] = []
    for n in computed:
        ins = [i for i in n.input if i and i not in static]
        if any(i in dq for i in ins) or (
            n.op_type in _EPILOGUE and ins and all(i in layer_out for i in ins) and len(ins) <= 2
        ):
            layer_out.update(n.output)
        else:
            floats.append(n)
    islands, island_nodes = _islands(floats, consumers, layer_out, static)
    adds = [n for n in computed if n.op_type == "Add" and len([i for i in n.input if i not in static]) == 2]
    concats = [n for n in computed if n.op_type == "Concat"]
    return {
        "qdq": sum(n.op_type == "QuantizeLinear" for n in g.node),
        "adds_int8": sum(all(i in dq for i in n.input) for n in adds),
        "adds": len(adds),
        "concats_int8": sum(
            all(i in dq for i in n.input) and len({_scale(g, dq[i]) for i in n.input}) == 1 for n in concats
        ),
        "concats": len(concats),
        "islands": islands,
        "island_nodes": island_nodes,
    }


def _islands(floats, consumers, layer_out, static) -> tuple[int, int]:
    """Connected groups of float nodes that read a quantized layer and write into a QuantizeLinear."""
    ids = {id(n): k for k, n in enumerate(floats)}
    parent = list(range(len(floats)))

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for n in floats:
        for o in n.output:
            for c in consumers.get(o, []):
                if id(c) in ids:
                    parent[find(ids[id(c)])] = find(ids[id(n)])
    reads, writes = set(), set()
    for n in floats:
        if any(i in layer_out for i in n.input if i not in static):
            reads.add(find(ids[id(n)]))
        if any(c.op_type == "QuantizeLinear" for o in n.output for c in consumers.get(o, [])):
            writes.add(find(ids[id(n)]))
    both = reads & writes
    return len(both), sum(find(k) in both for k in range(len(floats)))


def _feeds(entry: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    shape = entry["input"]["feed_shape"]
    return {entry["input"]["name"]: rng.standard_normal(shape).astype(np.float32)}


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)


def zoo_row(entry: dict) -> dict:
    model = onnx.load(str(REPO / ".zoo" / entry["file"]))
    amax = activation_amax(model, [_feeds(entry, s) for s in range(4)])
    evals = [_feeds(entry, 100 + s) for s in range(4)]
    ref = session(model)
    row = {"model": entry["name"], "file": entry["file"]}
    for placement in ("standard", "fused"):
        q = quantize_model(model, amax, QuantizeOptions(placement=placement)).model
        run = session(q)
        worst = math.inf
        for f in evals:
            for a, b in zip(ref.run(None, f), run.run(None, f)):
                if np.issubdtype(np.asarray(a).dtype, np.floating):
                    worst = min(worst, sqnr_db(np.asarray(a), np.asarray(b)))
        row[placement] = dict(placement_stats(q), sqnr=round(worst, 2))
    return row


def _cell(s: dict) -> str:
    return (
        f"{s['qdq']:4d} {s['adds_int8']:2d}/{s['adds']:<2d} {s['concats_int8']:2d}/{s['concats']:<2d} "
        f"{s['islands']:3d} ({s['island_nodes']:3d}) {s['sqnr']:6.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", action="store_true", help="every architecture of .zoo (its first slot)")
    ap.add_argument("--only", nargs="*", help="zoo: these model names only")
    ap.add_argument("--stats", nargs="*", default=[], help="Q/DQ files: print their counts")
    ap.add_argument("--json", help="zoo: write the rows here")
    args = ap.parse_args(argv)
    for path in args.stats:
        print(path, json.dumps(placement_stats(onnx.load(path))))
    if not args.zoo:
        return 0
    seen, rows = set(), []
    print("model | standard: qdq adds concats islands(nodes) sqnr | fused: same")
    for entry in json.loads((REPO / ".zoo" / "manifest.json").read_text())["models"]:
        if entry["name"] in seen or (args.only and entry["name"] not in args.only):
            continue
        seen.add(entry["name"])
        row = zoo_row(entry)
        rows.append(row)
        print(f"{row['model']:28s} | {_cell(row['standard'])} | {_cell(row['fused'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
