"""``--override-input-shape`` / ``model_input_shapes``: run a model at another declared input shape.

Some exports fix an input shape the model does not need (a detector declared ``[10, 3, 32, 32]``
that is run on whole frames). The override rewrites the declared dims of the named inputs, drops
the shapes the exporter recorded for everything downstream, and checks that the model takes the
new shape: ONNX shape inference in strict mode (with data propagation, so a Reshape to a constant
size that no longer fits is caught), then one ONNX Runtime run on zeros of that shape. The
rewritten model is written to a private temporary folder for the command's duration and used in
place of the original (removed when the command ends).
"""

import math
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from trtq.errors import ModelError, UsageError
from trtq.formatting import ascii_int
from trtq.model import forget_copies, format_shape, record_copy

_temp_dirs: list[str] = []


MAX_DIM = 2**31 - 1  # no real tensor has a longer axis (TensorRT's dims were int32 until 10)


def parse_dims(text: str) -> Optional[tuple[int, ...]]:
    """``1x3x240x320`` or ``1,3,240,320`` -> the dims, each a positive integer written with the digits
    0-9 and at most MAX_DIM; None otherwise (``²``, ``1_0``, a 400-digit dim). --shape uses it too."""
    dims = []
    for part in str(text).replace(",", "x").split("x"):
        d = ascii_int(part)
        if d is None or part.strip()[:1] in "+-" or not 0 < d <= MAX_DIM:
            return None
        dims.append(d)
    return tuple(dims)


# how NAME=DIMS / NAME:DIMS flags are read, said once for their --help
SHAPE_SPELLING = (
    "NAME=DIMS or NAME:DIMS (Polygraphy's form); the name is what comes before the last '=' (or, "
    "with no '=' there, the last ':') whose right side is dims, so 'input:0:1x3x224x224' names input:0"
)


def split_shape_flag(item: str) -> Optional[tuple[str, tuple[int, ...]]]:
    """(name, dims) of ``NAME=DIMS`` or Polygraphy's ``NAME:DIMS``, else None. DIMS never holds '='
    or ':', so the name is everything before the last '=' when its right side parses as dims, else
    before the last ':' when its right side does: ``input:0:1x3x224x224`` is input ``input:0`` (the
    names of TF-converted models). At most one of the two readings can parse (the right side of the
    earlier separator holds the later one), so no item has two meanings."""
    for sep in ("=", ":"):
        name, found, dims = item.rpartition(sep)
        parsed = parse_dims(dims) if found and name else None
        if parsed is not None:
            return name, parsed
    return None


def parse_override(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``NAME=DIMS`` / ``NAME:DIMS`` flags (DIMS like 1x3x240x320 or 1,3,240,320) -> {name: dims}
    (:func:`split_shape_flag`; the names are checked against the model where it is rewritten)."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        reading = split_shape_flag(item)
        if reading is None:
            raise UsageError(
                f"--override-input-shape {item}: expected INPUT=DIMS or INPUT:DIMS with positive integer "
                "dims (digits 0-9, each below 2**31)",
                "e.g. --override-input-shape input=1x3x240x320",
            )
        name, parsed = reading
        if name in out:
            raise UsageError(f"--override-input-shape gives input '{name}' twice", "pass one per input")
        out[name] = parsed
    return out


def override_input_shapes(model, shapes: Mapping[str, Sequence[int]], label: str):
    """A copy of ``model`` whose named inputs are declared with ``shapes``; ModelError when the
    model cannot take them (named input missing, other rank, shape inference or a run fails)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name for i in out.graph.initializer}
    inputs = {i.name: i for i in out.graph.input if i.name not in inits}
    for name, dims in shapes.items():
        if name not in inputs:
            raise UsageError(
                f"--override-input-shape names '{name}', which is not an input of {label}",
                "inputs: " + ", ".join(inputs),
            )
        tt = inputs[name].type.tensor_type
        old = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(old) != len(dims):
            raise ModelError(
                f"--override-input-shape {name}={'x'.join(map(str, dims))} has rank {len(dims)} but "
                f"{label} declares {name} as {format_shape(old)} (rank {len(old)})",
                "give one size per dimension",
            )
        tt.shape.ClearField("dim")
        for d in dims:
            tt.shape.dim.add().dim_value = int(d)
    # what the exporter recorded downstream was for the old shape: let inference redo it
    del out.graph.value_info[:]
    for o in out.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    what = ", ".join(f"{n}={format_shape(d)}" for n, d in shapes.items())
    try:
        out = onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        raise ModelError(
            f"{label} cannot take {what}: {_first_line(e)}",
            "the graph fixes that shape somewhere (a Reshape or Expand to constant sizes); "
            "re-export the model with dynamic axes",
        ) from None
    check_run_memory(out, shapes, what)
    _run_once(out, shapes, label, what)
    return out


def _bytes_of(value_info) -> int:
    """Bytes of a tensor whose type and every dim shape inference knows, else 0."""
    import numpy as np
    import onnx

    tt = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type") or not tt.HasField("shape"):
        return 0
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if any(d is None or d < 0 for d in dims):
        return 0
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 4
    return math.prod(dims) * itemsize


def check_run_memory(model, shapes: Mapping[str, Sequence[int]], what: str) -> None:
    """UsageError (exit 2) before the check run when its inputs and largest tensor (from shape
    inference) need more than the available memory: an absurd override is a one-line refusal, not
    an out-of-memory failure halfway through ONNX Runtime."""
    from trtq.memory import available_memory

    inputs = {i.name: _bytes_of(i) for i in model.graph.input if i.name in shapes}
    others = [(v.name, _bytes_of(v)) for v in list(model.graph.value_info) + list(model.graph.output)]
    largest = max(others, key=lambda nv: nv[1], default=("", 0))
    need = sum(inputs.values()) + largest[1]
    avail = available_memory()
    if avail is not None and need > avail:
        biggest = f"; its largest tensor '{largest[0]}' alone {_gib(largest[1])}" if largest[1] else ""
        raise UsageError(
            f"--override-input-shape {what}: one run at that shape needs at least {_gib(need)} "
            f"(inputs {_gib(sum(inputs.values()))}{biggest}), more than the {_gib(avail)} available",
            "give a smaller shape",
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n < 2**50 else f"{n / 2**50:.3g} PiB"


def _run_once(model, shapes: Mapping[str, Sequence[int]], label: str, what: str) -> None:
    import numpy as np
    import onnxruntime as ort

    from trtq.model import input_specs

    feeds = {}
    for s in input_specs(model):
        dims = shapes.get(s.name) or [d if isinstance(d, int) else 1 for d in s.shape]
        feeds[s.name] = np.zeros(tuple(int(d) for d in dims), dtype=s.dtype)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:  # a plain CPU session: this core check needs none of compare's runner choices
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:
        raise ModelError(
            f"{label} does not run at {what}: {_first_line(e)}",
            "the graph fixes that shape somewhere; re-export the model with dynamic axes",
        ) from None


def write_overridden(model_path: str, shapes: Mapping[str, Sequence[int]]) -> str:
    """Write the rewritten model to a private temporary folder; return its path."""
    import onnx

    from trtq.model import load_model

    label = Path(model_path).name
    model = override_input_shapes(load_model(model_path), shapes, label)
    folder = tempfile.mkdtemp(prefix="trtq-shape-")
    _temp_dirs.append(folder)
    path = Path(folder) / f"{Path(model_path).stem}.shape-override.onnx"
    onnx.save(model, str(path))
    record_copy(path, model_path)  # hashed as the user's model (trtq.model.model_sha256)
    return str(path)


def remove_temp_models() -> None:
    forget_copies()
    while _temp_dirs:
        shutil.rmtree(_temp_dirs.pop(), ignore_errors=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
