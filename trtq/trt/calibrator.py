"""TensorRT calibrators, made at run time as subclasses of the installed TensorRT's classes.

* cache-only (:func:`make_cache_calibrator`): for implicit INT8 builds. ``read_calibration_cache``
  returns trtq's table rendered with the header of the installed TensorRT and the calibrator's
  algorithm, ``get_batch`` returns None, so TensorRT takes the ranges from the cache and never
  calibrates.
* data-fed (:func:`calibrate_with_tensorrt`): ``trtq calibrate --backend tensorrt``. TensorRT's
  own calibrator is fed by trtq's Batcher through device memory; the cache TensorRT writes is
  stored atomically, with ``<cache>.json`` provenance like the ONNX Runtime backend writes.

Calibrators exist in TensorRT 8.6 and 10.x (deprecated since 10.1) and were removed in 11.
"""
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from trtq import __version__
from trtq.config import BuildOptions
from trtq.errors import ConfigError, DataError, TrtqError, UsageError
from trtq.fileio import atomic_path, sha256_file
from trtq.trt import compat

log = logging.getLogger(__name__)

# cache header algorithm -> TensorRT calibrator class (IInt8Calibrator::getAlgorithm must match
# the header, or TensorRT discards the cache and tries to calibrate)
CALIBRATOR_CLASSES = {
    "EntropyCalibration2": "IInt8EntropyCalibrator2",
    "MinMaxCalibration": "IInt8MinMaxCalibrator",
    "EntropyCalibration": "IInt8EntropyCalibrator",
}
# trtq calibrate --method -> TensorRT algorithm
METHOD_ALGORITHMS = {"entropy": "EntropyCalibration2", "max": "MinMaxCalibration"}


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

        def get_batch(self, names: Sequence[str], *args: Any) -> Optional[List[int]]:
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

    def __init__(self, batcher: Any, buffers: Dict[str, Any], dtypes: Dict[str, str]):
        self._it = iter(batcher)
        self.buffers = buffers
        self.dtypes = dtypes
        self.shapes = {k: tuple(v) for k, v in batcher.shapes.items()}
        self.batches = 0
        self.samples = 0
        self.error: Optional[BaseException] = None

    def next(self, names: Sequence[str]) -> Optional[List[int]]:
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

        def get_batch(self, names: Sequence[str], *args: Any) -> Optional[List[int]]:
            return feeder.next(list(names))

        def read_calibration_cache(self, *args: Any) -> None:
            return None  # always calibrate from the data

        def write_calibration_cache(self, data: Any, *args: Any) -> None:
            self.cache = bytes(memoryview(data))

    return FeedingCalibrator()


def calibrate_with_tensorrt(
    model_path: Path,
    batcher: Any,
    algorithm: str,
    output_cache: Path,
    options: Optional[BuildOptions] = None,
) -> Any:
    """Calibrate with TensorRT's own calibrator; write its cache (+ provenance); return the table.

    ``algorithm``: ``EntropyCalibration2`` / ``MinMaxCalibration`` (or ``entropy`` / ``max``).
    ``options``: workspace, tactic sources and optimization level of the throw-away build that
    TensorRT calibrates in (level 0 unless given: the engine is not kept).
    """
    from trtq.calib.cache import read_cache, write_provenance
    from trtq.model import input_specs, load_model
    from trtq.trt import cuda
    from trtq.trt.network import configure, parse_file

    model_path, output_cache = Path(model_path), Path(output_cache)
    options = options or BuildOptions()
    if options.optimization_level is None:
        options = dataclasses.replace(options, optimization_level=0)
    algorithm = normalize_algorithm(algorithm)
    trt = compat.import_tensorrt()
    calibrator_base(trt, algorithm)  # TensorRT 11 -> clear error before any work
    cuda.require_gpu()
    specs = input_specs(load_model(model_path))

    t0 = time.perf_counter()
    logger = compat.make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(compat.creation_mask(trt, compat.plan_build(trt, "fp32").creation_flags))
    parser = trt.OnnxParser(network, logger)
    parse_file(trt, parser, logger, model_path)
    config = builder.create_builder_config()
    compat.set_builder_flags(trt, config, ("INT8",))
    configure(trt, config, options)

    shapes = {k: tuple(int(d) for d in v) for k, v in batcher.shapes.items()}
    dtypes: Dict[str, str] = {}
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

    buffers: Dict[str, Any] = {}
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
    if calibrator.cache is None:
        errors = logger.take_errors()
        raise TrtqError(
            f"TensorRT {trt.__version__} did not write a calibration cache"
            + (f": {errors[0]}" if errors else ""),
            "run with -v for TensorRT's messages",
        )
    seconds = time.perf_counter() - t0

    from trtq.interrupt import held_for_outputs

    with held_for_outputs(), atomic_path(output_cache) as tmp:  # cache and provenance as one step (signals)
        tmp.write_bytes(calibrator.cache)
        table = read_cache(tmp)  # refuse to publish anything trtq cannot read back
        write_provenance(output_cache, {
            "format": "trtq-calibration/1",
            "trtq_version": __version__,
            "model": {
                "path": str(model_path),
                "sha256": sha256_file(model_path),
                "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in specs],
            },
            "data": {
                "fingerprint": batcher.fingerprint(),
                "samples": feeder.samples,
                "batch_size": batcher.batch_size,
                "shapes": {k: list(v) for k, v in shapes.items()},
                "skipped": len(getattr(batcher, "skipped", []) or []),
            },
            "method": {"name": "max" if algorithm == "MinMaxCalibration" else "entropy", "backend": "tensorrt"},
            "algorithm": algorithm,
            "trt_version": str(trt.__version__),
            "seconds": round(seconds, 3),
            "amax": dict(table.amax),
        })
    log.info("TensorRT calibration: %d batches, %d tensors, %.1f s", feeder.batches, len(table.amax), seconds)
    return table
