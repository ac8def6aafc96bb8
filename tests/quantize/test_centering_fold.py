"""The engine form of centred activations (trtq.quantize.centering_fold).

The folded Q/DQ model must compute what the Add form computes (ONNX Runtime, Q/DQ semantics), with
no activation and no Add left where only clamp-commuting ops lie before the quantizer, the Add
moved behind an averaging op, and nothing folded where the quantizer's clamp is not the activation.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import trtq.quantize.centering_fold as centering_fold
from tests.quantize.conftest import activation_amax, run
from tests.quantize.test_centering import _centrings, _chain, _feeds
from trtq.config import QuantizeOptions
from trtq.quantize import quantize_model


def _both_forms(model, amax, monkeypatch, **options):
    """(engine form, Add form) of the centred Q/DQ model; the Add form skips the fold step."""
    opts = QuantizeOptions(center_activations=True, **options)
    folded = quantize_model(model, amax, opts)
    with monkeypatch.context() as m:
        m.setattr(centering_fold, "fold_centrings", lambda model, centrings: {})
        added = quantize_model(model, amax, opts)
    return folded, added


def _ops(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize(
    "act,pad,producer",
    [("clip", False, "conv"), ("relu", False, "bn"), ("clip", True, "conv"), ("clip", False, "conv without bias")],
)
def test_engine_form_computes_the_add_form(act, pad, producer, monkeypatch):
    model = _chain(np.random.default_rng(0), act=act, pad=pad, producer=producer.split()[0])
    if producer == "conv without bias":  # folding gives conv0 a bias of -c per output channel
        del model.graph.node[0].input[2]
    amax = activation_amax(model, _feeds(np.random.default_rng(1)))
    folded, added = _both_forms(model, amax, monkeypatch)
    forms = {c["tensor"]: c["form"] for c in folded.centred}
    assert forms == dict({} if pad else {"a0": "fold"}, a1="fold", f="move", ha="fold")
    onnx.checker.check_model(folded.model)
    # Add form: one Add per centring; engine form: only the one moved behind the pooling, and the
    # activations of the folded ones gone (act0 unless a Pad reads it, act1 and the Gemm's act2;
    # the pooled Relu stays)
    assert _ops(added.model).count("Add") == len(forms) and _ops(folded.model).count("Add") == 1
    names = {n.name for n in folded.model.graph.node}
    assert not ({"act1", "act2"} | ({"act0"} if not pad else set())) & names and "act3" in names
    gap = next(n for n in folded.model.graph.node if n.op_type == "GlobalAveragePool")
    assert next(n for n in folded.model.graph.node if n.op_type == "Add").input[0] == gap.output[0] or _ops(
        folded.model
    ).index("Add") > _ops(folded.model).index("GlobalAveragePool")
    feeds = _feeds(np.random.default_rng(7), n=3)
    # the same INT8 levels at every quantizer, but where float rounding of (y + b) - c against
    # y + (b - c) lands on the other side of a rounding tie (one level)
    # (and the flips they cause downstream): 0.1% of the levels here
    for f in feeds:
        levels_a, levels_b = _levels(added.model, f), _levels(folded.model, f)
        assert levels_a.keys() == levels_b.keys()
        d = np.concatenate(
            [np.abs(la.astype(np.int32) - levels_b[k].astype(np.int32)).ravel() for k, la in levels_a.items()]
        )
        # without a bias of its own, conv0 writes y - c in one rounding where the Add form rounds twice:
        # 0.2-0.3% of a0's levels sit on the other side of a tie, and their flips cascade downstream
        bound = 1e-2 if producer == "conv without bias" else 5e-3
        assert d.max() <= 1 and (d > 0).mean() <= bound, (int(d.max()), float((d > 0).mean()))
    ref = np.concatenate([run(model, f)[0] for f in feeds])
    a = np.concatenate([run(added.model, f)[0] for f in feeds])
    span = float(ref.max() - ref.min())
    assert np.abs(a - ref).max() > 1e-3 * span  # the models are INT8 (the level check can fail)
    used = {i for n in folded.model.graph.node for i in n.input}
    assert [i.name for i in folded.model.graph.initializer if i.name not in used] == []


def test_fold_needs_the_clamp_to_be_the_activation(monkeypatch):
    """A quantizer coarser than the centred range clamps later than the activation: folding would
    change the function, so the Add form stays (nothing lies between it and the quantizer)."""
    model = _chain(np.random.default_rng(0), pad=False)
    amax = activation_amax(model, _feeds(np.random.default_rng(1)))
    _, added = _both_forms(model, amax, monkeypatch)
    qdq = added.model
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "a0")
    scale = next(i for i in qdq.graph.initializer if i.name == q.input[1])
    dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    assert dq.input[1] == q.input[1]  # one scale for the pair: doubling it keeps the pair consistent
    doubled = numpy_helper.to_array(scale) * np.float32(2)
    scale.CopyFrom(numpy_helper.from_array(np.asarray(doubled, np.float32), scale.name))
    feeds = _feeds(np.random.default_rng(7))
    before = [run(qdq, f)[0] for f in feeds]
    _, centrings = _centrings(model, amax)  # the centrings, as quantize_model finds them
    forms = centering_fold.fold_centrings(qdq, centrings)
    assert forms["a0"] == "kept" and forms["a1"] == "fold"
    assert "act0" in {n.name for n in qdq.graph.node}
    for b, f in zip(before, feeds):
        np.testing.assert_allclose(run(qdq, f)[0], b, rtol=1e-4, atol=1e-4)


def _levels(model, feeds) -> dict:
    """The INT8 output of every activation QuantizeLinear, keyed by the tensor it quantizes."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    qs = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    for q in qs:
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(q.output[0]))
    outs = run(m, feeds)[-len(qs) :]
    return {q.input[0]: o for q, o in zip(qs, outs)}


@pytest.mark.parametrize("placement", ["fused", "shared"])
def test_centring_with_another_placement_is_refused(placement):
    """The engine form above was found wrong with the fused pairs (levels up to 148 apart from the
    Add form) and quantizing other tensors with the shared ones: refused (exit 2) until it is not."""
    from trtq.errors import UsageError

    model = _chain(np.random.default_rng(0), act="clip", pad=False, producer="conv")
    amax = activation_amax(model, _feeds(np.random.default_rng(1)))
    with pytest.raises(UsageError, match=f"does not combine with --placement {placement}"):
        quantize_model(model, amax, QuantizeOptions(center_activations=True, placement=placement))
