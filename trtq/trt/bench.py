"""Time TensorRT plans with CUDA events.

Each timed iteration is ``event -> work -> event`` on one stream, then a sync, so the number is
GPU time for one inference (the host's launch overhead between iterations is not counted).
"work" is ``execute_async_v3``; with ``include_copies`` it is H2D copies + execute + D2H copies
from/to pinned host memory; with ``cuda_graph`` the same work is captured once into a CUDA graph
and replayed (if capture fails the plan is timed without a graph and the result says why).
Inputs are deterministic pseudo-random values in the engine's opt shape.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from trtq.config import BenchOptions
from trtq.errors import ConfigError, TrtqError

log = logging.getLogger(__name__)


@dataclass
class BenchResult:
    plan: str
    precision: Optional[str]
    batch: int
    input_shapes: dict[str, list[int]]
    iterations: int
    median_ms: float
    mean_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    inferences_per_s: float
    samples_per_s: float
    include_copies: bool
    cuda_graph: bool
    tensorrt_version: str = ""
    gpu_name: str = ""
    speedup_vs_first: float = 1.0  # first plan's median / this median
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(times_ms: Sequence[float], batch: int) -> dict[str, float]:
    """Latency statistics over per-iteration times (ms) and the throughput they imply."""
    t = np.asarray(times_ms, dtype=np.float64)
    if t.size == 0:
        raise TrtqError("no timed iterations", "increase --iterations or --duration")
    mean = float(t.mean())
    return {
        "median_ms": float(np.median(t)),
        "mean_ms": mean,
        "p90_ms": float(np.percentile(t, 90)),
        "p95_ms": float(np.percentile(t, 95)),
        "p99_ms": float(np.percentile(t, 99)),
        "min_ms": float(t.min()),
        "max_ms": float(t.max()),
        "inferences_per_s": 1000.0 / mean if mean > 0 else float("inf"),
        "samples_per_s": batch * 1000.0 / mean if mean > 0 else float("inf"),
    }


def _check_options(options: BenchOptions) -> None:
    if options.iterations is not None and options.iterations <= 0:
        raise ConfigError(f"bench.iterations must be positive, got {options.iterations}")
    if options.iterations is None and options.duration <= 0:
        raise ConfigError(f"bench.duration must be positive, got {options.duration}")
    if options.warmup < 0:
        raise ConfigError(f"bench.warmup must be >= 0, got {options.warmup}")


def _fill(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(size=tuple(shape)).astype(dt)
    if dt.kind == "b":
        return np.zeros(tuple(shape), dtype=dt)
    return np.zeros(tuple(shape), dtype=dt)  # integer inputs are often indices: 0 is always valid


def _time_loop(step: Callable[[], None], stream: Any, options: BenchOptions) -> list[float]:
    from trtq.trt import cuda

    deadline = time.perf_counter() + options.warmup
    step()
    stream.synchronize()
    while time.perf_counter() < deadline:
        step()
        stream.synchronize()
    start, end = cuda.Event(), cuda.Event()
    times: list[float] = []
    try:
        t_end = time.perf_counter() + options.duration
        while True:
            start.record(stream)
            step()
            end.record(stream)
            end.synchronize()
            times.append(end.elapsed_ms(start))
            if options.iterations is not None:
                if len(times) >= options.iterations:
                    break
            elif time.perf_counter() >= t_end:
                break
    finally:
        start.destroy()
        end.destroy()
    return times


def bench_plan(path: Path, options: BenchOptions) -> BenchResult:
    from trtq.trt import cuda
    from trtq.trt.runtime import EngineSession

    _check_options(options)
    s = EngineSession(Path(path))
    pinned: dict[str, Any] = {}
    graph = None
    notes: list[str] = []
    try:
        rng = np.random.default_rng(0)
        shapes = {t.name: s.default_shape(t) for t in s.input_tensors}
        s.set_input_shapes(shapes)
        s.bind()
        for t in s.io:
            pinned[t.name] = cuda.PinnedArray(s.shapes[t.name], t.dtype)
        for t in s.input_tensors:
            pinned[t.name].array[...] = _fill(s.shapes[t.name], t.dtype, rng)
            cuda.copy_to_device(s.buffers[t.name].ptr, pinned[t.name].array, s.stream)
        s.stream.synchronize()

        def work() -> None:
            if options.include_copies:
                for t in s.input_tensors:
                    cuda.copy_to_device(s.buffers[t.name].ptr, pinned[t.name].array, s.stream)
            s.enqueue()
            if options.include_copies:
                for t in s.output_tensors:
                    cuda.copy_to_host(pinned[t.name].array, s.buffers[t.name].ptr, s.stream)

        step = work
        used_graph = False
        if options.cuda_graph:
            work()  # TensorRT needs one enqueue before capture (it may allocate/set up lazily)
            s.stream.synchronize()
            try:
                graph = cuda.Graph(s.stream, work)
                step = lambda: graph.launch(s.stream)  # noqa: E731
                used_graph = True
            except TrtqError as e:
                notes.append(f"CUDA graph capture failed ({e.message}); timed without a graph")
                log.warning("%s: CUDA graph capture failed (%s); timing without a graph", Path(path).name, e.message)
                s.stream.destroy()
                s.stream = cuda.Stream()  # a failed capture can leave the stream unusable

        times = _time_loop(step, s.stream, options)
        first_input = s.input_tensors[0] if s.input_tensors else None
        batch = int(s.shapes[first_input.name][0]) if first_input and s.shapes[first_input.name] else 1
        meta = s.metadata or {}
        gpu_name = cuda.device_info()[0]
        return BenchResult(
            plan=str(path),
            precision=meta.get("precision"),
            batch=batch,
            input_shapes={k: list(v) for k, v in shapes.items()},
            iterations=len(times),
            include_copies=bool(options.include_copies),
            cuda_graph=used_graph,
            tensorrt_version=str(s.trt.__version__),
            gpu_name=str(gpu_name),
            notes=notes,
            **summarize(times, batch),
        )
    finally:
        if graph is not None:
            graph.destroy()
        for p in pinned.values():
            p.free()
        s.close()


def bench_plans(paths: Sequence[Path], options: BenchOptions) -> list[BenchResult]:
    """Time each plan in turn; ``speedup_vs_first`` compares medians with the first plan."""
    if not paths:
        raise ConfigError("no engine plans given", "pass one or more .plan files")
    results = [bench_plan(Path(p), options) for p in paths]
    base = results[0].median_ms
    for r in results:
        r.speedup_vs_first = base / r.median_ms if r.median_ms > 0 else float("inf")
    return results


def render_table(results: Sequence[BenchResult]) -> str:
    """A fixed-width text table, one row per plan."""
    head = ["plan", "prec", "batch", "median ms", "mean ms", "p99 ms", "min ms", "inf/s", "samples/s", "vs first"]
    rows = []
    for r in results:
        rows.append(
            [
                Path(r.plan).name,
                r.precision or "?",
                str(r.batch),
                f"{r.median_ms:.3f}",
                f"{r.mean_ms:.3f}",
                f"{r.p99_ms:.3f}",
                f"{r.min_ms:.3f}",
                f"{r.inferences_per_s:,.1f}",
                f"{r.samples_per_s:,.0f}",
                f"{r.speedup_vs_first:.2f}x",
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(head), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    if results:
        r0 = results[0]
        how = "H2D+execute+D2H" if r0.include_copies else "execute only"
        graph = ", CUDA graph" if any(r.cuda_graph for r in results) else ""
        out.append(f"({how}{graph}; CUDA-event time per iteration; {r0.gpu_name}, TensorRT {r0.tensorrt_version})")
    for r in results:
        for note in r.notes:
            out.append(f"note: {Path(r.plan).name}: {note}")
    return "\n".join(out)
