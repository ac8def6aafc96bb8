"""Block after block: learn the block's weight rounding and activation steps on its own output error.

For each block (:mod:`~trtq.quantize.reconstruct.blocks`), in graph order:

1. the float targets: the block run float on the float model's values of its inputs;
2. training, ``iterations`` steps of Adam on minibatches of the samples: the block quantized
   (weights soft-rounded, activations fake-quantized, each element kept float with probability
   ``drop``: QDrop) on the quantized model's values of its inputs, i.e. what the blocks before it
   produce with their learned, hard-rounded weights; loss: the output error relative to the
   target's energy, plus AdaRound's rounding penalty after a warm-up (``beta`` annealed from 20
   to 2), which drives every soft level to floor or floor + 1;
3. the block frozen (hard rounding); where what it learned gives a larger output error on the
   samples than where it started, it goes back to nearest rounding and the cache's steps;
4. the block run on all samples, quantized and float, to give the next block its inputs.

Only quantizers first read in this block learn here (a weight or a scale shared with an earlier
block keeps what it learned there). The errors reported per block are over all samples, with the
block's own quantizers at nearest rounding and the cache's scales before, learned after.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

WARMUP = 0.2  # fraction of the iterations without the rounding penalty
BETA = (20.0, 2.0)  # the penalty's exponent, annealed over the rest
PENALTY = 0.01  # weight of the rounding penalty against the relative output error
WEIGHT_LR = 1e-2  # Adam on the rounding variables
SCALE_LR = 1e-2  # Adam on the log activation steps
BIAS_LR = 1e-3  # Adam on the biases of Conv / Gemm (relative to nothing: biases are O(1) here)
DROP = 0.0  # QDrop: probability an element keeps its float value while training (off: see benchmarks/README.md)
CHUNK = 16  # samples per forward pass outside training


@dataclass
class Settings:
    iterations: int
    batch: int = 16
    drop: float = DROP
    penalty: float = PENALTY
    weight_lr: float = WEIGHT_LR
    scale_lr: float = SCALE_LR
    bias_lr: float = BIAS_LR
    learn_scales: bool = True
    learn_rounding: bool = True
    learn_bias: bool = False
    seed: int = 0


@dataclass
class BlockResult:
    index: int
    blocks: int
    name: str
    layers: int
    activations: int  # activation steps learned here
    iterations: int
    seconds: float
    error_before: float  # output error / target energy, all samples: nearest rounding, cache scales
    error_after: float  # the same with what the block kept
    rejected: float | None = None  # the error of what it learned, where that was worse and undone

    def describe(self) -> str:
        undone = "" if self.rejected is None else f" (learned {self.rejected:.4g}, worse: undone)"
        return (
            f"block {self.index + 1}/{self.blocks} ({self.name}, {self.layers} layers, {self.activations} "
            f"activation scales): output error {self.error_before:.4g} -> {self.error_after:.4g}{undone} "
            f"in {self.seconds:.1f} s"
        )


class Values:
    """Per tensor the values of every sample, the batch on ``axes[name]``."""

    def __init__(self, tensors: dict, axes: dict):
        self.tensors = tensors
        self.axes = axes

    def take(self, names, index) -> dict:
        return {n: self.tensors[n].index_select(self.axes[n], index.to(self.tensors[n].device)) for n in names}

    def count(self) -> int:
        name = next(iter(self.tensors))
        return self.tensors[name].shape[self.axes[name]]


def _chunks(total: int, size: int):
    import torch

    for a in range(0, total, size):
        yield torch.arange(a, min(total, a + size))


def run_block(graph, block, values: Values, axes: dict, names) -> Values:
    """``names`` of the block on every sample of ``values`` (no gradients), as one Values."""
    import torch

    steps = graph.steps[block.start : block.stop]
    parts: dict[str, list] = {n: [] for n in names}
    with torch.no_grad():
        for index in _chunks(values.count(), CHUNK):
            env = graph.run(steps, values.take(block.inputs, index), keep=set(names), batch=len(index))
            for n in names:
                parts[n].append(env[n])
    return Values({n: torch.cat(parts[n], axes[n]) for n in names}, {n: axes[n] for n in names})


def relative_error(got: dict, want: dict) -> Any:
    total = None
    for n, t in want.items():
        err = ((got[n] - t) ** 2).sum() / (t * t).sum().clamp_min(1e-30)
        total = err if total is None else total + err
    return total / len(want)


def _error(graph, block, inputs: Values, targets: Values) -> float:
    import torch

    steps = graph.steps[block.start : block.stop]
    names = list(targets.tensors)
    num = {n: 0.0 for n in names}
    den = {n: 0.0 for n in names}
    with torch.no_grad():
        for index in _chunks(inputs.count(), CHUNK):
            env = graph.run(steps, inputs.take(block.inputs, index), keep=set(names), batch=len(index))
            want = targets.take(names, index)
            for n in names:
                num[n] += float(((env[n] - want[n]) ** 2).sum())
                den[n] += float((want[n] ** 2).sum())
    return sum(num[n] / max(den[n], 1e-30) for n in names) / len(names)


def _block_quantizers(graph, block, learned: set):
    """(weight quantizers, activation quantizers) first read in ``block``, not learned before."""
    weights, acts = [], []
    for st in graph.steps[block.start : block.stop]:
        for w in st.weights:
            q = graph.weights[w]
            if id(q) not in learned:
                weights.append(q)
        if st.op == "QDQ" and id(st.fn) not in learned:
            acts.append(st.fn)
    return list({id(q): q for q in weights}.values()), list({id(q): q for q in acts}.values())


def _train(graph, block, weights, acts, inputs: Values, targets: Values, settings: Settings, check) -> None:
    import torch

    from trtq.quantize.reconstruct.quantizers import rounding_penalty

    steps = graph.steps[block.start : block.stop]
    names = list(targets.tensors)
    gen = torch.Generator(device=graph.device).manual_seed(settings.seed + block.start)
    cpu_gen = torch.Generator().manual_seed(settings.seed + block.start)
    rounding = weights if settings.learn_rounding else []
    groups, decayed = [], []
    if rounding:
        groups.append({"params": [q.v for q in rounding], "lr": settings.weight_lr})
    scales = [q.u for q in acts if settings.learn_scales and q.u.requires_grad]
    if scales:
        groups.append({"params": scales, "lr": settings.scale_lr})
        decayed.append(len(groups) - 1)
    biases = graph.learn_biases(steps) if settings.learn_bias else []
    if biases:
        groups.append({"params": biases, "lr": settings.bias_lr})
        decayed.append(len(groups) - 1)
    if not groups:
        return
    opt = torch.optim.Adam(groups)
    total = settings.iterations
    warm = int(total * WARMUP)
    n = inputs.count()
    for w in rounding:
        w.mode = "soft"
    for q in acts:
        q.drop, q.generator = settings.drop, gen
        q.train()
    for it in range(total):
        check()
        index = torch.randperm(n, generator=cpu_gen)[: min(settings.batch, n)]
        env = graph.run(steps, inputs.take(block.inputs, index), batch=len(index))
        loss = relative_error({k: env[k] for k in names}, targets.take(names, index))
        if rounding and it >= warm:
            progress = (it - warm) / max(1, total - warm)
            beta = BETA[1] + (BETA[0] - BETA[1]) * (1 - progress)
            loss = loss + settings.penalty * rounding_penalty(rounding, beta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for g in decayed:  # cosine decay of the step and bias learning rates
            base = groups[g].setdefault("initial_lr", groups[g]["lr"])
            groups[g]["lr"] = base * 0.5 * (1 + math.cos(math.pi * it / total))
        opt.step()
    for w in rounding:
        w.mode = "hard"
    for q in acts:
        q.drop, q.generator = 0.0, None
        q.eval()


def _restore(state) -> None:
    """Put each (parameter, value) of ``state`` back (the hard rounding of the starting ``v`` is
    nearest rounding; the starting ``u`` is the cache's step)."""
    import torch

    with torch.no_grad():
        for param, value in state:
            param.copy_(value)


def reconstruct_blocks(
    graph,
    blocks,
    inputs: Values,
    axes: dict,
    settings: Settings,
    progress: Callable[[BlockResult], None] | None = None,
    check: Callable[[], None] = lambda: None,
) -> list[BlockResult]:
    """Learn every block in turn (see the module doc); the quantizers of ``graph`` keep the result
    (weights in hard rounding, activation steps learned). ``inputs``: the graph inputs of every
    sample; ``axes``: each tensor's batch axis (graph inputs and block boundaries)."""
    float_values, quant_values = dict(inputs.tensors), dict(inputs.tensors)
    learned: set[int] = set()
    results = []
    for i, block in enumerate(blocks):
        start = time.monotonic()
        weights, acts = _block_quantizers(graph, block, learned)
        graph.quantize(False)
        targets = run_block(graph, block, Values(float_values, axes), axes, block.outputs)
        graph.quantize(True, "hard")
        for w in weights:
            w.mode = "nearest"
        quant_in = Values(quant_values, axes)
        trained = bool(weights or acts)
        before = _error(graph, block, quant_in, targets) if trained else 0.0
        start_state = [(q.v, q.v.detach().clone()) for q in weights] + [(q.u, q.u.detach().clone()) for q in acts]
        if trained:
            _train(graph, block, weights, acts, quant_in, targets, settings, check)
        learned.update(id(q) for q in weights + acts)
        after = _error(graph, block, quant_in, targets) if trained else 0.0
        rejected = None
        if after > before:  # worse than nearest rounding and the cache's steps on these samples: undo
            _restore(start_state)
            rejected, after = after, _error(graph, block, quant_in, targets)
        needed = {n for b in blocks[i + 1 :] for n in b.inputs}
        if needed:
            made = [n for n in block.outputs if n in needed]
            quant_values.update(run_block(graph, block, quant_in, axes, made).tensors)
            float_values.update({n: targets.tensors[n] for n in made})
            for values in (quant_values, float_values):
                for n in [n for n in values if n not in needed]:
                    del values[n]
        result = BlockResult(
            i,
            len(blocks),
            block.describe(),
            block.layers,
            len(acts),
            settings.iterations,
            time.monotonic() - start,
            before,
            after,
            rejected,
        )
        results.append(result)
        if progress is not None:
            progress(result)
    return results
