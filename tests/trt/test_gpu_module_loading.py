"""CUDA module loading of real builds (TensorRT + GPU, D39): a `trtq build` process runs its
builder under eager loading unless the user chose lazy, and the plan's metadata says which."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trt.models import TACTICS, residual_cnn
from trtq.trt.module_loading import ENV

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("chosen, expected", [(None, "eager"), ("LAZY", "lazy")])
def test_build_process_loading_mode(tmp_path, chosen, expected):
    model = residual_cnn(tmp_path / "m.onnx", batch=2)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if chosen:
        env[ENV] = chosen
    cmd = [sys.executable, "-m", "trtq", "build", "--model", str(model), "--precision", "fp16", "-o"]
    cmd += [str(tmp_path / "m.plan"), "--optimization-level", "0", "--tactic-sources", ",".join(TACTICS), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads(done.stdout)["metadata"]
    assert meta["module_loading"] == expected
    on_disk = json.loads((tmp_path / "m.plan.json").read_text())
    assert on_disk["module_loading"] == expected
    print(chosen, expected, meta.get("layout_rebuilds"), meta["build_seconds"])


def test_mode_of_this_process():
    """After CUDA has started here (the GPU check did), the driver names a mode."""
    from trtq.trt.module_loading import mode

    assert mode() in ("eager", "lazy")
