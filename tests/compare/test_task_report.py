"""Task metrics in the report: strict JSON, the text lines, the gate, and the semantics warning."""

import json
import math

from trtq.compare.accuracy import CompareReport
from trtq.compare.metrics import OutputMetrics
from trtq.compare.semantics import semantics_gaps
from trtq.compare.tasks import TaskResult
from trtq.config import CompareOptions


def output(name, task, top1=None):
    return OutputMetrics(
        name=name,
        sample_shape=(40, 97),
        samples=4,
        top1_agreement=top1,
        top1_matches=None if top1 is None else int(top1 * 4),
        cosine_mean=0.99,
        cosine_min=0.9,
        max_abs_error=0.1,
        mean_abs_error=0.01,
        sqnr_db=20.0,
        ref_max_abs=1.0,
        nonfinite=0,
        task=task,
    )


def report(*outputs, **kw):
    return CompareReport(reference="a.onnx", candidate="b.onnx", samples=4, batches=1, outputs=outputs, **kw)


def test_json_is_strict_and_names_the_gated_metric():
    ctc = TaskResult(
        "ctc",
        "given (--task)",
        {"sequence_agreement": 0.5, "cer": math.inf, "edits": 3, "reference_chars": 0, "matching_lines": 2},
    )
    d = report(output("rec", ctc)).to_dict()
    text = json.dumps(d, allow_nan=False)
    task = json.loads(text)["outputs"][0]["task"]
    assert task == {
        "name": "ctc",
        "how": "given (--task)",
        "gate_metric": "sequence_agreement",
        "metrics": {"sequence_agreement": 0.5, "cer": "inf", "edits": 3, "reference_chars": 0, "matching_lines": 2},
        "interval95": {"sequence_agreement": [0.150039, 0.849961]},
    }  # Wilson, 2 of 4


def test_wilson_interval_known_values():
    import numpy as np

    from trtq.compare.accuracy import wilson_interval

    for (p, n), (lo, hi) in {(0.5, 100): (0.4038, 0.5962), (1.0, 20): (0.8389, 1.0), (0.0, 20): (0.0, 0.1611)}.items():
        got = wilson_interval(p, n)
        assert abs(got[0] - lo) < 5e-5 and abs(got[1] - hi) < 5e-5, (p, n, got)  # published tables
    for p, n in ((0.927, 2000), (0.5, 4), (0.605, 200)):  # the bounds solve (p - q)^2 = z^2 q (1 - q) / n for q
        k = 1.959964**2 / n
        roots = sorted(np.roots([1 + k, -(2 * p + k), p * p]).real)
        assert np.allclose(wilson_interval(p, n), roots, atol=1e-12)
    assert wilson_interval(0.5, 0) is None and wilson_interval(math.nan, 10) is None


def test_per_sample_metrics_print_their_interval():
    """Fractions of samples carry a 95% interval in the text (how much another evaluation set of
    the same size could move them); F1, IoU and CER, not per-sample fractions, do not."""
    cls = TaskResult("classify", "inferred: x", {"top1_agreement": 0.75, "top5_agreement": 1.0})
    det = TaskResult("detect", "inferred: x", {"f1": 0.62})
    text = report(output("logits", cls), output("boxes", det)).render_text()
    assert "top-1 agreement 0.7500 (95% interval 0.301-0.954) [gates --min-agreement]" in text
    assert "top-5 agreement 1.0000 (95% interval 0.510-1.000)" in text
    assert "detection F1 0.6200 [gates --min-agreement]" in text


def test_text_lines_and_gate_per_task():
    det = TaskResult(
        "detect", "inferred: x", {"f1": 0.62, "precision": 0.7, "box_sqnr_db": 26.4, "matched": 31, "layout": "v8"}
    )
    raw = TaskResult("raw", "no task inferred for [N, 16, 4, 4]", {})
    rep = report(output("output0", det), output("feat", raw), output("scores", None, top1=0.75))
    text = rep.render_text()
    assert "task output0: detect (inferred: x)" in text
    assert "detection F1 0.6200 [gates --min-agreement]  precision 0.7000  box SQNR 26.40 dB" in text
    assert "matched 31, layout v8" in text
    assert "task feat: raw (no task inferred for [N, 16, 4, 4])" in text
    failed = rep.gate(CompareOptions(min_agreement=0.8))
    assert failed == [
        "output0: detection F1 0.62 is below --min-agreement 0.8",
        "scores: top-1 agreement 0.75 is below --min-agreement 0.8",
    ]
    assert rep.gate(CompareOptions(min_agreement=0.6)) == []
    nan = report(output("output0", TaskResult("segment", "x", {"iou": math.nan})))
    assert nan.gate(CompareOptions(min_agreement=0.1)) == ["output0: mask IoU nan is below --min-agreement 0.1"]


def test_semantics_gap_on_the_task_metric():
    main = report(output("output0", TaskResult("detect", "x", {"f1": 0.90})))
    close = report(output("output0", TaskResult("detect", "x", {"f1": 0.895})))
    far = report(output("output0", TaskResult("detect", "x", {"f1": 0.70})))
    assert semantics_gaps(main, close, "qdq", "onnxruntime") == []
    gaps = semantics_gaps(main, far, "qdq", "onnxruntime")
    assert len(gaps) == 1 and "detection F1 0.9000 vs 0.7000" in gaps[0]
