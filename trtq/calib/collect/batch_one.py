"""Feed a model whose batch dim is fixed at 1 in batches, when that computes the same values.

A fixed batch of 1 means one ONNX Runtime call, and one round of statistics updates, per sample.
When the batch size is not set, the model's inputs are re-declared with a dynamic batch dim and
the first batch is run both ways: batched, and one sample per call on the model as it is. Only if
every collected tensor is bit for bit the same (per sample) is the calibration fed in batches
(so the statistics, and the cache, are those of the one-sample path); otherwise, or when the model
does not take a batch, it keeps one sample per call. The choice is logged and recorded in the
provenance (``collection.fixed_batch_1``).
"""

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from trtq.errors import TrtqError

log = logging.getLogger(__name__)

BATCH = 8  # the batch the widened model is fed (data.batch_size's default for a dynamic batch)
DIM = "trtq_batch"


def fixed_batch_one(specs: Sequence[Any], data: Any) -> bool:
    """Every input has a fixed batch dim of 1 and neither data.batch_size nor data.shapes is set."""
    return (
        data.batch_size is None and not data.shapes and bool(specs) and all(s.shape and s.shape[0] == 1 for s in specs)
    )


def widened(model: Any) -> Any:
    """A copy of ``model`` whose inputs (and outputs) have a dynamic batch dim."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name for i in out.graph.initializer}
    for vi in list(out.graph.input) + list(out.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in inits and len(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = DIM
    del out.graph.value_info[:]  # recorded for batch 1: let inference redo it
    return out


def _digests(collector: Any, arrays: dict, rows: int) -> dict:
    """(tensor, row) -> (shape, digest) of each sample's values; (tensor, "whole") for a tensor
    that is not batched along dim 0."""
    out: dict = {}
    for part in collector.run_groups(arrays, rows):
        for name, value in part.items():
            if not value.ndim or value.shape[0] != rows:
                out[(name, "whole")] = value.shape
                continue
            for r in range(rows):
                row = np.ascontiguousarray(value[r])
                out[(name, r)] = (row.shape, row.dtype.str, hashlib.blake2b(row.tobytes()).digest())
        del part
    return out


def _slice_digest(value: np.ndarray, axis: int, index: int) -> tuple:
    row = np.ascontiguousarray(np.take(value, index, axis=axis))
    return (row.shape, row.dtype.str, hashlib.blake2b(row.tobytes()).digest())


def _digests_any_axis(collector: Any, arrays: dict, rows: int) -> dict:
    """(tensor, axis, row) -> digest of each sample's slice along every axis as long as the batch."""
    out: dict = {}
    for part in collector.run_groups(arrays, rows):
        for name, value in part.items():
            for axis in (a for a in range(value.ndim) if value.shape[a] == rows):
                for r in range(rows):
                    out[(name, axis, r)] = _slice_digest(value, axis, r)
        del part
    return out


def probe(
    model: Any,
    wide: Any,
    tensors: list[str],
    providers: Sequence[str],
    budget: int,
    batch: Any,
    rows: Optional[int] = None,
    any_axis: bool = False,
) -> tuple[bool, str]:
    """(batched is identical, why) on ``batch`` (a trtq.data Batch of the widened batcher), or on
    its first ``rows`` rows: the rows one call of the calibration would run. ``any_axis``: a tensor
    may carry the batch on another axis than 0 (``[T, N, C]`` behind an LSTM); calibration's
    per-sample statistics need it first, quantize's data steps do not."""
    from trtq.calib.collect.budgeted import GroupedCollector

    rows = batch.valid if rows is None else min(int(rows), batch.valid)
    arrays = {n: a[:rows] for n, a in batch.arrays.items()}
    try:
        wide_col = GroupedCollector(
            wide, tensors, providers, budget, {n: a.shape for n, a in arrays.items()}, split_rows=False
        )  # the whole batch at once: that is what is probed
        batched = _digests_any_axis(wide_col, arrays, rows) if any_axis else _digests(wide_col, arrays, rows)
    except TrtqError as e:
        return False, f"it does not run with a batch of {rows}: {str(e).splitlines()[0]}"
    del wide_col
    if not any_axis and any(k[1] == "whole" for k in batched):
        return False, "some activations are not batched along dim 0"
    one_col = GroupedCollector(model, tensors, providers, budget, {n: (1,) + a.shape[1:] for n, a in arrays.items()})
    for r in range(rows):
        if any_axis:
            for part in one_col.run_groups({n: a[r : r + 1] for n, a in arrays.items()}, 1):
                for name, value in part.items():
                    axes = [a for a in range(value.ndim) if value.shape[a] == 1 and (name, a, r) in batched]
                    if not any(batched[(name, a, r)] == _slice_digest(value, a, 0) for a in axes):
                        return False, f"'{name}' of sample {r} differs (ONNX Runtime's kernels depend on the batch)"
            continue
        single = _digests(one_col, {n: a[r : r + 1] for n, a in arrays.items()}, 1)
        for (name, _), value in single.items():
            if batched.get((name, r)) != value:
                return False, f"'{name}' of sample {r} differs (ONNX Runtime's kernels depend on the batch)"
    return True, f"all {len(tensors)} tensors bit-identical on {rows} samples"


def widen_if_identical(
    model: Any,
    specs: list,
    data: Any,
    tensors: list[str],
    providers: Sequence[str],
    budget: int,
    slice_at: Optional[int] = None,
    any_axis: bool = False,
) -> tuple[Any, list, Any, Optional[str]]:
    """(model, specs, data options, mode) to calibrate with: the widened model fed in batches when
    :func:`probe` finds it identical, else the given ones; mode None when the model is not batch-1.

    ``slice_at`` (default ``budget``): the bytes of activations one call may hold. Where a batch's
    would be run in slices of rows anyway, the probe runs one such slice (never a whole batch over
    the memory target); where that slice is one row, batching saves nothing and nothing is probed.
    ``any_axis``: as for :func:`probe`."""
    from trtq.calib.collect.budget import rows_per_call, tensor_bytes
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs

    if not fixed_batch_one(specs, data):
        return model, specs, data, None
    wide = widened(model)
    wide_specs = input_specs(wide)
    wide_data = dataclasses.replace(data, batch_size=BATCH)
    limit = BATCH if data.limit is None else max(1, min(BATCH, int(data.limit)))
    batches = list(Batcher(dataclasses.replace(wide_data, limit=limit), wide_specs))
    if not batches:
        return model, specs, data, "per-sample"
    first = batches[0]
    total = sum(tensor_bytes(wide, tensors, {n: (BATCH,) + a.shape[1:] for n, a in first.arrays.items()}).values())
    rows, target = rows_per_call(total, BATCH, budget, slice_at)  # as the calibration's collector will slice
    if rows == 1:
        del batches, first
        log.info(
            "batch-1 model fed one sample per call: one sample's activations take %d MiB and one call may "
            "hold %d MiB, so a batch would run one row per call anyway",
            -(-total // BATCH) >> 20,
            target >> 20,
        )
        return model, specs, data, "per-sample"
    same, why = probe(model, wide, tensors, providers, budget, first, rows, any_axis=any_axis)
    del batches, first
    if same:
        log.info("batch-1 model fed in batches of %d (%s)", BATCH, why)
        return wide, wide_specs, wide_data, "batched"
    log.info("batch-1 model fed one sample per call: batched, %s", why)
    return model, specs, data, "per-sample"
