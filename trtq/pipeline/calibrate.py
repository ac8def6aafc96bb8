"""``trtq calibrate``'s file-level step: the ONNX Runtime passes of :mod:`trtq.calib.calibrate`,
or TensorRT's own calibrator (``--backend tensorrt``, :mod:`trtq.trt.calibrator`), whose cache is
written here with the provenance of :mod:`trtq.calib.provenance`, as the ONNX Runtime path does."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from trtq.config import BuildOptions
from trtq.errors import UsageError

log = logging.getLogger(__name__)


def calibrate(cfg: Any, progress: Any = None, shard: tuple[int, int] | None = None,
              ranges: Path | None = None, keep_batches: Path | None = None) -> Any:
    """Calibrate ``cfg.model`` on ``cfg.data`` with the configured backend; a CalibrationResult."""
    cfg, selection = _tensor_selection(cfg)
    if cfg.calibrate.backend == "tensorrt":
        return calibrate_with_tensorrt(cfg)
    from trtq.calib.calibrate import run_calibration

    result = run_calibration(cfg, progress=progress, shard=shard, ranges=ranges, keep_batches=keep_batches,
                             selection=selection)
    return warn_range_flags(cfg, result)


def warn_range_flags(cfg: Any, result: Any) -> Any:
    """Keep the range check's flags (trtq.calib.range_check) of the tensors the Q/DQ model quantizes,
    and warn naming them: those are the ranges an engine uses."""
    if not result.range_flags:
        return result
    from trtq.calib.range_check import RATIO
    from trtq.model import load_model
    from trtq.quantize import planned_activations

    if cfg.model:
        quantized = set(planned_activations(load_model(cfg.model)))
        result.range_flags = [f for f in result.range_flags if f.tensor in quantized]
        among = f"the {len(quantized)} tensors the Q/DQ model quantizes"
    else:  # statistics without their model: every tensor counts
        among = f"the {len(result.amax)} calibrated tensors"
    if result.range_flags:
        worst = "; ".join(f.describe() for f in result.range_flags[:3])
        log.warning("%s ranges cost more than %gx mse's expected INT8 error on %d of %s (%s%s): such ranges have "
                    "wrecked detectors and CTC models; --method mse (the default) minimises that error",
                    result.method, RATIO, len(result.range_flags), among, worst,
                    " ..." if len(result.range_flags) > 3 else "")
    return result


# --tensors qdq: only the activations trtq quantize places Q/DQ on (an explicit build reads no other);
# --tensors all: every tensor
QDQ_TENSORS = "qdq"
ALL_TENSORS = "all"


def _tensor_selection(cfg: Any) -> tuple[Any, str | None]:
    """``calibrate.tensors`` resolved: ``all`` (every tensor), ``qdq``, a list of names; empty is
    every tensor, except for a cache written for TensorRT >= 11, which has no implicit INT8 and so
    reads only the Q/DQ set."""
    import dataclasses

    requested = list(cfg.calibrate.tensors)
    if requested == [ALL_TENSORS]:
        return dataclasses.replace(cfg, calibrate=dataclasses.replace(cfg.calibrate, tensors=())), None
    if QDQ_TENSORS in requested or ALL_TENSORS in requested:
        if len(requested) != 1:
            raise UsageError(f"--tensors {QDQ_TENSORS} / {ALL_TENSORS} stands alone",
                             f"pass --tensors {QDQ_TENSORS}, --tensors {ALL_TENSORS}, or a list of names")
        return _qdq_tensors(cfg), QDQ_TENSORS
    if not requested and cfg.calibrate.backend == "onnxruntime":
        major = _major(cfg)
        if major >= 11:
            log.info("TensorRT %d has no implicit INT8 calibration: only the activations trtq quantize places "
                     "Q/DQ on are calibrated (--tensors all for every tensor)", major)
            return _qdq_tensors(cfg), QDQ_TENSORS
    return cfg, None


def _major(cfg: Any) -> int:
    from trtq.calib.cache import parse_trt_version
    from trtq.calib.calibrate import resolve_trt_version

    return parse_trt_version(resolve_trt_version(cfg.calibrate.trt_version))[0]


def _qdq_tensors(cfg: Any) -> Any:
    """``cfg`` with ``calibrate.tensors`` = the activations quantize's placement reads."""
    import dataclasses

    from trtq.errors import ModelError
    from trtq.model import load_model
    from trtq.quantize import planned_activations

    if cfg.calibrate.backend == "tensorrt":
        raise UsageError(f"--tensors {QDQ_TENSORS} is for the onnxruntime backend",
                         "TensorRT's calibrator ranges every tensor: drop --tensors or --backend tensorrt")
    if not cfg.model:
        raise UsageError("no model given", "pass --model MODEL.onnx or set model: in the config")
    tensors = planned_activations(load_model(cfg.model))
    if not tensors:
        raise ModelError(f"{Path(cfg.model).name}: trtq quantize would place no Q/DQ pair on an activation",
                         "calibrate every tensor (drop --tensors qdq)")
    log.info("--tensors qdq: %d activations that quantize places Q/DQ on", len(tensors))
    return dataclasses.replace(cfg, calibrate=dataclasses.replace(cfg.calibrate, tensors=tuple(tensors)))


def calibrate_with_tensorrt(cfg: Any) -> Any:
    """``--backend tensorrt``: TensorRT's MinMax or EntropyCalibration2 calibrator over the data."""
    from trtq.calib.cache import ALGORITHM_FOR_METHOD, TENSORRT_METHODS
    from trtq.calib.calibrate import CalibrationResult, resolve_trt_version
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    if cfg.calibrate.method not in TENSORRT_METHODS:
        raise UsageError(
            f"--backend tensorrt supports --method max or entropy, not {cfg.calibrate.method}",
            "TensorRT has MinMax and EntropyCalibration2 calibrators only",
        )
    t0 = time.perf_counter()
    specs = input_specs(load_model(cfg.model))
    batcher = Batcher(cfg.data, specs)
    algorithm = ALGORITHM_FOR_METHOD[cfg.calibrate.method]
    out = Path(cfg.calibrate.output)
    table = calibrate_file_with_tensorrt(Path(cfg.model), batcher, algorithm, out, options=cfg.build)
    return CalibrationResult(
        cache_path=out, method=cfg.calibrate.method, algorithm=table.algorithm,
        trt_version=table.trt_version or resolve_trt_version(None), amax=dict(table.amax),
        samples=batcher.num_samples, batches=batcher.num_batches, seconds=time.perf_counter() - t0,
    )


def calibrate_file_with_tensorrt(model_path: Path, batcher: Any, algorithm: str, output_cache: Path,
                                 options: BuildOptions | None = None) -> Any:
    """Calibrate with TensorRT's own calibrator; write its cache (+ provenance); return the table.

    ``algorithm``: ``EntropyCalibration2`` / ``MinMaxCalibration`` (or ``entropy`` / ``max``);
    ``options``: the throw-away calibration build's settings (see ``run_tensorrt_calibration``).
    """
    from trtq.calib.cache import method_for_algorithm, read_cache, write_provenance
    from trtq.calib.provenance import calibration_provenance, data_entry, model_entry
    from trtq.fileio import atomic_path
    from trtq.interrupt import held_for_outputs
    from trtq.model import input_specs, load_model
    from trtq.trt.calibrator import run_tensorrt_calibration

    model_path, output_cache = Path(model_path), Path(output_cache)
    specs = input_specs(load_model(model_path))
    run = run_tensorrt_calibration(model_path, batcher, algorithm, options)
    with held_for_outputs(), atomic_path(output_cache) as tmp:  # cache and provenance as one step (signals)
        tmp.write_bytes(run.cache)
        table = read_cache(tmp)  # refuse to publish anything trtq cannot read back
        method = {"name": method_for_algorithm(run.algorithm), "backend": "tensorrt"}
        write_provenance(output_cache, calibration_provenance(
            model_entry(model_path, specs), data_entry(batcher, run.samples), method, run.algorithm,
            run.trt_version, table.amax, seconds=round(run.seconds, 3)))
    log.info("TensorRT calibration: %d batches, %d tensors, %.1f s", run.batches, len(table.amax), run.seconds)
    return table
