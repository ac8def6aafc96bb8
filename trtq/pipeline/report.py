"""``trtq report``'s step: the report's data (trtq.report.data) and its page (trtq.report.page),
written as one output."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def report(
    cfg: Any,
    cache: Path,
    statistics: Path | None,
    compare: Path | None,
    quantize: Path | None,
    bench: Path | None,
    output: Path,
) -> dict:
    """The report of ``cache`` (with the --save-stats ``statistics`` and the --json results of
    compare, quantize and bench where given) as data, its HTML page written to ``output``."""
    from trtq import interrupt, progress
    from trtq.fileio import atomic_write_text
    from trtq.report.data import build_report
    from trtq.report.page import render_html

    with progress.stage("report: reading the cache and statistics, every method's ranges"):
        data = build_report(Path(cache), statistics, compare, quantize, bench)
    with progress.stage("report: writing the page"):
        page = render_html(data)
    with interrupt.held_for_outputs():  # the one output: once in place, a signal no longer says "interrupted"
        atomic_write_text(Path(output), page)
    return data
