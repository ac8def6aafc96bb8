"""A small cuda-python wrapper: device and pinned buffers, streams, events, device info.

cuda-python's runtime functions return ``(error, results...)`` tuples; :func:`check` turns a
non-success code into a TrtqError naming the call. The module is imported lazily through
:func:`trtq.trt.compat.import_cudart`.
"""

import contextlib
import ctypes
from typing import Any, Optional

import numpy as np

from trtq.errors import EnvironmentMissing, TrtqError
from trtq.trt import compat

_RT: Any = None


def rt() -> Any:
    global _RT
    if _RT is None:
        _RT = compat.import_cudart()
    return _RT


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-python result tuple; raise on an error code."""
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    r = rt()
    if err != r.cudaError_t.cudaSuccess:
        try:
            name = r.cudaGetErrorName(err)[1]
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # pragma: no cover - best effort
            name = str(err)
        raise TrtqError(f"CUDA call {what} failed: {name}", "check the GPU with nvidia-smi")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def device_count() -> int:
    """Visible CUDA devices; 0 when there is no driver or no GPU."""
    r = rt()
    try:
        err, n = r.cudaGetDeviceCount()
    except RuntimeError:  # cuda-python raises when libcuda.so cannot be loaded
        return 0
    if err != r.cudaError_t.cudaSuccess:
        return 0
    return int(n)


def require_gpu() -> None:
    if device_count() == 0:
        raise EnvironmentMissing("no CUDA GPU visible", compat.NO_GPU_HINT)


def device_info() -> tuple[str, str]:
    """(name, "major.minor" compute capability) of the current device."""
    require_gpu()
    r = rt()
    dev = check(r.cudaGetDevice(), "cudaGetDevice")
    props = check(r.cudaGetDeviceProperties(dev), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(name).strip(), f"{props.major}.{props.minor}"


class DeviceBuffer:
    """``cudaMalloc`` memory; ``ptr`` is the integer address TensorRT takes."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(rt().cudaMalloc(self.nbytes), "cudaMalloc"))

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            check(rt().cudaFree(ptr), "cudaFree")

    def __del__(self) -> None:  # pragma: no cover - safety net only
        with contextlib.suppress(Exception):
            self.free()


class PinnedArray:
    """Page-locked host memory viewed as a numpy array (for asynchronous copies)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any):
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        self.ptr = int(check(rt().cudaMallocHost(nbytes), "cudaMallocHost"))
        raw = (ctypes.c_byte * nbytes).from_address(self.ptr)
        self.array = np.frombuffer(raw, dtype=np.uint8, count=nbytes)[: int(np.prod(shape)) * dtype.itemsize]
        self.array = self.array.view(dtype).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self.array = None
            check(rt().cudaFreeHost(ptr), "cudaFreeHost")


class Stream:
    def __init__(self) -> None:
        self.stream = check(rt().cudaStreamCreate(), "cudaStreamCreate")

    @property
    def handle(self) -> int:
        return int(self.stream)

    def synchronize(self) -> None:
        check(rt().cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def destroy(self) -> None:
        if self.stream is not None:
            s, self.stream = self.stream, None
            check(rt().cudaStreamDestroy(s), "cudaStreamDestroy")


class Event:
    def __init__(self) -> None:
        self.event = check(rt().cudaEventCreate(), "cudaEventCreate")

    def record(self, stream: Stream) -> None:
        check(rt().cudaEventRecord(self.event, stream.stream), "cudaEventRecord")

    def synchronize(self) -> None:
        check(rt().cudaEventSynchronize(self.event), "cudaEventSynchronize")

    def elapsed_ms(self, start: "Event") -> float:
        return float(check(rt().cudaEventElapsedTime(start.event, self.event), "cudaEventElapsedTime"))

    def destroy(self) -> None:
        if self.event is not None:
            e, self.event = self.event, None
            check(rt().cudaEventDestroy(e), "cudaEventDestroy")


def _kind(name: str) -> Any:
    return getattr(rt().cudaMemcpyKind, name)


def copy_to_device(dst: int, src: np.ndarray, stream: Optional[Stream] = None) -> None:
    src = np.ascontiguousarray(src)
    if stream is None:
        check(rt().cudaMemcpy(dst, src.ctypes.data, src.nbytes, _kind("cudaMemcpyHostToDevice")), "cudaMemcpy H2D")
    else:
        check(
            rt().cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes, _kind("cudaMemcpyHostToDevice"), stream.stream),
            "cudaMemcpyAsync H2D",
        )


def copy_to_host(dst: np.ndarray, src: int, stream: Optional[Stream] = None) -> None:
    if not dst.flags["C_CONTIGUOUS"]:
        raise ValueError("destination array must be C-contiguous")
    if stream is None:
        check(rt().cudaMemcpy(dst.ctypes.data, src, dst.nbytes, _kind("cudaMemcpyDeviceToHost")), "cudaMemcpy D2H")
    else:
        check(
            rt().cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes, _kind("cudaMemcpyDeviceToHost"), stream.stream),
            "cudaMemcpyAsync D2H",
        )


class Graph:
    """A CUDA graph captured from the work enqueued on a stream by ``enqueue()``."""

    def __init__(self, stream: Stream, enqueue: Any):
        r = rt()
        self.graph = None
        self.exec = None
        mode = r.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(r.cudaStreamBeginCapture(stream.stream, mode), "cudaStreamBeginCapture")
        try:
            enqueue()
        finally:
            # always end the capture, or the stream stays unusable
            result = r.cudaStreamEndCapture(stream.stream)
        self.graph = check(result, "cudaStreamEndCapture")
        self.exec = check(r.cudaGraphInstantiate(self.graph, 0), "cudaGraphInstantiate")

    def launch(self, stream: Stream) -> None:
        check(rt().cudaGraphLaunch(self.exec, stream.stream), "cudaGraphLaunch")

    def destroy(self) -> None:
        r = rt()
        if self.exec is not None:
            e, self.exec = self.exec, None
            check(r.cudaGraphExecDestroy(e), "cudaGraphExecDestroy")
        if self.graph is not None:
            g, self.graph = self.graph, None
            check(r.cudaGraphDestroy(g), "cudaGraphDestroy")
