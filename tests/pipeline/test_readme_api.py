"""README's "Python API" example runs as written and leaves a usable cache and Q/DQ model.

Whatever the block says: it must run from a copy of the checkout (configs/, sample_data/), and every
cache its ``write_cache("PATH", ...)`` calls name must be a readable TensorRT cache afterwards. A
block marked ``<!-- readme-test: skip -->`` (tests/test_readme.py's marker) is skipped."""

import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, repo_env
from tests.test_readme import blocks
from trtq.calib.cache import read_cache


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    found = [b for b in blocks(section) if b.lang == "python"]
    assert len(found) == 1, "the Python API section has one python block"
    if found[0].mark == "skip":
        pytest.skip("README's Python API block is marked <!-- readme-test: skip -->")
    return found[0].code


@pytest.mark.slow
def test_the_readme_python_example_runs(tmp_path):
    code = readme_example()
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    caches = re.findall(r"write_cache\(\s*[\"']([^\"']+)[\"']", code)
    assert caches, "the example writes a cache"
    for cache in caches:
        assert read_cache(tmp_path / cache).amax, cache
