"""Each task metric against a straightforward computation on outputs built with known answers:
boxes shifted by known amounts (known IoU and F1), known strings (known CER), masks of known
overlap, class scores with known ranks."""

import functools
import itertools
import math

import numpy as np
import pytest

from trtq.compare.classify import ClassifyAccumulator
from trtq.compare.ctc import CtcAccumulator, edit_distance, greedy_decode
from trtq.compare.detect import DetectAccumulator, Layout, nms
from trtq.compare.segment import SegmentAccumulator

# --------------------------------------------------------------------------------------------
# ctc


ALPHABET = "-abcdefghijklmnopqrstuvwxyz"  # class 0 is the CTC blank


def one_hot_path(path: str, classes: int = len(ALPHABET)) -> np.ndarray:
    """[T, C] scores whose arg-max at each step spells ``path`` ('-' = blank)."""
    out = np.full((len(path), classes), 0.01, np.float32)
    out[np.arange(len(path)), [ALPHABET.index(ch) for ch in path]] = 0.9
    return out


def batch(paths):
    width = max(len(p) for p in paths)
    return np.stack([one_hot_path(p.ljust(width, "-")) for p in paths])


def text(ids):
    return "".join(ALPHABET[i] for i in ids)


def test_greedy_decode_merges_repeats_and_drops_blanks():
    lines = greedy_decode(batch(["hhe-ll-llo", "--aa-a-", "----"]))
    assert [text(line) for line in lines] == ["hello", "aa", ""]  # "l-l" keeps both l's


def test_cer_and_sequence_agreement_on_known_strings():
    ref = batch(["hel-lo", "wo-rld", "ab-c", "x"])
    cand = batch(["hal-lo", "wo-rd", "ab-c", "xy"])
    acc = CtcAccumulator()
    acc.update(ref[:2], cand[:2])  # two updates: the sums stream
    acc.update(ref[2:], cand[2:])
    m = acc.metrics()
    # hello->hallo 1 substitution, world->word 1 deletion, abc->abc 0, x->xy 1 insertion
    assert m["edits"] == 3 and m["reference_chars"] == 5 + 5 + 3 + 1
    assert m["cer"] == pytest.approx(3 / 14)
    assert m["sequence_agreement"] == pytest.approx(1 / 4) and m["matching_lines"] == 1


def test_cer_when_the_reference_has_no_characters():
    acc = CtcAccumulator()
    acc.update(batch(["---"]), batch(["---"]))
    assert acc.metrics()["cer"] == 0.0 and acc.metrics()["sequence_agreement"] == 1.0
    acc.update(batch(["---"]), batch(["-a-"]))
    assert math.isinf(acc.metrics()["cer"])


def test_edit_distance_matches_the_recursive_definition():
    @functools.cache
    def lev(a, b):
        if not a or not b:
            return len(a) + len(b)
        return min(lev(a[1:], b) + 1, lev(a, b[1:]) + 1, lev(a[1:], b[1:]) + (a[0] != b[0]))

    rng = np.random.default_rng(0)
    for _ in range(200):
        a = "".join(rng.choice(list("abc"), rng.integers(0, 7)))
        b = "".join(rng.choice(list("abc"), rng.integers(0, 7)))
        assert edit_distance(a, b) == lev(a, b), (a, b)


# --------------------------------------------------------------------------------------------
# segment


def test_mask_iou_of_a_shifted_square():
    ref = np.zeros((1, 1, 32, 32), np.float32)
    cand = np.zeros_like(ref)
    ref[0, 0, 10:20, 10:20] = 0.9  # 100 px
    cand[0, 0, 12:22, 10:20] = 0.9  # shifted 2 rows: 80 px shared, 120 px in either
    acc = SegmentAccumulator(1, 0.5)
    acc.update(ref, cand)
    m = acc.metrics()
    assert m["iou"] == pytest.approx(80 / 120)
    assert m["pixel_agreement"] == pytest.approx(1 - 40 / 1024)
    assert m["reference_mask_fraction"] == pytest.approx(100 / 1024)


def test_threshold_decides_the_mask():
    ref = np.full((2, 1, 4, 4), 0.4, np.float32)
    cand = np.full((2, 1, 4, 4), 0.6, np.float32)
    low, high = SegmentAccumulator(1, 0.3), SegmentAccumulator(1, 0.5)
    low.update(ref, cand)
    high.update(ref, cand)
    assert low.metrics()["iou"] == 1.0  # both masks full
    assert high.metrics()["iou"] == 0.0  # only the candidate's
    empty = SegmentAccumulator(1, 0.5)
    empty.update(ref, ref)
    assert empty.metrics()["iou"] == 1.0  # neither has a mask pixel: they agree


def test_multiclass_mean_iou_matches_per_class_sets():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(3, 4, 9, 7)).astype(np.float32)
    cand = ref + rng.normal(0, 0.7, ref.shape).astype(np.float32)
    acc = SegmentAccumulator(4, 0.5)
    acc.update(ref[:1], cand[:1])
    acc.update(ref[1:], cand[1:])
    r, c = ref.argmax(1), cand.argmax(1)
    ious = []
    for k in range(4):
        inter = np.logical_and(r == k, c == k).sum()
        union = np.logical_or(r == k, c == k).sum()
        if union:
            ious.append(inter / union)
    assert acc.metrics()["iou"] == pytest.approx(np.mean(ious))
    assert acc.metrics()["pixel_agreement"] == pytest.approx((r == c).mean())


# --------------------------------------------------------------------------------------------
# classify


def test_top1_and_top5_against_sorting():
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(40, 12, 1, 1)).astype(np.float32)
    cand = ref + rng.normal(0, 1.0, ref.shape).astype(np.float32)
    acc = ClassifyAccumulator(12)
    acc.update(ref, cand)
    top1 = top5 = 0
    for r, c in zip(ref[:, :, 0, 0].tolist(), cand[:, :, 0, 0].tolist()):
        best = r.index(max(r))
        ranked = sorted(range(12), key=lambda k: -c[k])
        top1 += ranked[0] == best
        top5 += best in ranked[:5]
    m = acc.metrics()
    assert m["top1_agreement"] == top1 / 40 and m["top5_agreement"] == top5 / 40
    assert 0 < top1 < top5 < 40  # the noise makes the two differ
    assert "top5_agreement" not in ClassifyAccumulator(3).metrics()


# --------------------------------------------------------------------------------------------
# detect

CLASSES = 3


def yolo_v8(boxes, scores_by_class, anchors=40):
    """[1, 4+C, anchors]: one anchor per (cx, cy, w, h) box with its class scores, the other
    anchors background (scores 0.01)."""
    out = np.zeros((1, 4 + CLASSES, anchors), np.float32)
    out[0, 4:, :] = 0.01
    out[0, :4, :] = 1.0
    for i, (box, scores) in enumerate(zip(boxes, scores_by_class)):
        out[0, :4, i] = box
        out[0, 4:, i] = scores
    return out


def grid_boxes(n, size=20.0):
    """n boxes of size x size, 50 px apart (no two overlap)."""
    return [(25.0 + 50 * (i % 5), 25.0 + 50 * (i // 5), size, size) for i in range(n)]


def class_scores(label, score=0.9):
    s = [0.01] * CLASSES
    s[label] = score
    return s


def test_boxes_shifted_by_known_amounts_give_known_f1():
    ref_boxes = grid_boxes(10)
    labels = [i % CLASSES for i in range(10)]
    # shift 5 px: IoU (15 x 20) / (2 x 400 - 300) = 0.6, a match; shift 8 px: 240 / 560 = 0.43, not
    cand_boxes = [(cx + (8 if i < 3 else 5), cy, w, h) for i, (cx, cy, w, h) in enumerate(ref_boxes)]
    ref = yolo_v8(ref_boxes, [class_scores(k) for k in labels])
    cand = yolo_v8(cand_boxes, [class_scores(k) for k in labels])
    acc = DetectAccumulator(Layout(channels_first=True, objectness=False), 0.25, 0.45)
    acc.update(ref, cand)
    m = acc.metrics()
    assert (m["reference_detections"], m["candidate_detections"], m["matched"]) == (10, 10, 7)
    assert m["precision"] == m["recall"] == m["f1"] == pytest.approx(0.7)


def test_wrong_class_missed_box_and_extra_box():
    ref_boxes = grid_boxes(6)
    ref = yolo_v8(ref_boxes, [class_scores(0)] * 6)
    scores = [class_scores(0)] * 4 + [class_scores(1)] + [class_scores(0, 0.2)]  # 5th: wrong class; 6th: below 0.25
    cand_boxes = ref_boxes + [(400.0, 400.0, 30.0, 30.0)]  # an extra box where the reference has none
    cand = yolo_v8(cand_boxes, scores + [class_scores(2)])
    acc = DetectAccumulator(Layout(True, False), 0.25, 0.45)
    acc.update(ref, cand)
    m = acc.metrics()
    tp, n_ref, n_cand = 4, 6, 6  # 4 kept + wrong class + extra = 6 candidate detections
    assert (m["matched"], m["reference_detections"], m["candidate_detections"]) == (tp, n_ref, n_cand)
    assert m["precision"] == pytest.approx(tp / n_cand) and m["recall"] == pytest.approx(tp / n_ref)
    assert m["f1"] == pytest.approx(2 * tp / (n_ref + n_cand))


def test_nms_removes_duplicates_of_one_class_only():
    boxes = grid_boxes(4)
    # a near copy of box 0 (same class, IoU 0.6 > 0.45): suppressed; of box 1 with another class: kept
    dupes = [(boxes[0][0] + 5, boxes[0][1], 20.0, 20.0), (boxes[1][0] + 5, boxes[1][1], 20.0, 20.0)]
    ref = yolo_v8(boxes + dupes, [class_scores(0)] * 4 + [class_scores(0, 0.8), class_scores(1, 0.8)])
    acc = DetectAccumulator(Layout(True, False), 0.25, 0.45)
    acc.update(ref, ref)
    m = acc.metrics()
    assert m["reference_detections"] == 5 and m["f1"] == 1.0


def test_v5_rows_with_objectness_and_the_box_score_split():
    boxes = grid_boxes(5)
    ref = np.transpose(yolo_v8(boxes, [class_scores(1)] * 5), (0, 2, 1))  # [1, A, 4+C]
    ref = np.concatenate([ref[..., :4], np.full(ref.shape[:2] + (1,), 0.9, np.float32), ref[..., 4:]], -1)
    cand = ref.copy()
    cand[0, :2, 4] = 0.2  # objectness 0.2 x class 0.9 = 0.18 < 0.25: two detections lost
    cand[0, :, :4] += 0.5  # every box moved half a pixel
    acc = DetectAccumulator(Layout(channels_first=False, objectness=True), 0.25, 0.45)
    acc.update(ref, cand)
    m = acc.metrics()
    assert (m["reference_detections"], m["candidate_detections"], m["matched"]) == (5, 3, 3)
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(0.6)
    box_energy = np.sum(ref[..., :4].astype(np.float64) ** 2)
    box_noise = np.sum((ref[..., :4] - cand[..., :4]).astype(np.float64) ** 2)
    score_noise = np.sum((ref[..., 4:] - cand[..., 4:]).astype(np.float64) ** 2)
    assert m["box_sqnr_db"] == pytest.approx(10 * np.log10(box_energy / box_noise))
    score_energy = np.sum(ref[..., 4:].astype(np.float64) ** 2)
    assert m["score_sqnr_db"] == pytest.approx(10 * np.log10(score_energy / score_noise))


def test_no_reference_detections_is_no_verdict():
    """Nothing detected on the reference: F1 has nothing to measure (it was 1.0, which a score map
    misread as a YOLO head reported for every candidate)."""
    ref = yolo_v8([], [])
    acc = DetectAccumulator(Layout(True, False), 0.25, 0.45)
    acc.update(ref, ref)
    m = acc.metrics()
    assert m["f1"] is None and m["precision"] is None and m["recall"] is None
    assert m["reference_detections"] == 0 and "no detection above score 0.25" in m["undefined"]


def _iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def test_nms_matches_a_per_class_loop():
    rng = np.random.default_rng(3)
    xy = rng.uniform(0, 60, (80, 2))
    wh = rng.uniform(5, 25, (80, 2))
    boxes = np.concatenate([xy, xy + wh], 1)
    scores = rng.uniform(0, 1, 80)
    labels = rng.integers(0, 3, 80)
    kept = set(nms(boxes, scores, labels, 0.45).tolist())
    expected = set()
    for k in range(3):
        order = sorted(np.flatnonzero(labels == k), key=lambda i: -scores[i])
        keep = []
        for i in order:
            if all(_iou(boxes[i], boxes[j]) <= 0.45 for j in keep):
                keep.append(i)
        expected.update(keep)
    assert kept == expected and 10 < len(kept) < 80


def test_greedy_decode_matches_groupby():
    """greedy_decode against the textbook form: groupby over the arg-max path, blanks dropped."""
    rng = np.random.default_rng(4)
    probs = rng.uniform(size=(6, 30, 5))
    for ids, row in zip(greedy_decode(probs), probs.argmax(-1)):
        assert ids == [k for k, _ in itertools.groupby(row.tolist()) if k != 0]
