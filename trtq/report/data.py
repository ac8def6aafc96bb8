"""Gather what ``trtq report`` shows into one JSON-able dict (the ``--json`` output and the data
the HTML page renders).

Inputs: the calibration cache (and its ``.json`` provenance), optionally the ``--save-stats``
statistics (histograms: the ranges every method would choose, clipped fractions), a ``trtq compare
--json`` result (accuracy per output, ``per_layer`` sensitivity), a ``trtq quantize --json`` result
(which nodes stayed float, and why) and a ``trtq bench --json`` result (latency).
"""

import json
import math
from pathlib import Path
from typing import Any, Optional

from trtq import __version__
from trtq.errors import CacheError, InputError
from trtq.report.quantized import quantized_ranges

REPORT_FORMAT = "trtq-report/1"
DISPLAY_BINS = 256  # histogram bins kept for the page (the saved ones summed in groups)


def _num(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_json(path: Path, what: str, produced_by: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found: {path}", f"write it with {produced_by} > {path.name}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path} is not JSON ({type(e).__name__})", f"write it with {produced_by}") from None


def _clip_fields(counts, top: float, m: float, threshold: float, prefix: str = "clipped") -> dict:
    from trtq.report.clipping import clip_count

    c = clip_count(counts, top, m, threshold)
    return {
        prefix: c.fraction,
        f"{prefix}_min": c.fraction_at_least,
        f"{prefix}_values": c.at_most,
        f"{prefix}_exact": c.exact,
    }


def tensor_rows(table, stats, percentile: float, quantized: Optional[dict] = None) -> list[dict]:
    """One row per tensor of the cache (file order); histogram fields when ``stats`` has the tensor.

    ``quantized`` (tensor -> the range its Q/DQ pair applies, trtq.report.quantized) marks the rows
    the Q/DQ model quantizes; their clipping is counted at that range, the others' at the cache's
    amax. Without it ``quantized`` is None on every row (not known). Clipped values are counted by
    the rule of trtq.report.clipping: ``clipped`` the conservative share, ``clipped_min`` the
    certain one, ``clipped_exact`` whether the histogram decided."""
    import numpy as np

    from trtq.calib.methods import METHODS, compute_amax
    from trtq.report.clipping import clip_count

    rows = []
    for name, amax in table.amax.items():
        row: dict[str, Any] = {"name": name, "amax": _num(amax), "step": _num(amax / 127.0)}
        row["quantized"] = None if quantized is None else name in quantized
        threshold = float(quantized[name]) if row["quantized"] else float(amax)
        row["clip_amax"] = _num(threshold)
        if stats is not None and name in stats.maxima:
            counts = stats.counts[name]
            m, top = stats.maxima[name], stats.top(name)  # top: the histogram's upper edge (>= max)
            zeros = int(stats.zeros.get(name, 0))
            # one-pass (power-of-two) histograms: a two-pass method (entropy, TensorRT's search over
            # [0, max]) is not shown
            methods = [meth.name for meth in METHODS.rows() if stats.edges == "max" or meth.one_pass]
            ranges = {
                meth: float(compute_amax(meth, counts, m, percentile, zeros, top if stats.edges == "pow2" else None))
                for meth in methods
            }
            by = {meth: clip_count(counts, top, m, a) for meth, a in ranges.items()}
            group = max(1, counts.size // DISPLAY_BINS)
            shown = counts[: counts.size // group * group].reshape(-1, group).sum(axis=1)
            total = int(counts.sum())
            row.update(
                {
                    "max": m,
                    "amax_over_max": (amax / m) if m > 0 else None,
                    **_clip_fields(counts, top, m, threshold),
                    "values": total,
                    "zeros": (zeros / total) if total else 0.0,
                    "ranges": ranges,
                    "clipped_by": {meth: c.fraction for meth, c in by.items()},
                    "clipped_by_exact": {meth: c.exact for meth, c in by.items()},
                    "histogram": {"width": top / counts.size * group, "counts": [int(c) for c in np.asarray(shown)]},
                }
            )
        rows.append(row)
    return rows


def _runtime_of(candidate: str, compare: dict) -> str:
    if isinstance(compare.get("runtime"), str):
        return compare["runtime"]
    if str(candidate).endswith(".plan") or str(candidate).endswith(".engine"):
        meta_path = Path(str(candidate) + ".json")
        version = None
        if meta_path.is_file():
            try:
                version = json.loads(meta_path.read_text(encoding="utf-8")).get("tensorrt_version")
            except (OSError, ValueError, AttributeError):
                version = None
        return f"TensorRT engine{f' (TensorRT {version})' if version else ''}"
    return "ONNX Runtime (Q/DQ semantics: INT8 rounding simulated in float, CPU)"


def accuracy_section(compare: Any, path: Path) -> dict:
    if not isinstance(compare, dict) or not isinstance(compare.get("outputs"), list):
        raise InputError(f"{path} is not the JSON of trtq compare", "write it with trtq compare ... --json")
    outputs = []
    for o in compare["outputs"]:
        if isinstance(o, dict):  # every scalar field, so metrics compare adds later show up too
            outputs.append({k: v for k, v in o.items() if v is None or isinstance(v, (str, int, float))})
    return {
        "reference": compare.get("reference"),
        "candidate": compare.get("candidate"),
        "runtime": _runtime_of(str(compare.get("candidate") or ""), compare),
        "samples": compare.get("samples"),
        "outputs": outputs,
    }


_LAYER_KEYS = (
    "node",
    "op_type",
    "task_metric",
    "task_metric_name",
    "sqnr_db",
    "cosine_mean",
    "top1_agreement",
    "gain_db",
)


def _metric_value(v: Any) -> Optional[float]:
    """A metric as compare writes it (a number, or "inf" / "nan"); None when absent."""
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _low_first(v: Any) -> float:  # lower is worse; NaN the worst, a missing value ties at 0
    x = _metric_value(v)
    return 0.0 if x is None else (-math.inf if math.isnan(x) else x)


def _high_first(v: Any) -> float:
    x = _metric_value(v)
    return 0.0 if x is None else (-math.inf if math.isnan(x) else -x)


def layer_section(compare: Any) -> Optional[dict]:
    """compare's per-layer rows, sorted (again, whatever order the JSON has) by the metric the chart
    shows: the task metric first (top-1 agreement, detection F1 ...: the worst output's), then SQNR
    (only this layer INT8: lowest first) or the gain in dB (leave-one-out: largest first), as
    trtq.compare.sensitivity ranks them. ``metric`` names what the bars show and the rows are
    sorted by."""
    rows = compare.get("per_layer") if isinstance(compare, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    keep = [{k: r.get(k) for k in _LAYER_KEYS} for r in rows if isinstance(r, dict)]
    loo = any(r.get("gain_db") is not None for r in keep)
    task = next((r["task_metric_name"] for r in keep if r.get("task_metric_name")), None)
    if loo:
        keep.sort(key=lambda r: (_high_first(r["task_metric"]), _high_first(r["gain_db"]), _low_first(r["sqnr_db"])))
    else:
        keep.sort(key=lambda r: (_low_first(r["task_metric"]), _low_first(r["sqnr_db"]), _low_first(r["cosine_mean"])))
    second = ("gain_db", "SQNR gain (dB)") if loo else ("sqnr_db", "SQNR (dB)")
    first = ("task_metric", str(task)) if task else second
    return {
        "mode": "leave-one-out" if loo else "only",
        "metric": {"key": first[0], "name": first[1], "then_key": second[0] if task else None},
        "rows": keep,
    }


def float_section(quantize: Any, path: Path) -> list[dict]:
    if not isinstance(quantize, dict) or not isinstance(quantize.get("left_float"), list):
        raise InputError(f"{path} is not the JSON of trtq quantize", "write it with trtq quantize ... --json")
    return [
        {"node": str(r.get("node")), "reason": str(r.get("reason"))}
        for r in quantize["left_float"]
        if isinstance(r, dict)
    ]


def latency_section(bench: Any, path: Path) -> dict:
    if isinstance(bench, dict) and "error" in bench and "exit_code" in bench:  # a failed --json run
        raise InputError(
            f"{path} holds a failed trtq bench run (exit {bench['exit_code']}: {bench['error']})",
            "run trtq bench PLAN... --json where TensorRT and a GPU are, or leave out --bench",
        )
    if isinstance(bench, dict):
        bench = [bench]
    if not isinstance(bench, list) or not bench or not all(isinstance(b, dict) and "median_ms" in b for b in bench):
        raise InputError(f"{path} is not the JSON of trtq bench", "write it with trtq bench PLAN... --json")
    first = _num(bench[0].get("median_ms"))
    plans = []
    for b in bench:
        med = _num(b.get("median_ms"))
        plans.append(
            {
                "plan": b.get("plan"),
                "precision": b.get("precision"),
                "batch": b.get("batch"),
                "median_ms": med,
                "p99_ms": _num(b.get("p99_ms")),
                "samples_per_s": _num(b.get("samples_per_s")),
                "speedup_vs_first": (first / med) if first and med else None,
            }
        )
    versions = sorted({str(b.get("tensorrt_version")) for b in bench if b.get("tensorrt_version")})
    gpus = sorted({str(b.get("gpu_name")) for b in bench if b.get("gpu_name")})
    runtime = (
        "TensorRT engine"
        + (f" (TensorRT {', '.join(versions)})" if versions else "")
        + (f" on {', '.join(gpus)}" if gpus else "")
    )
    return {"runtime": runtime, "plans": plans}


def _histograms_line(meta: dict, st) -> Optional[str]:
    """How the histograms were collected, from the provenance (or the statistics file)."""
    hist = ((meta.get("collection") or {}).get("histograms")) if isinstance(meta.get("collection"), dict) else None
    if isinstance(hist, dict) and hist.get("edges") == "pow2":
        cap = hist.get("hist_elements")
        stride = (
            f"{hist.get('subsampled_tensors')} tensors on a per-sample stride past {cap} elements"
            if cap
            else "every element"
        )
        return f"one pass, power-of-two ranges; {stride}"
    if st is not None:
        return "one pass, power-of-two ranges" if st.edges == "pow2" else "two passes, [0, max] ranges"
    return None


def build_report(
    cache: Path,
    stats: Optional[Path] = None,
    compare: Optional[Path] = None,
    quantize: Optional[Path] = None,
    bench: Optional[Path] = None,
) -> dict:
    """The report's data; InputError / CacheError (one line, with the fix) on a bad or foreign input."""
    from trtq.calib.cache import read_cache, read_provenance
    from trtq.calib.freshness import provenance_matches_cache
    from trtq.calib.stats import load_stats

    table = read_cache(cache)
    prov = read_provenance(cache)
    if prov is not None and not provenance_matches_cache(prov, table.amax):
        prov = None  # the JSON describes an older cache at this path
    st = load_stats(stats) if stats is not None else None
    if st is not None:
        st_model = (st.meta.get("model") or {}).get("sha256")
        prov_model = ((prov or {}).get("model") or {}).get("sha256")
        if st_model and prov_model and st_model != prov_model:
            raise CacheError(
                f"{stats} holds statistics of another model than {cache}",
                "pass the --save-stats file of the run that wrote this cache",
            )
        if not set(table.amax) & set(st.maxima):
            raise CacheError(f"{stats} has no tensor of {cache}", "pass the statistics of this calibration")
    method = (prov or {}).get("method") or {}
    percentile = _num(method.get("percentile")) or 99.99
    meta = (prov or (st.meta if st is not None else {})) or {}
    data = meta.get("data") or {}
    model = meta.get("model") or {}
    report = {
        "format": REPORT_FORMAT,
        "provenance": {
            "cache": str(cache),
            "algorithm": table.algorithm,
            "trt_version": table.trt_version,
            "method": method.get("name"),
            "percentile": percentile,
            "num_bins": method.get("num_bins") or (st.num_bins if st is not None else None),
            # one pass over power-of-two ranges (mse / percentile) or two over [0, max]
            "histograms": _histograms_line(meta, st),
            "model": model.get("path"),
            "model_sha256": model.get("sha256"),
            "data_fingerprint": data.get("fingerprint"),
            "samples": data.get("samples"),
            "calibrated_by": f"trtq {meta.get('trtq_version')}" if meta.get("trtq_version") else None,
            "shards": ((meta.get("shard") or {}).get("count")) if isinstance(meta.get("shard"), dict) else None,
            "stats": str(stats) if stats is not None else None,
            "report_by": f"trtq {__version__}",
        },
        "clip_scope": None,
        "tensors": None,
        "layers": None,
        "float_layers": None,
        "accuracy": None,
        "latency": None,
    }
    ranges, how = None, "no --quantize given"
    if quantize is not None:
        q = read_json(quantize, "quantize result", "trtq quantize ... --json")
        report["float_layers"] = float_section(q, Path(quantize))
        ranges, how = quantized_ranges(q, Path(quantize))
    report["clip_scope"] = {"quantized_only": ranges is not None, "how": how}
    report["tensors"] = tensor_rows(table, st, percentile, ranges)
    if compare is not None:
        c = read_json(compare, "compare result", "trtq compare ... --json")
        report["accuracy"] = accuracy_section(c, Path(compare))
        report["layers"] = layer_section(c)
    if bench is not None:
        report["latency"] = latency_section(read_json(bench, "bench result", "trtq bench PLAN... --json"), Path(bench))
    report["summary"] = summary(report)
    return report


CLIP_THRESHOLD = 1e-4  # a tensor "clips" when more than this share of its values is above its range


def summary(report: dict, clip_threshold: float = CLIP_THRESHOLD) -> dict:
    """The clip list: tensors in scope (those the Q/DQ model quantizes; every calibrated one when
    the report has no Q/DQ information) whose conservative clipped share is above the threshold,
    most clipped first."""
    rows = report["tensors"]
    scope = report.get("clip_scope") or {}
    quantized_only = bool(scope.get("quantized_only"))
    in_scope = [r for r in rows if r.get("quantized") or not quantized_only]
    counted = [r for r in in_scope if "histogram" in r]
    clipping = sorted(
        (r for r in counted if (r.get("clipped") or 0) > clip_threshold), key=lambda r: (-r["clipped"], r["name"])
    )
    return {
        "tensors": len(rows),
        "with_histogram": sum(1 for r in rows if "histogram" in r),
        "quantized_only": quantized_only,
        "quantized": sum(1 for r in rows if r.get("quantized")) if quantized_only else None,
        "counted": len(counted),
        "threshold": clip_threshold,
        "clipping": len(clipping),
        # quantized with another range than the cache's (re-measured by quantize, or another cache's JSON)
        "other_range": [
            r["name"]
            for r in rows
            if r.get("quantized")
            and r["clip_amax"] is not None
            and r["amax"] is not None
            and abs(r["clip_amax"] - r["amax"]) > 1e-6 * abs(r["amax"])
        ],
        "clip_list": [r["name"] for r in clipping],
        "most_clipped": [r["name"] for r in clipping[:5]],
    }
