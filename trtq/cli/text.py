"""What the commands print: their result lines (``--json`` prints the data instead) and the
calibration's progress line on stderr."""

import time
from typing import Any

from trtq.formatting import first_few

REDRAW_SECONDS = (0.2, 2.0)  # the least time between two progress lines: on a terminal, elsewhere


class ProgressLine:
    """Calibration's progress (one line per batch, redrawn often on a terminal and written at a
    slower pace elsewhere: REDRAW_SECONDS, terminal first), drawn on trtq.progress's line (unless -q or
    --no-progress)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.last = 0.0

    def __call__(self, p) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        final = p.batches_done == p.batches
        from trtq import progress

        if not final and now - self.last < REDRAW_SECONDS[0 if progress.on_terminal() else 1]:
            return
        self.last = now
        rate = p.samples_done / p.elapsed if p.elapsed > 0 else 0.0
        eta = ""
        if 0 < p.batches_done < p.batches:
            eta = f"  ETA {progress.clock(p.elapsed / p.batches_done * (p.batches - p.batches_done))}"
        progress.show(
            f"pass {p.stage_index}/{p.stages} ({p.stage}): {p.batches_done}/{p.batches} batches, "
            f"{p.samples_done} samples, {rate:.1f} samples/s{eta}",
            final,
        )


def calibration_text(r) -> str:
    from trtq.calib.cache import version_code

    lines = []
    if r.batches:
        lines.append(
            f"calibrated {count(r.samples, 'sample')} ({count(r.batches, 'batch', 'batches')}) "
            f"with {r.method} in {r.seconds:.1f} s "
            f"({r.samples / r.seconds if r.seconds else 0:.1f} samples/s)"
        )
    else:
        lines.append(f"computed {r.method} ranges from saved statistics ({r.samples} samples)")
    zero = f" ({len(r.zero_tensors)} zero or below 1e-8 on every sample: scale floored)" if r.zero_tensors else ""
    lines.append(f"tensors     {len(r.amax)}{zero}")
    if getattr(r, "range_flags", None):
        from trtq.calib.range_check import RATIO

        lines.append(
            f"ranges      {r.method}: {len(r.range_flags)} quantized tensor(s) cost > {RATIO:g}x mse's "
            f"expected INT8 error, worst {r.range_flags[0].describe()}; consider --method mse"
        )
    if r.skipped:
        lines.append(
            f"skipped     {len(r.skipped)} bad samples: "
            + ", ".join(p for p, _ in r.skipped[:3])
            + (" ..." if len(r.skipped) > 3 else "")
        )
    if r.cache_path:
        lines.append(f"cache       {r.cache_path}  (TRT-{version_code(r.trt_version)}-{r.algorithm})")
        lines.append(f"provenance  {r.cache_path}.json")
    if r.stats_path:
        lines.append(f"statistics  {r.stats_path}")
    return "\n".join(lines)


def dry_run_text(cfg: Any, preview: Any) -> tuple[dict, str]:
    """(data, text) of ``calibrate --dry-run``: the model's inputs, the batches and their summary."""
    import json

    batcher, summary = preview.batcher, preview.summary
    data = {
        "model": str(cfg.model),
        "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in preview.specs],
        "batches": batcher.describe(),
        "summary": summary.to_dict(),
    }
    lines = [f"model   {cfg.model}"]
    for s in preview.specs:
        lines.append(f"input   {s.describe()}  -> batches of {list(batcher.shapes[s.name])}")
    lines.append(summary.render_text() if hasattr(summary, "render_text") else json.dumps(summary.to_dict(), indent=2))
    return data, "\n".join(lines)


def merge_text(r: Any) -> str:
    nxt = (
        "next: trtq calibrate --shard I/N --ranges {0} --save-stats hist-I.npz"
        if r.pass_name == "ranges"
        else "next: trtq calibrate --from-stats {0} --method METHOD"
    ).format(r.output)
    return (
        f"merged {count(r.shards, 'shard')} of pass {r.pass_name}: {count(r.samples, 'sample')}, "
        f"{count(r.tensors, 'tensor')} -> {r.output}\n{nxt}"
    )


def count(n: int, noun: str, plural: str = "") -> str:
    """``1 node``, ``2 nodes``: a count with its noun in the right number (``plural``: where it is
    not ``noun + "s"``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def quantize_text(result: Any, out: Any, learned_cache: Any = None) -> str:
    from trtq.pipeline.quantize import DATA_STEP_NOTES

    lines = [f"quantized   {count(len(result.quantized), 'node')} -> {out}"]
    lines += [f"            {note}" for note in result.notes if note.startswith(DATA_STEP_NOTES)]
    if learned_cache:
        lines.append(f"cache       {len(result.learned_amax)} learned activation ranges -> {learned_cache}")
    if result.left_float:
        lines.append(f"left float  {count(len(result.left_float), 'node')}:")
        lines += [f"  {name}: {reason}" for name, reason in result.left_float[:20]]
        if len(result.left_float) > 20:
            lines.append(f"  ... {len(result.left_float) - 20} more (see --json)")
    if result.missing_amax:
        lines.append(
            f"missing     {count(len(result.missing_amax), 'tensor')} not in the cache (their consumers stay float): "
            + first_few(result.missing_amax)
        )
    return "\n".join(lines)


def report_text(data: dict, output: Any) -> str:
    from trtq.report.data import summary

    s = data.get("summary") or summary(data)
    scope = f" of {s['quantized']} quantized" if s["quantized_only"] else ""
    clips = f", {s['clipping']}{scope} clip > {s['threshold'] * 100:g} %" if s["with_histogram"] else ""
    if clips and not s["quantized_only"]:
        clips += "; without --quantize, quantized or not"
    return f"report      {output}\ntensors     {s['tensors']} ({s['with_histogram']} with histograms{clips})"


def build_text(result: Any, out: Any) -> str:
    md = result.metadata
    source = ", Q/DQ from the model" if (md.get("quantize") or {}).get("source") == "model" else ""
    steps = "".join(f"steps      {note}\n" for note in (md.get("quantize") or {}).get("steps") or ())
    steps += "".join(f"lowered    {fix}\n" for fix in (md.get("quantize") or {}).get("lowered") or ())
    return (
        f"built {out} in {result.seconds:.1f} s\n"
        f"precision  {md.get('precision')} ({md.get('mode', '')}{source})\n{steps}"
        f"tensorrt   {md.get('tensorrt_version')} on {md.get('gpu_name')} (sm {md.get('compute_capability')})\n"
        f"{coverage_text(getattr(result, 'coverage', None))}"
        f"{layouts_text(md.get('layout_rebuilds'), md.get('module_loading'))}"
        f"{tuning_text(md.get('tuning'), out)}"
        f"metadata   {out}.json"
    )


def layouts_text(record: Any, loading: Any = None) -> str:
    """The build's layout line where it rebuilt or a padded tensor is left (trtq.trt.format_guard),
    with a hint where the builder ran under lazy module loading (``loading``, D39)."""
    if not record:
        return ""
    left = record["padded"]
    share = f" ({record['share']:.1%} of the profiled time)" if left and "share" in record else ""
    what = (
        "; padded left: " + ", ".join(f"{p['tensor']} {p['ratio']:g}x" for p in left) + share
        if left
        else "; no padded tensor left"
    )
    lazy = (
        "\n           the builder ran under lazy CUDA module loading, which can pick padded layouts: "
        "CUDA_MODULE_LOADING=EAGER (trtq build's default) before CUDA starts"
        if loading == "lazy"
        else ""
    )
    return f"layouts    {record['rebuilds']} rebuild(s){what}{lazy}\n"


def tuning_text(tuning: Any, plan: Any = None) -> str:
    """build --tune-placement's lines: each candidate (ms, metric, verdict), then the kept one and,
    for an INT8 one, how to write its Q/DQ file again (``plan``: the engine written)."""
    if not tuning:
        return ""
    from trtq.pipeline.tune_candidates import candidate_label

    lines = [
        f"tuning     {tuning['builds']} build(s); {tuning['metric']} within {tuning['tolerance']:g} of the default's"
    ]
    rows = [(candidate_label(c["placement"], c["left_float"], c.get("attention")), c) for c in tuning["candidates"]]
    implicit = tuning.get("implicit")
    if implicit:
        rows.append(("TensorRT's implicit INT8", dict(implicit, metric=None)))
    ref = tuning.get("float_reference")
    if ref:
        rows.append((f"{ref['precision']} reference (no Q/DQ)", ref))
    for label, c in rows:
        ms = f"{c['median_ms']:.3f} ms" if c["median_ms"] is not None else "-"
        metric = f"{c['metric']:.4f}" if c["metric"] is not None else "-"
        lines.append(f"  {label:<34} {ms:>10}  {metric:>8}  {c['verdict']}")
    chosen = tuning["chosen"]
    left = chosen["left_float"]
    if chosen.get("placement") is None:
        lines.append(f"kept       the {chosen.get('precision')} engine without Q/DQ (faster than every INT8 candidate)")
    else:
        attention = f", attention {chosen['attention']}" if chosen.get("attention") else ""
        lines.append(
            f"kept       {chosen['placement']}{attention}" + (f", left float: {first_few(left, 6)}" if left else "")
        )
        if plan is not None:
            lines.append(f"reuse      --placement-from {plan} (quantize / build write this placement again)")
    return "\n".join(lines) + "\n"


def coverage_text(cov: Any, names: int = 8) -> str:
    """trtq build's INT8 coverage lines (empty without a coverage): int8->int8 layers and their share
    of the profiled time, conversions and reformats, then the layers that fell back to float."""
    if cov is None:
        return ""
    timed = f", {cov.time_share:.1%} of profiled time" if cov.time_share is not None else ""
    if cov.int8_copy_share:
        timed += f" (+{cov.int8_copy_share:.1%} in INT8 copies / layout changes)"
    line = (
        f"int8       {cov.int8_layers}/{cov.layers} layers int8->int8 ({cov.layer_share:.1%}){timed}; "
        f"{len(cov.conversions)} int8/float conversions, {len(cov.reformats)} reformats\n"
    )
    if not cov.fallbacks:
        return line + "fallback   none: no float layer between INT8 layers\n"
    return line + f"fallback   {len(cov.fallbacks)} float between INT8: {first_few(cov.fallbacks, names)}\n"
