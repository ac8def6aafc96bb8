"""``trtq inspect-cache``'s step: a cache decoded (trtq.calib.cache_inspect), checked against a model
and compared with another cache where asked. Writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtq.errors import CacheError


def inspect_cache(
    cfg: Any,
    cache: Path,
    model: Path | None = None,
    other: Path | None = None,
    *,
    sort: str = "file",
    top: int | None = None,
) -> dict[str, Any]:
    """``{"summary": ..., "model_check": ..., "diff": ...}`` (the last two where ``model`` /
    ``other`` are given), rows sorted by ``sort`` and cut to ``top``."""
    from trtq.calib import cache_inspect as ic

    table = ic.load_for_inspection(Path(cache))
    result: dict[str, Any] = {"summary": ic.summarize(table, Path(cache), sort=sort, top=top)}
    if model:
        from trtq.calib.cache import read_provenance
        from trtq.model import load_model

        selection = ((read_provenance(Path(cache)) or {}).get("collection") or {}).get("tensors")
        result["model_check"] = ic.check_against_model(table, load_model(model), selection)
    if other:
        result["diff"] = ic.diff(table, ic.load_for_inspection(Path(other)), sort=sort, top=top)
    return result


def unusable(result: dict[str, Any], cache: Path, model: Path | None) -> CacheError | None:
    """The error to stop with once the result is shown: the model check found the cache unusable."""
    from trtq.calib.cache_inspect import FAILING_VERDICTS

    check = result.get("model_check")
    if check is None or check.verdict not in FAILING_VERDICTS:
        return None
    return CacheError(
        f"{cache} is not usable for {model}: {check.verdict}: {check.message}", "re-run trtq calibrate for this model"
    )
