"""Calibration statistics computed inside ONNX Runtime (``--collect in-graph``, the default).

The outputs collector (trtq.calib.collect.exposed) exposes every calibrated tensor as a graph output: ONNX
Runtime must keep each one for the whole call, write it to memory and hand it back, and the
histograms read it again from memory afterwards. Here instead one node of trtq's own operator
(``ai.trtq.calib.Pow2Stats``, trtq/calib/collect/_ingraph.c, in the compiled kernels' library) reads each
tensor right after the node that made it, folds it into its slot and returns a one-element dummy;
ONNX Runtime then frees or reuses the tensor as in inference. Peak memory is inference's plus the
statistics, and each activation is read while it is still in cache.

A slot takes what the Python accumulator it stands in for would: mse / percentile's power-of-two
histograms (trtq.calib.collect.one_pass.Pow2Histograms: padding rows of the last batch left out, the
per-sample stride, exact range merges), or entropy / max's two passes in the same session, signed
extremes (accumulators.AbsMaxAccumulator) then counts over ``[0, max]`` (accumulators.HistogramAccumulator).
The statistics, and so the cache, are the same integers as the outputs collector's
(tests/calib/test_ingraph.py). A node reading a tensor keeps ONNX Runtime from fusing it away just
as a graph output does.

Used on the CPU provider with the compiled kernels built; otherwise, or when ONNX Runtime will not
load the operator (a tensor that is not float32, an ONNX Runtime older than 1.16), calibration
takes the outputs collector.
"""

import ctypes
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Optional

import numpy as np
import onnx

from trtq.calib.collect import compiled
from trtq.calib.collect.accumulators import AbsMaxAccumulator, HistogramAccumulator, nonfinite_error
from trtq.calib.collect.exposed import _first_line
from trtq.calib.collect.kernels import NO_EXPONENT
from trtq.calib.collect.one_pass import Pow2Histograms
from trtq.errors import ModelError

log = logging.getLogger(__name__)

DOMAIN = "ai.trtq.calib"
OP = "Pow2Stats"
_NONFINITE, _NO_MEMORY = 1, 3  # slot statuses (_ingraph.h)
_MODE_EXTREMES, _MODE_FIXED = 1, 2  # _ingraph.h MODE_*


def unavailable(providers: Sequence[str]) -> Optional[str]:
    """Why in-graph statistics cannot run here, or None."""
    if compiled.library() is None:
        return "the compiled kernels are not built (or TRTQ_NO_NATIVE is set)"
    from trtq.calib.collect.exposed import default_providers

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
        stats_nodes[name] = onnx.helper.make_node(
            OP, [name], [out], name=out, domain=DOMAIN, collection=int(collection), slot=slot
        )
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
    """An ONNX Runtime session whose statistics nodes fold each batch's activations of ``tensors``
    in as it runs, one slot per tensor. It starts in the one-pass mode (power-of-two histograms,
    :meth:`fill_pow2`); :meth:`start_extremes` / :meth:`start_histograms` switch it to the two
    passes of entropy and max (:meth:`fill_extremes`, :meth:`fill_histograms`). Raises ModelError
    when ONNX Runtime does not take the operator (the caller then uses the outputs collector)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        tensors: Sequence[str],
        num_bins: int,
        providers: Sequence[str] = (),
        free_batch: bool = False,
        hist_elements: int = 0,
        leading: Collection[str] = (),
        one_sample: bool = False,
    ):
        import onnxruntime as ort

        lib = compiled.library()
        self.tensors, self.num_bins = list(tensors), int(num_bins)
        self.free_batch = free_batch  # the model takes any batch: padding rows are not run (as groups.py)
        flags = np.array([t in leading for t in self.tensors], dtype=np.int32)
        self._lib = lib
        self._id = lib.trtq_ingraph_create(
            len(self.tensors), self.num_bins, int(hist_elements), int(one_sample), flags.ctypes.data
        )
        if self._id <= 0:
            raise ModelError("could not allocate the in-graph statistics", "pass --collect outputs")
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            # ONNX Runtime's default order ran the statistics nodes late, keeping every activation
            # alive; by priority, then graph order, each runs right after its tensor's producer
            # (docs/decisions.md D22 has the memory and time of both)
            opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            # the memory pattern (one block planned from the first run) held more than allocating
            # per run does, at the same speed (D22)
            opts.enable_mem_pattern = False
            opts.register_custom_ops_library(lib._name)
            blob = _with_stats_nodes(model, self.tensors, self._id).SerializeToString()
            self.session = ort.InferenceSession(blob, opts, providers=list(providers) or ["CPUExecutionProvider"])
        except Exception as e:
            self.close()
            raise ModelError(
                f"ONNX Runtime does not run the in-graph statistics: {_first_line(e)}", "pass --collect outputs"
            ) from None
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self._outputs = [o.name for o in self.session.get_outputs()]

    def run_groups(self, arrays: dict, valid: Optional[int] = None):
        """Run one batch (the statistics are folded in as it runs); yields nothing to histogram."""
        from trtq.calib.collect.budgeted import without_padding

        arrays, valid = without_padding(arrays, valid, self.free_batch)
        batch = next(iter(arrays.values())).shape[0] if arrays else 0
        self._lib.trtq_ingraph_set_run(self._id, int(batch), int(batch if valid is None else valid))
        feeds = {name: np.ascontiguousarray(arrays[name]) for name in self.input_names}
        try:
            self.session.run(self._outputs, feeds)
        except Exception as e:
            raise ModelError(
                f"ONNX Runtime failed to run the model: {_first_line(e)}", "check the input shapes"
            ) from None
        slot = self._lib.trtq_ingraph_first_error(self._id)
        if slot != -1:
            if slot < 0:
                raise RuntimeError("in-graph statistics: the collection is gone")
            self._read(slot, np.zeros(self.num_bins, dtype=np.int64))  # raises for that tensor
        yield from ()

    def _read(self, slot: int, counts: np.ndarray) -> "_Stats":
        """Slot ``slot``'s statistics (its counts into ``counts``); DataError for a NaN / Inf met."""
        stats = _Stats()
        if self._lib.trtq_ingraph_read(self._id, slot, counts.ctypes.data, ctypes.byref(stats)):
            raise RuntimeError("in-graph statistics: the collection is gone")
        if stats.status == _NONFINITE:
            raise nonfinite_error(self.tensors[slot])
        if stats.status == _NO_MEMORY:
            raise MemoryError(f"in-graph statistics: no memory to count '{self.tensors[slot]}'")
        return stats

    def _slots(self):
        """(name, counts, stats) of every slot, in order (one counts buffer, refilled)."""
        counts = np.zeros(self.num_bins, dtype=np.int64)
        for slot, name in enumerate(self.tensors):
            yield name, counts, self._read(slot, counts)

    def fill_pow2(self, hist: Pow2Histograms) -> None:
        """One pass: copy the power-of-two histograms into ``hist`` (made for the same tensors)."""
        for name, counts, st in self._slots():
            hist.counts[name] = counts.copy()
            hist.exponents[name] = None if st.e == NO_EXPONENT else int(st.e)
            hist.maxima[name] = float(st.max)
            hist.zeros[name] = int(st.zeros)
            if st.stride > 1:
                hist.strides[name] = int(st.stride)

    def start_extremes(self) -> None:
        """Pass 1 of entropy / max: the following runs take each tensor's signed min and max."""
        self._lib.trtq_ingraph_set_mode(self._id, _MODE_EXTREMES)

    def fill_extremes(self, acc: AbsMaxAccumulator, skip: Collection[str] = ()) -> None:
        """Fold pass 1's extremes into ``acc`` (as its ``update_batch`` would), ``skip`` left out."""
        for name, _, st in self._slots():
            if name not in skip:
                acc.add_extremes(name, (st.lo, st.hi) if st.seen else None)

    def start_histograms(self, maxima: Mapping[str, float]) -> None:
        """Pass 2: the following runs count each tensor over ``[0, maxima[name]]``."""
        self._lib.trtq_ingraph_set_mode(self._id, _MODE_FIXED)
        for slot, name in enumerate(self.tensors):
            if self._lib.trtq_ingraph_set_range(self._id, slot, float(maxima[name])):
                raise RuntimeError(f"in-graph statistics: bad range {maxima[name]} for '{name}'")

    def fill_histograms(self, hist: HistogramAccumulator) -> None:
        """Add pass 2's counts, zeros and past-the-range flags to ``hist``."""
        for name, counts, st in self._slots():
            hist.add_counts(name, counts, int(st.zeros), bool(st.exceeded))

    def close(self) -> None:
        if getattr(self, "_id", 0) > 0:
            self.session = None
            self._lib.trtq_ingraph_free(self._id)
            self._id = 0

    def __del__(self):
        # at interpreter exit (a run stopped by a signal) ctypes or a module may be gone already; no
        # contextlib here for the same reason
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass


class _Stats(ctypes.Structure):
    """_ingraph.h's ingraph_stats_t."""

    _fields_ = [
        ("zeros", ctypes.c_int64),
        ("stride", ctypes.c_int64),
        ("max", ctypes.c_double),
        ("lo", ctypes.c_double),
        ("hi", ctypes.c_double),
        ("e", ctypes.c_int32),
        ("status", ctypes.c_int32),
        ("seen", ctypes.c_int32),
        ("exceeded", ctypes.c_int32),
    ]
