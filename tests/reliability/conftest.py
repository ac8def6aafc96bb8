"""Fixtures for the fault suite: a tiny real model, its data and cache, and ways to run trtq in a
child process (real signals, dropped privileges, size limits) or under a small tmpfs."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import CliResult, repo_env

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def make_model(path: Path, seed: int = 0) -> Path:
    """x[N,3,8,8] -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> y[N,16] (16 channels:
    large enough that trtq quantizes both layers)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.5, (16, 3, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, (16,)).astype(np.float32)
    g = rng.normal(0, 0.5, (16, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "g"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(g, "g")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


class Kit:
    """A model, .npy data, a calibrated cache (+ .json) in one folder, copied per test."""

    def __init__(self, root: Path):
        self.root = root
        self.model = root / "m.onnx"
        self.data = root / "x.npy"
        self.cache = root / "c.cache"
        self.prov = root / "c.cache.json"
        self.stats = root / "s.npz"

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the folder (hidden ones included) with its bytes."""
        out = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(self.root))] = p.read_bytes()
        return out


@pytest.fixture(scope="session")
def _kit_template(tmp_path_factory) -> Path:
    from trtq.cli import main

    root = tmp_path_factory.mktemp("kit")
    make_model(root / "m.onnx")
    np.save(root / "x.npy", np.random.default_rng(1).normal(0, 1, (6, 3, 8, 8)).astype(np.float32))
    args = [
        "calibrate",
        "--model",
        root / "m.onnx",
        "--data",
        root / "x.npy",
        "-o",
        root / "c.cache",
        "--save-stats",
        root / "s.npz",
        "-q",
    ]
    try:
        main([str(a) for a in args])
    except SystemExit as e:
        assert e.code in (0, None), e.code
    return root


@pytest.fixture
def kit(_kit_template, tmp_path) -> Kit:
    root = tmp_path / "kit"
    shutil.copytree(_kit_template, root)
    return Kit(root)


def one_line_error(r: CliResult) -> bool:
    """The contract: one error line on stderr, 'trtq: error: <what>; <fix>', last, no traceback
    (log warnings and progress lines before it are fine)."""
    from trtq.progress import is_progress_line

    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("trtq: error: ")]
    others_are_logs = all(
        ln.startswith(("trtq: WARNING: ", "trtq: INFO: ")) or is_progress_line(ln) for ln in lines[:-1]
    )
    return (
        len(errors) == 1
        and lines[-1] == errors[0]
        and ";" in errors[0]
        and others_are_logs
        and "Traceback" not in r.err
        and "internal error" not in r.err
    )


def temp_leftovers(folder: Path) -> list[str]:
    return [str(p) for p in Path(folder).rglob(".*.tmp")]


# ------------------------------------------------------------------------------------------------
# child processes
# ------------------------------------------------------------------------------------------------


def child_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = {k: v for k, v in repo_env().items() if not k.startswith("TRTQ_")}
    env.update(extra or {})
    return env


def _still_ignored(signum, frame) -> None:
    """The test process keeps ignoring the signal (see :func:`children_see_default_signals`)."""


@contextlib.contextmanager
def children_see_default_signals(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Child processes started inside begin with ``signums`` at their default action, as a command
    typed at an interactive shell does, however this test process was started.

    A command put in the background by a non-interactive shell (``pytest ... &`` in a script,
    ``nohup``) starts with SIGINT ignored, and an ignored signal stays ignored across fork and exec:
    a child would drop a SIGINT that came before its first handler, run on and exit 0. A signal with
    a handler is reset to its default at exec, so here the ignored ones get a handler that does
    nothing (this process goes on ignoring them) until the block ends. Main thread only."""
    previous = {}
    try:
        for signum in signums:
            if signal.getsignal(signum) == signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _still_ignored)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def ignored_signals(pid: int) -> int:
    """The mask of signals that process ``pid`` ignores (/proc SigIgn; 0 when it cannot be read)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigIgn:")), "0"), 16)


def trtq_cmd(args: Sequence) -> list[str]:
    return [sys.executable, "-m", "trtq"] + [str(a) for a in args]


def run_child(args: Sequence, prefix: Sequence[str] = (), timeout: float = 120, **kw) -> CliResult:
    p = subprocess.run(
        list(prefix) + trtq_cmd(args), capture_output=True, text=True, env=child_env(), timeout=timeout, **kw
    )
    return CliResult(p.returncode, p.stdout, p.stderr)


def _setpriv_works() -> bool:
    if not IS_ROOT:
        return True
    exe = shutil.which("setpriv")
    if not exe:
        return False
    try:
        probe = tempfile.mkdtemp()
        os.chmod(probe, 0)
        r = subprocess.run(
            [
                exe,
                "--bounding-set=-dac_override,-dac_read_search",
                sys.executable,
                "-c",
                f"import os; os.listdir({probe!r})",
            ],
            capture_output=True,
            timeout=30,
        )
        os.chmod(probe, 0o700)
        os.rmdir(probe)
        return r.returncode != 0 and b"PermissionError" in r.stderr
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def unprivileged() -> list[str]:
    """Command prefix under which file permissions apply: nothing for a normal user; for root,
    setpriv without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH (root ignores chmod otherwise)."""
    if not _setpriv_works():
        pytest.skip("running as root and setpriv cannot drop CAP_DAC_OVERRIDE here: permissions cannot be enforced")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if IS_ROOT else []


@contextlib.contextmanager
def tmpfs(folder: Path, size: str = "64k", read_only: bool = False) -> Iterator[Path]:
    """Mount a small tmpfs on ``folder`` (skip the test when this process cannot mount)."""
    folder.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0777" + (",ro" if read_only else "")
    if not IS_ROOT or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def remount_read_only(folder: Path) -> None:
    r = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")


def fill_up(folder: Path) -> None:
    """Fill the file system of ``folder`` until writing fails (disk full)."""
    for name, size in (("filler", 4096), ("filler2", 1)):  # then the last partial block
        with open(folder / name, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
