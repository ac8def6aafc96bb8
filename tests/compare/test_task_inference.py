"""Which task compare infers from an output's shape (and the op that makes it), and which shapes
an explicit --task fits."""
import pytest

from trtq.compare.tasks import TaskAccumulator, TaskSettings, fits, infer, require_fit
from trtq.errors import ConfigError, UsageError


@pytest.mark.parametrize("shape,producer,task,words", [
    ((8, 1000), None, "classify", "[N, 1000] class scores"),
    ((8, 1000, 1, 1), ("Conv", None), "classify", "[N, 1000, 1, 1] class scores"),
    ((8, 2), ("Identity", None), "classify", "argmax over axis 1"),
    ((8, 1, 640, 640), ("Sigmoid", None), "segment", "probability map"),
    ((8, 21, 64, 64), ("Resize", None), "segment", "class maps"),
    ((8, 40, 6625), ("Softmax", 2), "ctc", "Softmax over the last axis"),
    ((8, 80, 97), ("LogSoftmax", -1), "ctc", "CTC"),
    ((8, 22, 2100), ("Concat", 1), "detect", "YOLOv8 head: 22 rows (4 box + 18 class) x 2100 anchors"),
    ((8, 84, 8400), ("Concat", 1), "detect", "YOLOv8"),
    ((8, 25200, 85), ("Concat", 1), "detect", "YOLOv5 head: 25200 anchors x 85 values (4 box, objectness, 80 class)"),
    ((8, 40, 97), ("MatMul", None), "raw", "could be detect or ctc"),
    ((8, 40, 6625), ("Softmax", 1), "detect", "YOLOv8"),  # softmax over T, not the classes: not CTC
    ((8, 4, 100), ("Concat", 1), "raw", "could be detect or ctc"),  # rows of 4: no scores
    ((8, 1), None, "raw", "no task inferred for [N, 1]"),
    ((8,), None, "raw", "no task"),
    ((8, 16, 1, 32), None, "raw", "no task"),  # H = 1: a sequence, not a map
])
def test_inference_from_shape(shape, producer, task, words):
    got, how = infer(shape, producer)
    assert got == task and words in how, how


@pytest.mark.parametrize("task,shape,ok", [
    ("classify", (4, 10), True), ("classify", (4, 10, 1, 1), True), ("classify", (4, 10, 2, 2), False),
    ("classify", (4, 1), False), ("segment", (4, 1, 8, 8), True), ("segment", (4, 10), False),
    ("ctc", (4, 20, 30), True), ("ctc", (4, 20), False), ("detect", (4, 6, 50), True),
    ("detect", (4, 50, 6), True), ("detect", (4, 50, 5), False),  # v5 rows need objectness too
    ("detect", (4, 10), False), ("raw", (4,), True),
])
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
