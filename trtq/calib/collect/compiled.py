"""The compiled kernels (trtq/calib/collect/_kernels.c), loaded with ctypes: the one-pass and the
two-pass histograms and the mse search's level sums.

``pip install`` builds them where a C compiler is found (setup.py marks the extension optional);
otherwise, or with ``TRTQ_NO_NATIVE=1``, :func:`library` is None and trtq.calib.collect.kernels
runs numpy, which gives the same integers (the reference these kernels are tested against). ctypes
releases the GIL for the call, so the thread pool runs them side by side. The wrappers check
dtypes and layout: the C code trusts them.
"""

import ctypes
import importlib.util
import logging
import os
import threading
from typing import Optional

import numpy as np

log = logging.getLogger(__name__)
VERSION = 5  # _kernels.c's trtq_native_version(): the interface these wrappers call
_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_state = "untried"  # "untried" | "ok" | "missing"
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int32


def _load() -> Optional[ctypes.CDLL]:
    spec = importlib.util.find_spec("trtq.calib.collect._compiled")
    if spec is None or not spec.origin:
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
        built = lib.trtq_native_version()
        if built != VERSION:
            log.warning(
                "the compiled kernels were built from another trtq (interface %s, this one %s); "
                "using numpy. Rebuild them: pip install -e . (in the checkout)",
                built,
                VERSION,
            )
            return None
        lib.trtq_pow2_count.restype = ctypes.c_int
        lib.trtq_pow2_count.argtypes = [_P, _I64, _I64, _I64, _I32, _P, _I64, _I32, _P, _P, _P]
        lib.trtq_histogram_f32.restype = ctypes.c_int
        lib.trtq_histogram_f32.argtypes = [_P, _I64, _I64, ctypes.c_float, _P, _I64, ctypes.c_float, _I64, _P, _P]
        lib.trtq_native_simd.restype = ctypes.c_int
        lib.trtq_native_simd.argtypes = [ctypes.c_int]
        lib.trtq_level_sums.restype = None
        lib.trtq_level_sums.argtypes = [_P, _I64, _I64, _P, _P, _P, _I64, _P, _P]
        # the ONNX Runtime operator's collections (trtq.calib.collect.ingraph)
        lib.trtq_ingraph_create.restype = _I32
        lib.trtq_ingraph_create.argtypes = [_I64, _I64, _I64, _I32, _P]
        lib.trtq_ingraph_free.restype = None
        lib.trtq_ingraph_free.argtypes = [_I32]
        lib.trtq_ingraph_set_run.restype = _I32
        lib.trtq_ingraph_set_run.argtypes = [_I32, _I64, _I64]
        lib.trtq_ingraph_read.restype = _I32
        lib.trtq_ingraph_read.argtypes = [_I32, _I64, _P, _P]
        lib.trtq_ingraph_parallel.restype = _I32
        lib.trtq_ingraph_first_error.restype = _I64
        lib.trtq_ingraph_first_error.argtypes = [_I32]
        lib.trtq_ingraph_set_mode.restype = _I32
        lib.trtq_ingraph_set_mode.argtypes = [_I32, _I32]
        lib.trtq_ingraph_set_range.restype = _I32
        lib.trtq_ingraph_set_range.argtypes = [_I32, _I64, ctypes.c_double]
    except (OSError, AttributeError):  # not loadable here, or built from another version of the file
        return None
    return lib


def library() -> Optional[ctypes.CDLL]:
    """The loaded kernels, or None (not built, or TRTQ_NO_NATIVE set)."""
    global _lib, _state
    if os.environ.get("TRTQ_NO_NATIVE", "").strip() not in ("", "0"):
        return None
    if _state == "untried":
        with _lock:
            if _state == "untried":
                _lib = _load()
                _state = "ok" if _lib is not None else "missing"
    return _lib


def use_simd(on: bool) -> bool:
    """Tests only: the scalar loops (False) or the AVX2 ones where the CPU has them (True, the
    default); returns whether the AVX2 loops are now in use."""
    return bool(library().trtq_native_simd(int(on)))


def _checked(a: np.ndarray, dtype) -> int:
    if a.dtype != dtype or not a.flags.c_contiguous or a.ndim != 2:
        raise ValueError(
            f"compiled kernel: expected a C-contiguous 2-D {np.dtype(dtype).name} array, got {a.dtype} {a.shape}"
        )
    return a.ctypes.data


def pow2_count(rows: np.ndarray, stride: int, e0: int, lanes: np.ndarray, min_exp: int) -> tuple[int, int, int, int]:
    """The one-pass kernel (kernels.pow2_histogram): ``rows`` float32 [R, n] C-contiguous, ``lanes`` int32
    [4, num_bins] C-contiguous (updated); returns (e, max bits, zeros, status)."""
    lib = library()
    e, top, zeros = _I32(), _I32(), _I64()
    status = lib.trtq_pow2_count(
        _checked(rows, np.float32),
        rows.shape[0],
        rows.shape[1],
        int(stride),
        int(e0),
        _checked(lanes, np.int32),
        lanes.shape[1],
        int(min_exp),
        ctypes.byref(e),
        ctypes.byref(top),
        ctypes.byref(zeros),
    )
    return e.value, top.value, zeros.value, status


def histogram_f32(
    rows: np.ndarray, scale: np.float32, lanes: np.ndarray, exceed_at: np.float32, stride: int
) -> tuple[int, bool, bool]:
    """The two-pass kernel (kernels.histogram_into): ``rows`` float32 [R, n] and ``lanes`` int64
    [4, num_bins] (updated), both C-contiguous; returns (zeros, non-finite seen, a value at or
    above ``exceed_at``)."""
    zeros, exceeded = _I64(), _I32()
    nonfinite = library().trtq_histogram_f32(
        _checked(rows, np.float32),
        rows.shape[0],
        rows.shape[1],
        float(scale),
        _checked(lanes, np.int64),
        lanes.shape[1],
        float(exceed_at),
        int(stride),
        ctypes.byref(zeros),
        ctypes.byref(exceeded),
    )
    return zeros.value, bool(nonfinite), bool(exceeded.value)


def level_sums(
    starts: np.ndarray, weights: np.ndarray, p1: np.ndarray, p0: np.ndarray, a_out: np.ndarray, b_out: np.ndarray
) -> None:
    """kernels.level_sums's gathers; every array int64 and C-contiguous."""
    if weights.dtype != np.int64 or not weights.flags.c_contiguous or weights.shape != (starts.shape[1],):
        raise ValueError("compiled kernel: weights must be C-contiguous int64, one per column of starts")
    if p0.shape != p1.shape or a_out.shape != b_out.shape or a_out.shape != (starts.shape[0], p1.shape[1]):
        raise ValueError("compiled kernel: level_sums shapes do not match")
    if starts.size and (starts.min() < 0 or starts.max() >= p1.shape[0]):
        raise ValueError("compiled kernel: level_sums starts out of range")
    library().trtq_level_sums(
        _checked(starts, np.int64),
        starts.shape[0],
        starts.shape[1],
        weights.ctypes.data,
        _checked(p1, np.int64),
        _checked(p0, np.int64),
        p1.shape[1],
        _checked(a_out, np.int64),
        _checked(b_out, np.int64),
    )
