"""Block-wise reconstruction (``quantize --reconstruct``): weight rounding and activation steps
learned with the activations quantized in the loop.

In the spirit of AdaRound / BRECQ / QDrop, on trtq's own Q/DQ model: the model is converted to
torch (:mod:`~trtq.quantize.reconstruct.torchgraph`, with trtq's own op converter
:mod:`~trtq.quantize.reconstruct.ops`), cut into blocks (:mod:`~trtq.quantize.reconstruct.blocks`)
and each block learns, on the calibration samples, the rounding of every weight (up or down; the
per-channel scales stay trtq's) and the step of every activation Q/DQ pair it reads (symmetric, per
tensor, zero point 0: what TensorRT's Q/DQ expresses) so that its output matches the float
model's, its inputs coming from the blocks already quantized (:mod:`~trtq.quantize.reconstruct.loop`).
The result is written into the same Q/DQ model: each weight initializer becomes its levels times
its scales (exact multiples: Q/DQ gives them back unchanged), each activation pair's scale the
learned step. Nothing new runs at inference time.

PyTorch is an optional dependency (``pip install "trtq[reconstruct]"``), imported only here and
only when the step runs; CUDA is used when torch sees a GPU.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx

from trtq.errors import DataError, EnvironmentMissing, ModelError

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "trtq[reconstruct]"'
MIN_SAMPLES = 2


@dataclass
class ReconstructReport:
    blocks: list = field(default_factory=list)  # loop.BlockResult per block
    samples: int = 0
    device: str = "cpu"
    seconds: float = 0.0
    amax: dict = field(default_factory=dict)  # activation tensor -> learned amax (127 x its step)
    weights: list = field(default_factory=list)  # weight initializers rewritten

    def note(self) -> str:
        if not self.blocks:
            return "reconstruct: nothing to learn"
        before = float(np.mean([b.error_before for b in self.blocks]))
        after = float(np.mean([b.error_after for b in self.blocks]))
        iterations = self.blocks[0].iterations
        return (
            f"reconstruct: {len(self.blocks)} blocks on {self.samples} samples ({iterations} iterations each, "
            f"{self.device}, {self.seconds:.0f} s): {len(self.weights)} weights re-rounded, {len(self.amax)} "
            f"activation steps learned; block output error {before:.4g} -> {after:.4g} (mean)"
        )


def require_torch():
    """The torch module, or EnvironmentMissing (exit 4) saying how to install it."""
    import warnings

    try:
        with warnings.catch_warnings():  # a deprecation torch's CUDA module may warn about on import
            warnings.simplefilter("ignore", FutureWarning)
            import torch
    except ImportError:
        raise EnvironmentMissing("--reconstruct needs PyTorch, which is not installed", f"{INSTALL_HINT}") from None
    return torch


def default_device() -> str:
    torch = require_torch()
    return "cuda" if torch.cuda.is_available() else "cpu"


def gather_inputs(batches, names: list[str]) -> dict[str, np.ndarray]:
    """Every sample of ``batches`` (batch on axis 0, padding rows dropped) per graph input."""
    parts: dict[str, list] = {n: [] for n in names}
    for batch in batches:
        for n in names:
            if n not in batch.arrays:
                raise DataError(
                    f"reconstruct: the data has no values for the model input {n}",
                    "give data for every model input (data.inputs)",
                )
            parts[n].append(np.asarray(batch.arrays[n])[: batch.valid])
    if not names or not parts[names[0]]:
        raise DataError("reconstruct: the data gave no samples", "check --data and --samples")
    return {n: np.concatenate(v, axis=0) for n, v in parts.items()}


def reconstruct_model(
    qdq: onnx.ModelProto,
    batches,
    iterations: int,
    progress: Callable | None = None,
    check: Callable[[], None] = lambda: None,
    fixed: tuple = (),
    device: str | None = None,
    **settings: Any,
) -> ReconstructReport:
    """Learn the weight rounding and activation steps of the Q/DQ model ``qdq`` (trtq's, FP32 weights
    behind their pairs) on ``batches`` and write them into it (in place). ``fixed``: activation
    tensors whose step must stay as it is (centred ones). ``progress(BlockResult)`` after each
    block; ``check()`` between iterations (signals)."""
    torch = require_torch()
    from trtq.quantize.reconstruct.loop import Settings, Values, reconstruct_blocks
    from trtq.quantize.reconstruct.torchgraph import TorchGraph

    start = time.monotonic()
    device = device or default_device()
    graph = TorchGraph(qdq, device)
    arrays = gather_inputs(batches, graph.graph_inputs)
    samples = len(next(iter(arrays.values())))
    if samples < MIN_SAMPLES:
        raise DataError(
            f"reconstruct needs at least {MIN_SAMPLES} samples, the data gave {samples}",
            "pass more samples (--samples, --data)",
        )
    for q in graph.activations.values():
        if q.tensor in fixed:
            q.u.requires_grad_(False)
    inputs = {n: torch.as_tensor(a, device=graph.device) for n, a in arrays.items()}
    with _exact_float(torch):
        blocks, axes = _plan_blocks(graph, inputs)
        results = reconstruct_blocks(
            graph, blocks, Values(inputs, axes), axes, Settings(iterations=iterations, **settings), progress, check
        )
    report = ReconstructReport(results, samples, str(graph.device))
    report.weights, report.amax = write_back(qdq, graph, fixed)
    report.seconds = time.monotonic() - start
    return report


class _exact_float:
    """No TF32 in CUDA convolutions and matmuls while reconstructing (restored after)."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        b = self.torch.backends
        self.saved = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
        b.cudnn.allow_tf32 = False
        b.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        b = self.torch.backends
        b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = self.saved
        return False


def _plan_blocks(graph, inputs: dict):
    """The blocks, and the batch axis of every tensor the loop stores. Two float runs, on 2 and 3
    samples, tell each tensor's batch axis (graph inputs: 0; a cut whose tensor has none is not
    used) and let the shape computations fold into constants (:meth:`TorchGraph.fold_shape_steps`:
    a Reshape target computed from the input's shape would otherwise tie every block to the input)."""
    import torch

    from trtq.quantize.reconstruct.blocks import cut_points, make_blocks
    from trtq.quantize.reconstruct.torchgraph import WEIGHTED_OPS

    count = len(next(iter(inputs.values())))
    probes = []
    graph.quantize(False)
    for rows in (2, 3):
        index = torch.arange(rows) % count
        env = {n: v.index_select(0, index.to(v.device)) for n, v in inputs.items()}
        try:
            with torch.no_grad():
                graph.run(graph.steps, env, batch=rows)
        except ModelError:
            raise
        except Exception as e:  # a shape the model fixes, an op on an unexpected type ...
            raise ModelError(
                f"reconstruct: the torch form of the model does not run on {rows} samples at once ({_first_line(e)})",
                "reconstruct needs a model that runs batched; or use --weight-rounding gptq",
            ) from None
        probes.append((rows, env))
    if not graph.fold_shape_steps(probes):
        log.info("reconstruct: shape computations kept in the graph (a value follows the batch size)")
    computed = _computed(graph)
    cuts = cut_points(graph.steps, computed, graph.graph_inputs)
    wanted = {o for k in cuts for o in graph.steps[k].outputs if o} | set(graph.graph_outputs)
    axes = {n: 0 for n in inputs}
    for n in wanted:
        axis = _batch_axis([tuple(env[n].shape) if n in env else None for _, env in probes])
        if axis is not None:
            axes[n] = axis
    missing = [o for o in graph.graph_outputs if o not in axes]
    if missing:
        raise ModelError(
            f"reconstruct: graph output {missing[0]} has no batch axis",
            "reconstruct needs outputs with one axis per sample; or use --weight-rounding gptq",
        )
    usable = [k for k in cuts if all(o in axes for o in graph.steps[k].outputs if o and computed(o))]
    blocks = make_blocks(graph.steps, computed, graph.graph_inputs, graph.graph_outputs, WEIGHTED_OPS, usable)
    return blocks, axes


def _batch_axis(shapes) -> int | None:
    """The one axis whose size is 2 in the first shape and 3 in the second, else None."""
    if any(s is None for s in shapes) or len(shapes[0]) != len(shapes[1]):
        return None
    diff = [i for i, (x, y) in enumerate(zip(*shapes)) if x != y]
    return diff[0] if len(diff) == 1 and (shapes[0][diff[0]], shapes[1][diff[0]]) == (2, 3) else None


def _computed(graph) -> Callable[[str], bool]:
    static = set(graph.constants) | set(graph.weights) | set(graph.batch_constants)

    def computed(name: str) -> bool:
        return bool(name) and name not in static

    return computed


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def write_back(qdq: onnx.ModelProto, graph, fixed: tuple = ()) -> tuple[list[str], dict[str, float]]:
    """Put the learned levels (x their scales) into the weight initializers and the learned steps
    into the activation pairs' scale initializers of ``qdq`` (in place); (weights rewritten,
    {activation tensor: amax})."""
    from onnx import numpy_helper

    new: dict[str, np.ndarray] = {}
    for dq_out, q in graph.weights.items():
        levels = q.levels().detach().cpu().numpy()
        s = q.s.detach().cpu().numpy()
        new[graph.weight_sources[dq_out]] = (levels * s).astype(np.float32)
    amax: dict[str, float] = {}
    for dq_out, q in graph.activations.items():
        if q.tensor in fixed:
            continue
        step = np.float32(q.scale().detach().cpu().item())
        new[graph.scale_names[dq_out]] = np.array(step, dtype=np.float32)
        amax[q.tensor] = float(step) * 127.0
    for name, param in graph.learned_biases.items():
        new[name] = param.detach().cpu().numpy().astype(np.float32)
    for init in qdq.graph.initializer:
        if init.name in new:
            dtype = numpy_helper.to_array(init).dtype
            value = new[init.name].astype(dtype).reshape(tuple(init.dims))
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    return sorted(graph.weight_sources[d] for d in graph.weights), amax


__all__ = ["INSTALL_HINT", "ReconstructReport", "reconstruct_model", "require_torch"]
