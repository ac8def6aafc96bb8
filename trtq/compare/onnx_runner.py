"""Run a model on numpy batches, whatever it is: an ONNX file, an in-memory ONNX model, or a
TensorRT engine.

Every runner has the same small surface (the :class:`Runner` protocol):

* ``.name`` - a label for reports (the file name, or what the caller passed);
* ``.inputs`` / ``.outputs`` - ``List[TensorSpec]`` in the model's order;
* ``.run(feeds) -> Dict[name, np.ndarray]`` - one inference, outputs keyed by name;
* ``.close()`` and use as a context manager.

ONNX Runtime sessions are made with the same options everywhere (:func:`session_options`):
deterministic compute, default intra-op threads, log severity 3 (errors only), and the graph
optimization level that gives the semantics asked for (:data:`SEMANTICS`). A model with Q/DQ
nodes is scored by default as TensorRT computes it ("qdq": Q/DQ pairs as written, float math in
between: ONNX Runtime with basic graph optimizations only). ONNX Runtime's extended optimizations
replace Q/DQ pairs by its own int8 kernels (QDQS8ToU8Transformer and the QLinear fusions), whose
results can differ a lot from TensorRT's (docs/decisions.md D1 has the figures); "onnxruntime" asks for exactly
that, to score a model as ONNX Runtime would deploy it. Models without Q/DQ nodes always get all
optimizations (float results are the same up to rounding, and faster). Since ONNX Runtime 1.21
the basic level also quantizes a Conv's / Gemm's float bias to int32 at the input scale times the
weight scale (WeightBiasQuantization): the rounding flips values at the next quantizers and a
tiny weight scale saturates int32. TensorRT keeps the bias float, so the "qdq" sessions switch it off
(:data:`QDQ_CHANGING_OPTIMIZERS`, docs/decisions.md D40). Providers default to CPU;
CUDA (or another provider) is used when asked for and present in this onnxruntime build,
otherwise it is dropped with a warning.

Opening a file by its kind (``.onnx`` here, a TensorRT ``.plan`` through ``trtq.trt.runtime``) is
``trtq.pipeline.open_runner.open_runner``: compare never imports trt.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from trtq.closing import ClosesOnExit
from trtq.errors import ConfigError, DataError, ModelError
from trtq.model import TensorSpec, has_qdq

log = logging.getLogger(__name__)

# ONNX Runtime type strings -> numpy dtype names (the names trtq.model.TensorSpec uses)
_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(uint16)": "uint16",
    "tensor(int32)": "int32",
    "tensor(uint32)": "uint32",
    "tensor(int64)": "int64",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}
_NUMPY_FLOATS = ("float16", "float32", "float64")

_PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}

_ORT_PREFIX = re.compile(r"^\s*\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*[A-Z_]+\s*:\s*")

# protobuf cannot serialize a message of 2 GiB or more
_PROTOBUF_LIMIT = 2**31 - 1

# how a Q/DQ model is scored: "qdq" (what TensorRT computes) or "onnxruntime" (its int8 kernels)
SEMANTICS = ("qdq", "onnxruntime")
DEFAULT_SEMANTICS = "qdq"
SEMANTICS_LABEL = {
    "qdq": "Q/DQ semantics (what TensorRT computes; ONNX Runtime, basic graph optimizations)",
    "onnxruntime": "as ONNX Runtime deploys it (its fused int8 kernels; all graph optimizations)",
}


class Runner(Protocol):
    """What compare (and anything else that runs models) relies on."""

    name: str

    @property
    def inputs(self) -> list[TensorSpec]: ...

    @property
    def outputs(self) -> list[TensorSpec]: ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Runner: ...

    def __exit__(self, *exc: Any) -> None: ...


# ---------------------------------------------------------------------------------------------
# ONNX Runtime
# ---------------------------------------------------------------------------------------------


def check_semantics(semantics: str) -> str:
    if semantics not in SEMANTICS:
        raise ConfigError(f"unknown semantics '{semantics}'", "use one of: " + ", ".join(SEMANTICS))
    return semantics


# ONNX Runtime graph transformers of the basic level that change what a Q/DQ model computes (not
# only how fast): switched off in the "qdq" sessions. Older ONNX Runtime ignores unknown names.
QDQ_CHANGING_OPTIMIZERS = ("WeightBiasQuantization",)


def session_options(basic: bool = False) -> ort.SessionOptions:
    """The session options every trtq ONNX Runtime session uses; ``basic``: basic graph
    optimizations only (the Q/DQ semantics, see the module doc), else all of them."""
    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if basic else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    so.use_deterministic_compute = True
    so.log_severity_level = 3
    # intra_op_num_threads stays 0: ONNX Runtime picks one thread per physical core
    return so


def resolve_providers(requested: Sequence[str] | None = None) -> list[str]:
    """Provider list for a session: the requested ones this build has, then CPU.

    Accepts full names (``CUDAExecutionProvider``) or the short forms ``cpu``, ``cuda``,
    ``tensorrt``. A name onnxruntime has never heard of is a ConfigError; a known provider
    that this build or machine lacks is dropped with a warning.
    """
    if not requested:
        return ["CPUExecutionProvider"]
    known = set(ort.get_all_providers())
    available = set(ort.get_available_providers())
    chosen: list[str] = []
    for raw in requested:
        name = _PROVIDER_ALIASES.get(str(raw).strip().lower(), str(raw).strip())
        if name not in known:
            raise ConfigError(
                f"unknown ONNX Runtime provider '{raw}'",
                "use cpu, cuda or a full name such as CUDAExecutionProvider",
            )
        if name not in available:
            log.warning("ONNX Runtime provider %s is not available here; not using it", name)
            continue
        if name not in chosen:
            chosen.append(name)
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def _ort_message(err: BaseException) -> str:
    """First line of an ONNX Runtime error, without the '[ONNXRuntimeError] : 2 : X :' prefix."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return _ORT_PREFIX.sub("", first).strip() or type(err).__name__


def _ort_message_flat(err: BaseException) -> str:
    """The whole ONNX Runtime error on one line (run errors put the useful part on line 2)."""
    text = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return _ORT_PREFIX.sub("", text).strip() or type(err).__name__


def _model_has_qdq(model: Any | bytes | str | Path) -> bool:
    """Whether a path, serialized model or ModelProto has Q/DQ nodes (False when it cannot be read:
    the session load then reports the problem)."""
    if not isinstance(model, (str, Path, bytes, bytearray)):
        return has_qdq(model)
    import onnx

    try:
        proto = (
            onnx.load(str(model), load_external_data=False)
            if isinstance(model, (str, Path))
            else onnx.load_from_string(bytes(model))
        )
    except Exception:
        return False
    return has_qdq(proto)


def make_session(
    model: Any | bytes | str | Path,
    providers: Sequence[str] | None = None,
    label: str | None = None,
    semantics: str = DEFAULT_SEMANTICS,
    qdq: bool | None = None,
) -> ort.InferenceSession:
    """An InferenceSession from an ``onnx.ModelProto``, serialized model bytes, or a path.

    ``semantics`` decides how a Q/DQ model is run (see the module doc); ``qdq`` says whether the
    model has Q/DQ nodes when the caller knows. Load failures become a one-line ModelError naming
    ``label`` (default: the path, or "in-memory model").
    """
    check_semantics(semantics)
    basic = semantics == "qdq" and (_model_has_qdq(model) if qdq is None else qdq)
    if isinstance(model, (str, Path)):
        source: str | bytes = str(model)
        label = label or str(model)
    elif isinstance(model, (bytes, bytearray)):
        source = bytes(model)
        label = label or "in-memory model"
    else:  # an onnx.ModelProto (duck-typed so that this module does not need onnx)
        label = label or "in-memory model"
        size = model.ByteSize()
        if size > _PROTOBUF_LIMIT:
            raise ModelError(
                f"{label} is {size / 2**30:.1f} GiB, too large to run from memory",
                "save it with external data (onnx.save(..., save_as_external_data=True)) and pass the file",
            )
        source = model.SerializeToString()
    try:
        return ort.InferenceSession(
            source,
            sess_options=session_options(basic),
            providers=resolve_providers(providers),
            disabled_optimizers=list(QDQ_CHANGING_OPTIMIZERS) if basic else None,
        )
    except ConfigError:
        raise
    except Exception as e:  # InvalidProtobuf, InvalidGraph, NotImplemented, Fail, ...
        raise ModelError(
            f"onnxruntime {ort.__version__} cannot load {label}: {_ort_message(e)}",
            "check the model with python -m onnx.checker, re-export it with a supported opset, or upgrade onnxruntime",
        ) from None


def _spec_from_node_arg(arg) -> TensorSpec:
    dims = []
    for d in arg.shape or ():
        if isinstance(d, int) and d > 0:
            dims.append(int(d))
        elif isinstance(d, str) and d:
            dims.append(d)
        else:
            dims.append(None)
    return TensorSpec(arg.name, tuple(dims), _ORT_DTYPES.get(arg.type, arg.type))


class OnnxRunner(ClosesOnExit):
    """Runs an ONNX model with ONNX Runtime.

    Use :meth:`from_path` (or ``trtq.pipeline.open_runner.open_runner``) for files and :meth:`from_model`
    for an in-memory ``ModelProto``.
    ``run`` casts a float feed to the float type the model declares (a float32 batch can feed a
    float16 model); any other mismatch is reported by ONNX Runtime as a DataError.
    """

    _held = "_session"  # what close() lets go of

    def __init__(self, session: ort.InferenceSession, name: str, semantics: str | None = None, note: str = ""):
        self._session: ort.InferenceSession | None = session
        self.name = name
        self.semantics = semantics  # how its Q/DQ nodes run; None: it has none
        self.note = note  # what was done to the model before it ran (the report's runtime line says it)
        self._inputs = [_spec_from_node_arg(a) for a in session.get_inputs()]
        self._outputs = [_spec_from_node_arg(a) for a in session.get_outputs()]
        self._output_names = [s.name for s in self._outputs]

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        providers: Sequence[str] | None = None,
        name: str | None = None,
        semantics: str = DEFAULT_SEMANTICS,
    ) -> OnnxRunner:
        path = Path(path)
        check_model_file(path)
        qdq = _model_has_qdq(path)
        session = make_session(path, providers, label=str(path), semantics=semantics, qdq=qdq)
        return cls(session, name or path.name, semantics if qdq else None)

    @classmethod
    def from_model(
        cls,
        model: Any,
        providers: Sequence[str] | None = None,
        name: str = "in-memory model",
        semantics: str = DEFAULT_SEMANTICS,
        note: str = "",
    ) -> OnnxRunner:
        qdq = _model_has_qdq(model)
        session = make_session(model, providers, label=name, semantics=semantics, qdq=qdq)
        return cls(session, name, semantics if qdq else None, note)

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)

    @property
    def providers(self) -> list[str]:
        return list(self._live().get_providers())

    def describe_runtime(self) -> str:
        where = self.providers[0].replace("ExecutionProvider", "") if self._session is not None else "?"
        text = f"ONNX Runtime {ort.__version__} ({where})"
        text += f", {SEMANTICS_LABEL[self.semantics]}" if self.semantics else ""
        return text + (f", {self.note}" if self.note else "")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self._live()
        prepared: dict[str, np.ndarray] = {}
        for spec in self._inputs:
            if spec.name not in feeds:
                raise DataError(
                    f"no data for input '{spec.name}' of {self.name}",
                    "data has: " + (", ".join(sorted(feeds)) or "nothing"),
                )
            arr = np.asarray(feeds[spec.name])
            if spec.dtype in _NUMPY_FLOATS and arr.dtype.name in _NUMPY_FLOATS and arr.dtype.name != spec.dtype:
                arr = arr.astype(spec.dtype)
            prepared[spec.name] = np.ascontiguousarray(arr)
        try:
            values = session.run(self._output_names, prepared)
        except Exception as e:
            raise DataError(
                f"{self.name} failed on this batch: {_ort_message_flat(e)}",
                "check that data shapes and dtypes match the model inputs (data.shapes, preprocess)",
            ) from None
        return dict(zip(self._output_names, values))

    def _live(self) -> ort.InferenceSession:
        if self._session is None:
            raise ValueError(f"runner for {self.name} is closed")
        return self._session

    def __repr__(self) -> str:
        return f"OnnxRunner({self.name!r})"


def check_model_file(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"model not found: {path}", "check the path")
    if path.is_dir():
        raise ModelError(f"model path is a folder, not a file: {path}", "pass the .onnx model or .plan engine file")
    if path.stat().st_size == 0:
        raise ModelError(f"model file is empty: {path}", "re-export or rebuild it")
