"""The accuracy report: JSON-able dict, aligned text table, and pass/fail gates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtq.compare.metrics import OutputMetrics
from trtq.compare.tasks import gated_task_names, reported_apart
from trtq.errors import ConfigError
from trtq.formatting import format_number as fmt
from trtq.formatting import json_number as json_float


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first ``left`` columns are left-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


# metric key -> (printed name, format, unit); other keys (counts, settings) go on a second line
LABELS = {
    "top1_agreement": ("top-1 agreement", ".4f", ""),
    "top5_agreement": ("top-5 agreement", ".4f", ""),
    "f1": ("detection F1", ".4f", ""),
    "precision": ("precision", ".4f", ""),
    "recall": ("recall", ".4f", ""),
    "box_sqnr_db": ("box SQNR", ".2f", " dB"),
    "score_sqnr_db": ("score SQNR", ".2f", " dB"),
    "iou": ("mask IoU", ".4f", ""),
    "pixel_agreement": ("pixel agreement", ".4f", ""),
    "sequence_agreement": ("sequence agreement", ".4f", ""),
    "cer": ("character error rate", ".4f", ""),
}


# metrics that are a fraction of independent samples (each sample agrees or not): they get a 95%
# interval, how far another evaluation set of the same size could move them
PER_SAMPLE = ("top1_agreement", "top5_agreement", "sequence_agreement")
Z95 = 1.959964


def wilson_interval(fraction: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a fraction of ``n`` samples (None without samples or a value):
    unlike p +- z sqrt(p(1-p)/n) it stays inside [0, 1] and is not empty at 0 or 1."""
    if not n or fraction is None or math.isnan(fraction):
        return None
    p = min(max(float(fraction), 0.0), 1.0)
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _intervals(result: Any, samples: int) -> dict[str, tuple[float, float]]:
    found = {key: wilson_interval(result.metrics.get(key), samples) for key in PER_SAMPLE}
    return {key: ci for key, ci in found.items() if ci is not None}


def task_dict(result: Any, samples: int = 0) -> dict[str, Any] | None:
    """The ``task`` entry of an output in ``compare --json`` (None when there is no result)."""
    if result is None:
        return None
    return {
        "name": result.task,
        "how": result.how,
        "gate_metric": result.gate_metric,
        "metrics": {k: json_float(v) if isinstance(v, float) else v for k, v in result.metrics.items()},
        "interval95": {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in _intervals(result, samples).items()},
    }


def task_lines(outputs: Sequence[Any]) -> list[str]:
    """Per output with a task: its task and how it was chosen, then its metrics (the gated one
    marked), then counts and settings. Raw outputs get the first line only."""
    lines = []
    for o in outputs:
        result = o.task
        if result is None:
            continue
        lines.append(f"task {o.name}: {result.task} ({result.how})")
        if result.task == "raw":
            continue
        metrics, details = [], []
        intervals = _intervals(result, o.samples)
        for key, value in result.metrics.items():
            if key in LABELS:
                label, spec, unit = LABELS[key]
                text = f"{label} {fmt(value, spec)}{unit if value is not None else ''}"
                if key in intervals:
                    text += " (95% interval {:.3f}-{:.3f})".format(*intervals[key])
                metrics.append(text + " [gates --min-agreement]" if key == result.gate_metric else text)
            elif key == "undefined":
                details.append(f"no verdict: {value}")
            else:
                details.append(f"{key.replace('_', ' ')} {fmt(value, '.4g') if isinstance(value, float) else value}")
        lines.append("  " + "  ".join(metrics))
        if details:
            lines.append("  " + ", ".join(details))
    return lines


def gated_values(outputs: Sequence[Any]) -> list[tuple[Any, str, float | None]]:
    """(output, metric name, value) for each output the agreement gate reads: the task metric,
    or, for a raw output that looks like classifier scores, its top-1 agreement."""
    found = []
    for o in outputs:
        result = o.task
        if result is not None and result.gate_metric is not None:
            found.append((o, result.gate_label, result.value))
        elif o.top1_agreement is not None:
            found.append((o, "top-1 agreement", o.top1_agreement))
    return found


def _check_fraction(value: float | None, flag: str, low: float) -> None:
    if value is None:
        return
    if not (low <= float(value) <= 1.0):
        raise ConfigError(
            f"{flag} must be between {low:g} and 1, got {value}",
            "give a fraction, e.g. 0.99 (not a percentage)",
        )


def _below(value: float | None, threshold: float) -> bool:
    """True when ``value`` fails ``>= threshold``; NaN always fails."""
    return value is None or math.isnan(value) or value < threshold


@dataclass(frozen=True)
class CompareReport:
    reference: str
    candidate: str
    samples: int
    batches: int
    outputs: tuple[OutputMetrics, ...]
    runtime: str = ""  # what computed the candidate's outputs (and with which Q/DQ semantics)
    other: CompareReport | None = None  # the same Q/DQ model under the other semantics
    warnings: tuple[str, ...] = ()

    def output(self, name: str) -> OutputMetrics:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (see :func:`trtq.formatting.json_number` for how inf / nan are written)."""
        out = {
            "reference": self.reference,
            "candidate": self.candidate,
            "runtime": self.runtime,
            "samples": self.samples,
            "batches": self.batches,
            "outputs": [
                {
                    "name": o.name,
                    "sample_shape": list(o.sample_shape),
                    "samples": o.samples,
                    "top1_agreement": json_float(o.top1_agreement),
                    "top1_matches": o.top1_matches,
                    "cosine_mean": json_float(o.cosine_mean),
                    "cosine_min": json_float(o.cosine_min),
                    "max_abs_error": json_float(o.max_abs_error),
                    "mean_abs_error": json_float(o.mean_abs_error),
                    "sqnr_db": json_float(o.sqnr_db),
                    "ref_max_abs": json_float(o.ref_max_abs),
                    "nonfinite": o.nonfinite,
                    "task": task_dict(o.task, o.samples),
                }
                for o in self.outputs
            ],
        }
        if self.other is not None:
            out["other_semantics"] = {
                "runtime": self.other.runtime,
                "outputs": [
                    {
                        "name": o.name,
                        "top1_agreement": json_float(o.top1_agreement),
                        "task": task_dict(o.task, o.samples),
                        "sqnr_db": json_float(o.sqnr_db),
                        "cosine_mean": json_float(o.cosine_mean),
                    }
                    for o in self.other.outputs
                ],
            }
        out["warnings"] = list(self.warnings)
        return out

    def render_text(self) -> str:
        head = (
            [
                f"reference  {self.reference}",
                f"candidate  {self.candidate}",
            ]
            + ([f"runtime    {self.runtime}"] if self.runtime else [])
            + [
                f"samples    {self.samples} in {self.batches} batch{'es' if self.batches != 1 else ''}",
                "",
            ]
        )
        header = [
            "output",
            "samples",
            "top-1 agree",
            "cos mean",
            "cos min",
            "max abs err",
            "mean abs err",
            "max |ref|",
            "SQNR dB",
        ]
        rows = []
        for o in self.outputs:
            top1 = "-" if o.top1_agreement is None else (f"{o.top1_agreement:.4f} ({o.top1_matches}/{o.samples})")
            rows.append(
                [
                    o.name,
                    str(o.samples),
                    top1,
                    fmt(o.cosine_mean, ".6f"),
                    fmt(o.cosine_min, ".6f"),
                    fmt(o.max_abs_error, ".4g"),
                    fmt(o.mean_abs_error, ".4g"),
                    fmt(o.ref_max_abs, ".4g"),
                    fmt(o.sqnr_db, ".2f"),
                ]
            )
        tasks = task_lines(self.outputs)
        notes = [f"warning: output {o.name} has {o.nonfinite} NaN/Inf values" for o in self.outputs if o.nonfinite]
        if self.other is not None:
            for o in self.other.outputs:
                top1 = "" if o.top1_agreement is None else f"top-1 agree {o.top1_agreement:.4f}, "
                if o.task is not None and reported_apart(o.task.task):
                    top1 = f"{o.task.gate_label} {fmt(o.task.value, '.4f')}, "
                notes.append(f"{o.name} {self.other.runtime}: {top1}SQNR {fmt(o.sqnr_db, '.2f')} dB")
        notes += [f"warning: {w}" for w in self.warnings]
        return "\n".join(
            head + [table(header, rows)] + ([""] + tasks if tasks else []) + ([""] + notes if notes else [])
        )

    def gate(self, options: Any) -> list[str]:
        """Descriptions of the failed gates (empty list: all passed).

        ``options.min_agreement`` applies to the task metric of every output that has one
        (classify top-1, detect F1, segment mask IoU, ctc sequence agreement; raw outputs that
        look like classifier scores: top-1), and fails when no output has one (the gate could
        not be checked). ``options.min_cosine`` applies to the mean cosine similarity of every
        output. NaN metrics always fail.
        """
        min_agreement = getattr(options, "min_agreement", None)
        min_cosine = getattr(options, "min_cosine", None)
        _check_fraction(min_agreement, "--min-agreement", 0.0)
        _check_fraction(min_cosine, "--min-cosine", -1.0)
        failed: list[str] = []
        if min_agreement is not None:
            scored = gated_values(self.outputs)
            if not scored:
                failed.append(
                    "--min-agreement cannot be checked: no output has a task metric (pass --task "
                    f"{'|'.join(gated_task_names())}) or looks like classifier scores ([N, C] with C > 1)"
                )
            for o, label, value in scored:
                why = o.task.undefined if o.task is not None else None
                if value is None and why:
                    failed.append(f"{o.name}: {label} cannot be measured: {why}")
                elif _below(value, float(min_agreement)):
                    failed.append(
                        f"{o.name}: {label} {fmt(value, '.6g')} is below --min-agreement {float(min_agreement):g}"
                    )
        if min_cosine is not None:
            for o in self.outputs:
                if _below(o.cosine_mean, float(min_cosine)):
                    extra = f" ({o.nonfinite} NaN/Inf values)" if o.nonfinite else ""
                    failed.append(
                        f"{o.name}: mean cosine similarity {fmt(o.cosine_mean, '.8g')} is below "
                        f"--min-cosine {float(min_cosine):g}{extra}"
                    )
        return failed
