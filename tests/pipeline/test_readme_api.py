"""README's "Python API" example runs as written and leaves a usable cache and Q/DQ model."""

import shutil
import subprocess
import sys

import onnx
import pytest

from tests.conftest import ROOT, repo_env
from tests.test_readme import blocks
from trtq.calib.cache import read_cache


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    found = [b for b in blocks(section) if b.lang == "python"]
    assert len(found) == 1, "the Python API section has one python block"
    if found[0].mark == "skip":  # tests/test_readme.py's marker: the block is not run yet
        pytest.skip("README's Python API block is marked <!-- readme-test: skip -->")
    return found[0].code


@pytest.mark.slow
def test_the_readme_python_example_runs(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    r = subprocess.run(
        [sys.executable, "-c", readme_example()],
        cwd=tmp_path,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    table = read_cache(tmp_path / "out" / "api" / "calibration.cache")
    assert f"{len(table.amax)} tensors" in r.stdout
    model = onnx.load(str(tmp_path / "out" / "api" / "model.qdq.onnx"))
    assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    assert "top-1 agree" in r.stdout
