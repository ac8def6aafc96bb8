"""The provenance JSON written beside every calibration cache (``<cache>.json``, format
``trtq-calibration/1``): which model (path, sha256, inputs), which data (fingerprint, counts,
shapes), which method and TensorRT algorithm, and the amax table it produced. The ONNX Runtime
passes, TensorRT's own calibrator and ``--from-stats`` all build it here; the freshness check
(:mod:`trtq.calib.freshness`) and ``trtq report`` read it back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trtq import __version__

FORMAT = "trtq-calibration/1"


def model_entry(model_path: Path, specs: Sequence[Any]) -> dict[str, Any]:
    """The model a cache was calibrated for: path, content hash (of its external-data files too,
    trtq.model.model_sha256; their names under ``external_data``) and declared inputs."""
    import os

    from trtq.model import external_data_files, model_sha256

    entry: dict[str, Any] = {
        "path": str(model_path),
        "sha256": model_sha256(model_path),
        "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in specs],
    }
    external = external_data_files(model_path)
    if external:
        entry["external_data"] = [os.path.relpath(f, Path(model_path).parent) for f in external]
    return entry


def data_entry(batcher: Any, samples: int, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data it was calibrated on: the Batcher's fingerprint, counts and batch shapes, and the
    data options when given."""
    entry: dict[str, Any] = {
        "fingerprint": batcher.fingerprint(),
        "samples": samples,
        "batch_size": batcher.batch_size,
        "shapes": {k: list(v) for k, v in batcher.shapes.items()},
        "skipped": len(getattr(batcher, "skipped", []) or []),
    }
    if options is not None:
        entry["options"] = dict(options)
    return entry


def calibration_provenance(
    model: Mapping[str, Any],
    data: Mapping[str, Any],
    method: Mapping[str, Any],
    algorithm: str,
    trt_version: str,
    amax: Mapping[str, float],
    **extra: Any,
) -> dict[str, Any]:
    """The provenance of a cache calibrated by running the model (``extra``: e.g. ``seconds``)."""
    return {
        "format": FORMAT,
        "trtq_version": __version__,
        "model": dict(model),
        "data": dict(data),
        "method": dict(method),
        "algorithm": algorithm,
        "trt_version": trt_version,
        **extra,
        "amax": dict(amax),
    }


def restamped_provenance(
    meta: Mapping[str, Any],
    method: Mapping[str, Any],
    algorithm: str,
    trt_version: str,
    amax: Mapping[str, float],
    from_stats: Path,
) -> dict[str, Any]:
    """The provenance of a cache computed from saved statistics: the statistics file's own
    metadata (model, data) with this run's method, algorithm, TensorRT version and amax."""
    provenance = dict(meta)
    provenance.pop("tensors", None)
    provenance.update(
        {
            "format": FORMAT,
            "trtq_version": __version__,
            "method": dict(method),
            "algorithm": algorithm,
            "trt_version": trt_version,
            "amax": dict(amax),
            "from_stats": str(from_stats),
        }
    )
    return provenance
