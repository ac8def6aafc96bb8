"""The accuracy report: JSON-able dict, aligned text table, and pass/fail gates."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trtq.compare.formatting import fmt, json_float, table
from trtq.compare.metrics import OutputMetrics
from trtq.compare.task_report import gated_values, task_dict, task_lines
from trtq.errors import ConfigError


def _check_fraction(value: Optional[float], flag: str, low: float) -> None:
    if value is None:
        return
    if not (low <= float(value) <= 1.0):
        raise ConfigError(
            f"{flag} must be between {low:g} and 1, got {value}",
            "give a fraction, e.g. 0.99 (not a percentage)",
        )


def _below(value: Optional[float], threshold: float) -> bool:
    """True when ``value`` fails ``>= threshold``; NaN always fails."""
    return value is None or math.isnan(value) or value < threshold


@dataclass(frozen=True)
class CompareReport:
    reference: str
    candidate: str
    samples: int
    batches: int
    outputs: Tuple[OutputMetrics, ...]
    runtime: str = ""  # what computed the candidate's outputs (and with which Q/DQ semantics)
    other: Optional["CompareReport"] = None  # the same Q/DQ model under the other semantics
    warnings: Tuple[str, ...] = ()

    def output(self, name: str) -> OutputMetrics:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON-able dict (see :func:`json_float` for how inf / nan are written)."""
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
                    "task": task_dict(o.task),
                }
                for o in self.outputs
            ],
        }
        if self.other is not None:
            out["other_semantics"] = {
                "runtime": self.other.runtime,
                "outputs": [{"name": o.name, "top1_agreement": json_float(o.top1_agreement),
                             "task": task_dict(o.task),
                             "sqnr_db": json_float(o.sqnr_db), "cosine_mean": json_float(o.cosine_mean)}
                            for o in self.other.outputs],
            }
        out["warnings"] = list(self.warnings)
        return out

    def render_text(self) -> str:
        head = [
            f"reference  {self.reference}",
            f"candidate  {self.candidate}",
        ] + ([f"runtime    {self.runtime}"] if self.runtime else []) + [
            f"samples    {self.samples} in {self.batches} batch{'es' if self.batches != 1 else ''}",
            "",
        ]
        header = ["output", "samples", "top-1 agree", "cos mean", "cos min", "max abs err",
                  "mean abs err", "max |ref|", "SQNR dB"]
        rows = []
        for o in self.outputs:
            top1 = "-" if o.top1_agreement is None else (
                f"{o.top1_agreement:.4f} ({o.top1_matches}/{o.samples})")
            rows.append([
                o.name, str(o.samples), top1,
                fmt(o.cosine_mean, ".6f"), fmt(o.cosine_min, ".6f"),
                fmt(o.max_abs_error, ".4g"), fmt(o.mean_abs_error, ".4g"),
                fmt(o.ref_max_abs, ".4g"), fmt(o.sqnr_db, ".2f"),
            ])
        tasks = task_lines(self.outputs)
        notes = [
            f"warning: output {o.name} has {o.nonfinite} NaN/Inf values"
            for o in self.outputs if o.nonfinite
        ]
        if self.other is not None:
            for o in self.other.outputs:
                top1 = "" if o.top1_agreement is None else f"top-1 agree {o.top1_agreement:.4f}, "
                if o.task is not None and o.task.gate_metric is not None and o.task.task != "classify":
                    top1 = f"{o.task.gate_label} {fmt(o.task.value, '.4f')}, "
                notes.append(f"{o.name} {self.other.runtime}: {top1}SQNR {fmt(o.sqnr_db, '.2f')} dB")
        notes += [f"warning: {w}" for w in self.warnings]
        return "\n".join(head + [table(header, rows)] + ([""] + tasks if tasks else [])
                         + ([""] + notes if notes else []))

    def gate(self, options: Any) -> List[str]:
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
        failed: List[str] = []
        if min_agreement is not None:
            scored = gated_values(self.outputs)
            if not scored:
                failed.append(
                    "--min-agreement cannot be checked: no output has a task metric (pass --task "
                    "classify|detect|segment|ctc) or looks like classifier scores ([N, C] with C > 1)"
                )
            for o, label, value in scored:
                if _below(value, float(min_agreement)):
                    failed.append(
                        f"{o.name}: {label} {fmt(value, '.6g')} is below "
                        f"--min-agreement {float(min_agreement):g}"
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
