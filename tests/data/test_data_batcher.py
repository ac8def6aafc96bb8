"""Batcher: determinism, workers, last-batch policies, limit/shuffle, multi-input, skip_bad, shutdown."""

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from trtq.config import DataOptions, InputSource, PreprocessOptions, ResizeOptions
from trtq.data.batcher import Batcher
from trtq.errors import ConfigError, DataError
from trtq.model import input_specs, load_model

from .helpers import SMALL, collect, folder_options, image_folder, noise_rgb, npy_options, save_rgb, spec


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "imgs"
    image_folder(folder, 11)
    return folder


@pytest.fixture
def shards(tmp_path):
    """23 samples of shape (4,) in two shards; sample i is filled with the value i."""
    values = np.repeat(np.arange(23, dtype=np.float32)[:, None], 4, axis=1)
    np.save(tmp_path / "part0.npy", values[:10])
    np.save(tmp_path / "part1.npy", values[10:])
    return [tmp_path / "part*.npy"]


def rows_of(batcher):
    """The first element of every real row, in order (identifies npy samples)."""
    out = []
    for b in batcher:
        out.extend(b.arrays["x"][: b.valid, 0].tolist())
    return out


# ------------------------------------------------------------------------------------ content and determinism


def test_batches_hold_the_preprocessed_images_in_sorted_order(photos):
    b = Batcher(folder_options(photos, batch_size=4), [spec()])
    assert (b.batch_size, b.num_samples, b.num_batches, b.shapes) == (4, 11, 3, {"x": (4, 3, 8, 8)})
    batches = list(b)
    first = batches[0].arrays["x"][1]  # img_001.png
    ref = np.asarray(Image.fromarray(noise_rgb(20, 16, 1)).resize((8, 8), Image.BILINEAR)).astype(np.float64)
    np.testing.assert_allclose(first, (ref / 255).transpose(2, 0, 1), atol=1e-6)
    # batches really differ from each other, and rows within a batch too
    assert not np.array_equal(batches[0].arrays["x"], batches[1].arrays["x"])
    assert not np.array_equal(batches[0].arrays["x"][0], batches[0].arrays["x"][1])


def test_two_passes_and_two_batchers_identical(photos):
    opts = folder_options(photos, batch_size=4)
    b = Batcher(opts, [spec()])
    first, second = collect(b), collect(b)
    assert first == second
    assert collect(Batcher(opts, [spec()])) == first
    assert b.fingerprint() == Batcher(opts, [spec()]).fingerprint()


@pytest.mark.parametrize("prefetch", [1, 3])
def test_worker_count_does_not_change_bytes(photos, prefetch):
    results = [
        collect(Batcher(folder_options(photos, batch_size=3, workers=w, prefetch=prefetch), [spec()]))
        for w in (0, 1, 3)
    ]
    assert results[0] == results[1] == results[2]


def test_shuffle_is_seeded(shards):
    base = rows_of(Batcher(npy_options(shards, batch_size=5), [spec(shape=("N", 4))]))
    assert base == list(range(23))
    s1 = rows_of(Batcher(npy_options(shards, batch_size=5, shuffle=True, seed=1), [spec(shape=("N", 4))]))
    s1b = rows_of(Batcher(npy_options(shards, batch_size=5, shuffle=True, seed=1), [spec(shape=("N", 4))]))
    s2 = rows_of(Batcher(npy_options(shards, batch_size=5, shuffle=True, seed=2), [spec(shape=("N", 4))]))
    assert s1 == s1b
    assert s1 != s2 and s1 != base
    assert sorted(s1) == sorted(s2) == base
    assert s1 == np.random.default_rng(1).permutation(23).tolist()


def test_fingerprint_tracks_order_options_and_files(shards, tmp_path):
    def fp(**kw):
        return Batcher(npy_options(shards, batch_size=5, **kw), [spec(shape=("N", 4))]).fingerprint()

    base = fp()
    assert fp(workers=1, prefetch=2) == base  # how, not what
    assert fp(shuffle=True) != base
    assert fp(limit=10) != base
    np.save(tmp_path / "part1.npy", np.zeros((14, 4), np.float32))  # one more sample
    assert fp() != base


def test_fingerprint_tracks_preprocessing(photos):
    a = Batcher(folder_options(photos, batch_size=4), [spec()]).fingerprint()
    other = replace(SMALL, mean=(0.5,))
    assert Batcher(folder_options(photos, batch_size=4, preprocess=other), [spec()]).fingerprint() != a


# ------------------------------------------------------------------------------------ last batch, limit, batch size


def test_pad_repeats_last_sample(shards):
    batches = list(Batcher(npy_options(shards, batch_size=5), [spec(shape=("N", 4))]))
    assert [b.valid for b in batches] == [5, 5, 5, 5, 3]
    last = batches[-1].arrays["x"][:, 0].tolist()
    assert last == [20, 21, 22, 22, 22]
    assert all(b.arrays["x"].shape == (5, 4) for b in batches)
    assert [b.index for b in batches] == [0, 1, 2, 3, 4]


def test_drop_and_keep(shards):
    drop = Batcher(npy_options(shards, batch_size=5, last_batch="drop"), [spec(shape=("N", 4))])
    assert drop.num_batches == 4 and rows_of(drop) == list(range(20))
    keep = Batcher(npy_options(shards, batch_size=5, last_batch="keep"), [spec(shape=("N", 4))])
    batches = list(keep)
    assert keep.num_batches == 5 and batches[-1].arrays["x"].shape == (3, 4) and batches[-1].valid == 3


def test_keep_needs_dynamic_batch(shards):
    with pytest.raises(DataError, match="last_batch keep .*fixes the batch dim.*use last_batch: pad"):
        Batcher(npy_options(shards, last_batch="keep"), [spec(shape=(5, 4))])


def test_drop_with_too_few_samples(shards):
    with pytest.raises(DataError, match="only 23 samples, fewer than one batch of 32"):
        Batcher(npy_options(shards, batch_size=32, last_batch="drop"), [spec(shape=("N", 4))])


def test_limit_takes_first_n_after_shuffle(shards):
    lim = Batcher(npy_options(shards, batch_size=4, limit=6), [spec(shape=("N", 4))])
    assert (lim.num_samples, lim.num_batches) == (6, 2) and rows_of(lim) == [0, 1, 2, 3, 4, 5]
    sh = Batcher(npy_options(shards, batch_size=4, limit=6, shuffle=True, seed=3), [spec(shape=("N", 4))])
    assert rows_of(sh) == np.random.default_rng(3).permutation(23)[:6].tolist()
    with pytest.raises(ConfigError, match="data.limit must be at least 1"):
        Batcher(npy_options(shards, limit=0), [spec(shape=("N", 4))])


def test_batch_size_defaults_and_conflicts(shards):
    assert Batcher(npy_options(shards), [spec(shape=("N", 4))]).batch_size == 8
    assert Batcher(npy_options(shards), [spec(shape=(5, 4))]).batch_size == 5
    assert Batcher(npy_options(shards, shapes={"x": (3, 4)}), [spec(shape=("N", 4))]).batch_size == 3
    with pytest.raises(
        DataError, match=r"data.batch_size is 4 but the model's fixed batch dim of x is 5; set data.batch_size: 5"
    ):
        Batcher(npy_options(shards, batch_size=4), [spec(shape=(5, 4))])
    with pytest.raises(DataError, match=r"data.batch_size is 4 but data.shapes.x\[0\] is 3"):
        Batcher(npy_options(shards, batch_size=4, shapes={"x": (3, 4)}), [spec(shape=("N", 4))])


def test_dynamic_non_batch_dim_needs_shapes(photos):
    with pytest.raises(DataError, match=r"dynamic dim 2.*data.shapes.x"):
        Batcher(folder_options(photos), [spec(shape=("N", 3, "H", "W"))])
    b = Batcher(folder_options(photos, batch_size=2, shapes={"x": (2, 3, 8, 8)}), [spec(shape=("N", 3, "H", "W"))])
    assert next(iter(b)).arrays["x"].shape == (2, 3, 8, 8)


# ------------------------------------------------------------------------------------ inputs vs model


def test_multi_input_pairs_sample_i(photos, tmp_path):
    np.save(tmp_path / "aux.npy", np.arange(11, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32))
    opts = DataOptions(
        inputs={
            "image": InputSource(images=str(photos), preprocess=SMALL),
            "aux": InputSource(npy=(str(tmp_path / "aux.npy"),)),
        },
        batch_size=4,
    )
    specs = [spec("image"), spec("aux", ("N", 2))]
    b = Batcher(opts, specs)
    batches = list(b)
    assert set(batches[0].arrays) == {"image", "aux"}
    assert batches[1].arrays["aux"][:, 0].tolist() == [4, 5, 6, 7]
    assert batches[2].arrays["aux"][:, 0].tolist() == [8, 9, 10, 10]
    solo = Batcher(folder_options(photos, name="image", batch_size=4), [spec("image")])
    for x, y in zip(batches, solo):
        np.testing.assert_array_equal(x.arrays["image"], y.arrays["image"])


def test_multi_input_counts_must_match(photos, tmp_path):
    np.save(tmp_path / "aux.npy", np.zeros((7, 2), np.float32))
    opts = DataOptions(
        inputs={
            "image": InputSource(images=str(photos), preprocess=SMALL),
            "aux": InputSource(npy=(str(tmp_path / "aux.npy"),)),
        }
    )
    with pytest.raises(DataError, match="different numbers of samples: image=11, aux=7"):
        Batcher(opts, [spec("image"), spec("aux", ("N", 2))])


def test_config_inputs_must_match_model_inputs(photos):
    with pytest.raises(
        DataError,
        match=r"config names images which the model lacks; model input\(s\) x have no data; "
        r"model inputs: x; data.inputs: images",
    ):
        Batcher(folder_options(photos, name="images"), [spec("x")])
    with pytest.raises(DataError, match=r"model input\(s\) mask have no data"):
        Batcher(folder_options(photos), [spec("x"), spec("mask")])
    with pytest.raises(DataError, match="no data configured"):
        Batcher(DataOptions(), [spec("x")])


def test_real_sample_model_input(sample_model, photos):
    specs = input_specs(load_model(sample_model))
    opts = folder_options(
        photos,
        preprocess=PreprocessOptions(
            resize=ResizeOptions(mode="shorter", size=(256,)), center_crop=(224,), mean=(0.5,), std=(0.5,)
        ),
        batch_size=4,
    )
    b = Batcher(opts, specs)
    batch = next(iter(b))
    assert batch.arrays["x"].shape == (4, 3, 224, 224) and batch.arrays["x"].dtype == np.float32
    assert batch.arrays["x"].min() >= -1.0 and batch.arrays["x"].max() <= 1.0


# ------------------------------------------------------------------------------------ bad samples


@pytest.fixture
def photos_with_bad(photos):
    (photos / "img_003b.png").write_bytes(b"garbage, not a png")
    data = save_rgb(photos / "tmp.jpg", 64, 64, fmt="JPEG").read_bytes()
    (photos / "tmp.jpg").unlink()
    (photos / "img_007b.jpg").write_bytes(data[: len(data) // 2])
    return photos


def test_bad_image_stops_without_skip_bad(photos_with_bad):
    b = Batcher(folder_options(photos_with_bad, batch_size=4), [spec()])
    with pytest.raises(DataError, match=r"cannot decode image .*img_003b\.png: .*; remove it or pass --skip-bad"):
        list(b)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_skip_bad_counts_and_is_deterministic(photos_with_bad, photos, workers, tmp_path):
    b = Batcher(folder_options(photos_with_bad, batch_size=4, skip_bad=True, workers=workers), [spec()])
    assert b.num_samples == 13 and b.num_batches == 4  # pre-skip numbers
    got = collect(b)
    assert [valid for _, _, valid, _ in got] == [4, 4, 3]
    assert [p.rsplit("/", 1)[1] for p, _ in b.skipped] == ["img_003b.png", "img_007b.jpg"]
    assert all(reason for _, reason in b.skipped)
    assert collect(b) == got and len(b.skipped) == 2  # reset each pass, not doubled
    clean = tmp_path / "clean"
    image_folder(clean, 11)
    assert collect(Batcher(folder_options(clean, batch_size=4), [spec()])) == got


def test_skip_bad_with_nan_npy_sample(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(6, 2)
    arr[2, 0] = np.nan
    np.save(tmp_path / "n.npy", arr)
    with pytest.raises(DataError, match=r"n\.npy sample 2 has NaN or Inf"):
        list(Batcher(npy_options([tmp_path / "n.npy"], batch_size=2), [spec(shape=("N", 2))]))
    b = Batcher(npy_options([tmp_path / "n.npy"], batch_size=2, skip_bad=True), [spec(shape=("N", 2))])
    assert rows_of(b) == [0, 2, 6, 8, 10]
    assert b.skipped == [(f"{tmp_path / 'n.npy'}[2]", "NaN/Inf values")]


def test_wrong_shape_is_not_skipped(photos):
    exact = replace(SMALL, resize=ResizeOptions(mode="exact", size=(9, 9)))
    opts = folder_options(photos, skip_bad=True, preprocess=exact)
    with pytest.raises(DataError, match=r"preprocesses to \[3, 9, 9\] but input x expects \[3, 8, 8\]"):
        list(Batcher(opts, [spec()]))


# ------------------------------------------------------------------------------------ bounded, clean shutdown


class _CountingSource:
    """Wraps a source and counts loads (to see how far ahead the workers run)."""

    def __init__(self, inner, delay=0.0):
        self.inner, self.delay, self.loads = inner, delay, 0
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def load(self, i):
        with self.lock:
            self.loads += 1
        time.sleep(self.delay)
        return self.inner.load(i)


def _data_threads():
    return [t for t in threading.enumerate() if t.name.startswith("trtq-data")]


def test_prefetch_is_bounded(tmp_path):
    np.save(tmp_path / "big.npy", np.zeros((400, 4), np.float32))
    b = Batcher(npy_options([tmp_path / "big.npy"], batch_size=4, workers=2, prefetch=2), [spec(shape=("N", 4))])
    b.sources["x"] = counting = _CountingSource(b.sources["x"])
    it = iter(b)
    next(it)
    time.sleep(0.2)  # give the workers time to run ahead as far as they are allowed
    assert counting.loads <= 4 + 2 * 4 + 1  # the batch handed out + the window + one refill
    it.close()


def test_consumer_stopping_early_shuts_workers_down(tmp_path):
    np.save(tmp_path / "big.npy", np.zeros((400, 4), np.float32))
    b = Batcher(npy_options([tmp_path / "big.npy"], batch_size=4, workers=3), [spec(shape=("N", 4))])
    b.sources["x"] = _CountingSource(b.sources["x"], delay=0.002)
    for batch in b:
        if batch.index == 2:
            break
    deadline = time.time() + 5
    while _data_threads() and time.time() < deadline:
        time.sleep(0.01)
    assert not _data_threads()


def test_keyboard_interrupt_in_consumer_does_not_hang(tmp_path):
    np.save(tmp_path / "big.npy", np.zeros((400, 4), np.float32))
    b = Batcher(npy_options([tmp_path / "big.npy"], batch_size=4, workers=2), [spec(shape=("N", 4))])
    b.sources["x"] = _CountingSource(b.sources["x"], delay=0.002)
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        for batch in b:
            if batch.index == 1:
                raise KeyboardInterrupt
    assert time.time() - t0 < 5
    assert not _data_threads()


def test_error_in_worker_shuts_down(photos_with_bad):
    with pytest.raises(DataError):
        list(Batcher(folder_options(photos_with_bad, batch_size=2, workers=3), [spec()]))
    assert not _data_threads()


# ------------------------------------------------------------------------------------ describe


def test_describe_is_json_able(photos):
    import json

    b = Batcher(folder_options(photos, batch_size=4, limit=9), [spec()])
    d = json.loads(json.dumps(b.describe()))
    assert d["samples"] == 9 and d["available"] == 11 and d["batches"] == 3 and d["batch_size"] == 4
    assert d["inputs"]["x"]["shape"] == [4, 3, 8, 8]
    assert d["inputs"]["x"]["source"]["kind"] == "images"
    assert d["inputs"]["x"]["source"]["preprocess"]["resize"]["size"] == [8, 8]
    assert d["fingerprint"] == b.fingerprint()


def test_bad_option_values(photos):
    with pytest.raises(ConfigError, match="data.batch_size must be at least 1"):
        Batcher(folder_options(photos, batch_size=0), [spec()])
    with pytest.raises(ConfigError, match="data.prefetch"):
        Batcher(folder_options(photos, prefetch=0), [spec()])


def test_model_input_dtype(photos):
    b = Batcher(folder_options(photos, batch_size=2), [spec(dtype="float16")])
    x = next(iter(b)).arrays["x"]
    ref = next(iter(Batcher(folder_options(photos, batch_size=2), [spec()]))).arrays["x"]
    assert x.dtype == np.float16
    np.testing.assert_array_equal(x, ref.astype(np.float16))
    with pytest.raises(DataError, match="model input x takes uint8 but image preprocessing makes float32"):
        Batcher(folder_options(photos), [spec(dtype="uint8")])


_LEAKED_LOCK = r"""
import os, sys
import numpy as np
import trtq.data.batcher as batcher
from concurrent.futures import ThreadPoolExecutor
from trtq.config import DataOptions, InputSource
from trtq.model import TensorSpec


class Pool(ThreadPoolExecutor):
    calls = 0

    def submit(self, *args, **kwargs):
        Pool.calls += 1
        if Pool.calls == 6:  # Ctrl-C inside Semaphore.acquire, after its lock was taken (Python code)
            self._idle_semaphore._cond.acquire()
            raise KeyboardInterrupt
        return super().submit(*args, **kwargs)


batcher.ThreadPoolExecutor = Pool
opts = DataOptions(inputs={"x": InputSource(npy=(sys.argv[1],))}, batch_size=1, workers=2, prefetch=2)
try:
    for _ in batcher.Batcher(opts, [TensorSpec("x", ("N", 3, 4, 4), "float32")]):
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
    os._exit(0)  # as trtq's CLI leaves: without joining the pool's workers
print("not interrupted", flush=True)
"""


def test_an_interrupt_that_leaves_a_pool_lock_held_does_not_hang(tmp_path):
    """Seen once in 92 signalled calibrations: SIGTERM landed in ThreadPoolExecutor.submit between
    the idle semaphore's lock being taken and released; a worker then waited on that lock and the
    Batcher's pool.shutdown(wait=True) joined it forever (the CLI's watchdog stopped the run 10 s
    later). After an interrupt the Batcher no longer joins its workers."""
    import subprocess
    import sys

    np.save(tmp_path / "x.npy", np.zeros((32, 3, 4, 4), np.float32))
    try:
        p = subprocess.run(
            [sys.executable, "-c", _LEAKED_LOCK, str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the Batcher joined a worker that waits on the lock the interrupt left held")
    assert p.returncode == 0 and p.stdout.strip() == "interrupted", p.stdout + p.stderr
