"""Collect the activations in tensor groups when one batch of all of them exceeds ``--max-memory``.

The single collector session (trtq.calib.collect.exposed.OrtCollector) exposes every calibrated tensor as
a graph output, which keeps ONNX Runtime from fusing them away and from reusing their buffers: one
call holds a batch of all of them. Here, when that is over the budget (trtq.calib.collect.budget):

1. ONNX Runtime optimises that same all-tensor graph once (same options, nothing run) and hands
   the optimised graph back (``optimized_model_filepath``);
2. per group, the optimised graph cut down to the nodes its tensors need, with only the group's
   tensors as outputs, runs with optimisations off: the same nodes and kernels as the all-tensor
   session, so bit for bit the same values, while everything else is freed as in inference.

Each batch runs once per group (the early groups run a part of the model only). The histograms and
maxima are per tensor, so the statistics, and the cache, are the same whatever the grouping.

Before any grouping, a batch too large for the budget is run in slices of rows (``rows_per_call``)
when the model's batch dim is free: one model pass still, each call holding a slice's activations.
The statistics are those of the same samples, so the cache is what ``--batch-size`` of that slice
would give (trtq's caches do not depend on the batch size where ONNX Runtime's kernels do not).
Only when one row of every tensor still exceeds the budget are the tensors grouped too.
"""

import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import onnx

from trtq.calib.collect.exposed import OrtCollector, _with_outputs, default_providers

log = logging.getLogger(__name__)


def _optimized(model: onnx.ModelProto, tensors: Sequence[str], providers: Sequence[str]) -> onnx.ModelProto:
    """ONNX Runtime's optimised form of the all-tensor collector graph (the one OrtCollector runs)."""
    import onnxruntime as ort

    graph_inputs = {i.name for i in model.graph.input}
    exposed = _with_outputs(model, [t for t in tensors if t not in graph_inputs])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    fd, path = tempfile.mkstemp(suffix=".onnx", prefix="trtq-groups-")
    os.close(fd)
    try:
        opts.optimized_model_filepath = path
        ort.InferenceSession(exposed.SerializeToString(), opts, providers=list(providers) or default_providers())
        return onnx.load(path)
    finally:
        os.unlink(path)


def _pruned(model: onnx.ModelProto, outputs: Sequence[str]) -> bytes:
    """``model`` with only ``outputs`` as graph outputs and only the nodes they need."""
    need = set(outputs)
    keep = []
    for node in reversed(model.graph.node):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(_reads(node))
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[:]
    m.graph.node.extend(reversed(keep))
    typed = {o.name: o for o in model.graph.output}
    del m.graph.output[:]
    m.graph.output.extend(typed[o] for o in outputs)
    return m.SerializeToString()  # unused initializers: ONNX Runtime drops them at load


def _reads(node) -> set[str]:
    """Every value a node reads, the outer-scope ones of its subgraphs (If, Loop, Scan) included."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for g in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
            for inner in g.node:
                names |= _reads(inner)
    return names


class GroupedCollector:
    """:class:`OrtCollector` over ``tensors``, in groups of at most ``budget`` bytes per batch; one
    group (everything fits): the plain OrtCollector. :meth:`run_groups` yields each group's
    activations (valid until the next one)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        tensors: Sequence[str],
        providers: Sequence[str],
        budget: int,
        input_shapes: dict,
        split_rows: bool = True,
        slice_at: Optional[int] = None,
    ):
        """``budget``: the most one call may hold (tensor groups above it); ``slice_at`` (default
        ``budget``): the size above which a batch runs in slices of rows."""
        from trtq.calib.collect.budget import plan_groups, rows_per_call, tensor_bytes

        self.batch = batch = next((int(s[0]) for s in input_shapes.values() if len(s)), 1)
        self.free = batch_dim_free(model, input_shapes)  # padding rows of a last batch are not run
        sizes = tensor_bytes(model, tensors, input_shapes)
        self.rows_per_call = batch
        total = sum(sizes.values())
        rows, target = rows_per_call(total, batch, budget, slice_at)
        if split_rows and rows < batch and self.free:
            self.rows_per_call = rows
            sizes = tensor_bytes(
                model, tensors, {n: (self.rows_per_call,) + tuple(s[1:]) for n, s in input_shapes.items()}
            )
            log.info(
                "one batch of activations (%d MiB) is over %d MiB: %d of its %d rows per ONNX Runtime call",
                total >> 20,
                target >> 20,
                self.rows_per_call,
                batch,
            )
        self.groups = plan_groups(sizes, budget, self.rows_per_call)
        self.tensors = list(tensors)
        if len(self.groups) == 1:
            self._collectors = [OrtCollector(model, tensors, providers)]
        else:
            log.info(
                "one batch of activations exceeds --max-memory: %d tensor groups, one ONNX Runtime call each per batch",
                len(self.groups),
            )
            opt = _optimized(model, tensors, providers)
            inputs = {i.name for i in model.graph.input}
            self._collectors = [
                OrtCollector(model, g, providers, optimized=_pruned(opt, [t for t in g if t not in inputs]))
                for g in self.groups
            ]
        self.providers = self._collectors[0].providers

    def run_groups(self, arrays: dict[str, np.ndarray], valid: Optional[int] = None) -> Any:
        """Each group's activations for each slice of ``rows_per_call`` rows (padding rows past
        ``valid`` are not run), valid until the next one is produced."""
        arrays, valid = without_padding(arrays, valid, self.free)
        rows = next((a.shape[0] for a in arrays.values() if a.ndim), 0)
        if rows <= self.rows_per_call:
            for collector in self._collectors:
                yield collector.run(arrays, valid)
            return
        end = rows if valid is None else min(int(valid), rows)
        for collector in self._collectors:
            for start in range(0, end, self.rows_per_call):
                stop = min(start + self.rows_per_call, end)
                yield collector.run({n: a[start:stop] for n, a in arrays.items()})

    def run(self, arrays: dict[str, np.ndarray], valid: Optional[int] = None) -> dict[str, np.ndarray]:
        """Every tensor for the whole batch: views valid until the next call, or, when the batch
        runs in slices, the slices joined (copies)."""
        sliced = next((a.shape[0] for a in arrays.values() if a.ndim), 0) > self.rows_per_call
        pieces: dict[str, list] = {}
        for part in self.run_groups(arrays, valid):
            for name, value in part.items():
                pieces.setdefault(name, []).append(np.array(value) if sliced else value)
        return {name: np.concatenate(v) if sliced else v[-1] for name, v in pieces.items()}


def without_padding(arrays: dict[str, np.ndarray], valid: Optional[int], free: bool) -> tuple[dict, Optional[int]]:
    """``(arrays, valid)``, a padded last batch cut to its ``valid`` samples (``valid`` then None)
    where the model's batch dim is ``free``. Its padding rows repeat the last sample; the
    statistics leave them out of batch-sized tensors anyway, but a tensor whose batch axis is not
    the first (attention's [3, N, ...]) would count them. Both collectors run batches through it."""
    rows = next((a.shape[0] for a in arrays.values() if a.ndim), 0)
    if free and valid is not None and valid < rows:
        return {n: a[:valid] for n, a in arrays.items()}, None
    return arrays, valid


def batch_dim_free(model: onnx.ModelProto, input_shapes: dict) -> bool:
    """Every fed input's leading dim is the batch's and not fixed by the model (so a slice of rows
    runs)."""
    declared = {vi.name: vi for vi in model.graph.input}
    leading = {int(shape[0]) if len(shape) else None for shape in input_shapes.values()}
    if len(leading) != 1:
        return False
    for name, shape in input_shapes.items():
        vi = declared.get(name)
        if vi is None or not len(shape):
            return False
        dims = vi.type.tensor_type.shape.dim
        if not len(dims) or (dims[0].HasField("dim_value") and dims[0].dim_value > 0):
            return False
    return True
