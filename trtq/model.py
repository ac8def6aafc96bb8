"""Loading ONNX models and describing their inputs and outputs.

Everything that reads an ``.onnx`` file goes through :func:`load_model`, which turns every way a
file can be wrong into a one-line :class:`~trtq.errors.ModelError`.
"""

import operator
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

from trtq.errors import DataError, ModelError
from trtq.fileio import require_input_file

Dim = Union[int, str, None]  # static size, named dynamic dim, or unknown

# ONNX TensorProto element type -> numpy dtype name
_ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}
FLOAT_DTYPES = ("float32", "float16", "float64", "bfloat16")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[Dim, ...]
    dtype: str  # numpy dtype name, e.g. "float32"

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def describe(self) -> str:
        return f"{self.name} {format_shape(self.shape)} {self.dtype}"


def format_shape(shape: Sequence[Any]) -> str:
    """The one way trtq prints a shape: ``[?, 3, 224, 224]`` (named or unknown dims are ``?``)."""
    return "[" + ", ".join(_dim_text(d) for d in shape) + "]"


def _dim_text(d: Any) -> str:
    try:
        value = operator.index(d)  # int and numpy integers; not strings, None or floats
    except TypeError:
        return "?"
    return str(value) if value >= 0 else "?"


def load_model(path: Union[str, Path], load_external_data: bool = True):
    """Read and sanity-check an ONNX model; raise ModelError with a fix on any problem."""
    import onnx

    path = Path(path)
    require_input_file(path, ModelError, "model", "check the --model path", "pass the .onnx file")
    if path.stat().st_size == 0:
        raise ModelError(f"model file is empty: {path}", "re-export the model")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ModelError(f"cannot read model {path}: {e.strerror}", "check its permissions") from None
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except Exception as e:  # protobuf DecodeError, external data errors, ...
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(
            f"not a readable ONNX model: {path} ({reason})",
            "pass an .onnx file exported by torch.onnx / tf2onnx / paddle2onnx",
        ) from None
    if not model.graph.node and not model.graph.input:
        raise ModelError(f"not an ONNX model (empty graph): {path}", "pass an .onnx model file")
    return model


_external_cache: dict[tuple, list[Path]] = {}


def external_data_files(path: Union[str, Path]) -> list[Path]:
    """The files an ONNX model keeps tensor data in (ONNX external data: ``location`` of each
    external tensor, relative to the model's folder), sorted, without duplicates; [] when it has
    none or cannot be read (load_model reports that). What the model's identity is made of besides
    the .onnx itself: the output checks read them as inputs, the provenance hashes them."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return []
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read: load_model refuses it
        return []
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _external_cache:
        _external_cache.clear()  # one model at a time is all a command asks about
        _external_cache[key] = _read_locations(path)
    return list(_external_cache[key])


_copies: dict[str, str] = {}  # a rewritten copy (--override-input-shape) -> the user's model


def record_copy(copy: Union[str, Path], original: Union[str, Path]) -> None:
    """``copy`` is ``original`` rewritten (trtq.input_override): it has the original's identity."""
    _copies[str(copy)] = str(user_model(original))


def forget_copies() -> None:
    _copies.clear()


def user_model(path: Union[str, Path]) -> Path:
    """The user's model a rewritten copy was made from (a cache calibrated at one input shape is the
    same model's cache at another); any other path as it is."""
    return Path(_copies.get(str(path), path))


def model_sha256(path: Union[str, Path]) -> str:
    """The model's identity: the sha256 of the .onnx file and, when its tensors keep their data in
    external files, of those files too (each one's location and content, in order). For a model
    without external data it is the file's sha256, as before. Provenance, shards, --ranges and the
    freshness check all compare this, so a cache is stale once the weights file changes. A copy
    --override-input-shape wrote is the user's model (:func:`user_model`)."""
    import hashlib

    from trtq.fileio import sha256_file

    path = user_model(path)
    own = sha256_file(path)
    files = external_data_files(path)
    if not files:
        return own
    h = hashlib.sha256(own.encode("ascii"))
    for f in files:
        h.update(os.path.relpath(f, path.parent).encode("utf-8") + b"\0")
        h.update((sha256_file(f) if f.is_file() else "missing").encode("ascii"))
    return h.hexdigest()


def _read_locations(path: Path) -> list[Path]:
    import onnx

    try:
        if not _mentions(path, b"location"):  # no external data entry can be in the file: no parse
            return []
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return []
    found = set()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value:
                    found.add(path.parent / entry.value)
    return sorted(found)


def _mentions(path: Path, word: bytes, chunk: int = 1 << 20) -> bool:
    """``word`` occurs in the file (read in chunks: a model of gigabytes is not held twice)."""
    tail = b""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            window = tail + block
            if word in window:
                return True
            tail = window[-(len(word) - 1) :]
    return False


def _all_tensors(graph) -> Iterator[Any]:
    """Initializers and tensor attributes of ``graph`` and of every subgraph in it."""
    import onnx

    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_tensors(g)


def _dims(type_proto) -> tuple[Dim, ...]:
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return ()
    out: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)
    return tuple(out)


def _spec(value_info) -> TensorSpec:
    elem = value_info.type.tensor_type.elem_type
    return TensorSpec(value_info.name, _dims(value_info.type), _ONNX_DTYPES.get(elem, f"onnx:{elem}"))


def set_nodes(graph, nodes) -> None:
    """Replace the nodes of an ONNX graph by ``nodes`` (in that order)."""
    del graph.node[:]
    graph.node.extend(nodes)


def input_specs(model) -> list[TensorSpec]:
    """Real graph inputs (initializers that some exporters also list as inputs are skipped)."""
    inits = {i.name for i in model.graph.initializer}
    return [_spec(v) for v in model.graph.input if v.name not in inits]


def check_shape(spec: TensorSpec, shape: Sequence[int], what: str, error: type = DataError) -> tuple[int, ...]:
    """``shape`` as ints when it fits ``spec`` (same rank, positive, the model's fixed dims), else
    ``error`` naming ``what`` (the config key or flag the shape came from)."""
    given = tuple(int(d) for d in shape)
    if len(given) != len(spec.shape):
        raise error(
            f"{what} has rank {len(given)} but the model input {spec.describe()} has rank {len(spec.shape)}",
            "give one size per dimension",
        )
    for i, (g, d) in enumerate(zip(given, spec.shape)):
        if isinstance(d, int) and g != d:
            raise error(f"{what} dim {i} is {g} but the model fixes it to {d}", f"use {d} there")
        if g <= 0:
            raise error(f"{what} dim {i} must be positive, got {g}")
    return given


def _shape_hint(s: TensorSpec) -> str:
    dims = "x".join([""] + [str(d) if isinstance(d, int) else "?" for d in s.shape[1:]])
    return (
        f"give its full shape: --shape {s.name}=N{dims} with numbers for the ?, "
        f"or data.shapes.{s.name}: [...] in the config"
    )


def resolve_shapes(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Sequence[int]],
    batch_size: Optional[int],
    *,
    fallback: Optional[Mapping[str, Sequence[int]]] = None,
    default_batch: Optional[int] = None,
    error: type = DataError,
    hint: Callable[[TensorSpec], str] = _shape_hint,
) -> dict[str, tuple[int, ...]]:
    """Concrete shape for every input: the one resolver the Batcher and TensorRT's profiles use.

    ``shapes`` (from ``data.shapes``) wins; otherwise a dynamic leading dim takes ``batch_size``,
    a dynamic dim takes the ``fallback`` shape's (e.g. the shapes a cache was calibrated with), a
    leading one ``default_batch``; any other dynamic dim is ``error`` with ``hint(spec)`` saying
    which setting to give.
    """
    known = {s.name for s in specs}
    for name in shapes:
        if name not in known:
            raise error(
                f"data.shapes names '{name}', which is not a model input", "model inputs: " + ", ".join(sorted(known))
            )
    fallback = fallback or {}
    out: dict[str, tuple[int, ...]] = {}
    for s in specs:
        if s.name in shapes:
            out[s.name] = check_shape(s, shapes[s.name], f"data.shapes.{s.name}", error)
            continue
        dims: list[int] = []
        for i, d in enumerate(s.shape):
            if isinstance(d, int):
                dims.append(d)
            elif i == 0 and batch_size:
                dims.append(int(batch_size))
            elif s.name in fallback and len(fallback[s.name]) == len(s.shape):
                dims.append(int(fallback[s.name][i]))
            elif i == 0 and default_batch:
                dims.append(default_batch)
            else:
                raise error(f"model input {s.describe()} has a dynamic dim {i}", hint(s))
        out[s.name] = check_shape(s, dims, f"shape of {s.name}", error)
    return out


# ops that draw random values (quantize keeps them float and never evaluates them ahead of time)
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"})
# Ops whose outputs are never activations a TensorRT calibration cache would hold.
_NON_ACTIVATION_OPS = {
    "Shape",
    "Size",
    "NonZero",
    "ArgMax",
    "ArgMin",
    "Constant",
    "ConstantOfShape",
    "Range",
    "TopK",
    "NonMaxSuppression",
    "Unique",
    "EyeLike",
    *RANDOM_OPS,
    "QuantizeLinear",
    "DynamicQuantizeLinear",
}


LIGHT_INITIALIZER = 1024  # elements: float initializers this large are weights, whose values no shape reads
_FLOAT_TENSOR_TYPES = (1, 10, 11, 16)  # float32, float16, float64, bfloat16


def infer_shapes(model, strict_mode: bool = False, input_shapes: Optional[Mapping[str, Sequence[int]]] = None):
    """ONNX shape inference, for reading types and shapes: float initializers of at least
    :data:`LIGHT_INITIALIZER` elements take part as graph inputs of their type and shape instead
    of with their values (onnx serialises the whole model for every inference, several times a
    calibration: docs/decisions.md D22). ``input_shapes`` replaces the dims of those
    inputs. The returned model lacks those initializers: read it, do not run it. Raises what
    onnx.shape_inference.infer_shapes raises."""
    import numpy as np
    import onnx

    def weight(t) -> bool:
        return t.data_type in _FLOAT_TENSOR_TYPES and int(np.prod(t.dims, dtype=np.int64)) >= LIGHT_INITIALIZER

    g = model.graph
    big = {i.name for i in g.initializer if weight(i)}
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    lg = light.graph
    lg.name = g.name
    lg.node.extend(g.node)
    lg.initializer.extend(i for i in g.initializer if i.name not in big)
    lg.sparse_initializer.extend(g.sparse_initializer)
    lg.input.extend(g.input)
    declared = {vi.name for vi in g.input}
    lg.input.extend(
        onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
        for i in g.initializer
        if i.name in big and i.name not in declared
    )
    lg.output.extend(g.output)
    lg.value_info.extend(g.value_info)
    for vi in lg.input:
        if input_shapes and vi.name in input_shapes:
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in input_shapes[vi.name]:
                shape.dim.add().dim_value = int(d)
    return onnx.shape_inference.infer_shapes(light, strict_mode=strict_mode)


def calibratable_tensors(model) -> list[str]:
    """Float activations a TensorRT calibration cache can name, in topological order.

    These are the float graph inputs plus every float output of a compute node, excluding
    weights: initializers, ``Constant`` outputs, and anything computed only from those (e.g.
    Paddle exports that route weights through ``Constant -> Identity``).
    """
    try:
        inferred = infer_shapes(model)
    except Exception:  # shape inference is a help, not a requirement
        inferred = model
    ig = inferred.graph
    elem_type: dict[str, int] = {}
    for vi in list(ig.value_info) + list(ig.input) + list(ig.output):
        elem_type[vi.name] = vi.type.tensor_type.elem_type
    float_types = set(_FLOAT_TENSOR_TYPES)

    g = model.graph  # inferred's lacks the large initializers (infer_shapes)
    constant = {i.name for i in g.initializer}
    names: list[str] = []
    seen = set()
    for spec in input_specs(model):
        if spec.is_float:
            names.append(spec.name)
            seen.add(spec.name)
    for node in g.node:
        inputs = [i for i in node.input if i]
        if node.op_type == "Constant" or (inputs and all(i in constant for i in inputs)):
            constant.update(o for o in node.output if o)
            continue
        if node.op_type in _NON_ACTIVATION_OPS:
            continue
        for out in node.output:
            if not out or out in seen:
                continue
            t = elem_type.get(out)
            if t is not None and t != 0 and t not in float_types:
                continue
            names.append(out)
            seen.add(out)
    return names


# ops that mean a model is already quantized (Q/DQ format, or ONNX Runtime's QOperator format)
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
    }
)
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def all_nodes(graph):
    """Every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            for sub in list(a.graphs) + ([a.g] if a.HasField("g") else []):
                yield from all_nodes(sub)


def is_quantized(model) -> bool:
    """True when the model (subgraphs included) already holds Q/DQ or other quantized ops."""
    return any(n.op_type in QUANTIZED_OPS for n in all_nodes(model.graph))


def has_qdq(model) -> bool:
    """True when the model (subgraphs included) has QuantizeLinear/DequantizeLinear nodes."""
    return any(n.op_type in QDQ_OPS for n in all_nodes(model.graph))
