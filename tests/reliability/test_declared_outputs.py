"""Issue 29: every command declares what it reads and writes (trtq.outputs.Declared), and the one
guard (trtq.outputs.guard) checks that declaration before anything is written.

The walk below is what keeps a new flag from skipping the guard. For every command of the CLI:
every parameter that can name a file (a click.Path, --data) must be exercised by a case here, and a
string option that names no file must be listed in NOT_FILES (so a new string or path option
fails this test until it is looked at). Each case runs the real command with every such flag set
and checks that

- the guard ran exactly once, and every path given on the command line is in its declaration
  (an input, a folder, a model or an output),
- every file that appeared or changed in the folder is a declared output (a writer that bypassed
  the declaration, or wrote a side file it did not declare, fails here; one that writes through
  trtq.fileio is refused at run time as well, see test_an_undeclared_write_is_refused).
"""

import json
import os
from pathlib import Path

import click
import pytest

from tests.data.helpers import image_folder
from trtq.cli import cli

# string options that name no file: the rest of a command's options are flags, choices or numbers
NOT_FILES = {
    "shard",
    "max_memory",
    "trt_version",
    "tensors",
    "providers",
    "exclude",
    "tactic_sources",
    "shape",
    "override_input_shape",
    "scores",
    "boxes",
}  # scores / boxes: output names of the model


def file_params(command: click.Command) -> set[str]:
    """The parameters of ``command`` that can name a file; AssertionError for an unclassified string."""
    names = set()
    for p in command.params:
        if isinstance(p.type, click.Path) or p.name == "data":
            names.add(p.name)
        elif isinstance(p.type, click.types.StringParamType) and p.name not in NOT_FILES:
            raise AssertionError(
                f"trtq {command.name} {p.opts[0]}: a string option; if it names a file, declare it "
                "in the command's _declare call and add a case here, else add it to NOT_FILES"
            )
    return names


def test_every_command_is_walked():
    assert set(cli.commands) == {CASES_OF.get(k, k) for k in CASES}, "a command without declaration cases: add to CASES"


def test_a_new_string_option_must_be_classified():
    """The walk's classification itself: an unknown string option is refused."""
    cmd = click.Command("new", params=[click.Option(["--dump-graph"])])
    with pytest.raises(AssertionError, match="--dump-graph"):
        file_params(cmd)
    assert file_params(click.Command("new", params=[click.Option(["--out"], type=click.Path())])) == {"out"}


@pytest.fixture
def tree(kit):
    """The kit plus image data, a config, pass-1 shard files and the JSON of compare / quantize / bench."""
    root = kit.root
    image_folder(root / "imgs", 4, 8, 8)
    (root / "cfg.yaml").write_text("bench: {duration: 1}\n")
    (root / "bench.json").write_text(json.dumps([{"plan": "e.plan", "median_ms": 1.0}]))
    (root / "fake.plan").write_bytes(b"not an engine")
    return kit


def _p(kit, name):
    return kit.root / name


# (command, args, allowed exit codes); run in this order, later cases read what earlier ones wrote
CASES = {
    "calibrate": [
        (
            lambda k: [
                "calibrate",
                "--config",
                _p(k, "cfg.yaml"),
                "--model",
                k.model,
                "--data",
                k.data,
                "-o",
                _p(k, "n.cache"),
                "--save-stats",
                _p(k, "n.npz"),
            ],
            {0},
        ),
        (lambda k: ["calibrate", "--from-stats", k.stats, "-o", _p(k, "f.cache"), "--method", "percentile"], {0}),
        (
            lambda k: [
                "calibrate",
                "--model",
                k.model,
                "--data",
                _p(k, "imgs"),
                "--preprocess",
                "unit",
                "--method",
                "entropy",
                "--shard",
                "0/2",
                "--save-stats",
                _p(k, "r0.npz"),
                "--keep-batches",
                _p(k, "k0.bin"),
            ],
            {0},
        ),
        (
            lambda k: [
                "calibrate",
                "--model",
                k.model,
                "--data",
                _p(k, "imgs"),
                "--preprocess",
                "unit",
                "--method",
                "entropy",
                "--shard",
                "1/2",
                "--save-stats",
                _p(k, "r1.npz"),
            ],
            {0},
        ),
        (
            lambda k: ["calibrate", "--model", k.model, "--data", _p(k, "imgs"), "--preprocess", "unit", "--dry-run"],
            {0},
        ),
    ],
    "merge-stats": [
        (
            lambda k: [
                "merge-stats",
                _p(k, "r0.npz"),
                _p(k, "r1.npz"),
                "-o",
                _p(k, "ranges.npz"),
                "--config",
                _p(k, "cfg.yaml"),
            ],
            {0},
        ),
    ],
    "calibrate-pass-2": [  # calibrate again: pass 2 reads --ranges and the batches pass 1 kept
        (
            lambda k: [
                "calibrate",
                "--model",
                k.model,
                "--data",
                _p(k, "imgs"),
                "--preprocess",
                "unit",
                "--method",
                "entropy",
                "--shard",
                "0/2",
                "--ranges",
                _p(k, "ranges.npz"),
                "--keep-batches",
                _p(k, "k0.bin"),
                "--save-stats",
                _p(k, "h0.npz"),
            ],
            {0},
        ),
    ],
    "quantize": [
        (
            lambda k: [
                "quantize",
                "--config",
                _p(k, "cfg.yaml"),
                "--model",
                k.model,
                "--cache",
                k.cache,
                "-o",
                _p(k, "q.onnx"),
                "--data",
                k.data,
                "--bias-correction",
                "--json",
            ],
            {0},
        ),
        (  # the placement a tuned engine's metadata records
            lambda k: (
                ["quantize", "--model", k.model, "--cache", k.cache, "--placement-from", _tuned(k)]
                + ["-o", _p(k, "t.onnx")]
            ),
            {0},
        ),
    ],
    "compare": [
        (
            lambda k: [
                "compare",
                "--config",
                _p(k, "cfg.yaml"),
                "--reference",
                k.model,
                "--candidate",
                _p(k, "q.onnx"),
                "--data",
                k.data,
                "--per-layer",
                "--cache",
                k.cache,
                "--json",
            ],
            {0},
        ),
    ],
    "report": [
        (
            lambda k: [
                "report",
                "--config",
                _p(k, "cfg.yaml"),
                "--cache",
                k.cache,
                "--stats",
                k.stats,
                "--compare",
                _p(k, "compare.json"),
                "--quantize",
                _p(k, "quantize.json"),
                "--bench",
                _p(k, "bench.json"),
                "-o",
                _p(k, "r.html"),
            ],
            {0},
        ),
    ],
    "inspect-cache": [
        (
            lambda k: [
                "inspect-cache",
                k.cache,
                "--config",
                _p(k, "cfg.yaml"),
                "--model",
                k.model,
                "--diff",
                _p(k, "f.cache"),
            ],
            {0},
        ),
    ],
    "build": [  # exit 4 without TensorRT: the guard runs before TensorRT is looked for
        (
            lambda k: [
                "build",
                "--config",
                _p(k, "cfg.yaml"),
                "--model",
                k.model,
                "--cache",
                k.cache,
                "-o",
                _p(k, "e.plan"),
                "--timing-cache",
                _p(k, "t.cache"),
                "--data",
                k.data,
                "--placement-from",
                _tuned(k),
            ],
            {0, 4},
        ),
    ],
    "bench": [
        (lambda k: ["bench", _p(k, "fake.plan"), "--config", _p(k, "cfg.yaml")], {3, 4}),
    ],
}
CASES_OF = {"calibrate-pass-2": "calibrate"}


def _tuned(k) -> str:
    """The metadata of an engine whose --tune-placement search kept shared with nothing float."""
    from trtq.trt.metadata import FORMAT

    chosen = {"precision": "int8", "placement": "shared", "left_float": [], "attention": "float"}
    path = Path(_p(k, "tuned.plan.json"))
    path.write_text(json.dumps({"format": FORMAT, "tuning": {"chosen": chosen}}))
    return str(path)


def _files(root: Path) -> dict[str, tuple]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[os.path.realpath(p)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _given_paths(command: click.Command, args: list) -> dict[str, list[str]]:
    """param name -> the paths the command line gives it (--data NAME=PATH: the PATH)."""
    ctx = command.make_context(command.name, [str(a) for a in args[1:]], resilient_parsing=True)
    given = {}
    for name in file_params(command):
        value = ctx.params.get(name)
        values = [] if value is None else list(value) if isinstance(value, (tuple, list)) else [value]
        if name == "data":
            values = [v.partition("=")[2] if "=" in v and not os.path.exists(v) else v for v in values]
        if values:
            given[name] = [str(v) for v in values]
    return given


def test_every_file_flag_of_every_command_is_declared_and_guarded(trtq, tree, monkeypatch):
    import trtq.outputs as outputs

    kit = tree
    seen: list = []
    real_guard = outputs.guard

    def recording_guard(declared):
        seen.append(declared)
        real_guard(declared)

    monkeypatch.setattr(outputs, "guard", recording_guard)
    exercised: dict[str, set] = {name: set() for name in cli.commands}
    for key, cases in CASES.items():
        name = CASES_OF.get(key, key)
        command = cli.commands[name]
        for make, codes in cases:
            args = make(kit)
            given = _given_paths(command, args)
            exercised[name] |= set(given)
            seen.clear()
            before = _files(kit.root)
            r = trtq(args)
            assert r.code in codes, (args, r)
            if "--json" in args and name in ("compare", "quantize"):
                (kit.root / f"{name}.json").write_text(r.out)
                before = _files(kit.root)  # the test wrote that one
            assert len(seen) == 1, f"trtq {name}: the guard ran {len(seen)} times"
            declared = seen[0]
            names = {
                os.path.realpath(p) for _, p in declared.inputs + declared.folders + declared.models + declared.outputs
            }
            for param, paths in given.items():
                for p in paths:
                    assert os.path.realpath(p) in names, f"trtq {name} {param}={p} is not in its declaration"
            outs = {os.path.realpath(p) for _, p in declared.outputs}
            after = _files(kit.root)
            changed = {p for p, v in after.items() if before.get(p) != v}
            assert changed <= outs, f"trtq {name} wrote undeclared files: {sorted(changed - outs)}"
    for name, command in cli.commands.items():
        missing = file_params(command) - exercised[name]
        assert not missing, f"trtq {name}: no case gives {sorted(missing)}; add one to CASES"


def test_an_undeclared_write_is_refused(trtq, kit, monkeypatch):
    """The run-time side: a write through trtq.fileio to a path the guard was not given fails before
    it creates anything (here: report's page redirected to another path, as a new side file would)."""
    import trtq.fileio as fileio

    elsewhere = kit.root / "side.html"
    real = fileio.atomic_write_text
    monkeypatch.setattr(fileio, "atomic_write_text", lambda dest, text: real(elsewhere, text))
    r = trtq(["report", "--cache", kit.cache, "-o", kit.root / "r.html"])
    assert r.code == 1 and "is not an output this command declared" in r.err, r
    assert not elsewhere.exists() and not (kit.root / "r.html").exists()
