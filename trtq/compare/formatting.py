"""Number formatting and text tables shared by compare's reports."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence


def json_float(value: Optional[float]) -> Any:
    """A float for JSON: finite values as numbers, inf / -inf / nan as the strings "inf",
    "-inf", "nan" (strict JSON has no such numbers), None as null."""
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def fmt(value: Optional[float], spec: str) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)


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
