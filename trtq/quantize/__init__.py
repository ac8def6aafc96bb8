"""FP32 ONNX + amax table -> explicit Q/DQ ONNX for TensorRT (8.6, 10 and 11).

``quantize_model`` runs four steps, one module each:

- :mod:`~trtq.quantize.prepare`: normalised copy (opset >= 13, Constant weights as initializers,
  node names);
- :mod:`~trtq.quantize.plan` with the table in :mod:`~trtq.quantize.rules`: which node inputs get
  Q/DQ and with which scale (:mod:`~trtq.quantize.scales`);
- :mod:`~trtq.quantize.centering` (``options.center_activations``): one-sided activations feeding
  quantized layers shifted to use both halves of INT8 (an exact float rewrite, then re-planned);
- :mod:`~trtq.quantize.rewrite`: the QuantizeLinear/DequantizeLinear pairs, with stable names;
- :mod:`~trtq.quantize.rounding` (``options.weight_rounding == "gptq"`` with data): weight levels
  chosen for each layer's output error instead of nearest;
- :mod:`~trtq.quantize.bias` (``options.bias_correction`` with data): biases corrected for the
  mean shift of weight rounding, on the float graph (before the FP16 cast);
- :mod:`~trtq.quantize.reconstruct` (``options.reconstruct`` with data, needs torch): weight
  rounding and activation steps learned block by block with the activations quantized;
- :mod:`~trtq.quantize.fp16` (``options.fp16``): the float rest cast to float16.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

import onnx

from trtq import callable_package
from trtq.config import QuantizeOptions
from trtq.errors import CacheError, ModelError, UsageError
from trtq.formatting import first_few
from trtq.model import QUANTIZED_OPS, is_quantized
from trtq.qdq_info import read_qdq
from trtq.quantize.affine_fold import fold_affine
from trtq.quantize.fp16 import cast_float_rest
from trtq.quantize.graph import GraphIndex, default_opset
from trtq.quantize.plan import make_plan
from trtq.quantize.prepare import prepare_model
from trtq.quantize.rewrite import insert_qdq
from trtq.quantize.scales import check_amax


@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    quantized: list[str]  # node names that got Q/DQ on their inputs, in graph order
    left_float: list[tuple[str, str]]  # (node name, reason) for quantizable nodes kept float
    missing_amax: list[str]  # activation tensors the rules needed but amax lacked
    notes: list[str] = field(default_factory=list)  # what preparing the model changed
    qdq_pairs: int = 0  # QuantizeLinear/DequantizeLinear pairs inserted
    centred: list[dict] = field(default_factory=list)  # center_activations: tensor, shift, amax
    learned_amax: dict[str, float] = field(default_factory=dict)  # reconstruct: tensor -> learned amax

    def to_dict(self) -> dict:
        return {
            "quantized": list(self.quantized),
            "left_float": [{"node": n, "reason": r} for n, r in self.left_float],
            "missing_amax": list(self.missing_amax),
            "notes": list(self.notes),
            "qdq_pairs": self.qdq_pairs,
            "centred": list(self.centred),
            # the activation tensors the model quantizes, with 127 x their scale (what trtq report reads)
            "activations": dict(read_qdq(self.model).activations),
            "opset": default_opset(self.model),
            **({"learned_amax": dict(self.learned_amax)} if self.learned_amax else {}),
        }


def _tensor_names(graph: onnx.GraphProto) -> set:
    names = {v.name for v in graph.input} | {v.name for v in graph.output}
    names |= {i.name for i in graph.initializer}
    for node in graph.node:
        names.update(node.output)
    return names


def quantize_model(
    model: onnx.ModelProto,
    amax: Mapping[str, float],
    options: Optional[QuantizeOptions] = None,
    only_nodes: Optional[Collection[str]] = None,
    data: Optional[Iterable] = None,
    float_grouped_consumers: bool = False,
    keep_float: Optional[Mapping[str, str]] = None,
) -> QuantizeResult:
    """Explicit INT8 Q/DQ copy of an FP32 ``model``; ``amax`` maps tensor names to amax.

    ``only_nodes`` restricts quantization to those node names (per-layer sensitivity).
    ``data`` (batches, e.g. a Batcher; iterated once per step) feeds gptq weight rounding and bias
    correction when the options ask for them; without it neither runs.
    ``float_grouped_consumers``: also leave float the quantized layers a grouped Conv left float
    (--exclude / float_layers) feeds (what TensorRT 8 needs, see :mod:`~trtq.quantize.float_choice`).
    ``keep_float``: layers to leave float, name -> reason: the ``float_layers`` choice, made by the
    caller (:func:`trtq.pipeline.quantize.choose_float_layers` ranks the layers with compare's
    per-layer sensitivity, which itself runs this function). The input model is not modified.
    """
    options = options if options is not None else QuantizeOptions()
    _refuse_unfit(model, amax)
    check_reconstruct_options(options)
    check_centering_options(options)
    prepared, notes = prepare_model(model)
    if options.center_activations and options.center_padded:
        from trtq.quantize.centering_border import fold_zero_pads

        fold_zero_pads(prepared)  # a zero Pad in front of a Conv becomes its pads: centred through a border map
    if options.fold_affine:
        fold_affine(prepared, notes)
    index = GraphIndex(prepared)
    _check_only_nodes(index, only_nodes)
    if options.exclude and only_nodes is None:
        notes += _unmatched_exclude_note(index, options.exclude)
    plan, keep_float = _plan(index, amax, options, only_nodes, dict(keep_float or {}), float_grouped_consumers, notes)
    observed, centred = model, []  # the float model the data steps read
    gptq_levels = data is not None and options.weight_rounding == "gptq"
    if options.center_activations:
        plan, centred = _centre(prepared, index, plan, amax, options, only_nodes, keep_float)
        notes.append(_centring_note(centred))
        if options.center_padded:
            notes.append(_border_note(prepared))
        if centred and gptq_levels:
            # gptq chooses the readers' levels for the shifted inputs they see
            observed = onnx.ModelProto()
            observed.CopyFrom(prepared)
    out = insert_qdq(prepared, plan)
    if centred and not gptq_levels:
        from trtq.quantize.centering import settle_on_levels

        settle_on_levels(out, centred)  # before bias correction, which then reads the unshifted model
    if data is not None:
        notes += _data_steps(observed, out, options, data, centred)
    learned: dict[str, float] = {}
    if data is not None and options.reconstruct:
        learned, note = _reconstruct(out, options, data)
        notes.append(note)
    forms = {}
    if centred:
        from trtq.quantize.centering_fold import fold_centrings

        forms = fold_centrings(out, centred)  # the form engines run: the clamp of Q is the activation
        notes.append(_fold_note(forms))
    if options.fp16:
        out = cast_float_rest(out, amax)
        notes.append("cast the float rest to float16 (Q/DQ and graph inputs/outputs stay float32)")
    return QuantizeResult(
        model=out,
        quantized=plan.quantized,
        left_float=plan.left_float,
        missing_amax=plan.missing_amax,
        notes=notes,
        qdq_pairs=len(plan.pairs),
        centred=[
            {"tensor": c.tensor, "shift": c.shift, "amax": c.amax, "form": forms.get(c.tensor, "kept")} for c in centred
        ],
        learned_amax=learned,
    )


def check_reconstruct_options(options: QuantizeOptions) -> None:
    """Refuse what ``reconstruct`` does not combine with: it chooses the weight levels itself (no
    gptq, no bias correction of other levels) and learns the activation steps of the uncentred
    model (no center_activations); ``iterations`` >= 1."""
    if not options.reconstruct:
        return
    other = [
        flag
        for flag, on in (
            ("--weight-rounding gptq", options.weight_rounding == "gptq"),
            ("--bias-correction", options.bias_correction),
            ("--center-activations", options.center_activations),
            ("--center-padded", options.center_padded),
        )
        if on
    ]
    if other:
        raise UsageError(
            f"--reconstruct does not combine with {', '.join(other)}: it learns the weight levels and "
            "activation scales itself",
            "drop " + " and ".join(other) + " (quantize.weight_rounding / bias_correction / center_activations / "
            "center_padded)",
        )
    if options.iterations < 1:
        raise UsageError(f"quantize iterations must be >= 1, got {options.iterations}", "pass --iterations 60")


def check_centering_options(options: QuantizeOptions) -> None:
    """Refuse ``center_padded`` without ``center_activations``, and ``center_activations`` with a
    placement other than standard: the engine form of the
    centrings (centering_fold) is written for the standard pairs; with the fused pairs it computed
    levels up to 148 apart from the Add form it stands for, with the shared pairs it quantized other
    tensors (tests/quantize/test_centering_fold.py)."""
    if options.center_padded and not options.center_activations:
        raise UsageError(
            "--center-padded widens --center-activations to the tensors padded convs read, and that is off",
            "add --center-activations (quantize.center_activations: true)",
        )
    if options.center_activations and options.placement_used() != "standard":
        raise UsageError(
            f"--center-activations does not combine with --placement {options.placement} yet: the centrings' "
            "engine form is written for the standard placement",
            f"drop --center-activations, or use --placement standard (quantize.placement: {options.placement})",
        )


def _reconstruct(qdq: onnx.ModelProto, options: QuantizeOptions, data) -> tuple[dict[str, float], str]:
    """Learned weight levels and activation steps written into ``qdq`` (in place); (learned amax, note)."""
    from trtq import progress
    from trtq.interrupt import check
    from trtq.quantize.reconstruct import reconstruct_model

    with progress.task("reconstruct: blocks") as shown:  # one line per block (the total is known after the first)

        def done(block) -> None:
            undone = "" if block.rejected is None else f" (undone: learned {block.rejected:.3g})"
            note = f"error {block.error_before:.3g} -> {block.error_after:.3g}{undone} {block.name}"
            shown.update(block.index + 1, block.blocks, note)

        report = reconstruct_model(qdq, data, options.iterations, progress=done, check=check)
    return report.amax, report.note()


def planned_activations(model: onnx.ModelProto, placements: Optional[Sequence[str]] = None) -> list[str]:
    """The activations trtq's ``placements`` (default: all of them) put a Q/DQ pair on (the inputs
    of Conv, Gemm, MatMul, residual Adds ... as :func:`quantize_model` would with each), in the
    model's topological order: all an explicit (Q/DQ) build reads from a calibration cache, so a
    cache of these serves ``quantize --placement`` standard, fused and shared alike, and
    ``--attention`` float or int8.
    ``calibrate --tensors qdq`` calibrates only these."""
    from trtq.model import calibratable_tensors
    from trtq.quantize.fused import PLACEMENTS

    available = calibratable_tensors(model)
    prepared, _ = prepare_model(model)
    folded = onnx.ModelProto()
    folded.CopyFrom(prepared)
    fold_affine(folded)  # quantize.fold_affine true or false: the pairs of both
    wanted: set[str] = set()
    for graph in (prepared, folded):
        index = GraphIndex(graph)
        for placement in PLACEMENTS if placements is None else placements:
            plan = make_plan(index, {t: 1.0 for t in available}, (), True, None, {}, placement, "int8")
            wanted.update(pair.tensor for pair in plan.pairs.values() if not pair.weight)
    return [t for t in available if t in wanted]


def _refuse_unfit(model: onnx.ModelProto, amax: Mapping[str, float]) -> None:
    """Refuse a model that is quantized already, and a cache with unusable values or for another model."""
    if is_quantized(model):
        raise ModelError(
            "model already has Q/DQ nodes",
            "quantize the FP32 model, or build this one as it is (trtq build --model MODEL.qdq.onnx)",
        )
    check_amax(amax)
    names = _tensor_names(model.graph)
    if not any(name in names for name in amax):
        raise CacheError(
            f"cache does not belong to this model: none of its {len(amax)} tensors are in the model",
            "calibrate this model (trtq calibrate) or pass the cache made for it",
        )


def _check_only_nodes(index: GraphIndex, only_nodes: Optional[Collection[str]]) -> None:
    if only_nodes is None:
        return
    unknown = sorted(set(only_nodes) - {n.name for n in index.nodes})
    if unknown:
        raise UsageError(
            f"only_nodes names {len(unknown)} node(s) that are not in the model: " + first_few(unknown),
            "use node names from a quantize report",
        )


def _options_plan(index: GraphIndex, amax: Mapping[str, float], options: QuantizeOptions, only_nodes, keep_float):
    """:func:`make_plan` with the options' exclusions, weight granularity, placement and attention."""
    return make_plan(
        index,
        amax,
        options.exclude,
        options.per_channel,
        only_nodes,
        keep_float,
        options.placement_used(),
        options.attention,
    )


def _plan(
    index: GraphIndex,
    amax: Mapping[str, float],
    options: QuantizeOptions,
    only_nodes,
    keep_float: dict[str, str],
    float_grouped_consumers: bool,
    notes: list[str],
):
    """The Q/DQ plan with ``keep_float`` left float and, for TensorRT 8, the consumers of float
    grouped convs too; (plan, the layers kept float)."""
    if keep_float:
        notes.append(f"float layers: {len(keep_float)} most sensitive left float: " + ", ".join(keep_float))
    plan = _options_plan(index, amax, options, only_nodes, keep_float)
    if float_grouped_consumers:
        from trtq.quantize.float_choice import GROUPED_CONSUMER_REASON, grouped_conv_consumers

        risky, extra = grouped_conv_consumers(index, plan.left_float, plan.quantized)
        if extra:
            keep_float = dict(keep_float, **{n: GROUPED_CONSUMER_REASON for n in extra})
            plan = _options_plan(index, amax, options, only_nodes, keep_float)
            notes.append(f"float grouped conv consumers: {', '.join(extra)} left float (fed by {', '.join(risky)})")
    return plan, keep_float


UNMATCHED_EXCLUDE = "--exclude matched no node"  # the start of the note that says which


def _unmatched_exclude_note(index: GraphIndex, exclude) -> list[str]:
    from trtq.quantize.plan import Exclusions

    nodes = list(index.graph.node)
    unmatched = Exclusions(exclude, [n.name for n in nodes]).unmatched(nodes)
    if not unmatched:
        return []
    return [f"{UNMATCHED_EXCLUDE}: " + ", ".join(repr(p) for p in unmatched)]


def _centring_note(centred) -> str:
    if centred:
        return f"centred activations: {len(centred)} shifted to use both halves of INT8: " + first_few(
            [c.describe() for c in centred], 3
        )
    return "centred activations: none (no Relu/Clip output with a biased producer feeds only quantized Conv/Gemm)"


def _border_note(model: onnx.ModelProto) -> str:
    from trtq.quantize.centering_border import SUFFIX

    n = sum(1 for node in model.graph.node if SUFFIX in node.name)
    return (
        f"centred through padding: {n} padded conv(s) followed by a constant border map (exact; TensorRT 8.6 "
        "runs those convs FP16: a slower engine, docs/decisions.md D42)"
        if n
        else "centred through padding: no padded conv reads a centred tensor"
    )


def _fold_note(forms: dict[str, str]) -> str:
    counts = {f: sum(1 for v in forms.values() if v == f) for f in ("fold", "move", "kept")}
    return (
        f"centring in engine form: {counts['fold']} folded into their producer (the quantizer's clamp is "
        f"the activation), {counts['move']} shifted after pooling, {counts['kept']} kept as an Add"
    )


def _centre(
    prepared: onnx.ModelProto,
    index: GraphIndex,
    plan,
    amax: Mapping[str, float],
    options: QuantizeOptions,
    only_nodes,
    keep_float,
):
    """Centre what :func:`~trtq.quantize.centering.find_centrings` allows in the float model
    ``prepared`` (in place; ``index`` describes it) and re-plan with the halved amax; (plan, centrings)."""
    from trtq.quantize.centering import apply_centrings, find_centrings
    from trtq.quantize.plan import find_amax

    uses = {(i, s) for i, s, _ in plan.uses}
    acts = {p.tensor: find_amax(index, amax, p.tensor) for p in plan.pairs.values() if not p.weight}
    centred = find_centrings(
        index, {t: a for t, a in acts.items() if a is not None}, lambda i, s: (i, s) in uses, options.center_padded
    )
    if not centred:
        return plan, []
    apply_centrings(prepared, centred, index)
    shifted = dict(amax, **{c.tensor: c.amax for c in centred})
    return _options_plan(GraphIndex(prepared), shifted, options, only_nodes, keep_float), centred


def _data_steps(fp32: onnx.ModelProto, qdq: onnx.ModelProto, options: QuantizeOptions, data, centred=()) -> list[str]:
    """gptq rounding and bias correction on ``qdq`` (in place), from one pass of the FP32 model over
    ``data``; returns their notes. Bias correction measures its shift against the chosen levels.
    ``centred``: the centrings ``fp32`` (then the centred float model) carries; readers gptq keeps
    at nearest get their compensation settled on those levels when no bias correction follows."""
    if options.weight_rounding != "gptq" and not options.bias_correction:
        return []
    from trtq.calib.collect.exposed import observe
    from trtq.model import calibratable_tensors
    from trtq.quantize.bias import ChannelMeans, correct_biases, correction_sources
    from trtq.quantize.rounding import SecondMoments, apply_rounding, round_weights, rounding_targets

    available = set(calibratable_tensors(fp32))
    moments = SecondMoments(rounding_targets(qdq, available)) if options.weight_rounding == "gptq" else None
    means = ChannelMeans(correction_sources(qdq, available)) if options.bias_correction else None
    steps = " + ".join(w for w, on in (("gptq rounding", moments), ("bias correction", means)) if on is not None)
    observe(fp32, [o for o in (moments, means) if o is not None], data, label=f"{steps}: reading activations")

    notes = []
    samples = getattr(data, "num_samples", None)
    of = f" on {samples} samples" if samples is not None else ""
    rounded = {}
    if moments is not None:
        rounded, report = round_weights(moments)
        notes.append(
            f"weight rounding gptq: {report.layers} layers{of}, output error "
            f"{report.error_ratio:.2f}x nearest rounding's"
            + (
                f"; nearest kept for {len(report.skipped)}: "
                + ", ".join(f"{n} ({why})" for n, why in report.skipped[:3])
                if report.skipped
                else ""
            )
        )
    if moments is not None and centred and not options.bias_correction and report.skipped:
        from trtq.quantize.centering import settle_on_levels

        settle_on_levels(qdq, list(centred), readers={name for name, _ in report.skipped})
    if means is not None:
        corrected = correct_biases(qdq, means.result(), rounded)
        notes.append(f"bias correction: {len(corrected)} layers" + (f", input means{of}" if of else ""))
    if rounded:
        apply_rounding(qdq, rounded)
    return notes


__all__ = ["QUANTIZED_OPS", "QuantizeResult", "is_quantized", "quantize_model"]

# called, the package is the Python API's trtq.quantize() (trtq.api; see trtq/__init__.py)
callable_package(__name__)
