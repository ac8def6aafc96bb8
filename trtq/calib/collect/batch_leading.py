"""Which activations hold one sample per leading index, proven from the graph.

Subsampling a tensor per sample (trtq.calib.collect.one_pass) is independent of batching only where its leading
dim really is the batch. ONNX shape inference carries the inputs' symbolic batch dim (say ``N``) to
the outputs of Conv, elementwise ops, pooling, Transpose that keeps axis 0 and so on; a tensor
whose inferred dim 0 is that same symbol is batch-leading. Anything else (a Reshape that folds the
batch, a sequence-first layout, an unknown shape) is not, and is histogrammed whole.
"""

import logging
from collections.abc import Sequence

import onnx

from trtq.model import infer_shapes, input_specs

log = logging.getLogger(__name__)


def _dims(vi: onnx.ValueInfoProto):
    t = vi.type.tensor_type
    return list(t.shape.dim) if t.HasField("shape") else None


def one_sample_calls(model: onnx.ModelProto) -> bool:
    """Every graph input that takes data declares a fixed leading dim of 1: each call is one sample."""
    specs = input_specs(model)
    return bool(specs) and all(s.shape and s.shape[0] == 1 for s in specs)


def batch_leading(model: onnx.ModelProto, tensors: Sequence[str]) -> set:
    """The ``tensors`` whose inferred leading dim is the inputs' shared symbolic batch dim."""
    leads = {s.shape[0] if s.shape else None for s in input_specs(model)}
    if len(leads) != 1 or not isinstance(next(iter(leads)), str):  # one named dim, on every input
        return set()
    symbol = leads.pop()
    try:
        inferred = infer_shapes(model)
    except Exception as e:  # a model shape inference cannot read: nothing is proven
        log.debug("shape inference failed (%s): every tensor histogrammed whole", e)
        return set()
    g = inferred.graph
    leading = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = _dims(vi)
        leading[vi.name] = bool(dims) and dims[0].dim_param == symbol
    return {t for t in tensors if leading.get(t)}
