"""The model zoo's steps, shared by tests/zoo/test_zoo.py and benchmarks/bench_zoo.py.

One case is one file of the zoo's manifest (scripts/export_zoo.py writes both): make its
calibration and compare data, run ``trtq calibrate``, ``trtq quantize`` and ``trtq compare --json``
through a CLI runner the caller passes in, and check what came out with code written apart from
trtq's: ONNX Runtime sessions of the FP32 and Q/DQ models, SQNR, a count of quantized nodes read
from the Q/DQ graph, and plain scoring of each output's task in the layout the manifest states.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
CALIB_SHARDS = 3
CALIB_SHARD_SAMPLES = 8
COMPARE_SAMPLES = 16
# Q/DQ output vs FP32, ONNX Runtime running the Q/DQ pairs as written: an output whose SQNR is
# below this fails. Why 10 dB (the error's power at most a tenth of the signal's): on these
# random-weight models a correct INT8 quantizer (mse ranges, per-channel weights) measured
# 13-40 dB (benchmarks/bench_zoo.py prints each); per layer INT8 gives ~35-40 dB and the error adds
# up over depth, so even the deepest (DenseNet-121, ViT's twelve blocks) stay above 10 dB. What a
# broken quantizer does lands below it: a scale off by 2x on one tensor clips or halves its
# resolution (6-10 dB lost there), a Q/DQ on the wrong axis or channels out of order scrambles
# the output (about 0 dB), a dropped bias or zero point shifts it (a few dB).
SQNR_MIN_DB = 10.0
# An output may state a lower bound of its own in the manifest ("sqnr_min_db") where a correct
# quantizer measurably cannot reach SQNR_MIN_DB; the manifest says why (what stock ONNX Runtime
# quantize_static measured on it).
METRIC_TOLERANCE = 0.01  # compare's task metric vs the plain scoring here (the goal)
GATE_KEYS = {"classify": "top1_agreement", "segment": "iou", "ctc": "sequence_agreement", "detect": "f1"}

Runner = Callable[[list], Any]  # args -> object with .code, .out, .err (tests/conftest.py's CliResult)


def output_floor(entry: dict[str, Any], name: str) -> float:
    """The SQNR bound of one output: the manifest's own where it states one, else SQNR_MIN_DB."""
    for o in entry["outputs"]:
        if o["name"] == name and isinstance(o.get("sqnr_min_db"), (int, float)):
            return float(o["sqnr_min_db"])
    return SQNR_MIN_DB


def zoo_dir() -> Path:
    return Path(os.environ.get("TRTQ_ZOO") or ROOT / ".zoo")


def load_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest, or None when there is no zoo (or no readable manifest) in ``folder``."""
    path = folder / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    models = [m for m in data.get("models", []) if (folder / m["file"]).is_file()]
    return dict(data, models=models) if models else None


def case_id(entry: dict[str, Any]) -> str:
    return entry["file"][: -len(".onnx")]


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def _smooth(rng: np.random.Generator, shape: tuple[int, ...], spatial: tuple[int, int]) -> np.ndarray:
    """Image-like samples: coarse noise upsampled (blobs and edges) plus fine noise."""
    n = shape[0]
    hi, wi = spatial
    h, w = shape[hi], shape[wi]
    coarse_shape = list(shape)
    coarse_shape[hi], coarse_shape[wi] = max(1, h // 8 + 1), max(1, w // 8 + 1)
    coarse = rng.standard_normal(coarse_shape).astype(np.float32)
    big = np.repeat(np.repeat(coarse, 8, axis=hi), 8, axis=wi)
    big = np.take(np.take(big, np.arange(h), axis=hi), np.arange(w), axis=wi)
    x = 0.8 * big + 0.4 * rng.standard_normal(shape).astype(np.float32)
    return np.clip(x, -2.5, 2.5).reshape(n, *shape[1:]).astype(np.float32)


def make_samples(entry: dict[str, Any], count: int, seed: int) -> np.ndarray:
    """``count`` deterministic samples of the entry's input (feed shape, batch axis = count)."""
    inp = entry["input"]
    shape = (count, *inp["feed_shape"][1:])
    rng = np.random.default_rng(seed)
    spatial = (1, 2) if inp["layout"] == "NHWC" else (len(shape) - 2, len(shape) - 1)
    x = _smooth(rng, shape, spatial)
    channels = shape[3] if inp["layout"] == "NHWC" else shape[1]
    if channels == 1:  # grayscale crops and digits: [0, 1] with a dark background
        x = np.clip(x / 2.5, 0.0, 1.0)
    return x.astype(np.float32)


def write_data(entry: dict[str, Any], folder: Path) -> tuple[str, Path]:
    """Calibration shards (folder/calib_*.npy) and compare samples (folder/compare.npy), from
    seeds of their own: the glob and the compare file."""
    folder.mkdir(parents=True, exist_ok=True)
    base = sum(map(ord, entry["name"])) * 1009
    for k in range(CALIB_SHARDS):
        np.save(folder / f"calib_{k}.npy", make_samples(entry, CALIB_SHARD_SAMPLES, base + k))
    cmp_path = folder / "compare.npy"
    np.save(cmp_path, make_samples(entry, COMPARE_SAMPLES, base + 100))
    return str(folder / "calib_*.npy"), cmp_path


# ---------------------------------------------------------------------------------------------
# ONNX Runtime, written apart from trtq's runner
# ---------------------------------------------------------------------------------------------


def session(path: Path, optimized: bool):
    """optimized: all of ONNX Runtime's graph optimizations (its fused int8 kernels, as it deploys a
    Q/DQ model); else the basic ones (constant folding: the Q/DQ pairs computed as written), the
    level compare runs a Q/DQ candidate at, so its numbers and the plain scoring here see the same
    outputs (a near-tie flips between levels: 1 of 16 top-1 decisions on MobileNetV3)."""
    from trtq.compare.onnx_runner import make_session

    return make_session(path, semantics="onnxruntime" if optimized else "qdq", qdq=True)


def run_all(sess, entry: dict[str, Any], x: np.ndarray) -> dict[str, np.ndarray]:
    """Every output for the samples ``x``, batched as the model allows, batch axis restored to
    where the manifest's layout puts it (axis 1 for TNC)."""
    names = [o["name"] for o in entry["outputs"]]
    fixed = entry["input"]["shape"][0] != "N"
    step = int(entry["input"]["shape"][0]) if fixed else 8
    parts: dict[str, list] = {n: [] for n in names}
    for i in range(0, len(x), step):
        got = sess.run(names, {entry["input"]["name"]: x[i : i + step]})
        for n, g in zip(names, got):
            parts[n].append(g)
    axis = {o["name"]: 1 if o.get("layout") == "TNC" else 0 for o in entry["outputs"]}
    return {n: np.concatenate(v, axis=axis[n]) for n, v in parts.items()}


def sqnr_db(ref: np.ndarray, cand: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    noise = float(np.sum((ref - cand.astype(np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    if not np.all(np.isfinite(cand)):
        return -math.inf
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def count_weighted(model) -> int:
    return sum(n.op_type in WEIGHTED_OPS for n in model.graph.node)


def count_quantized(model) -> int:
    """Weighted nodes whose first two inputs (data and weight, or both MatMul operands) each come
    out of a DequantizeLinear: read from the graph, not from quantize's report."""
    dq_out = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return sum(
        n.op_type in WEIGHTED_OPS and len(n.input) >= 2 and n.input[0] in dq_out and n.input[1] in dq_out
        for n in model.graph.node
    )


def weight_rounded_copy(src: Path, dst: Path) -> None:
    """The FP32 model with every float weight (initializers and Constant nodes of rank >= 2)
    rounded to 8 bits per tensor: a candidate that differs from the reference, made without trtq,
    so compare's task checks still run where quantize wrote nothing usable."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))

    def rounded(t):
        w = numpy_helper.to_array(t)
        if w.dtype != np.float32 or w.ndim < 2 or not w.size:
            return None
        scale = float(np.max(np.abs(w))) / 127.0 or 1.0
        return numpy_helper.from_array((np.round(w / scale) * scale).astype(np.float32), t.name)

    for i, init in enumerate(model.graph.initializer):
        new = rounded(init)
        if new is not None:
            model.graph.initializer[i].CopyFrom(new)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    new = rounded(a.t)
                    if new is not None:
                        a.t.CopyFrom(new)
    onnx.save(model, str(dst))


# ---------------------------------------------------------------------------------------------
# plain scoring of the tasks, in the manifest's layouts
# ---------------------------------------------------------------------------------------------


def top1_agreement(ref: np.ndarray, cand: np.ndarray) -> float:
    r, c = ref.reshape(len(ref), -1).argmax(1), cand.reshape(len(cand), -1).argmax(1)
    return float(np.mean(r == c))


def mask_iou(ref: np.ndarray, cand: np.ndarray, layout: str, threshold: float = 0.5) -> float:
    """Mean over the classes seen (in either) of each class's IoU over all samples; a 1-channel
    map is one mask, value > threshold."""
    axis = -1 if layout == "NHWC" else 1
    if ref.shape[axis] == 1:
        a, b = ref > threshold, cand > threshold
        union = np.logical_or(a, b).sum()
        return float(np.logical_and(a, b).sum() / union) if union else 1.0
    r, c = ref.argmax(axis), cand.argmax(axis)
    ious = []
    for k in range(ref.shape[axis]):
        union = np.logical_or(r == k, c == k).sum()
        if union:
            ious.append(np.logical_and(r == k, c == k).sum() / union)
    return float(np.mean(ious)) if ious else 1.0


def ctc_decode(scores_ntc: np.ndarray, blank: int = 0) -> list[list[int]]:
    return [[k for k, _ in itertools.groupby(row.tolist()) if k != blank] for row in scores_ntc.argmax(-1)]


def sequence_agreement(ref: np.ndarray, cand: np.ndarray, layout: str) -> float:
    if layout == "TNC":
        ref, cand = ref.transpose(1, 0, 2), cand.transpose(1, 0, 2)
    r, c = ctc_decode(ref), ctc_decode(cand)
    return sum(a == b for a, b in zip(r, c)) / len(r)


def _iou(a: list, b: list) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def dfl_detections(
    pairs: list[tuple[np.ndarray, np.ndarray, int]],
    width: int,
    conf: float = 0.25,
    nms_iou: float = 0.45,
    keep: int = 300,
    candidates: int = 3000,
) -> list[tuple[int, float, list]]:
    """One sample's (class, score, [x1, y1, x2, y2]) after per-class NMS, from per-stride
    (scores [HW, C], box distributions [HW, 4 (R+1)], stride): each side's distance is the
    expectation of its softmaxed bins, in strides, from the cell centre."""
    rows = []
    for scores, dist, stride in pairs:
        bins = dist.reshape(len(dist), 4, -1).astype(np.float64)
        p = np.exp(bins - bins.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        side = (p * np.arange(bins.shape[-1])).sum(-1) * stride
        cols = -(-width // stride)
        for i in range(len(scores)):
            k = int(np.argmax(scores[i]))
            score = float(scores[i][k])
            if score > conf:
                cx, cy = (i % cols + 0.5) * stride, (i // cols + 0.5) * stride
                rows.append((k, score, [cx - side[i, 0], cy - side[i, 1], cx + side[i, 2], cy + side[i, 3]]))
    rows = sorted(rows, key=lambda r: -r[1])[:candidates]
    kept: list = []
    for r in rows:
        if all(d[0] != r[0] or _iou(d[2], r[2]) <= nms_iou for d in kept):
            kept.append(r)
            if len(kept) == keep:
                break
    return kept


def detection_f1(ref_dets: list[list], cand_dets: list[list], match_iou: float = 0.5) -> float | None:
    """F1 of candidate detections against the reference's, per sample: best score first, each to
    its highest-IoU unmatched reference box of the same class (IoU >= match_iou). None when the
    reference has no detection at all."""
    matched = n_ref = n_cand = 0
    for rd, cd in zip(ref_dets, cand_dets):
        n_ref, n_cand = n_ref + len(rd), n_cand + len(cd)
        used: set = set()
        for k, _, box in sorted(cd, key=lambda d: -d[1]):
            best, best_iou = None, -1.0
            for j, (rk, _, rbox) in enumerate(rd):
                if j not in used and rk == k:
                    v = _iou(box, rbox)
                    if v > best_iou:
                        best, best_iou = j, v
            if best is not None and best_iou >= match_iou:
                used.add(best)
                matched += 1
    if n_ref == 0:
        return None
    p, r = (matched / n_cand if n_cand else 0.0), matched / n_ref
    return 2 * p * r / (p + r) if p + r else 0.0


def split_detect_f1(entry: dict[str, Any], ref: dict[str, np.ndarray], cand: dict[str, np.ndarray]) -> float | None:
    """Plain F1 of a split-head detector whose boxes are DFL distributions (the manifest's pairs)."""
    width = int(entry["input"]["feed_shape"][-1 if entry["input"]["layout"] == "NCHW" else -2])
    heads = [o for o in entry["outputs"] if o.get("role") == "scores"]
    strides = {o["name"]: o["stride"] for o in entry["outputs"] if o.get("role") == "boxes"}
    n = len(ref[heads[0]["name"]])
    dets = []
    for outs in (ref, cand):
        dets.append(
            [
                dfl_detections([(outs[h["name"]][i], outs[h["pair"]][i], strides[h["pair"]]) for h in heads], width)
                for i in range(n)
            ]
        )
    return detection_f1(dets[0], dets[1])


def plain_metric(expect: dict[str, Any], ref: np.ndarray, cand: np.ndarray) -> float | None:
    task = expect["task"]
    if task == "classify":
        return top1_agreement(ref, cand)
    if task == "segment":
        return mask_iou(ref, cand, expect.get("layout", "NCHW"))
    if task == "ctc":
        return sequence_agreement(ref, cand, expect.get("layout", "NTC"))
    return None


def _stated_layout(task: dict[str, Any]) -> str | None:
    for where in (task, task.get("metrics") or {}):
        if isinstance(where.get("layout"), str):
            return where["layout"]
    return None


def check_tasks(
    entry: dict[str, Any], report: dict[str, Any], ref: dict[str, np.ndarray], cand: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    """Per output of the manifest: what compare said, what was expected, and the problems."""
    by_name = {o["name"]: o for o in report.get("outputs", [])}
    rows = []
    for expect in entry["outputs"]:
        name, want = expect["name"], expect["task"]
        rec = by_name.get(name)
        row: dict[str, Any] = {
            "output": name,
            "expected": want,
            "expected_layout": expect.get("layout"),
            "got": None,
            "how": None,
            "problems": [],
        }
        rows.append(row)
        if rec is None or not isinstance(rec.get("task"), dict):
            row["problems"].append(f"compare reports no task for output '{name}'")
            continue
        task = rec["task"]
        got, how = task.get("name"), str(task.get("how") or "")
        row.update(got=got, how=how, layout=_stated_layout(task))
        if want == "raw":
            if got != "raw":
                row["problems"].append(
                    f"'{name}': a confident '{got}' on an output nothing in the graph explains "
                    f"({how}); expected raw with a reason"
                )
            elif not how:
                row["problems"].append(f"'{name}': raw without a reason")
            continue
        allowed = expect.get("auto") or [want]
        if got not in allowed:
            row["problems"].append(
                f"'{name}': expected {want}"
                + (f" ({expect['layout']})" if expect.get("layout") else "")
                + f", compare inferred {got}: {how}"
            )
            continue
        if got == "raw":  # allowed here: compare says it cannot tell, and must say what would fit
            if "--task" not in how:
                row["problems"].append(f"'{name}': raw without the --task flags that would fit: {how}")
            continue
        stated = row["layout"]
        if stated and expect.get("layout") and stated.lower() != str(expect["layout"]).lower():
            row["problems"].append(f"'{name}': compare reads it as {stated}, the model's layout is {expect['layout']}")
        if want == "detect":
            metrics = task.get("metrics") or {}
            role = task.get("role") or metrics.get("role")
            if role and expect.get("role") and role != expect["role"]:
                row["problems"].append(f"'{name}': compare takes it for {role}, it is the {expect['role']}")
            if metrics.get("reference_detections") == 0 and isinstance(metrics.get("f1"), (int, float)):
                row["problems"].append(f"'{name}': F1 {metrics['f1']} with no reference detections ({how})")
            continue
        value = (task.get("metrics") or {}).get(GATE_KEYS[want])
        plain = plain_metric(expect, ref[name], cand[name])
        row.update(value=value, plain=plain)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            row["problems"].append(f"'{name}': no {GATE_KEYS[want]} in compare's {want} metrics")
        elif plain is not None and abs(value - plain) > METRIC_TOLERANCE:
            row["problems"].append(
                f"'{name}': compare's {GATE_KEYS[want]} {value:.3f}, scored here in the "
                f"model's layout {plain:.3f} ({how})"
            )
    return rows


def explicit_task_args(entry: dict[str, Any]) -> list[str] | None:
    """The compare flags that state the manifest's tasks and layouts where inference may not
    (TNC / NHWC layouts, split detector heads), or None where the outputs need none or no flag
    could (anchor regressions without their anchors)."""
    outs = entry["outputs"]
    tasks = {o["task"] for o in outs}
    if len(tasks) != 1:
        return None
    task = tasks.pop()
    if task in ("ctc", "segment"):
        layouts = {o.get("layout") for o in outs}
        return ["--task", task, "--layout", layouts.pop()] if len(layouts) == 1 else None
    if task == "detect" and all(o.get("layout") == "split" for o in outs):
        heads = [o for o in outs if o["role"] == "scores"]
        formats = {o.get("box_format") for o in outs if o["role"] == "boxes"}
        if len(formats) != 1 or None in formats:
            return None
        return [
            "--task",
            "detect",
            "--scores",
            ",".join(h["name"] for h in heads),
            "--boxes",
            ",".join(h["pair"] for h in heads),
            "--box-format",
            formats.pop(),
        ]
    return None


def check_explicit(
    entry: dict[str, Any], report: dict[str, Any], ref: dict[str, np.ndarray], cand: dict[str, np.ndarray]
) -> list[str]:
    """Problems of compare given the explicit task flags: every output scored as that task, in
    the stated layout, with the metric plain scoring here computes (within METRIC_TOLERANCE)."""
    problems = []
    by_name = {o["name"]: o for o in report.get("outputs", [])}
    plain_f1 = None
    for expect in entry["outputs"]:
        name, want = expect["name"], expect["task"]
        task = (by_name.get(name) or {}).get("task")
        if not isinstance(task, dict):
            problems.append(f"'{name}': no task in compare's report")
            continue
        if task.get("name") != want:
            if (
                want == "detect"
                and task.get("name") == "raw"
                and any(
                    f"'{o}'" in str(task.get("how")) and ((by_name.get(o) or {}).get("task") or {}).get("name") == want
                    for o in by_name
                    if o != name
                )
            ):
                continue  # split heads are scored together, on the output whose report this one names
            problems.append(f"'{name}': given {want}, compare scored it {task.get('name')}: {task.get('how')}")
            continue
        stated = _stated_layout(task)
        if want in ("ctc", "segment") and stated and stated.lower() != expect["layout"].lower():
            problems.append(f"'{name}': given layout {expect['layout']}, compare reports {stated}")
        metrics = task.get("metrics") or {}
        value = metrics.get(GATE_KEYS[want])
        if want == "detect":
            if expect.get("role") != "scores" and value is None:
                continue  # the box outputs are scored with their score outputs
            if plain_f1 is None:
                plain_f1 = ("f1", split_detect_f1(entry, ref, cand))
            plain = plain_f1[1]
        else:
            plain = plain_metric(expect, ref[name], cand[name])
        if plain is None:
            if isinstance(value, (int, float)):
                problems.append(f"'{name}': {GATE_KEYS[want]} {value} where the reference has nothing to agree with")
        elif not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(f"'{name}': no {GATE_KEYS[want]} in compare's {want} metrics ({task.get('how')})")
        elif abs(value - plain) > METRIC_TOLERANCE:
            problems.append(f"'{name}': compare's {GATE_KEYS[want]} {value:.3f}, scored here {plain:.3f}")
    return problems


# ---------------------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _json(text: str) -> dict[str, Any] | None:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass
class Step:
    args: list
    code: int
    line: str  # stderr's last line (the error, where it failed)
    report: dict[str, Any] | None

    def command(self) -> str:
        return "trtq " + " ".join(str(a) for a in self.args)


@dataclass
class CaseResult:
    entry: dict[str, Any]
    work: Path
    steps: dict[str, Step] = field(default_factory=dict)
    weighted: int = 0
    quantized: int | None = None
    loads: bool | None = None  # the Q/DQ model: loads and runs in ONNX Runtime (both levels)
    load_error: str = ""
    sqnr: dict[str, float] = field(default_factory=dict)
    candidate: str = ""  # what compare's candidate was: "qdq" or "weight-rounded fp32"
    tasks: list[dict[str, Any]] = field(default_factory=list)
    explicit: list[str] | None = None  # compare's problems given the task flags (None: no flags apply)
    calibrate_seconds: float | None = None
    error: str = ""  # a step of this module that crashed (a bug here, shown, not hidden)
    model: Path | None = None
    cache: Path | None = None
    compare_data: Path | None = None

    def step_failed(self, name: str) -> str | None:
        s = self.steps.get(name)
        if s is None:
            return f"{name} did not run"
        if s.code != 0:
            return f"`{s.command()}` exited {s.code}: {s.line}"
        return None


def run_case(entry: dict[str, Any], folder: Path, work: Path, run: Runner) -> CaseResult:
    """calibrate -> quantize -> check the Q/DQ model -> compare, each step recorded."""
    import onnx

    res = CaseResult(entry, work)
    model = folder / entry["file"]
    try:
        res.weighted = count_weighted(onnx.load(str(model), load_external_data=False))
        calib_glob, cmp_path = write_data(entry, work / "data")
        cache, qdq = work / "calibration.cache", work / "model.qdq.onnx"
        res.model, res.cache, res.compare_data = model, cache, cmp_path

        def step(name, args):
            r = run(args)
            res.steps[name] = Step(args, r.code, _last_line(r.err), _json(r.out) if r.code == 0 else None)
            return res.steps[name]

        cal = step("calibrate", ["calibrate", "-m", model, "--data", calib_glob, "-o", cache, "--json"])
        if cal.code == 0 and cal.report:
            res.calibrate_seconds = cal.report.get("seconds")
        q = None
        if cal.code == 0:
            q = step("quantize", ["quantize", "-m", model, "--cache", cache, "-o", qdq, "--json"])
        x = np.load(cmp_path)
        ref = run_all(session(model, optimized=True), entry, x)  # FP32: as compare runs the reference
        cand = None
        if q is not None and q.code == 0 and qdq.is_file():
            try:
                qmodel = onnx.load(str(qdq))
                res.quantized = count_quantized(qmodel)
                run_all(session(qdq, optimized=True), entry, x[:8])
                cand = run_all(session(qdq, optimized=False), entry, x)
                res.loads = True
            except Exception as e:  # the artefact trtq wrote does not load or run: that is the finding
                res.loads, res.load_error = False, f"{type(e).__name__}: {_last_line(str(e))[:300]}"
        elif q is not None:
            res.loads = False if qdq.is_file() else None
        if cand is not None:
            res.sqnr = {n: sqnr_db(ref[n], cand[n]) for n in ref}
            res.candidate, cand_path = "qdq", qdq
        else:
            cand_path = work / "model.rounded.onnx"
            weight_rounded_copy(model, cand_path)
            cand = run_all(session(cand_path, optimized=True), entry, x)
            res.candidate = "weight-rounded fp32 (quantize wrote no loadable model)"
        base = ["compare", "--reference", model, "--candidate", cand_path, "--data", cmp_path, "--json"]
        cmp = step("compare", base)
        if cmp.code == 0 and cmp.report:
            res.tasks = check_tasks(entry, cmp.report, ref, cand)
        flags = explicit_task_args(entry)
        if flags:
            given = step("compare_given", base + flags)
            res.explicit = (
                [] if given.code == 0 and given.report else [f"`{given.command()}` exited {given.code}: {given.line}"]
            )
            if given.report:
                res.explicit = check_explicit(entry, given.report, ref, cand)
    except Exception as e:  # reported with the case: a crash here is shown, not hidden
        res.error = f"{type(e).__name__}: {e}"
    return res


def placement_check(
    case: CaseResult, placement: str, run: Runner, extra: tuple[str, ...] = ()
) -> tuple[Step, str, dict[str, float]]:
    """``trtq quantize --placement`` (plus ``extra`` flags) from the case's cache: (the step, why its
    model does not load and run in ONNX Runtime or "", SQNR per output against FP32 on the compare
    samples)."""
    import onnx

    out = case.work / f"model.{placement}{''.join(extra).replace('-', '.')}.qdq.onnx"
    args = ["quantize", "-m", case.model, "--cache", case.cache, "--placement", placement, "-o", out, "--json"]
    args += list(extra)
    r = run(args)
    step = Step(args, r.code, _last_line(r.err), _json(r.out) if r.code == 0 else None)
    if r.code != 0:
        return step, "", {}
    x = np.load(case.compare_data)
    ref = run_all(session(case.model, optimized=True), case.entry, x)
    try:
        onnx.load(str(out))
        run_all(session(out, optimized=True), case.entry, x[:8])
        cand = run_all(session(out, optimized=False), case.entry, x)
    except Exception as e:  # the artefact does not load or run: the finding
        return step, f"{type(e).__name__}: {_last_line(str(e))[:300]}", {}
    return step, "", {n: sqnr_db(ref[n], cand[n]) for n in ref}
