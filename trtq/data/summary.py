"""One full pass over a Batcher, reduced to the numbers ``trtq calibrate --dry-run`` shows."""

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass
class InputSummary:
    """Statistics over the real (non-padding) rows of one input."""

    name: str
    shape: tuple[int, ...]  # full batch shape
    dtype: str
    min: Optional[float] = None
    max: Optional[float] = None
    mean: Optional[float] = None
    std: Optional[float] = None  # population standard deviation over all values


@dataclass
class DataSummary:
    inputs: list[InputSummary]
    batches: int
    samples: int
    padded_rows: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [dict(asdict(i), shape=list(i.shape)) for i in self.inputs],
            "batches": self.batches,
            "samples": self.samples,
            "padded_rows": self.padded_rows,
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "seconds": round(self.seconds, 6),
            "samples_per_second": round(self.samples_per_second, 3),
        }

    def render_text(self) -> str:
        lines = [
            f"batches {self.batches}, samples {self.samples}, padded rows {self.padded_rows}, "
            f"skipped {len(self.skipped)}, {self.seconds:.2f} s ({self.samples_per_second:.1f} samples/s)"
        ]
        for i in self.inputs:
            if i.min is None:
                lines.append(f"  {i.name}: {list(i.shape)} {i.dtype}, no samples")
            else:
                lines.append(
                    f"  {i.name}: {list(i.shape)} {i.dtype}  min {i.min:.6g}  max {i.max:.6g}  "
                    f"mean {i.mean:.6g}  std {i.std:.6g}"
                )
        for path, reason in self.skipped[:5]:
            lines.append(f"  skipped {path}: {reason}")
        if len(self.skipped) > 5:
            lines.append(f"  ... and {len(self.skipped) - 5} more skipped")
        return "\n".join(lines)


class _Moments:
    """Count, mean and sum of squared deviations, merged batch by batch (Chan et al.)."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = np.inf
        self.max = -np.inf

    def update(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        xb = x.astype(np.float64, copy=False)
        n_b = xb.size
        mean_b = float(xb.mean())
        m2_b = float(np.square(xb - mean_b).sum())
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * self.n * n_b / n
        self.n = n
        self.min = min(self.min, float(xb.min()))
        self.max = max(self.max, float(xb.max()))


def summarize(batcher) -> DataSummary:
    """Iterate ``batcher`` once and summarize what it produced."""
    moments = {name: _Moments() for name in batcher.shapes}
    batches = samples = padded = 0
    t0 = time.perf_counter()
    for batch in batcher:
        batches += 1
        samples += batch.valid
        rows = 0
        for name, arr in batch.arrays.items():
            rows = arr.shape[0]
            moments[name].update(arr[: batch.valid])
        padded += rows - batch.valid
    seconds = time.perf_counter() - t0
    inputs = []
    for name, m in moments.items():
        src = batcher.sources[name] if hasattr(batcher, "sources") else None
        dtype = str(src.dtype) if src is not None else ""
        s = InputSummary(name, tuple(batcher.shapes[name]), dtype)
        if m.n:
            s.min, s.max, s.mean, s.std = m.min, m.max, m.mean, float(np.sqrt(m.m2 / m.n))
        inputs.append(s)
    return DataSummary(inputs, batches, samples, padded, list(batcher.skipped), seconds)
