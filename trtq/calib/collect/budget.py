"""How much memory one batch of collected activations may take (``--max-memory``), and the tensor
groups that keep each ONNX Runtime call under it.

Every collected tensor is a graph output of the collector's session, so ONNX Runtime cannot reuse
its buffer: one call holds one batch of *all* of them. When that exceeds the budget the tensors are
split into contiguous groups (model order) whose batch bytes fit, and each batch is run once per
group (trtq.calib.collect.budgeted.GroupedCollector). Sizes come from ONNX shape inference at the batch's
input shapes, float32 assumed where a type or shape is unknown (the largest known size then).
"""

import math
import re
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from trtq.errors import ConfigError, UsageError
from trtq.memory import available_memory

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# ASCII digits only (re.ASCII: \d would take other scripts' digits, which float() reads), at most 18
_SIZE = re.compile(r"^\s*(\d{1,18}(?:\.\d{0,18})?|\.\d{1,18})\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE | re.ASCII)
MAX_SIZE = 1 << 60  # 1 EiB: more than any machine's memory, far below where float or int64 sizes break


def parse_size(text) -> int:
    """``2G``, ``512M``, ``1.5GiB``, ``1048576`` (bytes) -> bytes; ConfigError on anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _SIZE.match(str(text))
        if not m:
            shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
            raise ConfigError(
                f"--max-memory must be a size such as 2G or 512M, got {shown!r}",
                "use a number (digits 0-9, at most 18) with K, M, G or T (binary units), e.g. --max-memory 2G",
            )
        value, unit = float(m.group(1)), m.group(2).upper()
    if not math.isfinite(value) or value * _UNITS[unit] > MAX_SIZE:
        raise ConfigError(f"--max-memory {value:g}{unit} is more than 1 EiB", "e.g. --max-memory 2G")
    size = int(value * _UNITS[unit])
    if size < 1:
        raise ConfigError(f"--max-memory must be positive, got {text!r}", "e.g. --max-memory 2G")
    return size


SLICE_TARGET = 256 << 20  # without --max-memory: activations one call holds before batches are sliced


def resolve_budget(setting) -> int:
    """The configured budget in bytes, or a quarter of the available memory (4 GiB when unknown)."""
    if setting is not None:
        return parse_size(setting)
    avail = available_memory()
    return max(avail // 4, 64 << 20) if avail else 4 << 30


def slice_target(setting, budget: int) -> int:
    """Bytes of activations above which a batch runs in slices of rows: the budget when
    --max-memory is given; else at most :data:`SLICE_TARGET` (slicing costs no extra pass, and
    halved the peak memory for a little time: docs/decisions.md D22). Tensor groups, which cost
    a pass each, still start at the budget only."""
    return budget if setting is not None else min(budget, SLICE_TARGET)


def tensor_bytes(model, tensors: Sequence[str], input_shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Bytes of each tensor for inputs of ``input_shapes`` (shape inference; unknown -> the largest
    known size, or the largest input's)."""
    from trtq.model import infer_shapes

    try:
        inferred = infer_shapes(model, input_shapes=input_shapes)
    except Exception:
        inferred = model
    typed = {
        vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    }
    sizes: dict[str, Optional[int]] = {}
    for name in tensors:
        sizes[name] = _size(typed.get(name))
    known = [s for s in sizes.values() if s is not None]
    fallback = max(known) if known else max(int(np.prod(s)) * 4 for s in input_shapes.values())
    return {n: (s if s is not None else fallback) for n, s in sizes.items()}


def _size(vi) -> Optional[int]:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = vi.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return None
    import onnx

    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)).itemsize
    except Exception:
        itemsize = 4
    return int(np.prod([d.dim_value for d in dims], dtype=np.int64)) * itemsize


def rows_within(total: int, batch: int, budget: int) -> int:
    """Rows per call for a batch of ``batch`` whose activations take ``total`` bytes: the largest
    divisor of ``batch`` whose rows fit in ``budget``, at least 1 (one row over the budget is then
    grouped by tensor). A divisor, so every slice has one shape: ONNX Runtime's bound output
    buffers are reused, where a shorter last slice made it allocate a second set each batch
    (twice the peak memory: docs/decisions.md D22)."""
    batch = max(int(batch), 1)
    per_row = -(-int(total) // batch)
    fit = max(1, min(batch, int(budget) // max(per_row, 1)))
    return max(d for d in range(1, fit + 1) if batch % d == 0)


def rows_per_call(total: int, batch: int, budget: int, slice_at: Optional[int] = None) -> tuple[int, int]:
    """(rows of a batch of ``batch`` one call runs, the byte target that decided it): the whole batch
    when its activations (``total`` bytes) fit ``slice_at`` (capped at ``budget``; ``budget`` when
    None), else :func:`rows_within` that target."""
    target = budget if slice_at is None else min(budget, slice_at)
    return (batch if total <= target else rows_within(total, batch, target)), target


def plan_groups(sizes: Mapping[str, int], budget: int, batch: int) -> list[list[str]]:
    """Contiguous groups of ``sizes`` (tensor -> bytes of one batch) of at most ``budget`` bytes
    each; one group when everything fits. UsageError (exit 2) naming the fix when one tensor alone
    does not fit."""
    if sum(sizes.values()) <= budget:
        return [list(sizes)]
    biggest = max(sizes, key=lambda n: sizes[n])
    if sizes[biggest] > budget:
        per_sample = -(-sizes[biggest] // max(batch, 1))
        fix = f"raise --max-memory to at least {_human(sizes[biggest])}" + (
            f", or lower --batch-size (one sample needs {_human(per_sample)})" if batch > 1 else ""
        )
        raise UsageError(
            f"--max-memory {_human(budget)} is too small: tensor '{biggest}' alone takes "
            f"{_human(sizes[biggest])} for a batch of {batch}",
            fix,
        )
    groups: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if groups[-1] and used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size
    return groups


def _human(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{math.ceil(n / div * 10) / 10:g}{unit}"
    return f"{n}B"
