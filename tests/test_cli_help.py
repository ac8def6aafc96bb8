"""Every command's --help ends with its exit codes, the codes trtq.errors and the signal handlers give."""

from __future__ import annotations

import re

import pytest

from trtq.cli import cli
from trtq.errors import ConfigError, EnvironmentMissing, InputError, TrtqError, UsageError

COMMANDS = sorted(cli.commands)


def _codes(help_text: str) -> list[int]:
    tail = help_text.rsplit("Exit codes:", 1)[1]
    return [int(m.group(1)) for m in re.finditer(r"^\s{2}(\d+)\s", tail, re.M)]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_ends_with_the_exit_codes(trtq, command):
    r = trtq([command, "--help"] if command else ["--help"])
    assert r.code == 0, r
    assert "\nExit codes:\n" in r.out
    # the section is the last one: nothing but its rows (and their wrapped lines) after it
    after = r.out.rsplit("Exit codes:", 1)[1].strip("\n").splitlines()
    assert all(re.match(r"^\s+(\d+\s+\S|\S)", ln) for ln in after), after
    codes = {
        0,
        TrtqError.exit_code,
        UsageError.exit_code,
        ConfigError.exit_code,
        InputError.exit_code,
        EnvironmentMissing.exit_code,
        130,
        143,
    }
    assert _codes(r.out) == sorted(codes)


def test_a_command_words_its_own_failures(trtq):
    compare = trtq(["compare", "--help"]).out.rsplit("Exit codes:", 1)[1]
    assert "--min-agreement" in compare
    build = trtq(["build", "--help"]).out.rsplit("Exit codes:", 1)[1]
    assert "TensorRT" in build
    quantize = trtq(["quantize", "--help"]).out.rsplit("Exit codes:", 1)[1]
    assert "TensorRT" not in quantize
