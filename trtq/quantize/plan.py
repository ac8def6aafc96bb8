"""Decide which node inputs get Q/DQ and with which scale; no graph is changed here."""

import dataclasses
import functools
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import onnx

from trtq.errors import ConfigError
from trtq.quantize import fused, rules, shared
from trtq.quantize.graph import DATA_MOVEMENT_OPS, FLOAT, GraphIndex, tensor_groups
from trtq.quantize.scales import activation_scale, weight_scale

PairKey = tuple[str, Optional[int]]  # (tensor, per-channel axis or None for per tensor)
# a bias over input scale x weight scale stays below this (int32's 2**31 - 1, halved for later bias edits)
INT32_BIAS_LIMIT = 2.0**30
BIASED_OPS = ("Conv", "ConvTranspose", "Gemm")


@dataclass
class QdqPair:
    tensor: str
    axis: Optional[int]
    scale: np.ndarray  # float32 scalar (per tensor) or 1-D (per channel)
    weight: bool


@dataclass
class Plan:
    pairs: dict[PairKey, QdqPair] = field(default_factory=dict)  # in order of first use
    uses: list[tuple[int, int, PairKey]] = field(default_factory=list)  # (node index, slot, pair)
    quantized: list[str] = field(default_factory=list)
    left_float: list[tuple[str, str]] = field(default_factory=list)
    missing_amax: list[str] = field(default_factory=list)


class Exclusions:
    """``--exclude`` entries: an op type or an exact node name (``Conv@1`` is that node only, not
    ``Conv@10``), otherwise a regex searched in node names (``'^head/'``)."""

    def __init__(self, patterns: Collection[str], node_names: Collection[str] = ()):
        self.exact = {p for p in patterns if p in set(node_names)}
        self.entries = []
        for p in patterns:
            if p in self.exact:
                continue
            try:
                self.entries.append((p, re.compile(p)))
            except re.error as e:
                raise ConfigError(
                    f"--exclude {p!r} is neither an op type nor a valid regular expression ({e})",
                    "escape regex characters, e.g. --exclude 'head\\.conv'",
                ) from None

    def unmatched(self, nodes: Iterable[onnx.NodeProto]) -> list[str]:
        """The entries that name no node of ``nodes`` (by op type, exact name or regex), in order."""
        nodes = list(nodes)
        return [
            pattern
            for pattern, regex in self.entries
            if not any(pattern == n.op_type or regex.search(n.name) for n in nodes)
        ]

    def reason(self, node: onnx.NodeProto) -> Optional[str]:
        if node.name in self.exact:
            return f"excluded by --exclude {node.name}"
        for pattern, regex in self.entries:
            if pattern == node.op_type or regex.search(node.name):
                return f"excluded by --exclude {pattern}"
        return None


_TYPE_NAMES = {v: k for k, v in onnx.TensorProto.DataType.items()}


def _type_reason(index: GraphIndex, tensor: str) -> Optional[str]:
    t = index.elem_type(tensor)
    if t is not None and t != FLOAT:
        return f"input {tensor} is {_TYPE_NAMES.get(t, t)}, not FLOAT (Q/DQ scales are float32)"
    return None


def find_amax(index: GraphIndex, amax: Mapping[str, float], tensor: str) -> Optional[float]:
    """amax of ``tensor``, or of the first tensor the cache names along a data-movement chain."""
    for name in index.source_through(tensor, DATA_MOVEMENT_OPS):
        if name in amax:
            return float(amax[name])
    return None


def make_plan(
    index: GraphIndex,
    amax: Mapping[str, float],
    exclude: Collection[str],
    per_channel: bool,
    only_nodes: Optional[Collection[str]],
    keep_float: Optional[Mapping[str, str]] = None,
    placement: str = "standard",
    attention: str = "float",
) -> Plan:
    """``keep_float``: node name -> reason, nodes left float on top of ``exclude``; ``placement``
    "fused" adds the pairs of :mod:`~trtq.quantize.fused` to the standard plan, "shared" those of
    :mod:`~trtq.quantize.shared`; ``attention`` float or int8 (``quantize.attention``,
    :func:`~trtq.quantize.rules.attention_reason`)."""
    if placement not in fused.PLACEMENTS:  # "auto" is resolved by QuantizeOptions.placement_used
        raise ValueError(f"make_plan: unknown placement {placement!r}")
    if attention not in ("float", "int8"):
        raise ValueError(f"make_plan: unknown attention {attention!r}")
    plan = Plan()
    keep_float = keep_float or {}
    exclusions = Exclusions(exclude, [n.name for n in index.graph.node])
    only = set(only_nodes) if only_nodes is not None else None
    act_amax: dict[str, float] = {}
    decisions: dict[int, list[tuple[int, PairKey]]] = {}

    def gate(node: onnx.NodeProto) -> Optional[str]:
        reason = keep_float.get(node.name) or exclusions.reason(node)
        if reason is None and only is not None and node.name not in only:
            reason = "not selected (only_nodes)"
        return reason

    def activation(tensor: str, missing: list[str]) -> Optional[PairKey]:
        value = find_amax(index, amax, tensor)
        if value is None:
            missing.append(tensor)
            return None
        act_amax[tensor] = value
        return (tensor, None)

    # 1. compute ops from the placement table
    for idx, node in enumerate(index.nodes):
        rule = rules.PLACEMENT.get(node.op_type)
        if rule is None or node.domain not in ("", "ai.onnx"):
            continue
        reason = gate(node) or rules.attention_reason(index, node, attention) or rules.size_reason(index, node)
        missing: list[str] = []
        slots: list[tuple[int, PairKey]] = []
        if not reason:
            record = functools.partial(activation, missing=missing)
            reason, slots = _table_inputs(index, node, rule, per_channel, record)
        if not reason and missing:
            reason = "no amax in the cache for " + ", ".join(missing)
            plan.missing_amax.extend(t for t in missing if t not in plan.missing_amax)
        if reason:
            plan.left_float.append((node.name, reason))
            continue
        decisions[idx] = slots

    # 2. residual Adds: Q/DQ on the skip input of an Add fused into a quantized Conv
    links, prefer = [i for i, n in enumerate(index.nodes) if n.op_type == rules.CONCAT_OP], None
    if placement == "fused":  # and Concat inputs, data-movement groups (fused.py)
        prefer = {key[0] for slots in decisions.values() for _, key in slots}
        fused.add_fused(index, plan, decisions, gate, lambda t: activation(t, []))
        fused.drop_conflicting_groups(index, decisions, prefer, act_amax)
        links += [i for i in decisions if index.nodes[i].op_type in fused.MOVEMENT_OPS]
    elif placement == "shared":  # residual Adds, pooling / Resize inputs, every reader of a pair (shared.py)
        shared.add_shared(index, plan, decisions, gate, lambda t: activation(t, []))
    else:
        _residual_decisions(index, plan, decisions, gate, activation)

    # 3. Concat: the quantized tensors around one Concat share the largest amax
    used = {key[0] for slots in decisions.values() for _, key in slots if key[0] in act_amax}
    act_amax = {t: v for t, v in act_amax.items() if t in used}
    _share_concat_scales(index, act_amax, links, prefer)

    # 4. pairs in node order, with their scales
    _add_pairs(index, plan, decisions, act_amax)
    return plan


def _residual_decisions(
    index: GraphIndex, plan: Plan, decisions: dict[int, list[tuple[int, PairKey]]], gate, activation
) -> None:
    """Add to ``decisions`` the skip input of every residual Add fused into a quantized Conv."""
    quantized_nodes = {i: True for i in decisions}
    for idx, node in enumerate(index.nodes):
        if node.op_type != rules.RESIDUAL_OP or node.domain not in ("", "ai.onnx"):
            continue
        skip = rules.residual_skip_input(index, node, quantized_nodes)
        if skip is None:
            continue
        tensor = node.input[skip]
        missing: list[str] = []
        reason = gate(node) or _type_reason(index, tensor)
        key = None if reason else activation(tensor, missing)
        if not reason and key is None:
            reason = f"no amax in the cache for the residual input {tensor}"
            plan.missing_amax.extend(t for t in missing if t not in plan.missing_amax)
        if reason:
            plan.left_float.append((node.name, reason))
            continue
        decisions[idx] = [(skip, key)]


def _add_pairs(
    index: GraphIndex, plan: Plan, decisions: dict[int, list[tuple[int, PairKey]]], act_amax: Mapping[str, float]
) -> None:
    """The plan's quantized nodes, Q/DQ pairs (with their scales) and uses, in node order."""
    for idx in sorted(decisions):
        plan.quantized.append(index.nodes[idx].name)
        for slot, key in decisions[idx]:
            if key not in plan.pairs:
                tensor, axis = key
                if index.is_constant(tensor):
                    plan.pairs[key] = QdqPair(tensor, axis, weight_scale(index.array(tensor), axis), True)
                else:
                    plan.pairs[key] = QdqPair(tensor, None, activation_scale(act_amax[tensor]), False)
            plan.uses.append((idx, slot, key))
    _fit_int32_biases(index, plan, decisions)


def _fit_int32_biases(index: GraphIndex, plan: Plan, decisions: Mapping[int, list[tuple[int, PairKey]]]) -> None:
    """Raise a weight channel's scale where the reader's bias would not fit int32 at input scale x
    weight scale, the bias quantization of ONNX Runtime 1.21+ (docs/decisions.md D40) and of other
    int8 runtimes; TensorRT keeps the bias float and computes the same either way. Only channels
    whose weights are next to nothing (a dead channel: max|W| ~1e-8, scale ~1e-10) are raised; their
    weights then round to a few levels or to zero, about what they are worth."""
    for idx, slots in decisions.items():
        node = index.nodes[idx]
        keys = dict(slots)
        if node.op_type not in BIASED_OPS or len(node.input) < 3 or not index.is_constant(node.input[2]):
            continue
        if keys.get(0) not in plan.pairs or keys.get(1) not in plan.pairs:
            continue
        pair = plan.pairs[keys[1]]
        bias = np.abs(index.array(node.input[2]).astype(np.float64)).reshape(-1)
        need = bias / (float(plan.pairs[keys[0]].scale) * INT32_BIAS_LIMIT)
        scale = pair.scale.astype(np.float64)
        if scale.ndim == 0:
            need = need.max(initial=0.0)
        elif need.shape != scale.shape:  # a bias not one per output channel (grouped ConvTranspose)
            continue
        if np.any(scale < need):
            plan.pairs[keys[1]] = dataclasses.replace(pair, scale=np.maximum(scale, need).astype(np.float32))


def _table_inputs(index: GraphIndex, node: onnx.NodeProto, rule: rules.OpRule, per_channel: bool, activation):
    """(reason to keep float or None, [(slot, pair)]) for one op of the placement table.

    ``activation(tensor)`` returns the pair of a computed tensor, or None when amax is missing
    (it records the tensor); the caller turns missing amax into the reason.
    """
    slots: list[tuple[int, PairKey]] = []
    for slot in rule.inputs:
        tensor = node.input[slot] if slot < len(node.input) else ""
        if not tensor:
            return f"input {slot} is missing", []
        reason = _type_reason(index, tensor)
        if reason:
            return reason, []
        if index.is_constant(tensor):
            weight = index.array(tensor)
            if not np.all(np.isfinite(weight)):
                return f"weight {tensor} has NaN or Inf values", []
            axis = None
            if per_channel and slot == rule.weight_slot:
                axis = rule.channel_axis(node, weight.ndim)
                if axis is not None and not 0 <= axis < weight.ndim:
                    axis = None
            slots.append((slot, (tensor, axis)))
        elif index.is_static(tensor):
            return f"input {tensor} is computed from constants by ops trtq does not fold", []
        elif rule.constant_weight_required and slot == rule.weight_slot:
            return f"weight {tensor} is computed at run time, not a constant", []
        else:
            key = activation(tensor)
            if key is not None:
                slots.append((slot, key))
    return None, slots


def _share_concat_scales(
    index: GraphIndex, act_amax: dict[str, float], links: Iterable[int], prefer: Optional[set] = None
) -> None:
    """The quantized tensors around one node of ``links`` (every Concat; fused: the data-movement
    ops that got a pair on their input too) share
    the largest amax among them, or among those of ``prefer`` in the group when there are any
    (fused: the tensors the table's Conv/Gemm/MatMul inputs quantize, so the readers keep the
    scale they were calibrated for and the group is clipped where the standard placement clips)."""
    root = tensor_groups(index, links, lambda n: [t for t in list(n.input) + list(n.output) if t in act_amax])
    groups: dict[str, list[str]] = {}
    for t, r in root.items():
        groups.setdefault(r, []).append(t)
    for members in groups.values():
        chosen = [t for t in members if prefer is not None and t in prefer] or members
        shared = max(act_amax[t] for t in chosen)
        for t in members:
            act_amax[t] = shared
