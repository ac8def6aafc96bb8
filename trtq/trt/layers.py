"""Per-layer time of a TensorRT plan: where an engine spends its latency, and in what precision.

``profile_layers(plan)`` runs the plan with a TensorRT ``IProfiler`` attached (each enqueue then
reports every fused layer's GPU time) and joins the times with the engine inspector's layer list,
which names each fused layer's precision when the plan was built with detailed profiling (trtq
build does that). Two plans of one model (say TensorRT's implicit INT8 and an explicit Q/DQ engine)
side by side show which layers TensorRT built differently.

Profiled times add up to more than the plain median (the profiler synchronises around layers), so
they are for comparing layers, not for quoting latency: ``trtq bench`` without --layers does that.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from trtq.errors import ConfigError
from trtq.trt.coverage import PROFILE_RUNS, Int8Coverage, datatype, int8_coverage


@dataclass
class LayerTime:
    name: str
    mean_ms: float
    share: float  # of the profiled total
    kind: str = ""  # the inspector's LayerType, when known
    precision: str = ""  # data types of its inputs -> outputs, when known
    tactic: str = ""


@dataclass
class LayerProfile:
    plan: str
    runs: int
    total_ms: float  # sum of the layers' mean times
    layers: list[LayerTime] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _types(entries: Any) -> str:
    """'int8,fp16'-style summary of the inspector's Format/Datatype strings (e.g. 'Row major linear
    FP32', 'Channel major INT8 format where channel % 32 == 0')."""
    out = []
    for e in entries or []:
        fmt = str(e.get("Format/Datatype", "")).lower() if isinstance(e, dict) else ""
        out.append(datatype(e) or fmt[:12] or "?")
    return ",".join(dict.fromkeys(out))


def _details(layers: list) -> dict[str, dict[str, str]]:
    found = {}
    for layer in layers:
        if not isinstance(layer, dict) or "Name" not in layer:
            continue
        ins, outs = _types(layer.get("Inputs")), _types(layer.get("Outputs"))
        found[str(layer["Name"])] = {
            "kind": str(layer.get("LayerType", "")),
            "precision": f"{ins}->{outs}" if ins or outs else "",
            "tactic": str(layer.get("TacticName", "")),
        }
    return found


def _profiler(trt: Any, times: dict[str, list[float]]) -> Any:
    class Profiler(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            times.setdefault(layer_name, []).append(float(ms))

    return Profiler()


def measure_layers(path: Path, runs: int = 50) -> tuple[dict[str, float], list]:
    """(mean GPU ms of every layer of ``path`` over ``runs`` profiled enqueues after two warm-up
    runs, the engine inspector's layer list with the execution context set)."""
    from trtq.trt import compat, cuda
    from trtq.trt.bench import _fill
    from trtq.trt.runtime import EngineSession

    if runs <= 0:
        raise ConfigError(f"--layers needs a positive number of runs, got {runs}")
    s = EngineSession(Path(path))
    try:
        rng = np.random.default_rng(0)
        s.set_input_shapes({t.name: s.default_shape(t) for t in s.input_tensors})
        s.bind()
        for t in s.input_tensors:
            cuda.copy_to_device(s.buffers[t.name].ptr, _fill(s.shapes[t.name], t.dtype, rng), s.stream)
        for _ in range(2):
            s.enqueue()
        s.stream.synchronize()
        times: dict[str, list[float]] = {}
        s.context.profiler = _profiler(s.trt, times)
        for _ in range(runs):
            s.enqueue()
            s.stream.synchronize()
        inspected = compat.engine_layers(s.trt, s.engine, s.context)
    finally:
        s.close()
    return {name: float(np.mean(v)) for name, v in times.items() if v}, inspected


def padded_layouts(path: Path, runs: int = PROFILE_RUNS) -> Any:
    """The layout check (:func:`trtq.trt.format_guard.check_layouts`) of the plan at ``path``: its
    inspector list after ``runs`` profiled runs (a context that has not run may report dynamic dims
    as -1) and the profile, which :func:`trtq.pipeline.build.checked_coverage` reuses."""
    from trtq.trt.format_guard import check_layouts

    times, inspected = measure_layers(path, runs)
    return check_layouts(inspected, times)


def profile_layers(path: Path, runs: int = 50) -> LayerProfile:
    """Mean GPU time of every layer of ``path`` over ``runs`` profiled enqueues (after two warm-up
    runs), largest first."""
    means, inspected = measure_layers(path, runs)
    details = _details(inspected)
    total = sum(means.values())
    layers = [
        LayerTime(name, ms, ms / total if total > 0 else 0.0, **details.get(name, {}))
        for name, ms in sorted(means.items(), key=lambda kv: -kv[1])
    ]
    return LayerProfile(str(path), runs, total, layers)


def engine_coverage(path: Path, runs: int = PROFILE_RUNS) -> Optional[Int8Coverage]:
    """The INT8 coverage (:func:`trtq.trt.coverage.int8_coverage`) of the plan at ``path``: its
    layers profiled over ``runs`` enqueues (random inputs at the profile's opt shapes) and its
    inspector layer list."""
    times, inspected = measure_layers(path, runs)
    return int8_coverage(inspected, times)


def render_layers(profiles: Sequence[LayerProfile], top: int = 25) -> str:
    """One table per plan: its ``top`` slowest layers, then a line for the rest."""
    out = []
    for p in profiles:
        out.append(
            f"{Path(p.plan).name}: {len(p.layers)} layers, {p.total_ms:.3f} ms profiled "
            f"(mean of {p.runs} runs; profiling adds overhead: compare layers, not this total)"
        )
        out.append(f"  {'ms':>7}  {'share':>6}  {'precision':<14}  {'type':<14}  layer")
        for layer in p.layers[:top]:
            out.append(
                f"  {layer.mean_ms:7.4f}  {layer.share:6.1%}  {layer.precision[:14]:<14}  "
                f"{layer.kind[:14]:<14}  {layer.name}"
            )
        rest = p.layers[top:]
        if rest:
            out.append(
                f"  {sum(x.mean_ms for x in rest):7.4f}  {sum(x.share for x in rest):6.1%}  "
                f"{'':<14}  {'':<14}  ({len(rest)} more layers)"
            )
        out.append(
            "  by precision: " + ", ".join(f"{k} {ms:.3f} ms ({share:.1%}, {n})" for k, ms, share, n in by_precision(p))
        )
    return "\n".join(out)


def by_precision(profile: LayerProfile) -> list[tuple[str, float, float, int]]:
    """(precision, ms, share, layers) summed over the layers of each input -> output precision,
    largest first; layers the inspector gave no precision for count as '?'."""
    sums: dict[str, list] = {}
    for layer in profile.layers:
        entry = sums.setdefault(layer.precision or "?", [0.0, 0.0, 0])
        entry[0] += layer.mean_ms
        entry[1] += layer.share
        entry[2] += 1
    return sorted(((k, ms, share, n) for k, (ms, share, n) in sums.items()), key=lambda t: -t[1])


__all__ = [
    "LayerProfile",
    "LayerTime",
    "by_precision",
    "engine_coverage",
    "measure_layers",
    "profile_layers",
    "render_layers",
]
