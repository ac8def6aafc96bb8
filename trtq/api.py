"""trtq's Python API, exported by ``trtq/__init__.py``: calibrate from data in memory, quantize,
compare; the same pipeline steps as the CLI (trtq.pipeline), the same files, the same errors.

``data`` is an iterable of batches (trtq.data.in_memory): numpy arrays, dicts of arrays by input
name, torch tensors, or tuples whose first elements are the inputs (a ``torch.utils.data.DataLoader``
of ``(images, labels)`` as it is; torch is never imported). Batches are re-cut to ``batch_size``
(the model's fixed batch dim, else 8) and the last one padded, as ``trtq calibrate`` does, so the
same samples in the same order give the same cache bytes. The provenance (``<cache>.json``) then
differs from the CLI's in ``data.fingerprint`` (the sha256 of the samples' bytes, not of the file
list and preprocessing) and ``data.options`` (``{"source": "in-memory", "batch_size": N,
"last_batch": "pad"}``, not the config's data section) only; ``model.path`` is the path as given.

Errors are trtq's own (trtq.errors, the CLI's exit code in ``exit_code``), ``str(err)`` the CLI's
one line ``"<message>; <hint>"``: ConfigError / UsageError for options, DataError for the data,
ModelError for the model, CacheError for a cache. Warnings go to the ``trtq`` loggers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# options the CLI sets from its own flags, not a keyword of the API: where files go, TensorRT's backend
_NOT_OPTIONS = {"calibrate": ("output", "save_stats", "backend"), "quantize": ("output",), "compare": ("per_layer",)}


@dataclass
class Calibration:
    """What :func:`calibrate` measured: ``amax`` (tensor name -> amax), the method, TensorRT
    algorithm and version of the cache header, the counts, and the provenance the cache's ``.json``
    will hold. :meth:`write_cache` writes both."""

    amax: dict[str, float]
    method: str
    algorithm: str
    trt_version: str
    samples: int
    batches: int
    model: str
    provenance: dict
    zero_tensors: list[str] = field(default_factory=list)
    range_flags: list = field(default_factory=list)

    def __repr__(self) -> str:
        return (
            f"Calibration(method={self.method!r}, tensors={len(self.amax)}, samples={self.samples}, "
            f"batches={self.batches}, trt_version={self.trt_version!r}, model={self.model!r})"
        )

    def write_cache(self, path: Any, trt_version: str | None = None) -> Path:
        """Write the TensorRT calibration cache to ``path`` and its provenance to ``path.json``,
        atomically and as one step, with the writer of ``trtq calibrate``; ``trt_version`` (default:
        the version calibrated for) is the header's. Returns the cache's path."""
        from trtq.calib.cache import resolve_trt_version
        from trtq.outputs import Declared, guard
        from trtq.pipeline.calibrate import write_outputs

        path = Path(os.fspath(path))
        version = self.trt_version if trt_version is None else resolve_trt_version(str(trt_version))
        guard(Declared.of(models=[("model", self.model)], outputs=[("cache", path), ("provenance", f"{path}.json")]))
        write_outputs(path, self.algorithm, version, self.amax, dict(self.provenance, trt_version=version))
        return path


def calibrate(
    model: Any,
    data: Iterable[Any],
    method: str = "mse",
    batch_size: int | None = None,
    *,
    progress: Callable[[Any], None] | None = None,
    **options: Any,
) -> Calibration:
    """Calibrate the ONNX model at ``model`` (a path) on ``data`` (module doc) with ``method`` (a
    name of trtq.calib.methods: mse, entropy, percentile, max, ...); nothing is written.

    ``options``: the config's other ``calibrate:`` keys (percentile, num_bins, tensors, trt_version,
    providers, max_memory, hist_elements, collect). ``progress(p)`` is called after every batch with
    a trtq.calib.collect.passes.Progress. A generator is read once: entropy's second pass reads the
    batches pass 1 kept on temporary disk (a DataError if they could not be kept)."""
    from trtq.calib.methods import METHODS
    from trtq.pipeline.calibrate import calibrate as step

    path = _model_path(model, "calibrate")
    overrides = {"calibrate.method": METHODS.get(method).name, **_section("calibrate", options)}
    cfg = _config(path, overrides)
    result = step(cfg, progress=progress, batches=_batches(data, batch_size), write=False)
    return Calibration(
        amax=dict(result.amax),
        method=result.method,
        algorithm=result.algorithm,
        trt_version=result.trt_version,
        samples=result.samples,
        batches=result.batches,
        model=path,
        provenance=result.provenance,
        zero_tensors=list(result.zero_tensors),
        range_flags=list(result.range_flags),
    )


def quantize(
    model: Any, calibration: Any, data: Iterable[Any] | None = None, batch_size: int | None = None, **options: Any
) -> Any:
    """The explicit Q/DQ ``onnx.ModelProto`` of the model at ``model`` with the ranges of
    ``calibration`` (a :class:`Calibration` or a cache path), as ``trtq quantize`` makes it and
    checked as it checks it before writing (the ONNX checker and one ONNX Runtime run, on the first
    batch of ``data`` where given, else a synthetic one).

    ``options``: the config's ``quantize:`` keys (exclude, per_channel, fp16, allow_stale,
    center_activations, center_padded; equalize, bias_correction, weight_rounding="gptq" and float_layers read the
    first ``samples`` (128) samples of ``data``, which a generator may be: those are kept)."""
    import tempfile

    from trtq.errors import UsageError
    from trtq.pipeline.quantize import needs_data
    from trtq.pipeline.quantize import quantize as step

    path = _model_path(model, "quantize")
    cfg = _config(path, _section("quantize", options))
    if needs_data(cfg.quantize) and data is None:
        raise UsageError(
            "equalize, bias_correction, weight_rounding gptq and float_layers read data",
            "pass data= (batches of calibration samples, as for trtq.calibrate)",
        )
    batches = None if data is None else _kept_batches(data, batch_size)
    if isinstance(calibration, Calibration):
        with tempfile.TemporaryDirectory(prefix="trtq-api-") as tmp:
            cache = calibration.write_cache(Path(tmp) / "calibration.cache")
            return step(cfg, Path(path), cache, None, batches=batches).model
    if isinstance(calibration, (str, os.PathLike)):
        return step(cfg, Path(path), Path(os.fspath(calibration)), None, batches=batches).model
    raise UsageError(
        f"calibration must be a trtq.Calibration or a cache path, not a {type(calibration).__name__}",
        "pass what trtq.calibrate() returned, or the path of a calibration.cache",
    )


def compare(
    model: Any,
    candidate: Any,
    data: Iterable[Any],
    batch_size: int | None = None,
    *,
    per_layer: str | None = None,
    calibration: Any = None,
    top: int = 10,
    **options: Any,
) -> dict:
    """Run the reference ``model`` and ``candidate`` (paths, or ``onnx.ModelProto`` such as
    :func:`quantize` returns; a ``.plan`` path runs on TensorRT) on ``data`` and return what
    ``trtq compare --json`` prints: per output the task metric (``outputs[i]["task"]``), top-1
    agreement, cosine, SQNR (``sqnr_db``), ...; ``per_layer`` ("only" or "leave-one-out", with
    ``calibration``) adds the ranking under ``"per_layer"``.

    ``options``: the config's ``compare:`` keys (task, limit, semantics, min_agreement, min_cosine,
    detect_format, layout, ...); a failed ``min_agreement`` / ``min_cosine`` gate raises the
    TrtqError the CLI exits 1 with."""
    import tempfile

    from trtq.errors import TrtqError, UsageError
    from trtq.pipeline.compare import compare as step

    if per_layer not in (None, "only", "leave-one-out"):
        raise UsageError(f"per_layer must be 'only' or 'leave-one-out', not {per_layer!r}", "or leave it out")
    if per_layer and calibration is None:
        raise UsageError("per_layer needs the calibration", "pass calibration= (a trtq.Calibration or a cache path)")
    with tempfile.TemporaryDirectory(prefix="trtq-api-") as tmp:
        reference = _model_path(model, "compare", Path(tmp) / "reference.onnx")
        cand = _model_path(candidate, "compare", Path(tmp) / "candidate.onnx", noun="candidate")
        cache = None
        if calibration is not None:
            cache = (
                calibration.write_cache(Path(tmp) / "calibration.cache")
                if isinstance(calibration, Calibration)
                else Path(os.fspath(calibration))
            )
        cfg = _config(reference, _section("compare", options))
        report, rows = step(
            cfg,
            Path(reference),
            Path(cand),
            cache,
            per_layer_mode=per_layer,
            top=top,
            batches=_batches(data, batch_size),
        )
    out = report.to_dict()
    if rows is not None:
        out["per_layer"] = [row.to_dict() for row in rows]
    failed = report.gate(cfg.compare)
    if failed:
        raise TrtqError("accuracy gate failed: " + "; ".join(failed))
    return out


def _batches(data: Any, batch_size: int | None) -> Callable[[list], Any]:
    """The in-memory batch source's maker the pipeline steps call with the model's input specs."""
    from trtq.data.in_memory import InMemoryBatches

    return lambda specs: InMemoryBatches(data, specs, batch_size)


def _kept_batches(data: Any, batch_size: int | None) -> Callable[[list, int], Any]:
    """quantize's maker (specs, limit): one source of the first ``limit`` samples, made on the first
    call and handed to every later one (the data steps read it, then the check run its first batch)."""
    from trtq.data.in_memory import InMemoryBatches

    made: list[Any] = []

    def make(specs: list, limit: int) -> Any:
        if not made:
            made.append(InMemoryBatches(data, specs, batch_size, limit=limit))
        return made[0]

    return make


def _model_path(model: Any, api: str, proto_path: Path | None = None, noun: str = "model") -> str:
    """The path of ``model``: a path as given; an ``onnx.ModelProto`` saved at ``proto_path``
    where the function takes one (compare), else a UsageError."""
    from trtq.errors import UsageError

    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if type(model).__name__ == "ModelProto" and proto_path is not None:
        import onnx

        onnx.save(model, str(proto_path))
        return str(proto_path)
    takes = "a path or an onnx.ModelProto" if proto_path is not None else "the path of an ONNX file"
    raise UsageError(
        f"trtq.{api}(): the {noun} must be {takes}, not a {type(model).__name__}",
        "save the model with onnx.save and pass its path" if proto_path is None else "pass the .onnx path",
    )


def _section(section: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as dotted config keys of ``section``; UsageError naming an unknown one."""
    from trtq.config import CalibrateOptions, CompareOptions, QuantizeOptions
    from trtq.errors import UsageError

    fields = dataclasses.fields(
        {"calibrate": CalibrateOptions, "quantize": QuantizeOptions, "compare": CompareOptions}[section]
    )
    known = [f.name for f in fields if f.name not in _NOT_OPTIONS[section]]
    for key in options:
        if key not in known:
            raise UsageError(f"trtq.{section}() has no option {key!r}", f"options: {', '.join(known)}")
    return {f"{section}.{key}": value for key, value in options.items()}


def _config(model: str, overrides: Mapping[str, Any]) -> Any:
    """The config of one API call: the defaults and ``overrides`` (checked and converted as the CLI's
    flags are; the environment's TRTQ_* variables are not read)."""
    from trtq.config import load_config

    cfg = load_config(None, {"model": model, **overrides}, environ={})
    if cfg.compare.task != "auto":
        from trtq.compare.tasks import TASKS

        cfg = dataclasses.replace(cfg, compare=dataclasses.replace(cfg.compare, task=TASKS.get(cfg.compare.task).name))
    return cfg
