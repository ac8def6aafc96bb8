"""trtq.calib.collect.replay keeps pass 1's batches for pass 2 within its disk budget, also for a
source whose length is not known ahead (in-memory data from a generator)."""

from __future__ import annotations

import numpy as np

from trtq.calib.collect.replay import ReplayedBatches
from trtq.data.in_memory import InMemoryBatches
from trtq.model import TensorSpec

SPECS = [TensorSpec("x", ("N", 4), "float32")]


def generator(batches: int):
    return (np.full((8, 4), float(i), np.float32) for i in range(batches))


def test_pass_2_replays_pass_1_within_the_budget():
    source = InMemoryBatches(generator(3), SPECS)
    with ReplayedBatches(source, budget=3 * 8 * 4 * 4) as replay:  # exactly three batches of float32
        first = [b.arrays["x"].copy() for b in replay.first()]
        second = [b.arrays["x"] for b in replay.second()]  # the generator is not read again
    assert [a.tobytes() for a in second] == [a.tobytes() for a in first]


def test_a_source_of_unknown_length_stops_keeping_at_the_budget():
    source = InMemoryBatches(generator(3), SPECS)
    assert source.num_batches == 0  # a generator has no len: the disk check ahead sees one batch
    with ReplayedBatches(source, budget=2 * 8 * 4 * 4) as replay:
        assert len(list(replay.first())) == 3
        assert not replay.enabled and replay._file is None  # nothing past the budget stays on disk
