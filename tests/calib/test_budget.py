"""--max-memory (tensor groups, trtq.calib.collect.budget / groups) and fixed-batch-1 models fed in batches
(trtq.calib.collect.batch_one): the caches are byte-identical to the plain path, bad sizes are one-line errors."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.calib.collect import budget
from trtq.errors import ConfigError, UsageError
from trtq.input_override import override_input_shapes


@pytest.mark.parametrize(
    "text,size",
    [
        ("2G", 2 << 30),
        ("512M", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("64k", 64 << 10),
        ("1048576", 1 << 20),
        (" 3 MB ", 3 << 20),
        (4096, 4096),
    ],
)
def test_parse_size(text, size):
    assert budget.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2X", "-1G", "0", "G", "1.2.3M", "inf"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError):
        budget.parse_size(text)


def test_default_budget_is_a_quarter_of_available(monkeypatch):
    monkeypatch.setattr(budget, "available_memory", lambda: 8 << 30)
    assert budget.resolve_budget(None) == 2 << 30
    monkeypatch.setattr(budget, "available_memory", lambda: None)
    assert budget.resolve_budget(None) == 4 << 30
    assert budget.resolve_budget("1G") == 1 << 30


def test_plan_groups_contiguous_and_bounded():
    sizes = {f"t{i}": s for i, s in enumerate([5, 5, 3, 8, 1, 1, 9])}
    assert budget.plan_groups(sizes, 100, 8) == [list(sizes)]
    groups = budget.plan_groups(sizes, 10, 8)
    assert [n for g in groups for n in g] == list(sizes)
    assert all(sum(sizes[n] for n in g) <= 10 for g in groups)
    with pytest.raises(UsageError, match="raise --max-memory to at least"):
        budget.plan_groups(sizes, 8, 8)


def _sample_args(sample_model, sample_images, out, *extra):
    return [
        "calibrate",
        "--model",
        sample_model,
        "--data",
        sample_images,
        "--preprocess",
        "imagenet",
        "--limit",
        "8",
        "--batch-size",
        "4",
        "-o",
        out,
        *extra,
    ]


@pytest.mark.parametrize("method", ["mse", "max"])
def test_budgets_give_the_same_cache(trtq, sample_model, sample_images, tmp_path, method):
    """The sample model's activations take ~37 MB a sample (batch of 4): 80M holds two rows, so each
    batch runs in two calls of every tensor (one model pass); 12M not even one row, so the tensors
    are grouped too. Both give the unbounded run's cache and statistics, byte for byte."""
    ref = tmp_path / "ref.cache"
    r = trtq(_sample_args(sample_model, sample_images, ref, "--method", method, "--save-stats", tmp_path / "ref.npz"))
    assert r.code == 0, r
    ref_prov = json.loads((tmp_path / "ref.cache.json").read_text())
    assert ref_prov["collection"]["tensor_groups"] == 1 and ref_prov["collection"]["rows_per_call"] is None
    a = np.load(tmp_path / "ref.npz")
    for size in ("80M", "12M"):
        out = tmp_path / f"{size}.cache"
        # --collect outputs: the budget bounds exposed activations (mse's default, in-graph, has none;
        # so for mse this also holds the two collections to the same statistics)
        r = trtq(
            _sample_args(
                sample_model,
                sample_images,
                out,
                "--method",
                method,
                "--max-memory",
                size,
                "--save-stats",
                tmp_path / f"{size}.npz",
                "--collect",
                "outputs",
            )
        )
        assert r.code == 0, r
        assert ref.read_bytes() == out.read_bytes()
        b = np.load(tmp_path / f"{size}.npz")
        assert np.array_equal(a["counts"], b["counts"]) and np.array_equal(a["maxima"], b["maxima"])
        prov = json.loads((tmp_path / f"{size}.cache.json").read_text())["collection"]
        if size == "80M":
            assert prov["tensor_groups"] == 1 and prov["rows_per_call"] == 2
        else:
            assert prov["tensor_groups"] > 3 and prov["rows_per_call"] == 1


def test_rows_within():
    assert budget.rows_within(100, 4, 1000) == 4  # fits: every row
    assert budget.rows_within(100, 4, 50) == 2
    assert budget.rows_within(100, 4, 49) == 1  # 25 bytes a row
    assert budget.rows_within(100, 4, 10) == 1  # not even one row: grouping takes over
    assert budget.rows_within(101, 4, 52) == 2  # a row rounds up (26 bytes)
    assert budget.rows_within(800, 8, 600) == 4  # 6 rows fit; slices of one shape: a divisor of 8
    assert budget.rows_within(700, 7, 600) == 1  # 7 is prime


@pytest.mark.parametrize(
    "size,needle",
    [("2X", "must be a size such as 2G"), ("0", "must be positive"), ("1K", "raise --max-memory to at least")],
)
def test_max_memory_errors_are_one_line_exit_2(trtq, sample_model, sample_images, tmp_path, size, needle):
    r = trtq(
        _sample_args(sample_model, sample_images, tmp_path / "c.cache", "--max-memory", size, "--collect", "outputs")
    )
    assert r.code == 2, r
    assert needle in r.err and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    assert not (tmp_path / "c.cache").exists()


def test_max_memory_config_key(trtq, sample_model, sample_images, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("calibrate:\n  max_memory: 3Q\n")
    args = _sample_args(sample_model, sample_images, tmp_path / "c.cache")
    r = trtq([args[0], "--config", cfg, *args[1:]])
    assert r.code == 2 and "3Q" in r.err, r


def test_fixed_batch_1_model_fed_in_batches_gives_the_same_cache(trtq, sample_model, sample_images, tmp_path):
    one = tmp_path / "b1.onnx"
    onnx.save(override_input_shapes(onnx.load(str(sample_model)), {"x": [1, 3, 224, 224]}, "m"), str(one))
    base = [
        "calibrate",
        "--model",
        one,
        "--data",
        sample_images,
        "--preprocess",
        "imagenet",
        "--limit",
        "12",
        "--method",
        "mse",
    ]
    r = trtq([*base, "-o", tmp_path / "batched.cache"])
    assert r.code == 0, r
    r = trtq([*base, "-o", tmp_path / "single.cache", "--batch-size", "1"])
    assert r.code == 0, r
    assert (tmp_path / "batched.cache").read_bytes() == (tmp_path / "single.cache").read_bytes()
    prov = json.loads((tmp_path / "batched.cache.json").read_text())
    assert prov["collection"]["fixed_batch_1"] == "batched"
    assert prov["data"]["batch_size"] == 8 and prov["model"]["inputs"][0]["shape"][0] == 1
    assert json.loads((tmp_path / "single.cache.json").read_text())["collection"]["fixed_batch_1"] is None


@pytest.mark.parametrize("rows_fit,mode", [(1, "per-sample"), (2, "batched")])
def test_fixed_batch_1_probe_stays_within_the_memory_target(
    trtq, sample_model, sample_images, tmp_path, monkeypatch, rows_fit, mode
):
    """A batch of 8 over --max-memory: the probe runs the rows one call would run (2 here), never the
    whole batch; where one row is all that fits, nothing is probed and samples go one per call.
    Either way the cache is the one-sample-per-call cache, byte for byte."""
    from trtq.calib.collect import batch_one
    from trtq.calib.collect.exposed import select_tensors

    one = tmp_path / "b1.onnx"
    model = override_input_shapes(onnx.load(str(sample_model)), {"x": [1, 3, 224, 224]}, "m")
    onnx.save(model, str(one))
    shapes = {"x": (batch_one.BATCH, 3, 224, 224)}  # as trtq estimates it: the widened model, a batch of 8
    wide = batch_one.widened(model)
    per_row = sum(budget.tensor_bytes(wide, select_tensors(model), shapes).values()) // batch_one.BATCH
    limit = f"{(rows_fit * per_row + per_row // 2) // 1024}K"  # rows_fit rows fit, one more does not
    probed = []

    def spy(*args, **kwargs):
        probed.append(args[-1])
        return real(*args, **kwargs)

    real = batch_one.probe
    monkeypatch.setattr(batch_one, "probe", spy)
    base = ["calibrate", "--model", one, "--data", sample_images, "--preprocess", "imagenet", "--limit", "8"]
    r = trtq([*base, "--max-memory", limit, "-o", tmp_path / "a.cache"])
    assert r.code == 0, r
    assert probed == ([] if rows_fit == 1 else [2])
    assert json.loads((tmp_path / "a.cache.json").read_text())["collection"]["fixed_batch_1"] == mode
    r = trtq([*base, "--batch-size", "1", "-o", tmp_path / "b.cache"])
    assert r.code == 0, r
    assert (tmp_path / "a.cache").read_bytes() == (tmp_path / "b.cache").read_bytes()


def _reshape_model(path):
    """x[1,4] -> Reshape to the constant [1, 4] -> Relu: cannot take a batch of 8."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.array([1, 4], dtype=np.int64), "shape")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


def test_fixed_batch_1_model_that_cannot_batch_falls_back(trtq, tmp_path, caplog):
    _reshape_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(0, 1, (10, 1, 4)).astype(np.float32)[:, 0])
    r = trtq(
        [
            "calibrate",
            "--model",
            tmp_path / "m.onnx",
            "--data",
            tmp_path / "x.npy",
            "-o",
            tmp_path / "a.cache",
            "--method",
            "entropy",
        ]
    )
    assert r.code == 0, r
    assert json.loads((tmp_path / "a.cache.json").read_text())["collection"]["fixed_batch_1"] == "per-sample"
    r = trtq(
        [
            "calibrate",
            "--model",
            tmp_path / "m.onnx",
            "--data",
            tmp_path / "x.npy",
            "-o",
            tmp_path / "b.cache",
            "--method",
            "entropy",
            "--batch-size",
            "1",
        ]
    )
    assert r.code == 0, r
    assert (tmp_path / "a.cache").read_bytes() == (tmp_path / "b.cache").read_bytes()


def test_probe_mismatch_keeps_one_sample_per_call(trtq, sample_model, sample_images, tmp_path, monkeypatch):
    from trtq.calib.collect import batch_one

    monkeypatch.setattr(batch_one, "probe", lambda *a, **k: (False, "'t' of sample 0 differs"))
    one = tmp_path / "b1.onnx"
    onnx.save(override_input_shapes(onnx.load(str(sample_model)), {"x": [1, 3, 224, 224]}, "m"), str(one))
    r = trtq(
        [
            "calibrate",
            "--model",
            one,
            "--data",
            sample_images,
            "--preprocess",
            "imagenet",
            "--limit",
            "3",
            "-o",
            tmp_path / "c.cache",
        ]
    )
    assert r.code == 0, r
    prov = json.loads((tmp_path / "c.cache.json").read_text())
    assert prov["collection"]["fixed_batch_1"] == "per-sample" and prov["data"]["batch_size"] == 1


def _relu_chain(batch_dim):
    """x [batch_dim, 64] -> Relu -> Neg -> Relu: three 256-byte-a-row tensors."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 64])
    y = helper.make_tensor_value_info("c", TensorProto.FLOAT, [batch_dim, 64])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
    ]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("batch_dim,rows,groups", [("N", 2, 1), (4, 4, 3)])
def test_slices_only_where_the_batch_dim_is_free(batch_dim, rows, groups):
    """A free batch dim: 2 of 4 rows per call (three tensors of 256 B a row, a 1600 B budget), every
    tensor in one call; a batch fixed at 4: whole batches, tensors in groups. Both give the values of
    an unbounded run, row for row."""
    from trtq.calib.collect.budgeted import GroupedCollector

    model = _relu_chain(batch_dim)
    x = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
    col = GroupedCollector(model, ["a", "b", "c"], ["CPUExecutionProvider"], 1600, {"x": (4, 64)})
    assert (col.rows_per_call, len(col.groups)) == (rows, groups)
    parts = list(col.run_groups({"x": x}))
    assert len(parts) == (4 // rows) * groups
    assert all(v.shape[0] == rows for p in parts for v in p.values())
    out = col.run({"x": x})
    np.testing.assert_array_equal(out["a"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["c"], np.maximum(-np.maximum(x, 0), 0))
    if batch_dim == "N":  # padding rows past `valid` are not run
        assert sum(v.shape[0] for p in col.run_groups({"x": x}, valid=3) for k, v in p.items() if k == "a") == 3


def test_slices_start_below_the_budget_when_no_budget_is_given():
    """Without --max-memory a batch is sliced above SLICE_TARGET (no extra pass), while tensor
    groups (a pass each) wait for the budget itself; a given --max-memory is both."""
    from trtq.calib.collect.budgeted import GroupedCollector

    assert budget.slice_target(None, 8 << 30) == budget.SLICE_TARGET
    assert budget.slice_target(None, 256 << 20) == 256 << 20
    assert budget.slice_target("4G", 4 << 30) == 4 << 30
    model = _relu_chain("N")  # 768 bytes a row
    col = GroupedCollector(model, ["a", "b", "c"], ["CPUExecutionProvider"], 1 << 20, {"x": (4, 64)}, slice_at=1600)
    assert (col.rows_per_call, len(col.groups)) == (2, 1)
    col = GroupedCollector(model, ["a", "b", "c"], ["CPUExecutionProvider"], 1 << 20, {"x": (4, 64)})
    assert (col.rows_per_call, len(col.groups)) == (4, 1)


def test_probe_finds_the_batch_on_another_axis_for_the_data_steps():
    """[T, N, C] behind a Transpose (an LSTM's layout): not batched along dim 0, so calibration's
    per-sample statistics keep one sample per call; quantize's data steps (any_axis) batch it."""
    from onnx import TensorProto, helper, numpy_helper

    from trtq.calib.collect import batch_one
    from trtq.data.batcher import Batch

    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 1, (6, 5)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["x"], ["tnc"], perm=[1, 0, 2]),
            helper.make_node("MatMul", ["tnc", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 5])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    wide = batch_one.widened(model)
    x = np.random.default_rng(1).normal(0, 1, (8, 4, 6)).astype(np.float32)
    batch = Batch(0, {"x": x}, 8)
    same, why = batch_one.probe(model, wide, ["tnc", "y"], (), 1 << 30, batch)
    assert not same and "not batched along dim 0" in why
    same, why = batch_one.probe(model, wide, ["tnc", "y"], (), 1 << 30, batch, any_axis=True)
    assert same and "bit-identical on 8 samples" in why, why
