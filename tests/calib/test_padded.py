"""Zero-padded tensors take their statistics from the tensor they pad (trtq.calib.collect.padded): the
collector never runs them (so ONNX Runtime can fold the Pad into its Conv), and where every element
is counted the cache is exactly what measuring them gives; on a per-sample stride the padding zeros
are sampled at the input's rate."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.calib.kernel_paths import require_kernels
from trtq.calib.collect import padded
from trtq.calib.collect.padded import PadLink, pad_links
from trtq.model import calibratable_tensors

SHAPES = {"x": (4, 4, 6, 6)}


def _pad(name, src, pads, opset, value=None, mode=None, axes=None):
    """A Pad node of ``src`` (and its initializers) in the style of ``opset``."""
    kw = {"mode": mode} if mode else {}
    if opset < 11:
        if value is not None:
            kw["value"] = float(value)
        return helper.make_node("Pad", [src], [name], pads=list(pads), **kw), []
    inits = [numpy_helper.from_array(np.array(pads, np.int64), f"{name}_pads")]
    inputs = [src, f"{name}_pads"]
    if value is not None or axes is not None:
        inputs.append("" if value is None else f"{name}_value")
        if value is not None:
            inits.append(numpy_helper.from_array(np.array(value, np.float32), f"{name}_value"))
    if axes is not None:
        inputs.append(f"{name}_axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), f"{name}_axes"))
    return helper.make_node("Pad", inputs, [name], **kw), inits


def _model(opset=13, extra=()) -> onnx.ModelProto:
    """x[N,4,6,6] -> Relu r -> Pad p (H 1/2, W 2/1) -> Conv 3x3 c -> Pad q (W 1/1) -> MaxPool m,
    plus ``extra`` Pad nodes of r: (name, pads, kwargs)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, "w")
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    inits = [w]
    n, i = _pad("p", "r", [0, 0, 1, 2, 0, 0, 2, 1], opset)
    nodes.append(n), inits.extend(i)
    nodes.append(helper.make_node("Conv", ["p", "w"], ["c"]))
    n, i = _pad("q", "c", [0, 0, 0, 1, 0, 0, 0, 1], opset)
    nodes.append(n), inits.extend(i)
    nodes.append(helper.make_node("MaxPool", ["q"], ["m"], kernel_shape=[2, 2]))
    outputs = [helper.make_tensor_value_info("m", TensorProto.FLOAT, None)]
    for name, pads, kw in extra:
        n, i = _pad(name, "r", pads, opset, **kw)
        nodes.append(n), inits.extend(i)
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6, 6])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _links(model):
    return pad_links(model, calibratable_tensors(model), SHAPES)


@pytest.mark.parametrize("opset", [9, 13, 18])
def test_zero_pads_of_calibrated_tensors_are_linked_with_their_zeros_per_sample(opset):
    links = _links(_model(opset))
    # p: 4 x (6+3) x (6+3) - 4 x 6 x 6; q (Conv out 4 x 7 x 7): 4 x 7 x 9 - 4 x 7 x 7
    assert links == {"p": PadLink("r", 4 * 81 - 144), "q": PadLink("c", 4 * 63 - 4 * 49)}


def test_opset_18_axes_name_the_padded_axes():
    extra = [("a", [1, 1, 1, 1], {"axes": [-1, 2]}), ("b", [1, 1], {"axes": [0]})]
    links = _links(_model(18, extra))
    assert links["a"] == PadLink("r", 4 * 8 * 8 - 144)
    assert "b" not in links  # pads the batch axis: measured


@pytest.mark.parametrize("kw", [{"value": 1.0}, {"mode": "reflect"}, {"mode": "edge"}])
def test_pads_that_add_anything_but_zeros_are_measured(kw):
    links = _links(_model(13, [("e", [0, 0, 1, 1, 0, 0, 1, 1], kw)]))
    assert "e" not in links and set(links) == {"p", "q"}


def test_batch_axis_negative_pads_runtime_pads_and_unknown_shapes_are_measured():
    model = _model(13, [("b", [1, 0, 0, 0, 0, 0, 0, 0], {}), ("n", [0, 0, -1, 0, 0, 0, 0, 0], {})])
    assert set(_links(model)) == {"p", "q"}
    model = _model(13, [("e", [0, 0, 1, 1, 0, 0, 1, 1], {})])
    model.graph.node.insert(0, helper.make_node("Mul", ["e_pads", "e_pads"], ["e_pads2"]))  # pads known at run time
    next(n for n in model.graph.node if n.output[0] == "e").input[1] = "e_pads2"
    assert set(_links(model)) == {"p", "q"}
    assert pad_links(_model(13), calibratable_tensors(_model(13)), {}) == {}  # N unknown: nothing proven
    assert pad_links(_model(13), ["p", "q", "c"], SHAPES) == {"q": PadLink("c", 4 * 63 - 4 * 49)}  # r not calibrated


def _data(tmp_path: Path, n=7) -> Path:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 4, 6, 6)).astype(np.float32)
    x[2] *= 20.0
    np.save(tmp_path / "x.npy", x)
    return tmp_path / "x.npy"


def _calibrate(trtq, tmp_path, model, name, *args):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    out = tmp_path / f"{name}.cache"
    r = trtq(
        [
            "calibrate",
            "--model",
            path,
            "--data",
            _data(tmp_path),
            "-o",
            out,
            "--batch-size",
            "4",
            "--save-stats",
            out.with_suffix(".npz"),
            "-q",
            *args,
        ]
    )  # 7 samples: a padded last batch
    assert r.code == 0, r
    return out.read_bytes(), np.load(out.with_suffix(".npz")), json.loads(Path(f"{out}.json").read_text())


def _measured(monkeypatch):
    monkeypatch.setattr(padded, "pad_links", lambda *a, **k: {})


@pytest.mark.parametrize("collect", ["in-graph", "outputs"])
@pytest.mark.parametrize("method", [("mse", "--hist-elements", "0"), ("entropy",), ("max",), ("percentile",)])
def test_every_element_counted_gives_the_cache_of_measuring_them(trtq, tmp_path, monkeypatch, method, collect):
    if collect == "in-graph":
        require_kernels(monkeypatch, "compiled")  # the in-graph operator is part of them
    args = ("--method", *method, "--collect", collect)
    cache, stats, prov = _calibrate(trtq, tmp_path, _model(), "derived", *args)
    assert prov["collection"]["padded_from_input"] == 2
    _measured(monkeypatch)
    cache_m, stats_m, prov_m = _calibrate(trtq, tmp_path, _model(), "measured", *args)
    assert prov_m["collection"]["padded_from_input"] == 0
    if method[0] == "percentile":  # its one-pass histograms are strided on this model: see below
        return
    assert cache == cache_m
    assert set(stats.files) == set(stats_m.files)
    for key in stats.files:
        if key != "header":  # names the run (provenance), not statistics
            assert np.array_equal(stats[key], stats_m[key]), key


def test_on_a_stride_the_padding_zeros_are_sampled_at_the_inputs_rate(trtq, tmp_path):
    _, stats, _ = _calibrate(trtq, tmp_path, _model(), "strided", "--method", "mse", "--hist-elements", "50")
    from trtq.calib.stats import load_stats

    st = load_stats(tmp_path / "strided.npz")
    # r holds 144 elements a sample: stride 3 (the smallest prime, dividing no dim, with 144 / k <= 50)
    # would divide 6; so 5: ceil(144 / 5) = 29 counted a sample; p gains 180 zeros a sample: 36 of them
    assert st.counts["r"].sum() == 7 * 29
    assert st.counts["p"].sum() == 7 * (29 + 36)
    assert st.zeros["p"] == st.zeros["r"] + 7 * 36
    assert np.array_equal(st.counts["p"][1:], st.counts["r"][1:])
    assert st.maxima["p"] == st.maxima["r"] and st.tops["p"] == st.tops["r"]


def test_a_session_runs_no_padded_tensor(monkeypatch, tmp_path):
    """The reason for the rule: the collector's session neither runs a statistics node on nor
    exposes a padded tensor, so ONNX Runtime may fold the Pad into the Conv."""
    from trtq.calib.collect import ingraph

    require_kernels(monkeypatch, "compiled")

    seen = []
    real = ingraph.InGraphCollector.__init__

    def spy(self, model, tensors, *a, **k):
        seen.append(list(tensors))
        real(self, model, tensors, *a, **k)

    monkeypatch.setattr(ingraph.InGraphCollector, "__init__", spy)
    from trtq.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    with pytest.raises(SystemExit) as e:
        main(
            [
                "calibrate",
                "--model",
                str(path),
                "--data",
                str(_data(tmp_path)),
                "-o",
                str(tmp_path / "c.cache"),
                "-q",
                "--batch-size",
                "4",
            ]
        )
    assert e.value.code in (0, None)
    assert seen and all("p" not in t and "q" not in t and "r" in t and "c" in t for t in seen)


@pytest.mark.parametrize("method", ["entropy", "mse"])
def test_shards_of_a_padded_model_merge_to_the_single_run(trtq, tmp_path, method):
    """Each shard derives its padded tensors from its own samples (the zeros add up across shards):
    the merged statistics are the single run's, on a stride (mse) and over [0, max] (entropy)."""
    from tests.calib.test_shard import _sharded
    from trtq.calib.stats import load_stats

    extra = ("--hist-elements", "50") if method == "mse" else ()
    _calibrate(trtq, tmp_path, _model(), "single", "--method", method, *extra)
    stats = _sharded(
        trtq, tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "shards", 2, *extra, batch_sizes=(4, 3), method=method
    )
    single, merged = load_stats(tmp_path / "single.npz"), load_stats(stats)
    assert merged.maxima == single.maxima and merged.zeros == single.zeros
    assert all(np.array_equal(merged.counts[n], single.counts[n]) for n in single.counts)
    assert single.zeros["p"] > single.zeros["r"]
