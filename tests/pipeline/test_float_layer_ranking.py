"""quantize --float-layers: every layer screened on a few samples, the shortlist ranked on
RANK_SAMPLES; on the sample classifier the choice is the one ranking every layer on all of them."""

import dataclasses

import pytest

import trtq.pipeline.quantize as pq
from trtq.calib.cache import read_cache
from trtq.config import load_config
from trtq.model import load_model


@pytest.fixture(scope="module")
def sample_cache(tmp_path_factory):
    from trtq.cli import main

    out = tmp_path_factory.mktemp("rank") / "c.cache"
    with pytest.raises(SystemExit) as done:
        main(["calibrate", "--config", "configs/sample.yaml", "-o", str(out), "-q"])
    assert done.value.code in (0, None)
    return out


def test_screened_ranking_chooses_what_ranking_every_layer_chooses(sample_cache, monkeypatch):
    import trtq.compare.sensitivity as sensitivity

    cfg = load_config("configs/sample.yaml", {})
    model, amax = load_model(cfg.model), read_cache(sample_cache).amax
    options = dataclasses.replace(cfg.quantize, float_layers=3, samples=16)
    calls = []
    real = sensitivity.per_layer_sensitivity

    def counted(*args, **kwargs):
        rows = real(*args, **kwargs)
        calls.append((kwargs["limit"], len(rows), kwargs.get("layers")))
        return rows

    monkeypatch.setattr(sensitivity, "per_layer_sensitivity", counted)
    screened = pq.choose_float_layers(model, amax, options, pq.sample_batches(model, options, cfg.data))
    (screen_limit, screen_rows, _), (rank_limit, _, shortlist) = calls
    assert (screen_limit, rank_limit) == (8, 16) and screen_rows > 9 and len(shortlist) == 9
    monkeypatch.setattr(pq, "SCREEN_SAMPLES", pq.RANK_SAMPLES)  # no screen: every layer on every sample
    full = pq.choose_float_layers(model, amax, options, pq.sample_batches(model, options, cfg.data))
    assert sorted(screened) == sorted(full) and len(full) == 3


def test_per_layer_ranks_only_the_layers_asked_for(sample_cache):
    from trtq.compare.sensitivity import per_layer_sensitivity

    cfg = load_config("configs/sample.yaml", {})
    model, amax = load_model(cfg.model), read_cache(sample_cache).amax
    options = dataclasses.replace(cfg.quantize, samples=8)
    rows = per_layer_sensitivity(
        model,
        amax,
        options,
        pq.sample_batches(model, dataclasses.replace(options, float_layers=1), cfg.data),
        limit=8,
        layers=["Conv.3", "Conv.1", "not_a_layer"],
    )
    assert sorted(r.node for r in rows) == ["Conv.1", "Conv.3"]
