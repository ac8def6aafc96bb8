"""Run a TensorRT plan on host numpy arrays: ``TrtRunner(plan).run({"x": array}) -> {name: array}``.

Loading checks ``<plan>.json`` first (built by this TensorRT version, for this GPU?), then what
TensorRT itself says: a foreign or non-plan file is a one-line ModelError, never a crash.
"""

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from trtq.closing import ClosesOnExit
from trtq.errors import DataError, ModelError
from trtq.model import TensorSpec, format_shape
from trtq.trt import compat
from trtq.trt.metadata import check_metadata, read_metadata

log = logging.getLogger(__name__)


class EngineSession:
    """A deserialized engine with an execution context, a stream and device buffers.

    Shared by :class:`TrtRunner` (host arrays in and out) and :mod:`trtq.trt.bench` (timing).
    """

    def __init__(self, plan_path: Path, check: bool = True):
        from trtq.trt import cuda

        self.path = Path(plan_path)
        self.trt = trt = compat.import_tensorrt()
        cuda.require_gpu()
        if not self.path.is_file():
            raise ModelError(f"engine not found: {self.path}", "build one with trtq build")
        data = self.path.read_bytes()
        if not data:
            raise ModelError(f"engine file is empty: {self.path}", "rebuild it with trtq build")
        self.metadata = read_metadata(self.path)
        if self.metadata is not None and check:
            name, cc = cuda.device_info()
            check_metadata(self.metadata, self.path, str(trt.__version__), name, cc)
        self.logger = compat.make_logger(trt)
        self.runtime = trt.Runtime(self.logger)
        try:
            engine = self.runtime.deserialize_cuda_engine(data)
        except Exception as e:  # some versions raise instead of returning None
            log.debug("deserialize_cuda_engine raised %r", e)
            engine = None
        if engine is None:
            errors = self.logger.take_errors()
            detail = f" ({errors[0]})" if errors else ""
            raise ModelError(
                f"{self.path.name} is not a TensorRT {trt.__version__} engine for this GPU{detail}",
                "rebuild it with trtq build (plans only load in the TensorRT version and GPU model that built them)",
            )
        self.engine = engine
        self.context = engine.create_execution_context()
        if self.context is None:
            raise ModelError(
                f"TensorRT cannot create an execution context for {self.path.name}", "check free GPU memory"
            )
        self.io = compat.io_tensors(trt, engine)
        self.stream = cuda.Stream()
        self.buffers: dict[str, Any] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}

    # -- shapes and buffers ------------------------------------------------------------------

    @property
    def input_tensors(self) -> list[compat.IOTensor]:
        return [t for t in self.io if t.is_input]

    @property
    def output_tensors(self) -> list[compat.IOTensor]:
        return [t for t in self.io if not t.is_input]

    def profile(self, name: str) -> tuple[tuple[int, ...], ...]:
        return compat.profile_shapes(self.engine, name, 0)

    def default_shape(self, t: compat.IOTensor) -> tuple[int, ...]:
        """The static shape, or the profile's opt shape for a dynamic input."""
        if all(d >= 0 for d in t.shape):
            return t.shape
        return self.profile(t.name)[1]

    def set_input_shapes(self, shapes: Mapping[str, Sequence[int]]) -> None:
        for t in self.input_tensors:
            shape = tuple(int(d) for d in shapes[t.name])
            if any(d >= 0 and d != g for d, g in zip(t.shape, shape)) or len(shape) != len(t.shape):
                raise DataError(
                    f"input {t.name} has shape {format_shape(shape)} but the engine expects "
                    f"{format_shape(t.shape)} (? = any)",
                    "feed data of the shape the engine was built for",
                )
            if any(d < 0 for d in t.shape) and not self.context.set_input_shape(t.name, shape):
                lo, _, hi = self.profile(t.name)
                raise DataError(
                    f"input {t.name} shape {format_shape(shape)} is outside the engine's profile "
                    f"{format_shape(lo)}..{format_shape(hi)}",
                    "rebuild with build.profiles covering this shape",
                )
            self.shapes[t.name] = shape
        for t in self.output_tensors:
            shape = tuple(int(d) for d in self.context.get_tensor_shape(t.name))
            if any(d < 0 for d in shape):
                raise ModelError(
                    f"output {t.name} has a data-dependent shape {format_shape(shape)}",
                    "trtq runs engines whose output shapes follow from the input shapes only",
                )
            self.shapes[t.name] = shape

    def bind(self) -> None:
        """(Re)allocate device buffers for the current shapes and give TensorRT their addresses."""
        from trtq.trt import cuda

        for t in self.io:
            if t.dtype.startswith("trt:"):
                raise ModelError(f"tensor {t.name} has type {t.dtype[4:]}, which trtq cannot feed or read")
            nbytes = int(np.prod(self.shapes[t.name], dtype=np.int64)) * np.dtype(t.dtype).itemsize
            buf = self.buffers.get(t.name)
            if buf is None or buf.nbytes < nbytes:
                if buf is not None:
                    buf.free()
                buf = self.buffers[t.name] = cuda.DeviceBuffer(nbytes)
            self.context.set_tensor_address(t.name, buf.ptr)

    def enqueue(self) -> None:
        compat.execute(self.context, self.stream.handle)

    def close(self) -> None:
        for buf in self.buffers.values():
            buf.free()
        self.buffers = {}
        stream = getattr(self, "stream", None)
        if stream is not None:
            stream.destroy()
            self.stream = None
        self.context = None
        self.engine = None
        self.runtime = None


def _spec(t: compat.IOTensor) -> TensorSpec:
    return TensorSpec(t.name, tuple(None if d < 0 else d for d in t.shape), t.dtype)


class TrtRunner(ClosesOnExit):
    """Synchronous inference on a plan with host arrays.

    ``check_metadata=False`` skips the ``<plan>.json`` version/GPU checks (TensorRT still checks).
    """

    _held = "_s"  # what close() lets go of

    def __init__(self, plan_path: Path, check_metadata: bool = True):
        self._s: Optional[EngineSession] = EngineSession(Path(plan_path), check=check_metadata)
        self.path = Path(plan_path)
        self.metadata = self._s.metadata
        self.inputs: list[TensorSpec] = [_spec(t) for t in self._s.input_tensors]
        self.outputs: list[TensorSpec] = [_spec(t) for t in self._s.output_tensors]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from trtq.trt import cuda

        s = self._s
        if s is None:
            raise ModelError("this TrtRunner is closed")
        names = {t.name for t in s.input_tensors}
        missing = sorted(names - set(feeds))
        extra = sorted(set(feeds) - names)
        if missing or extra:
            raise DataError(
                f"engine inputs are {sorted(names)}; missing {missing}, unexpected {extra}",
                "feed exactly the engine's inputs",
            )
        arrays: dict[str, np.ndarray] = {}
        for t in s.input_tensors:
            arr = np.asarray(feeds[t.name])
            want = np.dtype(t.dtype)
            if arr.dtype != want:
                if arr.dtype.kind != want.kind and not (arr.dtype.kind in "iu" and want.kind in "iu"):
                    raise DataError(
                        f"input {t.name} is {arr.dtype} but the engine takes {want}", f"convert it to {want}"
                    )
                arr = arr.astype(want)
            arrays[t.name] = np.ascontiguousarray(arr)
        s.set_input_shapes({k: v.shape for k, v in arrays.items()})
        s.bind()
        for name, arr in arrays.items():
            cuda.copy_to_device(s.buffers[name].ptr, arr, s.stream)
        s.enqueue()
        out: dict[str, np.ndarray] = {}
        for t in s.output_tensors:
            host = np.empty(s.shapes[t.name], dtype=np.dtype(t.dtype))
            cuda.copy_to_host(host, s.buffers[t.name].ptr, s.stream)
            out[t.name] = host
        s.stream.synchronize()
        return out

    def __repr__(self) -> str:
        return f"TrtRunner({str(self.path)!r})"
