"""mse / percentile statistics computed inside ONNX Runtime (``--collect in-graph``).

The outputs collector (trtq.calib.collect) exposes every calibrated tensor as a graph output: ONNX
Runtime must keep each one for the whole call, write it to memory and hand it back, and the
histograms read it again from memory afterwards. Here instead one node of trtq's own operator
(``ai.trtq.calib.Pow2Stats``, trtq/calib/_ingraph.c, in the compiled kernels' library) reads each
tensor right after the node that made it, folds it into its power-of-two histogram and returns
a one-element dummy; ONNX Runtime then frees or reuses the tensor as in inference. Peak memory is
inference's plus the histograms, and each activation is read while it is still in cache.

The operator follows trtq.calib.pow2.Pow2Histograms' rules (padding rows of the last batch left
out, the per-sample stride, exact range merges): the counts, maxima and zeros, and so the cache,
are the same integers as the outputs collector's (tests/calib/test_ingraph.py). A node reading a
tensor keeps ONNX Runtime from fusing it away just as a graph output does.

Used for mse / percentile on the CPU provider with the compiled kernels built; anything else, or a
session that will not load the operator (a tensor that is not float32, an ONNX Runtime older than
1.16), takes the outputs collector.
"""
import ctypes
import logging
from typing import Optional
from collections.abc import Sequence

import numpy as np
import onnx

from trtq.calib import native
from trtq.calib.pow2 import Pow2Histograms
from trtq.calib.stats import nonfinite_error
from trtq.errors import ModelError

log = logging.getLogger(__name__)

DOMAIN = "ai.trtq.calib"
OP = "Pow2Stats"
_NO_EXPONENT = -(1 << 30)
_NONFINITE, _NO_MEMORY = 1, 3


def unavailable(providers: Sequence[str]) -> Optional[str]:
    """Why in-graph statistics cannot run here, or None."""
    if native.library() is None:
        return "the compiled kernels are not built (or TRTQ_NO_NATIVE is set)"
    from trtq.calib.collect import default_providers

    use = list(providers) or default_providers()
    if use != ["CPUExecutionProvider"]:
        return f"providers {', '.join(use)}: the statistics operator runs on the CPU provider only"
    return None


def _with_stats_nodes(model: onnx.ModelProto, tensors: Sequence[str], collection: int) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs are one Pow2Stats node per tensor (slot = position),
    each placed right after the node that makes its tensor: with the priority-based order ONNX
    Runtime keeps the graph's order where it can, so each tensor is read while in cache and freed
    after its last use."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    taken = {o for n in g.node for o in n.output} | {i.name for i in g.input}
    stats_nodes = {}
    del g.output[:]
    for slot, name in enumerate(tensors):
        out = f"trtq_stats_{slot}"
        while out in taken:
            out += "_"
        stats_nodes[name] = onnx.helper.make_node(OP, [name], [out], name=out, domain=DOMAIN,
                                                  collection=int(collection), slot=slot)
        g.output.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [1]))
    ordered = [stats_nodes.pop(i.name) for i in g.input if i.name in stats_nodes]
    for node in g.node:
        ordered.append(node)
        ordered += [stats_nodes.pop(o) for o in node.output if o in stats_nodes]
    ordered += stats_nodes.values()  # none expected: every tensor is a graph input or a node output
    del g.node[:]
    g.node.extend(ordered)
    if not any(op.domain == DOMAIN for op in m.opset_import):
        m.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return m


class InGraphCollector:
    """An ONNX Runtime session that folds each batch's activations into ``hist`` (a fresh
    :class:`Pow2Histograms` whose tensors it calibrates) as it runs; :meth:`finish` copies the
    result into ``hist``. Raises ModelError when ONNX Runtime does not take the operator (the
    caller then uses the outputs collector)."""

    def __init__(self, model: onnx.ModelProto, hist: Pow2Histograms, leading: set, providers: Sequence[str] = (),
                 free_batch: bool = False):
        import onnxruntime as ort

        lib = native.library()
        self.hist, self.tensors = hist, list(hist.counts)
        self.free_batch = free_batch  # the model takes any batch: padding rows are not run (as groups.py)
        flags = np.array([t in leading for t in self.tensors], dtype=np.int32)
        self._lib = lib
        self._id = lib.trtq_ingraph_create(len(self.tensors), hist.num_bins, hist.hist_elements,
                                           int(hist.one_sample_calls), flags.ctypes.data)
        if self._id <= 0:
            raise ModelError("could not allocate the in-graph statistics", "pass --collect outputs")
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            # ONNX Runtime's default order ran the statistics nodes late, keeping every activation
            # alive (EfficientNet-Lite0, 128 samples: 1.43 GB, 3.5 s); by priority, then graph order, each
            # runs right after its tensor's producer (450 MB, 2.3 s; inference alone 317 MB, 0.8 s)
            opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            # the memory pattern (one block planned from the first run) held 460-560 MB where
            # allocating per run holds ~400 (EfficientNet-Lite0, --tensors qdq); same speed
            opts.enable_mem_pattern = False
            opts.register_custom_ops_library(lib._name)
            blob = _with_stats_nodes(model, self.tensors, self._id).SerializeToString()
            self.session = ort.InferenceSession(blob, opts, providers=list(providers) or ["CPUExecutionProvider"])
        except Exception as e:
            self.close()
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(f"ONNX Runtime does not run the in-graph statistics: {first}",
                             "pass --collect outputs") from None
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self._outputs = [o.name for o in self.session.get_outputs()]

    def run_groups(self, arrays: dict, valid: Optional[int] = None):
        """Run one batch (the statistics are folded in as it runs); yields nothing to histogram."""
        batch = next(iter(arrays.values())).shape[0] if arrays else 0
        if self.free_batch and valid is not None and valid < batch:
            arrays, batch = {n: a[:valid] for n, a in arrays.items()}, int(valid)
        self._lib.trtq_ingraph_set_run(self._id, int(batch), int(batch if valid is None else valid))
        feeds = {name: np.ascontiguousarray(arrays[name]) for name in self.input_names}
        try:
            self.session.run(self._outputs, feeds)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(f"ONNX Runtime failed to run the model: {first}", "check the input shapes") from None
        if self._lib.trtq_ingraph_first_error(self._id) != -1:
            self.finish()  # raises for the tensor
        yield from ()

    def finish(self) -> None:
        """Copy the statistics into ``hist``; DataError for a tensor that held a NaN / Inf."""
        h = self.hist
        counts = np.zeros(h.num_bins, dtype=np.int64)
        e, top, zeros, stride, status = (ctypes.c_int32(), ctypes.c_double(), ctypes.c_int64(), ctypes.c_int64(),
                                         ctypes.c_int32())
        for slot, name in enumerate(self.tensors):
            if self._lib.trtq_ingraph_read(self._id, slot, counts.ctypes.data, ctypes.byref(e), ctypes.byref(top),
                                           ctypes.byref(zeros), ctypes.byref(stride), ctypes.byref(status)):
                raise RuntimeError("in-graph statistics: the collection is gone")
            if status.value == _NONFINITE:
                raise nonfinite_error(name)
            if status.value == _NO_MEMORY:
                raise MemoryError(f"in-graph statistics: no memory to count '{name}'")
            h.counts[name] = counts.copy()
            h.exponents[name] = None if e.value == _NO_EXPONENT else int(e.value)
            h.maxima[name] = float(top.value)
            h.zeros[name] = int(zeros.value)
            if stride.value > 1:
                h.strides[name] = int(stride.value)

    def close(self) -> None:
        if getattr(self, "_id", 0) > 0:
            self.session = None
            self._lib.trtq_ingraph_free(self._id)
            self._id = 0

    def __del__(self):
        self.close()
