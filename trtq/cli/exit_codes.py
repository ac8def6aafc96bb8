"""The end of every command's ``--help``: its exit codes (trtq.errors' classes, cli.process's
signals), with what the failure codes mean for that command."""

from __future__ import annotations

from typing import Any

import click

# (code, meaning) in every command's --help; the meanings a command words its own way are in WHAT
EXIT_CODES = (
    ("0", "success"),
    ("1", "the operation failed"),
    ("2", "usage or config error: a flag, a config key or value (nothing was run)"),
    ("3", "invalid input: data, model or cache"),
    ("4", "environment missing: a Python package"),
    ("130", "interrupted (Ctrl-C); nothing partial is left"),
    ("143", "terminated (SIGTERM); nothing partial is left"),
)
_TENSORRT = "environment missing: TensorRT, cuda-python or a GPU, or a Python package"
WHAT = {
    "compare": {
        "1": "the operation failed, or an accuracy gate (--min-agreement, --min-cosine) failed",
        "4": "environment missing: TensorRT or a GPU for a .plan candidate, or a Python package",
    },
    "calibrate": {"4": "environment missing: TensorRT for --backend tensorrt, or a Python package"},
    "build": {"4": _TENSORRT},
    "bench": {"4": _TENSORRT},
    "inspect-cache": {"3": "invalid input, or the cache does not fit the --model given"},
}


def exit_codes(command: str) -> list[tuple[str, str]]:
    own = WHAT.get(command, {})
    return [(code, own.get(code, meaning)) for code, meaning in EXIT_CODES]


class WithExitCodes(click.Command):
    """A command whose --help ends with its exit codes."""

    def format_epilog(self, ctx: click.Context, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        _write_codes(formatter, self.name or "")


class GroupWithExitCodes(click.Group):
    """The trtq group: its --help ends with the exit codes; its commands are :class:`WithExitCodes`."""

    command_class = WithExitCodes

    def format_epilog(self, ctx: click.Context, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        _write_codes(formatter, "")


def _write_codes(formatter: Any, command: str) -> None:
    with formatter.section("Exit codes"):
        formatter.write_dl(exit_codes(command))
