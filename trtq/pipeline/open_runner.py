"""Choosing a runner by the model file's kind: ``.onnx`` -> compare's ONNX Runtime runner,
``.plan`` / ``.engine`` -> trt's runtime runner (imported only then, so that ONNX models run
without TensorRT). Both have the :class:`trtq.compare.onnx_runner.Runner` surface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtq.closing import ClosesOnExit
from trtq.compare.onnx_runner import DEFAULT_SEMANTICS, OnnxRunner, Runner, check_model_file
from trtq.errors import EnvironmentMissing, ModelError, UsageError
from trtq.model import TensorSpec

ONNX_SUFFIXES = (".onnx",)
ENGINE_SUFFIXES = (".plan", ".engine")
FP16_REST = "float rest cast to FP16 (as an engine built with --fp16 runs it)"


class EngineRunner(ClosesOnExit):
    """Adapter giving a ``trtq.trt.runtime.TrtRunner`` the full Runner surface (name, context
    manager, specs as lists) without depending on its internals."""

    _held = "_inner"  # what close() lets go of

    def __init__(self, inner: Any, name: str):
        self._inner = inner
        self.name = name

    @property
    def inputs(self) -> list[TensorSpec]:
        return [_as_spec(s) for s in self._inner.inputs]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [_as_spec(s) for s in self._inner.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(self._inner.run(dict(feeds)))

    def describe_runtime(self) -> str:
        version = getattr(getattr(self._inner, "trt", None), "__version__", None)
        return f"TensorRT {version} engine" if version else "TensorRT engine"

    def __repr__(self) -> str:
        return f"EngineRunner({self.name!r})"


def _as_spec(s: Any) -> TensorSpec:
    """A TensorSpec with dynamic dims (-1 in TensorRT) as None."""
    dtype = getattr(s, "dtype", "")
    dtype = getattr(dtype, "name", None) or str(dtype)
    dims = tuple(
        (int(d) if int(d) > 0 else None) if isinstance(d, (int, np.integer)) else d for d in getattr(s, "shape", ())
    )
    return TensorSpec(str(s.name), dims, dtype)


def _open_engine(path: Path) -> EngineRunner:
    try:
        from trtq.trt.runtime import TrtRunner
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("tensorrt", "cuda"):
            raise EnvironmentMissing(
                f"running {path.name} needs TensorRT and cuda-python ({e.name} is not installed)",
                "pip install tensorrt cuda-python (or pip install -e '.[gpu]' in the trtq checkout) on a machine "
                "with an NVIDIA GPU",
            ) from None
        raise EnvironmentMissing(
            f"this trtq installation cannot run TensorRT engines ({e.name} is missing)",
            "install a trtq version with TensorRT support",
        ) from None
    return EngineRunner(TrtRunner(path), path.name)


def open_runner(
    path: str | Path,
    providers: Sequence[str] | None = None,
    semantics: str = DEFAULT_SEMANTICS,
    float_rest: str = "fp32",
) -> Runner:
    """A runner for ``path``: ``.onnx`` -> ONNX Runtime, ``.plan`` / ``.engine`` -> TensorRT.

    ``providers``, ``semantics`` and ``float_rest`` apply to ONNX models only (default CPU, Q/DQ
    semantics, the rest as written; ``"fp16"``: the rest cast to float16 first, see
    :func:`trtq.quantize.fp16.cast_float_rest`).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in ONNX_SUFFIXES:
        if float_rest == "fp16":
            return _fp16_rest_runner(path, providers, semantics)
        return OnnxRunner.from_path(path, providers, semantics=semantics)
    if suffix in ENGINE_SUFFIXES:
        if float_rest == "fp16":
            raise UsageError(
                f"--float-rest fp16 applies to .onnx candidates; {path.name} is an engine and runs as it was built",
                "drop --float-rest for an engine",
            )
        check_model_file(path)
        return _open_engine(path)
    raise ModelError(
        f"cannot tell what kind of model {path.name} is",
        "pass an .onnx model or a TensorRT engine (.plan / .engine)",
    )


def _fp16_rest_runner(path: Path, providers: Sequence[str] | None, semantics: str) -> OnnxRunner:
    """``path`` with everything outside its Q/DQ pairs in float16 (in memory; the file stays)."""
    from trtq.model import load_model
    from trtq.quantize.fp16 import cast_float_rest

    check_model_file(path)
    model = load_model(path)
    try:
        model = cast_float_rest(model)
    except Exception as e:  # an op or type the cast does not know
        raise ModelError(
            f"cannot cast the float rest of {path.name} to float16 ({str(e).strip().splitlines()[0][:200]})",
            "drop --float-rest fp16 for this model",
        ) from None
    return OnnxRunner.from_model(model, providers, name=path.name, semantics=semantics, note=FP16_REST)
