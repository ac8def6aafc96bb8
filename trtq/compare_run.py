"""The ``compare`` command's orchestration: batches from the config, two runners, the report."""
from pathlib import Path
from typing import Optional


def run_compare(cfg, candidate: Path, cache: Optional[Path], per_layer_mode: Optional[str], top: Optional[int]):
    """Return (CompareReport, per-layer rows or None)."""
    from trtq.compare import compare_models, per_layer_sensitivity
    from trtq.data.batcher import Batcher
    from trtq.errors import UsageError
    from trtq.model import input_specs, load_model
    from trtq.runners import open_runner

    reference_model = load_model(cfg.model)
    batcher = Batcher(cfg.data, input_specs(reference_model))
    with open_runner(Path(cfg.model)) as ref, open_runner(candidate) as cand:
        report = compare_models(ref, cand, batcher, cfg.compare)
    layers = None
    if per_layer_mode:
        if cache is None:
            raise UsageError("--per-layer needs the calibration cache", "pass --cache calibration.cache")
        from trtq.calib.cache import read_cache
        from trtq.calib.freshness import check_cache_for_model

        table = read_cache(cache)
        check_cache_for_model(cache, Path(cfg.model), cfg.quantize.allow_stale, table.amax)
        layers = per_layer_sensitivity(reference_model, table.amax, cfg.quantize, batcher,
                                       mode=per_layer_mode, top=top, limit=cfg.compare.limit)
    return report, layers
