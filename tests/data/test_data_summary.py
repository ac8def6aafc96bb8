"""summarize(): statistics over real rows only, counts, JSON-able output."""

import json

import numpy as np

from trtq.data.batcher import Batcher
from trtq.data.summary import summarize

from .helpers import npy_options, spec


def test_summary_matches_numpy_over_real_rows(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, (23, 5)).astype(np.float32)
    data[22] = 1000.0  # the last sample is repeated as padding: it must count once
    np.save(tmp_path / "d.npy", data)
    b = Batcher(npy_options([tmp_path / "d.npy"], batch_size=4), [spec(shape=("N", 5))])
    s = summarize(b)
    assert (s.batches, s.samples, s.padded_rows, s.skipped) == (6, 23, 1, [])
    (x,) = s.inputs
    ref = data.astype(np.float64)
    assert x.name == "x" and x.shape == (4, 5) and x.dtype == "float32"
    assert x.min == ref.min() and x.max == ref.max() == 1000.0
    np.testing.assert_allclose([x.mean, x.std], [ref.mean(), ref.std()], rtol=1e-12)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["samples"] == 23 and d["padded_rows"] == 1 and d["inputs"][0]["shape"] == [4, 5]
    assert d["samples_per_second"] > 0 and s.seconds > 0
    assert "padded rows 1" in s.render_text() and "std" in s.render_text()


def test_summary_reports_skipped(tmp_path):
    data = np.ones((6, 2), np.float32)
    data[1, 1] = np.nan
    np.save(tmp_path / "n.npy", data)
    b = Batcher(npy_options([tmp_path / "n.npy"], batch_size=2, skip_bad=True), [spec(shape=("N", 2))])
    s = summarize(b)
    assert s.samples == 5 and s.padded_rows == 1 and len(s.skipped) == 1
    assert s.to_dict()["skipped"][0]["path"].endswith("n.npy[1]")
    assert "skipped" in s.render_text()
