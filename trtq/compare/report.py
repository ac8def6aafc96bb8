"""The accuracy report: JSON-able dict, aligned text table, and pass/fail gates."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trtq.compare.metrics import OutputMetrics
from trtq.errors import ConfigError
from trtq.numbers import format_number as fmt
from trtq.numbers import json_number as json_float


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first ``left`` columns are left-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


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
        """Plain JSON-able dict (see :func:`trtq.numbers.json_number` for how inf / nan are written)."""
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
                }
                for o in self.outputs
            ],
        }
        if self.other is not None:
            out["other_semantics"] = {
                "runtime": self.other.runtime,
                "outputs": [{"name": o.name, "top1_agreement": json_float(o.top1_agreement),
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
        notes = [
            f"warning: output {o.name} has {o.nonfinite} NaN/Inf values"
            for o in self.outputs if o.nonfinite
        ]
        if self.other is not None:
            for o in self.other.outputs:
                top1 = "" if o.top1_agreement is None else f"top-1 agree {o.top1_agreement:.4f}, "
                notes.append(f"{o.name} {self.other.runtime}: {top1}SQNR {fmt(o.sqnr_db, '.2f')} dB")
        notes += [f"warning: {w}" for w in self.warnings]
        return "\n".join(head + [table(header, rows)] + ([""] + notes if notes else []))

    def gate(self, options: Any) -> List[str]:
        """Descriptions of the failed gates (empty list: all passed).

        ``options.min_agreement`` applies to every output with a top-1 agreement, and fails when
        no output has one (the gate could not be checked). ``options.min_cosine`` applies to the
        mean cosine similarity of every output. NaN metrics always fail.
        """
        min_agreement = getattr(options, "min_agreement", None)
        min_cosine = getattr(options, "min_cosine", None)
        _check_fraction(min_agreement, "--min-agreement", 0.0)
        _check_fraction(min_cosine, "--min-cosine", -1.0)
        failed: List[str] = []
        if min_agreement is not None:
            scored = [o for o in self.outputs if o.top1_agreement is not None]
            if not scored:
                failed.append(
                    "--min-agreement cannot be checked: no output looks like classifier "
                    "scores ([N, C] with C > 1)"
                )
            for o in scored:
                if _below(o.top1_agreement, float(min_agreement)):
                    failed.append(
                        f"{o.name}: top-1 agreement {fmt(o.top1_agreement, '.6g')} is below "
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
