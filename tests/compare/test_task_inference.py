"""Which task compare infers from an output's shape (and the op that makes it), and which shapes
an explicit --task fits."""

import numpy as np
import pytest

from trtq.compare.origin import OutputOrigin
from trtq.compare.tasks import TaskAccumulator, TaskSettings, fits, infer, require_fit
from trtq.errors import ConfigError, UsageError

SIG_CONV = OutputOrigin(op="Sigmoid", class_axis=1, class_evidence="Conv output (channels on axis 1)")
NHWC = OutputOrigin(op="Transpose", class_axis=3, class_evidence="Transpose [0, 2, 3, 1] of a Conv output")
LN = OutputOrigin(op="Gather", source="LayerNormalization")


@pytest.mark.parametrize(
    "shape,producer,task,words",
    [
        ((8, 1000), None, "classify", "[N, 1000] class scores"),
        ((8, 1000, 1, 1), ("Conv", None), "classify", "[N, 1000, 1, 1] class scores"),
        ((8, 2), ("Identity", None), "classify", "argmax over axis 1"),
        ((8, 384), LN, "raw", "made by LayerNormalization: features rather than class scores"),
        ((8, 1, 640, 640), SIG_CONV, "segment", "NCHW [N, 1, 640, 640] is a probability map"),
        ((8, 21, 64, 64), ("Resize", None), "raw", "could be NCHW or NHWC"),  # Resize alone says nothing
        ((8, 21, 64, 64), SIG_CONV, "segment", "class maps, argmax over axis 1"),
        ((8, 64, 64, 3), NHWC, "segment", "NHWC [N, 64, 64, 3] is class maps, argmax over axis 3"),
        ((8, 64, 64, 3), None, "raw", "pass --task segment --layout NCHW or --layout NHWC"),
        ((8, 40, 6625), ("Softmax", 2), "ctc", "classes on the last axis by Softmax over axis 2"),
        ((8, 80, 97), ("LogSoftmax", -1), "ctc", "CTC"),
        ((8, 22, 2100), ("Concat", 1), "detect", "YOLOv8 head: 22 rows (4 box + 18 class) x 2100 anchors"),
        ((8, 84, 8400), ("Concat", 1), "detect", "YOLOv8"),
        (
            (8, 25200, 85),
            ("Concat", 1),
            "detect",
            "YOLOv5 head: 25200 anchors x 85 values (4 box, objectness, 80 class)",
        ),
        ((8, 40, 97), ("MatMul", None), "raw", "could be detect or ctc"),
        ((8, 40, 6625), ("Softmax", 1), "detect", "YOLOv8"),  # softmax over T, not the classes: not CTC (shape only)
        ((8, 4, 100), ("Concat", 1), "raw", "could be detect or ctc"),  # rows of 4: no scores
        ((8, 1), None, "raw", "no task inferred for [N, 1]"),
        ((8,), None, "raw", "no task"),
        ((8, 16, 1, 32), SIG_CONV, "raw", "no task"),  # H = 1: a sequence, not a map
    ],
)
def test_inference_from_shape(shape, producer, task, words):
    got, how = infer(shape, producer)
    assert got == task and words in how, how


def test_a_tnc_softmax_output_is_ctc_with_its_layout():
    got, how = infer((8, 40, 97), ("Softmax", 2), batch_axis=1)
    assert got == "ctc" and "TNC" in how


def test_yolo_shaped_outputs_whose_values_are_not_a_yolo_head_are_raw():
    """A [N, HW, C] score map (every value a probability) and a [N, HW, 32] DFL box map (logits)
    have a YOLOv5 head's shape; their values say otherwise."""
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, (2, 400, 10)).astype(np.float32)
    got, how = infer(scores.shape, ("Sigmoid", None), scores)
    assert got == "raw" and "box values all lie within [-1, 1]" in how and "--task detect" in how
    boxes = rng.normal(0, 3, (2, 400, 32)).astype(np.float32)
    got, how = infer(boxes.shape, ("Conv", None), boxes)
    assert got == "raw" and "not probabilities" in how
    head = np.concatenate([rng.uniform(0, 320, (2, 400, 4)), rng.uniform(0, 1, (2, 400, 6))], -1)
    assert infer(head.shape, ("Concat", 2), head)[0] == "detect"


def test_outputs_sharing_anchors_are_split_heads_not_yolo_heads():
    got, how = infer((2, 1600, 80), ("Sigmoid", None), siblings=["boxes_8"])
    assert got == "raw" and "split detector heads" in how and "--scores" in how and "boxes_8" in how


@pytest.mark.parametrize(
    "task,shape,ok",
    [
        ("classify", (4, 10), True),
        ("classify", (4, 10, 1, 1), True),
        ("classify", (4, 10, 2, 2), False),
        ("classify", (4, 1), False),
        ("segment", (4, 1, 8, 8), True),
        ("segment", (4, 10), False),
        ("ctc", (4, 20, 30), True),
        ("ctc", (4, 20), False),
        ("detect", (4, 6, 50), True),
        ("detect", (4, 50, 6), True),
        ("detect", (4, 50, 5), False),  # v5 rows need objectness too
        ("detect", (4, 10), False),
        ("raw", (4,), True),
    ],
)
def test_which_shapes_a_task_fits(task, shape, ok):
    assert (fits(task, shape, TaskSettings(task=task)) is None) == ok


def test_detect_format_overrides_the_orientation_guess():
    settings = TaskSettings(task="detect", detect_format="v8")
    acc = TaskAccumulator("y", settings)
    import numpy as np

    acc.update(np.zeros((2, 50, 5), np.float32), np.zeros((2, 50, 5), np.float32))
    assert acc.result().metrics["layout"] == "v8"  # [N, A, 4+C] rows without objectness


def test_an_explicit_task_that_fits_one_output_of_two():
    import numpy as np

    settings = TaskSettings(task="segment")
    accs = {"map": TaskAccumulator("map", settings), "vec": TaskAccumulator("vec", settings)}
    accs["map"].update(np.zeros((2, 1, 4, 4)), np.zeros((2, 1, 4, 4)))
    accs["vec"].update(np.zeros((2, 10)), np.zeros((2, 10)))
    require_fit(accs, settings)  # one output fits: no error
    assert accs["map"].result().task == "segment"
    assert accs["vec"].result().task == "raw" and "does not fit [N, 10]" in accs["vec"].result().how
    del accs["map"]
    with pytest.raises(UsageError, match=r"--task segment does not fit the model's outputs \('vec' is \[N, 10\]\)"):
        require_fit(accs, settings)


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="unknown compare task"):
        TaskSettings(task="pose").check()
    with pytest.raises(ConfigError, match="--score-threshold must be between 0 and 1"):
        TaskSettings(score_threshold=2.0).check()
