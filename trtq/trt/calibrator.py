"""TensorRT calibrators, made at run time as subclasses of the installed TensorRT's classes.

* cache-only (:func:`make_cache_calibrator`): for implicit INT8 builds. ``read_calibration_cache``
  returns trtq's table rendered with the header of the installed TensorRT and the calibrator's
  algorithm, ``get_batch`` returns None, so TensorRT takes the ranges from the cache and never
  calibrates.
* data-fed (:func:`run_tensorrt_calibration`): ``trtq calibrate --backend tensorrt``. TensorRT's
  own calibrator is fed by trtq's Batcher through device memory; it returns the cache TensorRT
  wrote, which :mod:`trtq.pipeline.calibrate` stores with its ``<cache>.json`` provenance.

Calibrators exist in TensorRT 8.6 and 10.x (deprecated since 10.1) and were removed in 11.
"""

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from trtq import interrupt
from trtq.calib.methods import METHODS
from trtq.config import BuildOptions
from trtq.errors import ConfigError, DataError, TrtqError, UsageError
from trtq.trt import compat

log = logging.getLogger(__name__)

# cache header algorithm -> TensorRT calibrator class (IInt8Calibrator::getAlgorithm must match
# the header, or TensorRT discards the cache and tries to calibrate)
CALIBRATOR_CLASSES = {
    "EntropyCalibration2": "IInt8EntropyCalibrator2",
    "MinMaxCalibration": "IInt8MinMaxCalibrator",
    "EntropyCalibration": "IInt8EntropyCalibrator",
}
# the --method names TensorRT's own calibrators compute -> their algorithm (trtq.calib.methods)
METHOD_ALGORITHMS = {m.name: m.algorithm for m in METHODS.rows() if m.tensorrt}


def normalize_algorithm(name: str) -> str:
    """Accept a cache header algorithm (``EntropyCalibration2``) or a method (``entropy``)."""
    if name in CALIBRATOR_CLASSES:
        return name
    if name in METHOD_ALGORITHMS:
        return METHOD_ALGORITHMS[name]
    for known in CALIBRATOR_CLASSES:
        if known.lower() == str(name).lower():
            return known
    raise ConfigError(
        f"TensorRT has no calibrator for algorithm {name!r}",
        "use one of " + ", ".join(list(CALIBRATOR_CLASSES) + list(METHOD_ALGORITHMS)),
    )


def calibrator_base(trt: Any, algorithm: str) -> Any:
    algorithm = normalize_algorithm(algorithm)
    if not compat.has_implicit_int8(trt):
        raise UsageError(
            f"TensorRT {compat.version_of(trt)} has no calibrators (removed in TensorRT 11)",
            "use --mode explicit for builds, and --backend onnxruntime for trtq calibrate",
        )
    base = getattr(trt, CALIBRATOR_CLASSES[algorithm], None)
    if base is None:
        raise UsageError(f"TensorRT {compat.version_of(trt)} has no {CALIBRATOR_CLASSES[algorithm]}")
    return base


def make_cache_calibrator(trt: Any, algorithm: str, cache: bytes, batch_size: int) -> Any:
    """A calibrator that only hands TensorRT ``cache`` (already rendered for this TensorRT)."""
    base = calibrator_base(trt, algorithm)

    class CacheCalibrator(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.cache_reads = 0
            self.batch_requests = 0

        def get_batch_size(self) -> int:
            return int(batch_size)

        def get_batch(self, names: Sequence[str], *args: Any) -> Optional[list[int]]:
            self.batch_requests += 1
            return None  # no data: TensorRT must use the cache

        def read_calibration_cache(self, *args: Any) -> bytes:
            self.cache_reads += 1
            return cache

        def write_calibration_cache(self, data: Any, *args: Any) -> None:
            return None

    return CacheCalibrator()


# ------------------------------------------------------------------------------------------------
# data-fed calibration
# ------------------------------------------------------------------------------------------------


def fill_padding(array: np.ndarray, valid: int) -> np.ndarray:
    """Rows ``valid:`` of a padded last batch replaced by copies of the real rows.

    TensorRT calibrates with full batches only; repeating real samples leaves every maximum
    unchanged (MinMax exact) instead of adding padding values to the statistics.
    """
    n = array.shape[0]
    if valid <= 0 or valid >= n:
        return array
    out = np.array(array, copy=True)
    out[valid:] = array[np.arange(valid, n) % valid]
    return out


class BatchFeeder:
    """Copies the Batcher's batches into device buffers for ``IInt8Calibrator.get_batch``."""

    def __init__(self, batcher: Any, buffers: dict[str, Any], dtypes: dict[str, str]):
        self._it = iter(batcher)
        self.buffers = buffers
        self.dtypes = dtypes
        self.shapes = {k: tuple(v) for k, v in batcher.shapes.items()}
        self.batches = 0
        self.samples = 0
        self.error: Optional[BaseException] = None

    def next(self, names: Sequence[str]) -> Optional[list[int]]:
        # exceptions must not cross into TensorRT's C++: keep them and stop the calibration
        if self.error is not None:
            return None
        try:
            batch = next(self._it)
            ptrs = []
            for name in names:
                ptrs.append(self._upload(name, batch))
            self.batches += 1
            self.samples += int(batch.valid)
            log.debug("calibration batch %d (%d samples)", batch.index, batch.valid)
            return ptrs
        except StopIteration:
            return None
        except BaseException as e:  # KeyboardInterrupt included: re-raised after the build
            self.error = e
            return None

    def _upload(self, name: str, batch: Any) -> int:
        from trtq.trt import cuda

        if name not in batch.arrays or name not in self.buffers:
            raise DataError(
                f"TensorRT asks for input {name} but the data has none",
                "configure data.inputs for every model input",
            )
        arr = fill_padding(np.asarray(batch.arrays[name]), int(batch.valid))
        want = self.shapes[name]
        if tuple(arr.shape) != want:
            raise DataError(f"batch for {name} has shape {list(arr.shape)}, expected {list(want)}")
        arr = np.ascontiguousarray(arr, dtype=self.dtypes[name])
        buf = self.buffers[name]
        cuda.copy_to_device(buf.ptr, arr)
        return buf.ptr


def make_feeding_calibrator(trt: Any, algorithm: str, feeder: BatchFeeder, batch_size: int) -> Any:
    base = calibrator_base(trt, algorithm)

    class FeedingCalibrator(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.cache: Optional[bytes] = None

        def get_batch_size(self) -> int:
            return int(batch_size)

        def get_batch(self, names: Sequence[str], *args: Any) -> Optional[list[int]]:
            return feeder.next(list(names))

        def read_calibration_cache(self, *args: Any) -> None:
            return None  # always calibrate from the data

        def write_calibration_cache(self, data: Any, *args: Any) -> None:
            self.cache = bytes(memoryview(data))

    return FeedingCalibrator()


@dataclass
class TensorRTCalibration:
    """What TensorRT's own calibrator produced: its cache bytes (not yet written) and the counts."""

    cache: bytes
    algorithm: str
    trt_version: str
    batches: int
    samples: int
    seconds: float


def run_tensorrt_calibration(
    model_path: Path, batcher: Any, algorithm: str, options: Optional[BuildOptions] = None
) -> TensorRTCalibration:
    """Calibrate with TensorRT's own calibrator, fed by ``batcher``; return the cache it wrote.

    ``algorithm``: ``EntropyCalibration2`` / ``MinMaxCalibration`` (or ``entropy`` / ``max``).
    ``options``: workspace, tactic sources and optimization level of the throw-away build that
    TensorRT calibrates in (level 0 unless given: the engine is not kept). Writing the cache and
    its provenance is :func:`trtq.pipeline.calibrate.calibrate_file_with_tensorrt`'s.
    """
    from trtq.trt import cuda
    from trtq.trt.network import configure, parse_file

    model_path = Path(model_path)
    options = options or BuildOptions()
    if options.optimization_level is None:
        options = dataclasses.replace(options, optimization_level=0)
    algorithm = normalize_algorithm(algorithm)
    trt = compat.import_tensorrt()
    calibrator_base(trt, algorithm)  # TensorRT 11 -> clear error before any work
    cuda.require_gpu()

    t0 = time.perf_counter()
    # a signal is raised when TensorRT returns (the feeder's interrupt.check() ends the calibration at
    # the next batch), never inside TensorRT's logger callback
    with interrupt.deferred():
        logger = compat.make_logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(compat.creation_mask(trt, compat.plan_build(trt, "fp32").creation_flags))
        parser = trt.OnnxParser(network, logger)
        parse_file(trt, parser, logger, model_path)
        config = builder.create_builder_config()
        compat.set_builder_flags(trt, config, ("INT8",))
        configure(trt, config, options)
        shapes = {k: tuple(int(d) for d in v) for k, v in batcher.shapes.items()}
        dtypes = _calibration_inputs(builder, network, config, shapes)
        feeder, calibrator = _calibrate(trt, builder, network, config, batcher, algorithm, shapes, dtypes)
    if calibrator.cache is None:
        errors = logger.take_errors()
        raise TrtqError(
            f"TensorRT {trt.__version__} did not write a calibration cache" + (f": {errors[0]}" if errors else ""),
            "run with -v for TensorRT's messages",
        )
    return TensorRTCalibration(
        calibrator.cache, algorithm, str(trt.__version__), feeder.batches, feeder.samples, time.perf_counter() - t0
    )


def _calibration_inputs(builder: Any, network: Any, config: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """The dtype of every network input (each must have data); dynamic inputs get a profile fixed
    at the batch shape."""
    dtypes: dict[str, str] = {}
    dynamic = []
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t.name not in shapes:
            raise DataError(
                f"model input {t.name} has no calibration data",
                "configure data.inputs." + t.name,
            )
        dtypes[t.name] = compat.dtype_name(t.dtype)
        if any(int(d) < 0 for d in t.shape):
            dynamic.append(t.name)
    if dynamic:
        profile = builder.create_optimization_profile()
        for name in dynamic:
            profile.set_shape(name, shapes[name], shapes[name], shapes[name])
        config.add_optimization_profile(profile)
        compat.set_calibration_profile(config, profile)
    return dtypes


def _calibrate(
    trt: Any,
    builder: Any,
    network: Any,
    config: Any,
    batcher: Any,
    algorithm: str,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict[str, str],
) -> tuple[BatchFeeder, Any]:
    """The throw-away build in which TensorRT calibrates, fed through device buffers."""
    from trtq.trt import cuda

    buffers: dict[str, Any] = {}
    try:
        for name, dt in dtypes.items():
            buffers[name] = cuda.DeviceBuffer(int(np.prod(shapes[name])) * np.dtype(dt).itemsize)
        feeder = BatchFeeder(batcher, buffers, dtypes)
        calibrator = make_feeding_calibrator(trt, algorithm, feeder, batcher.batch_size)
        config.int8_calibrator = calibrator
        builder.build_serialized_network(network, config)  # the engine itself is not needed
    finally:
        for buf in buffers.values():
            buf.free()
    if feeder.error is not None:
        if isinstance(feeder.error, (TrtqError, KeyboardInterrupt)):
            raise feeder.error
        raise TrtqError(f"reading calibration data failed: {feeder.error!r}") from feeder.error
    if feeder.batches == 0:
        raise DataError("no calibration batches: the data source is empty", "check data.inputs")
    return feeder, calibrator
