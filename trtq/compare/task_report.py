"""How task metrics appear in compare's report: JSON, text lines, and what the gate reads."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from trtq.compare.formatting import fmt, json_float

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


def task_dict(result: Any) -> Optional[Dict[str, Any]]:
    """The ``task`` entry of an output in ``compare --json`` (None when there is no result)."""
    if result is None:
        return None
    return {
        "name": result.task,
        "how": result.how,
        "gate_metric": result.gate_metric,
        "metrics": {k: json_float(v) if isinstance(v, float) else v for k, v in result.metrics.items()},
    }


def task_lines(outputs: Sequence[Any]) -> List[str]:
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
        for key, value in result.metrics.items():
            if key in LABELS:
                label, spec, unit = LABELS[key]
                text = f"{label} {fmt(value, spec)}{unit if value is not None else ''}"
                metrics.append(text + " [gates --min-agreement]" if key == result.gate_metric else text)
            else:
                details.append(f"{key.replace('_', ' ')} {fmt(value, '.4g') if isinstance(value, float) else value}")
        lines.append("  " + "  ".join(metrics))
        if details:
            lines.append("  " + ", ".join(details))
    return lines


def gated_values(outputs: Sequence[Any]) -> List[Tuple[Any, str, Optional[float]]]:
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
