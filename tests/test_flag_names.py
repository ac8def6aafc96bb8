"""A flag that sets a config key has the key's name (``--optimization-level`` for
build.optimization_level): the test walks every Click command and the config dataclasses. A flag
that sets no key, or one under another name, is listed below with the reason."""

from __future__ import annotations

import dataclasses

import click
import pytest

from trtq.cli import cli
from trtq.config import TrtqConfig

# flags that set no config key: what a command reads or writes, or how it runs this time
NO_KEY = {
    "--config": "the config file itself",
    "--json": "output form of this run",
    "--verbose": "logging of this run",
    "--quiet": "logging of this run",
    "--help": "click",
    "--version": "click",
    "--dry-run": "calibrate: a preview, not a setting",
    "--from-stats": "calibrate: an input file",
    "--progress": "calibrate: output of this run",
    "--shard": "calibrate: one part of a sharded run",
    "--ranges": "calibrate: an input file of a sharded run",
    "--keep-batches": "calibrate: a side file of a sharded run",
    "--candidate": "compare: the model under test",
    "--cache": "an input file (quantize, build, compare --per-layer)",
    "--per-layer-mode": "compare: how this run ranks",
    "--top": "rows shown (compare --per-layer, inspect-cache)",
    "--diff": "inspect-cache: an input file",
    "--sort": "inspect-cache: row order shown",
    "--stats": "report: an input file",
    "--compare": "report: an input file",
    "--quantize": "report: an input file",
    "--bench": "report: an input file",
    "--layers": "bench: a per-layer profile of this run",
}
# flags that set a key of another name: a repeatable flag gives one entry of a mapping or list
OTHER_NAME = {
    "--data": ("data.inputs", "one NAME=PATH per flag; the key maps every input to its source"),
    "--preprocess": ("data.inputs.*.preprocess", "a preset for every input of the flag's --data"),
    "--shape": ("data.shapes", "one INPUT=DIMS per flag (trtexec's --shapes takes a list in one)"),
    "--override-input-shape": ("model_input_shapes", "one INPUT=DIMS per flag, Polygraphy's name"),
    "--reference": ("model", "compare: the reference is the config's model"),
}


def _keys(cls, prefix: str = "") -> set[str]:
    """Every leaf key of a config dataclass, dotted (``build.optimization_level``)."""
    out = set()
    for f in dataclasses.fields(cls):
        sub = f.type if isinstance(f.type, type) else None
        default = f.default if f.default is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            out |= _keys(type(default), f"{prefix}{f.name}.")
        elif sub is not None and dataclasses.is_dataclass(sub):
            out |= _keys(sub, f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


KEYS = _keys(TrtqConfig)
LEAVES = {k.rsplit(".", 1)[-1] for k in KEYS}


def _options():
    for name, command in sorted(cli.commands.items()):
        for p in command.params:
            if isinstance(p, click.Option):
                hidden = set(getattr(p, "hidden_aliases", ()))
                longs = [o for o in p.opts + p.secondary_opts if o.startswith("--") and o not in hidden]
                yield name, p, longs[0]


def test_the_walk_sees_the_config_and_the_flags():
    assert "build.optimization_level" in KEYS and "bench.warmup" in KEYS and "data.batch_size" in KEYS
    assert len(list(_options())) > 80


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_a_flag_that_sets_a_key_has_its_name(command):
    problems = []
    for name, p, flag in _options():
        if name != command or flag in NO_KEY or flag in OTHER_NAME:
            continue
        spelled = flag[2:].replace("-", "_")
        if p.name not in LEAVES:
            problems.append(f"{flag} (dest {p.name}) sets no config key: name it as one, or list it in NO_KEY")
        elif spelled != p.name:
            problems.append(f"{flag} sets the key {p.name}: spell it --{p.name.replace('_', '-')}")
    assert not problems, problems


def test_the_exceptions_are_real_flags():
    flags = {flag for _, _, flag in _options()} | {"--help", "--version"}
    assert set(NO_KEY) | set(OTHER_NAME) <= flags, (set(NO_KEY) | set(OTHER_NAME)) - flags
    assert all(key.split(".*")[0] in KEYS or key.split(".*")[0] in {"data.inputs"} for key, _ in OTHER_NAME.values())


def test_former_spellings_still_work(trtq):
    help_text = trtq(["build", "--help"]).out
    assert "--optimization-level" in help_text and "--opt-level" not in help_text
    r = trtq(["build", "--model", "m.onnx", "--opt-level", "9"])
    assert r.code == 2 and "--optimization-level must be in 0..5, got 9" in r.err, r


@pytest.mark.parametrize("text, seconds", [("0.5", 0.5), ("200ms", 0.2), ("2s", 2.0), ("3", 3.0), ("1.5S", 1.5)])
def test_warmup_and_duration_are_seconds_with_an_optional_unit(text, seconds):
    from trtq.cli.flags import SECONDS

    assert SECONDS.convert(text, None, None) == pytest.approx(seconds)


def test_a_duration_in_another_unit_is_refused(trtq, tmp_path):
    plan = tmp_path / "e.plan"
    plan.write_bytes(b"x")
    for value in ("2h", "-1s", "ms"):
        r = trtq(["bench", plan, "--warmup", value])
        assert r.code == 2 and "--warmup must be" in r.err, r
    assert "not trtexec's ms" in trtq(["bench", "--help"]).out
