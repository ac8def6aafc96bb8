"""trtq.data.in_memory: the Batcher's batches, byte for byte, from data in memory."""

from __future__ import annotations

import numpy as np
import pytest

from tests.api.tiny import two_input_model, write_npy_config
from trtq.data.in_memory import InMemoryBatches
from trtq.errors import DataError
from trtq.model import TensorSpec

SPECS = [TensorSpec("a", ("N", 4, 16), "float32"), TensorSpec("b", ("N", 4, 16), "float32")]


def test_the_batches_are_the_batchers_batches(tmp_path):
    from trtq.config import load_config
    from trtq.data.batcher import Batcher

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(19, 4, 16)).astype(np.float32), rng.normal(size=(19, 4, 16)).astype(np.float32)
    config = write_npy_config(tmp_path, two_input_model(tmp_path / "m.onnx"), {"a": a, "b": b}, "mse")
    batcher = Batcher(load_config(config, environ={}).data, SPECS)
    mine = InMemoryBatches([{"a": a[i : i + 3], "b": b[i : i + 3]} for i in range(0, 19, 3)], SPECS)
    theirs = list(batcher)
    ours = list(mine)
    assert [(x.index, x.valid) for x in ours] == [(x.index, x.valid) for x in theirs] == [(0, 8), (1, 8), (2, 3)]
    for x, y in zip(ours, theirs):
        for name in ("a", "b"):
            assert x.arrays[name].dtype == y.arrays[name].dtype
            assert x.arrays[name].tobytes() == y.arrays[name].tobytes()  # padding rows included
    assert (mine.num_samples, mine.num_batches, mine.shapes) == (19, 3, {"a": (8, 4, 16), "b": (8, 4, 16)})
    assert len(mine.fingerprint()) == 64


def test_a_list_is_read_again_and_a_generator_says_it_cannot_be():
    arrays = [np.ones((4, 4, 16))] * 3
    specs = SPECS[:1]
    listed = InMemoryBatches(arrays, specs, batch_size=5)
    assert [b.valid for b in listed] == [b.valid for b in listed] == [5, 5, 2]
    generated = InMemoryBatches(iter(arrays), specs, batch_size=5)
    assert [b.valid for b in generated] == [5, 5, 2]
    with pytest.raises(DataError, match="generator") as e:
        list(generated)
    assert "\n" not in str(e.value)


def test_a_fixed_batch_dim_sets_the_batch_size_and_must_be_kept():
    specs = [TensorSpec("x", (4, 3), "float32")]
    assert InMemoryBatches([np.zeros((6, 3))], specs).batch_size == 4
    with pytest.raises(DataError, match="the model fixes the batch dim to 4"):
        InMemoryBatches([np.zeros((6, 3))], specs, batch_size=8)


def test_one_array_or_one_dict_is_all_the_samples():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(10, 4, 16)).astype(np.float32), rng.normal(size=(10, 4, 16)).astype(np.float32)
    whole = list(InMemoryBatches({"a": a, "b": b}, SPECS))
    parts = list(InMemoryBatches([{"a": a[:3], "b": b[:3]}, {"a": a[3:], "b": b[3:]}], SPECS))
    assert [(x.valid, x.arrays["a"].tobytes(), x.arrays["b"].tobytes()) for x in whole] == [
        (x.valid, x.arrays["a"].tobytes(), x.arrays["b"].tobytes()) for x in parts
    ]
    assert [x.valid for x in InMemoryBatches(a, SPECS[:1], batch_size=4)] == [4, 4, 2]


def test_a_limit_takes_the_first_samples_and_keeps_a_generators():
    arrays = [np.full((3, 4, 16), float(i), np.float32) for i in range(5)]
    for data in (arrays, iter(arrays)):
        source = InMemoryBatches(data, SPECS[:1], batch_size=4, limit=7)
        for _ in range(2):  # a generator's first 7 samples are kept for every pass
            batches = list(source)
            assert [b.valid for b in batches] == [4, 3]
            assert [float(v) for v in np.concatenate([b.arrays["a"][: b.valid] for b in batches])[:, 0, 0]] == [
                0,
                0,
                0,
                1,
                1,
                1,
                2,
            ]
