"""``trtq compare``'s step: batches from the config, the runners, the accuracy report."""

import dataclasses
from functools import partial
from pathlib import Path
from typing import Optional


def compare(
    cfg,
    reference: Path,
    candidate: Path,
    cache: Optional[Path] = None,
    *,
    per_layer_mode: Optional[str] = None,
    top: Optional[int] = None,
    batches=None,
):
    """(CompareReport, per-layer rows or None) of ``candidate`` against ``reference`` on ``cfg.data``;
    ``per_layer_mode`` (with the calibration ``cache``) ranks the quantized layers too. ``batches``
    (the Python API, trtq.api): a function of the reference's input specs that returns the batch
    source read instead of ``cfg.data`` (trtq.data.in_memory).

    A Q/DQ ONNX candidate runs with ``cfg.compare.semantics`` and, in the same pass, the other
    semantics (the report carries both, and a warning where they differ by more than noise), its
    float rest in float16 where ``cfg.compare.float_rest`` says "fp16"."""
    cfg = dataclasses.replace(cfg, model=str(reference))
    from trtq import progress
    from trtq.compare import per_layer_sensitivity
    from trtq.compare.evaluate import compare_many
    from trtq.compare.onnx_runner import SEMANTICS
    from trtq.compare.semantics import semantics_gaps
    from trtq.compare.tasks import output_producers
    from trtq.data.batcher import Batcher
    from trtq.errors import UsageError
    from trtq.model import input_specs, load_model
    from trtq.pipeline.open_runner import open_runner

    reference_model = load_model(cfg.model)
    specs = input_specs(reference_model)
    batcher = Batcher(cfg.data, specs) if batches is None else batches(specs)
    opened = partial(open_runner, candidate, float_rest=cfg.compare.float_rest)
    with open_runner(Path(cfg.model)) as ref, opened(semantics=cfg.compare.semantics) as cand:
        runners = [cand]
        if getattr(cand, "semantics", None):  # a Q/DQ ONNX model: score it both ways
            other = next(s for s in SEMANTICS if s != cfg.compare.semantics)
            runners.append(opened(semantics=other))
        limit = cfg.compare.limit
        total = min(batcher.num_batches, -(-int(limit) // batcher.batch_size)) if limit else batcher.num_batches
        try:
            with progress.task("compare: batches", total) as shown:
                reports = compare_many(
                    ref,
                    runners,
                    batcher,
                    cfg.compare,
                    progress=lambda done, samples: shown.update(done, note=f"{samples} samples"),
                    producers=output_producers(reference_model),
                )
        finally:
            for r in runners[1:]:
                r.close()
    report = reports[0]
    if len(reports) > 1:
        gaps = semantics_gaps(report, reports[1], cfg.compare.semantics, other)
        report = dataclasses.replace(report, other=reports[1], warnings=tuple(gaps))
    layers = None
    if per_layer_mode:
        if cache is None:
            raise UsageError("--per-layer needs the calibration cache", "pass --cache calibration.cache")
        from trtq.calib.cache import read_cache
        from trtq.calib.freshness import check_cache_for_model

        table = read_cache(cache)
        check_cache_for_model(cache, Path(cfg.model), cfg.quantize.allow_stale, table.amax)
        with progress.task(f"per-layer ({per_layer_mode}): layers") as shown:
            layers = per_layer_sensitivity(
                reference_model,
                table.amax,
                cfg.quantize,
                batcher,
                mode=per_layer_mode,
                top=top,
                limit=cfg.compare.limit,
                task_options=cfg.compare,
                progress=progress.callback(shown),
            )
    return report, layers
