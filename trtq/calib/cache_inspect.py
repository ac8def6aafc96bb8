"""Library side of ``trtq inspect-cache``: decode a calibration cache, check it against a model,
compare two caches. Pure functions returning dataclasses; :func:`to_jsonable` and
:func:`render_text` turn a result (or a dict of results) into ``--json`` data or aligned text.

Sort keys: ``file`` (order in the file), ``name`` (A-Z), ``amax`` and ``scale`` (largest first),
``rel-diff`` (largest difference first; diffs only, summaries fall back to file order).
"""

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Optional, Union

from trtq.calib.cache import INT8_MAX, CalibrationTable, scale_hex, scale_of, scale_problem, version_code
from trtq.errors import ConfigError, TrtqError
from trtq.formatting import format_number, json_number

SORT_KEYS = ("file", "name", "amax", "scale", "rel-diff")

# verdicts of check_against_model that make `inspect-cache --model` exit 3 (a CI gate)
FAILING_VERDICTS = ("no-match", "unusable")

# names TensorRT gives to tensors it creates itself (not ONNX values)
_TRT_INTERNAL = re.compile(r"^(\(Unnamed Layer\* \d+\)|ONNXTRT_)")


@dataclass
class TensorRow:
    name: str
    amax: float
    scale: float  # amax / 127 rounded to float32
    hex: str  # what a TensorRT cache stores


@dataclass
class CacheSummary:
    path: str
    format: str  # "tensorrt" | "onnxruntime"
    header: Optional[str]  # "TRT-8600-EntropyCalibration2"; None for ONNX Runtime tables
    trt_version: Optional[str]
    algorithm: str
    count: int
    amax_min: Optional[float]
    amax_median: Optional[float]
    amax_max: Optional[float]
    zero_amax: list[str]
    nonfinite: list[str]
    sort: str
    rows: list[TensorRow]  # after sorting and --top
    unusable: list[str] = field(default_factory=list)  # zero, denormal, huge, NaN/Inf scales: quantize refuses them
    # the range method trtq used ("mse", "percentile 99.99"), from the provenance JSON when it matches
    # this cache; the header's algorithm is only TensorRT's label (trtq writes EntropyCalibration2)
    method: Optional[str] = None


@dataclass
class ModelCheck:
    model_tensors: int  # calibratable tensors of the model
    covered: int  # of those, how many the cache has
    missing_from_cache: list[str]  # model order
    not_in_model: list[str]  # cache order
    tensorrt_internal: int  # of not_in_model: names TensorRT makes up ((Unnamed Layer* N) ..., ONNXTRT_...)
    # "complete" | "incomplete" | "qdq-set" | "unusable" | "no-match"; Q/DQ model: "qdq-same" | "qdq-differs"
    verdict: str
    message: str
    unusable: list[str] = field(default_factory=list)  # model tensors whose scale cannot be used
    qdq_model: bool = False  # the model has Q/DQ nodes: its activation scales are compared with the cache's
    differing: list[str] = field(default_factory=list)  # Q/DQ model: tensors whose scale differs from the cache


@dataclass
class DiffRow:
    name: str
    amax_a: float
    amax_b: float
    rel_diff: float  # |a - b| / max(|a|, |b|); 0 when equal


@dataclass
class CacheDiff:
    label_a: str
    label_b: str
    header_a: Optional[str]
    header_b: Optional[str]
    compared: int
    only_in_a: list[str]
    only_in_b: list[str]
    median_rel_diff: Optional[float]
    max_rel_diff: Optional[float]
    max_rel_diff_tensor: Optional[str]
    over_1pct: int
    over_10pct: int
    sort: str
    rows: list[DiffRow] = field(default_factory=list)  # after sorting and --top


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _check_sort(sort: str, top: Optional[int]) -> None:
    if sort not in SORT_KEYS:
        raise ConfigError(f"unknown sort key '{sort}'", "use one of: " + ", ".join(SORT_KEYS))
    if top is not None and (not isinstance(top, int) or top < 1):
        raise ConfigError(f"--top must be a positive number, got {top!r}")


def _desc_key(value: float) -> tuple:
    """Sort key putting NaN last and the largest (inf included) first."""
    return (math.isnan(value), -value if not math.isnan(value) else 0.0)


def header_of(table: CalibrationTable) -> Optional[str]:
    if table.source_format != "tensorrt" or not table.trt_version:
        return None
    return f"TRT-{version_code(table.trt_version)}-{table.algorithm}"


def _hex(amax: float) -> str:
    if math.isnan(amax):
        return "7fc00000"
    if math.isinf(amax):
        return "7f800000" if amax > 0 else "ff800000"
    return scale_hex(amax)


def _scale(amax: float) -> float:
    return amax / 127.0 if not math.isfinite(amax) else scale_of(amax)


# --------------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------------


def summarize(
    table: CalibrationTable, path: Union[str, Path, None] = None, sort: str = "file", top: Optional[int] = None
) -> CacheSummary:
    """Header decoded, count, amax statistics, zero/non-finite tensors, and the per-tensor rows."""
    _check_sort(sort, top)
    rows = [TensorRow(n, float(a), _scale(float(a)), _hex(float(a))) for n, a in table.amax.items()]
    finite = [r.amax for r in rows if math.isfinite(r.amax)]
    if sort == "name":
        rows.sort(key=lambda r: r.name)
    elif sort in ("amax", "scale"):
        rows.sort(key=lambda r: _desc_key(r.amax))
    if top is not None:
        rows = rows[:top]
    return CacheSummary(
        path=str(path) if path is not None else "",
        format=table.source_format,
        header=header_of(table),
        trt_version=table.trt_version,
        algorithm=table.algorithm,
        count=len(table.amax),
        amax_min=min(finite) if finite else None,
        amax_median=float(statistics.median(finite)) if finite else None,
        amax_max=max(finite) if finite else None,
        zero_amax=[n for n, a in table.amax.items() if a == 0],
        nonfinite=[n for n, a in table.amax.items() if not math.isfinite(a)],
        sort=sort if sort != "rel-diff" else "file",
        rows=rows,
        unusable=unusable_entries(table),
        method=_method_from_provenance(table, path),
    )


def _method_from_provenance(table: CalibrationTable, path: Union[str, Path, None]) -> Optional[str]:
    """ "mse" / "percentile 99.99" / ... when ``<cache>.json`` was written with this very cache."""
    from trtq.calib.cache import read_provenance

    if path is None:
        return None
    try:
        data = read_provenance(path)
    except TrtqError:
        return None
    if not data or not isinstance(data.get("method"), dict) or not isinstance(data.get("amax"), dict):
        return None
    recorded = data["amax"]
    if set(recorded) != set(table.amax) or any(
        not isinstance(recorded[n], (int, float)) or _hex(float(recorded[n])) != _hex(float(a))
        for n, a in table.amax.items()
    ):
        return None  # the JSON belongs to another version of the cache
    name = str(data["method"].get("name", "?"))
    if name == "percentile" and data["method"].get("percentile") is not None:
        return f"percentile {data['method']['percentile']}"
    return name


def unusable_entries(table: CalibrationTable) -> list[str]:
    """Entries whose scale cannot quantize anything (see trtq.calib.cache.scale_problem)."""
    return [n for n, a in table.amax.items() if scale_problem(float(a) / INT8_MAX) is not None]


# --------------------------------------------------------------------------------------------
# model coverage
# --------------------------------------------------------------------------------------------


QDQ_SAME_REL = 1e-5  # float32 scale round trips (hex, decimal tables) stay far below this


def check_against_qdq_model(table: CalibrationTable, model) -> ModelCheck:
    """A Q/DQ model carries its own activation scales: which of them the cache has, and whether they
    are the cache's (amax = 127 * scale, relative difference <= :data:`QDQ_SAME_REL`)."""
    from trtq.qdq_info import read_qdq

    acts = read_qdq(model).activations
    missing = [n for n in acts if n not in table.amax]
    differing = [
        n
        for n, a in acts.items()
        if n in table.amax and abs(a - table.amax[n]) > QDQ_SAME_REL * max(abs(a), abs(table.amax[n]))
    ]
    covered = len(acts) - len(missing)
    if covered == 0:
        verdict, message = (
            "no-match",
            (
                f"none of the model's {len(acts)} quantized activations is in the cache: "
                "it was made for another model (or another export of it)"
            ),
        )
    elif missing or differing:
        verdict = "qdq-differs"
        message = (
            f"{len(differing)} of {covered} quantized activations have another scale in the model than in "
            f"the cache"
            + (f"; {len(missing)} are not in the cache" if missing else "")
            + ": the model was not quantized from this cache (or was changed since)"
        )
    else:
        verdict, message = "qdq-same", f"all {len(acts)} quantized activations have the cache's scale"
    return ModelCheck(
        model_tensors=len(acts),
        covered=covered,
        missing_from_cache=missing,
        not_in_model=[],
        tensorrt_internal=0,
        verdict=verdict,
        message=message,
        qdq_model=True,
        differing=differing,
    )


def check_against_model(table: CalibrationTable, model, selection: Optional[str] = None) -> ModelCheck:
    """Which calibratable tensors of ``model`` (an onnx.ModelProto) the cache covers, and which
    cache entries the model does not have. A Q/DQ model is checked by :func:`check_against_qdq_model`.
    ``selection``: the provenance's ``collection.tensors``; ``"qdq"`` (calibrate --tensors qdq) makes
    the uncovered rest expected: verdict ``qdq-set`` instead of ``incomplete``."""
    from trtq.model import calibratable_tensors, has_qdq

    if has_qdq(model):
        return check_against_qdq_model(table, model)

    wanted = calibratable_tensors(model)
    wanted_set = set(wanted)
    missing = [n for n in wanted if n not in table.amax]
    extra = [n for n in table.amax if n not in wanted_set]
    internal = sum(1 for n in extra if _TRT_INTERNAL.match(n))
    covered = len(wanted) - len(missing)
    bad = set(unusable_entries(table))
    unusable = [n for n in wanted if n in bad]
    if covered == 0:
        verdict = "no-match"
        message = (
            f"none of the model's {len(wanted)} calibratable tensors is in the cache: "
            "it was made for another model (or another export of it)"
        )
    elif unusable:
        verdict = "unusable"
        message = (
            f"{len(unusable)} of the model's tensors have a zero, denormal, huge or non-finite scale "
            f"({_names(unusable, 5)}): trtq quantize refuses this cache"
        )
    elif missing and selection == "qdq":
        verdict = "qdq-set"
        message = (
            f"the cache holds the {covered} activations trtq quantize places Q/DQ on (calibrate --tensors qdq): "
            f"all an explicit build reads; the other {len(missing)} calibratable tensors have no range, so "
            "an implicit build (build --mode implicit) refuses it"
        )
    elif missing:
        verdict = "incomplete"
        message = (
            f"{len(missing)} of {len(wanted)} calibratable tensors have no range; TensorRT runs them in "
            "higher precision, and trtq quantize leaves their consumers in float"
        )
    else:
        verdict = "complete"
        message = f"all {len(wanted)} calibratable tensors have a range"
    if extra:
        message += f"; {len(extra)} cache entries are not tensors of the model"
        if internal:
            message += f" ({internal} TensorRT-internal names)"
    return ModelCheck(
        model_tensors=len(wanted),
        covered=covered,
        missing_from_cache=missing,
        not_in_model=extra,
        tensorrt_internal=internal,
        verdict=verdict,
        message=message,
        unusable=unusable,
    )


# --------------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------------


def rel_diff(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``: 0 when equal (both 0 included), 1 when only one side is
    infinite, NaN when either is NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b:
        return 0.0
    denom = max(abs(a), abs(b))
    if math.isinf(denom):
        return 1.0
    return abs(a - b) / denom


def diff(
    a: CalibrationTable,
    b: CalibrationTable,
    sort: str = "file",
    top: Optional[int] = None,
    labels: Sequence[str] = ("cache", "other"),
) -> CacheDiff:
    """Per tensor in both: amax in each and the relative difference; tensors in only one; summary."""
    _check_sort(sort, top)
    rows = [
        DiffRow(n, float(v), float(b.amax[n]), rel_diff(float(v), float(b.amax[n])))
        for n, v in a.amax.items()
        if n in b.amax
    ]
    finite = [r.rel_diff for r in rows if not math.isnan(r.rel_diff)]
    worst = max((r for r in rows if not math.isnan(r.rel_diff)), key=lambda r: r.rel_diff, default=None)
    if sort == "name":
        rows.sort(key=lambda r: r.name)
    elif sort in ("amax", "scale"):
        rows.sort(key=lambda r: _desc_key(r.amax_a))
    elif sort == "rel-diff":
        rows.sort(key=lambda r: _desc_key(r.rel_diff))
    if top is not None:
        rows = rows[:top]
    return CacheDiff(
        label_a=labels[0],
        label_b=labels[1],
        header_a=header_of(a),
        header_b=header_of(b),
        compared=sum(1 for n in a.amax if n in b.amax),
        only_in_a=[n for n in a.amax if n not in b.amax],
        only_in_b=[n for n in b.amax if n not in a.amax],
        median_rel_diff=float(statistics.median(finite)) if finite else None,
        max_rel_diff=max(finite) if finite else None,
        max_rel_diff_tensor=worst.name if worst is not None else None,
        over_1pct=sum(1 for d in finite if d > 0.01),
        over_10pct=sum(1 for d in finite if d > 0.10),
        sort=sort,
        rows=rows,
    )


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def to_jsonable(result: Any) -> Any:
    """Plain JSON data: dataclasses become dicts; Inf/NaN become the strings "inf"/"-inf"/"nan"."""
    if is_dataclass(result) and not isinstance(result, type):
        return to_jsonable(asdict(result))
    if isinstance(result, Mapping):
        return {str(k): to_jsonable(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return [to_jsonable(v) for v in result]
    if isinstance(result, float):
        return json_number(result)
    if hasattr(result, "item") and callable(result.item):  # numpy scalar
        return to_jsonable(result.item())
    return result


def _pct(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    return f"{100.0 * v:.3g}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Right-aligned number columns, last column (the tensor name) left-aligned and unpadded."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header[:-1])]

    def line(cells: Sequence[str]) -> str:
        return indent + "  ".join([c.rjust(w) for c, w in zip(cells[:-1], widths)] + [cells[-1]])

    return [line(header)] + [line(r) for r in rows]


def _names(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _name_lines(entries: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """One line per non-empty list of names: its label, then the first names and how many more."""
    return [label + _names(names) for label, names in entries if names]


def _render_summary(s: CacheSummary) -> list[str]:
    if s.format == "tensorrt":
        fmt = f"TensorRT calibration cache, header {s.header} (TensorRT {s.trt_version}, {s.algorithm})"
    else:
        fmt = "ONNX Runtime calibration table (name amax; no TensorRT header)"
    out = [
        f"cache      {s.path}",
        f"format     {fmt}",
    ]
    if s.method:
        out.append(
            f"method     {s.method} (trtq calibrate, from the provenance JSON; the header names TensorRT's "
            "calibrator format, not the range method)"
        )
    out += [
        f"tensors    {s.count}",
        f"amax       min {format_number(s.amax_min)}   median {format_number(s.amax_median)}   "
        f"max {format_number(s.amax_max)}",
    ]
    out += _name_lines(
        [
            (f"zero amax  {len(s.zero_amax)}: ", s.zero_amax),
            (f"non-finite {len(s.nonfinite)}: ", s.nonfinite),
            (
                f"unusable   {len(s.unusable)} (zero, denormal, huge or non-finite scale; "
                "quantize refuses the cache): ",
                s.unusable,
            ),
        ]
    )
    if s.rows:
        order = {"file": "file order", "name": "by name", "amax": "largest amax first", "scale": "largest scale first"}
        shown = f"{len(s.rows)} of {s.count}" if len(s.rows) < s.count else f"all {s.count}"
        out.append(f"rows       {shown}, {order.get(s.sort, s.sort)}")
        out += _table(
            ["amax", "scale", "hex", "tensor"],
            [[format_number(r.amax), format_number(r.scale), r.hex, r.name] for r in s.rows],
        )
    return out


def _render_check(c: ModelCheck) -> list[str]:
    what = "quantized activations of the Q/DQ model" if c.qdq_model else "calibratable tensors"
    out = [
        f"model      {c.covered} of {c.model_tensors} {what} have a range in the cache",
        f"verdict    {c.verdict}: {c.message}",
    ]
    return out + _name_lines(
        [
            ("differ     ", c.differing),
            ("missing    ", c.missing_from_cache),
            (f"extra      {len(c.not_in_model)} not tensors of the model: ", c.not_in_model),
        ]
    )


def _render_diff(d: CacheDiff) -> list[str]:
    out = [
        f"diff       {d.label_a} ({d.header_a or 'no header'}) vs {d.label_b} ({d.header_b or 'no header'})",
        f"compared   {d.compared} tensors in both: median rel diff {_pct(d.median_rel_diff)}, "
        f"max {_pct(d.max_rel_diff)}" + (f" ({d.max_rel_diff_tensor})" if d.max_rel_diff_tensor else ""),
        f"           {d.over_1pct} differ by more than 1%, {d.over_10pct} by more than 10%",
    ]
    out += _name_lines(
        [
            (f"only in {d.label_a}  {len(d.only_in_a)}: ", d.only_in_a),
            (f"only in {d.label_b}  {len(d.only_in_b)}: ", d.only_in_b),
        ]
    )
    if d.rows:
        out += _table(
            ["rel diff", f"amax {d.label_a}", f"amax {d.label_b}", "tensor"],
            [[_pct(r.rel_diff), format_number(r.amax_a), format_number(r.amax_b), r.name] for r in d.rows],
        )
    return out


def render_text(result: Any) -> str:
    """Readable text for a CacheSummary, ModelCheck, CacheDiff, or a dict holding any of them
    under "summary", "model_check", "diff" (printed in that order, separated by blank lines)."""
    parts: list[list[str]] = []
    items = (
        [result[k] for k in ("summary", "model_check", "diff") if k in result]
        if isinstance(result, Mapping)
        else [result]
    )
    for item in items:
        if isinstance(item, CacheSummary):
            parts.append(_render_summary(item))
        elif isinstance(item, ModelCheck):
            parts.append(_render_check(item))
        elif isinstance(item, CacheDiff):
            parts.append(_render_diff(item))
        elif item is not None:
            raise TypeError(f"cannot render {type(item).__name__}")
    return "\n\n".join("\n".join(p) for p in parts)


def load_for_inspection(path: Union[str, Path]) -> CalibrationTable:
    """Read a cache for display: like read_cache, but Inf/NaN scales (which TensorRT itself writes
    for tensors it could not range) are kept instead of refused."""
    from trtq.calib.cache import read_cache

    return read_cache(Path(path), allow_nonfinite=True)
