"""How trtq writes a number that may be missing or not finite, in text and in JSON: the one
formatter behind ``compare``'s and ``inspect-cache``'s tables and their ``--json``; and how it reads
one that a user typed (``ascii_int``, ``ascii_float``: every flag and flag-like value goes through
them)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

# at most 18 digits: every count trtq takes fits an int64 (ONNX dims, numpy sizes, file offsets)
_ASCII_INT = re.compile(r"[+-]?[0-9]{1,18}")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


def ascii_int(text: Any) -> int | None:
    """The integer ``text`` spells with the ASCII digits 0-9 (an optional sign, surrounding spaces,
    at most 18 digits), else None. ``int()`` alone also takes other scripts' digits (``"١٢"``,
    full-width ``"１２"``), underscores (``"1_000"``) and numbers of any length."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if abs(text) < 10**18 else None
    t = str(text).strip()
    return int(t) if _ASCII_INT.fullmatch(t) else None


def ascii_float(text: Any) -> float | None:
    """The finite number ``text`` spells with ASCII digits (``1.5``, ``.5``, ``2e-3``), else None
    (``float()`` also takes ``"nan"``, ``"inf"``, ``"1_0"`` and other scripts' digits)."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        t = str(text).strip()
        if not _ASCII_FLOAT.fullmatch(t):
            return None
        value = float(t)
    return value if math.isfinite(value) else None


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


def first_few(names: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` of ``names`` comma-separated, `` ...`` after them when there are more
    (the one way a message lists what it refuses)."""
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")
