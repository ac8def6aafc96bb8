"""How trtq writes a number that may be missing or not finite, in text and in JSON: the one
formatter behind ``compare``'s and ``inspect-cache``'s tables and their ``--json``."""
from __future__ import annotations

import math
from typing import Any


def nonfinite_name(value: float) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a value that is not finite, else None."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return None


def format_number(value: float | None, spec: str = ".6g") -> str:
    """Text for a table cell: ``-`` for None, nan / inf / -inf by name, else ``format(value, spec)``."""
    if value is None:
        return "-"
    return nonfinite_name(value) or format(value, spec)


def json_number(value: float | None) -> Any:
    """A float for JSON: finite values as numbers, inf / -inf / nan as the strings "inf", "-inf",
    "nan" (strict JSON has no such numbers), None as null."""
    if value is None:
        return None
    value = float(value)
    return nonfinite_name(value) or value
