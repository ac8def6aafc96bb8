"""Cut a model's steps into the blocks that are reconstructed one after the other.

A cut may sit after a step (not an activation Q/DQ step: a pair goes with the layers that read it)
where exactly one computed tensor is still to be read later: everything downstream then depends
on the upstream part only through that tensor, so a block can be trained alone on that tensor's
values. Between two cuts lies a segment: one layer with its epilogue (Conv + BatchNorm + activation
+ Pad), or a whole multi-path region (an inverted-residual block with its skip Add, an attention
block with its residual, an Inception-like branch set): nothing inside such a region is a cut.
Consecutive segments are merged into blocks of at most ``max_layers`` weighted layers (Conv,
ConvTranspose, Gemm, MatMul with a quantized constant weight); a region with more stays one block.
On MobileNet / EfficientNet-Lite graphs that gives the inverted-residual blocks (expand, depthwise,
project), with or without their skip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

MAX_LAYERS = 3


@dataclass
class Block:
    start: int  # first step
    stop: int  # one past the last step
    inputs: list[str]  # tensors it reads that earlier steps (or the graph inputs) computed
    outputs: list[str]  # tensors later blocks read, then graph outputs it computes
    layers: int = 0  # weighted layers with a quantized weight
    names: list[str] = field(default_factory=list)  # the weighted layers' step names

    def describe(self) -> str:
        if not self.names:
            return f"steps {self.start}-{self.stop - 1}"
        return self.names[0] if len(self.names) == 1 else f"{self.names[0]} .. {self.names[-1]}"


def _last_reads(steps) -> dict[str, int]:
    last: dict[str, int] = {}
    for k, st in enumerate(steps):
        for name in st.inputs:
            if name:
                last[name] = k
    return last


def cut_points(steps, computed: Callable[[str], bool], graph_inputs) -> list[int]:
    """Step indices k after which exactly one computed tensor is read later (see the module doc).
    ``computed(name)``: the tensor is computed at run time (not a constant or a weight)."""
    last = _last_reads(steps)
    live = {n for n in graph_inputs if computed(n) and n in last}
    cuts = []
    for k, st in enumerate(steps):
        live.update(o for o in st.outputs if o and computed(o) and last.get(o, -1) > k)
        live.difference_update([n for n in st.inputs if last.get(n) == k])
        if st.op != "QDQ" and len(live) == 1 and k < len(steps) - 1:
            cuts.append(k)
    return cuts


def _weighted(step, weighted_ops) -> bool:
    return step.op in weighted_ops and bool(step.weights)


def make_blocks(
    steps,
    computed: Callable[[str], bool],
    graph_inputs,
    graph_outputs,
    weighted_ops,
    cuts=None,
    max_layers: int = MAX_LAYERS,
) -> list[Block]:
    """The blocks of ``steps`` (see the module doc). ``cuts``: the allowed cut points (default
    :func:`cut_points`; the caller drops those whose tensor has no batch axis)."""
    if cuts is None:
        cuts = cut_points(steps, computed, graph_inputs)
    bounds = [-1, *sorted(cuts), len(steps) - 1]
    segments = [(a + 1, b + 1) for a, b in zip(bounds, bounds[1:]) if b > a]
    groups: list[list[int]] = []
    count = 0
    for a, b in segments:
        n = sum(_weighted(steps[k], weighted_ops) for k in range(a, b))
        if groups and (count == 0 or count + n <= max_layers):
            groups[-1][1] = b
            count += n
        else:
            groups.append([a, b])
            count = n
    last = _last_reads(steps)
    outputs = set(graph_outputs)
    blocks = []
    for a, b in groups:
        reads, made = [], set()
        for k in range(a, b):
            reads += [n for n in steps[k].inputs if n and computed(n) and n not in made and n not in reads]
            made.update(o for o in steps[k].outputs if o)
        later = [
            n
            for n in dict.fromkeys(reads + [o for k in range(a, b) for o in steps[k].outputs])
            if n and computed(n) and last.get(n, -1) >= b
        ]
        produced = [o for k in range(a, b) for o in steps[k].outputs if o in outputs]
        names = [steps[k].name for k in range(a, b) if _weighted(steps[k], weighted_ops)]
        blocks.append(Block(a, b, reads, later + [o for o in produced if o not in later], len(names), names))
    return blocks
