"""The CLI contract: one-line errors, exit codes, nothing written on failure."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, requires_no_tensorrt


def test_help_does_not_import_heavy_modules():
    code = (
        "import sys\n"
        "from trtq.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('numpy', 'onnx', 'onnxruntime', 'tensorrt', 'PIL') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "calibrate" in r.stdout and "inspect-cache" in r.stdout


def test_module_entry_point_and_version():
    r = subprocess.run([sys.executable, "-m", "trtq", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("trtq, version ")
    from trtq.calib.collect import compiled

    if compiled.library() is not None:
        assert r.stdout.rstrip().endswith("(histogram kernels: compiled)")
    env = dict(os.environ, TRTQ_NO_NATIVE="1")
    r = subprocess.run([sys.executable, "-m", "trtq", "--version"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("(histogram kernels: numpy)")


@pytest.mark.parametrize("cmd", ["calibrate", "quantize", "compare", "build", "bench", "inspect-cache"])
def test_every_subcommand_has_help(trtq, cmd):
    r = trtq([cmd, "--help"])
    assert r.code == 0 and "Usage: trtq " + cmd in r.out


def test_usage_errors_exit_2(trtq, tmp_path):
    r = trtq(["no-such-command"])
    assert r.code == 2 and "No such command" in r.err
    r = trtq(["calibrate", "--method", "median"])
    assert r.code == 2 and "median" in r.err
    bad = tmp_path / "c.yaml"
    bad.write_text("calibrate: {metod: max}\n")
    r = trtq(["calibrate", "--config", bad])
    assert r.code == 2
    assert r.err.strip() == (
        "trtq: error: unknown config key 'calibrate.metod'; valid keys here: method, percentile, "
        "num_bins, tensors, output, trt_version, backend, providers, save_stats, max_memory, "
        "hist_elements, collect"
    )
    r = trtq(["calibrate", "--config", tmp_path / "missing.yaml"])
    assert r.code == 2 and "config file not found" in r.err
    r = trtq(["calibrate"])
    assert r.code == 2 and "no model given" in r.err


def test_environment_variables_are_checked(trtq, monkeypatch):
    monkeypatch.setenv("TRTQ_CALIBRATE_METHOD", "nonsense")
    r = trtq(["calibrate", "--model", "x.onnx"])
    assert r.code == 2 and "calibrate.method" in r.err


@pytest.mark.parametrize(
    "bad, key, other_case",
    [("calibrate: {method: median}", "calibrate.method", "MSE"), ("compare: {task: dettect}", "compare.task", "CTC")],
)
def test_every_command_checks_the_registered_names_of_its_config(trtq, tmp_path, bad, key, other_case):
    """The method and task names are checked against their registries when the config loads, as
    its other values are: also by a command that does not use them; another case is taken."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(bad + "\n")
    cache = tmp_path / "x.cache"
    cache.write_text("TRT-8600-EntropyCalibration2\nx: 3c010a14\n")
    r = trtq(["inspect-cache", cache, "--config", cfg])
    assert r.code == 2 and f"config key '{key}' must be one of" in r.err, r
    section, field = key.split(".")
    cfg.write_text(f"{section}: {{{field}: {other_case}}}\n")
    assert trtq(["inspect-cache", cache, "--config", cfg]).code == 0


def test_bad_model_exits_3_with_one_line(trtq, tmp_path):
    r = trtq(["calibrate", "--model", tmp_path / "nope.onnx", "--data", tmp_path])
    assert r.code == 3 and r.err.count("\n") == 1 and "model not found" in r.err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01garbage" * 100)
    r = trtq(["calibrate", "--model", junk, "--data", tmp_path, "--preprocess", "imagenet"])
    assert r.code == 3 and "not a readable ONNX model" in r.err and "Traceback" not in r.err
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    r = trtq(["quantize", "--model", empty, "--cache", tmp_path / "c.cache"])
    assert r.code == 3 and "empty" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.onnx", "junk.onnx"]


def test_images_without_preprocessing_is_a_usage_error(trtq, sample_model, sample_images):
    r = trtq(["calibrate", "--model", sample_model, "--data", sample_images])
    assert r.code == 2 and "--preprocess" in r.err


@requires_no_tensorrt
def test_tensorrt_commands_exit_4_without_tensorrt(trtq, sample_model, tmp_path):
    r = trtq(["build", "--model", sample_model, "--precision", "fp32", "-o", tmp_path / "m.plan"])
    assert r.code == 4, r
    assert "TensorRT" in r.err and "pip install" in r.err
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"not really a plan")
    r = trtq(["bench", plan])
    assert r.code == 4, r
    assert list(tmp_path.iterdir()) == [plan]


def test_click_invocations_in_one_process_each_get_their_own_stdout():
    """The stdout guard (results on stdout, everything else on stderr) lasts one command, also when
    click's own main runs it (CliRunner, as an embedding program would): a second command's result
    went to the first runner's closed stream and stdout stayed pointed at stderr."""
    import json
    import sys

    from tests.conftest import cli_runner
    from trtq.cli import cli

    cache = ROOT / "tests" / "golden" / "trt8600_entropy2.cache"
    before = sys.stdout
    for _ in range(2):
        r = cli_runner().invoke(cli, ["inspect-cache", str(cache), "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["summary"]["count"] > 0
    assert sys.stdout is before


def test_a_flag_group_reaches_the_command_as_one_object():
    import click
    from click.testing import CliRunner

    from trtq.cli.flags import option_group

    pair = option_group("pair", click.option("--a", type=int), click.option("--b-value", default="x"))
    seen = {}

    @click.command()
    @click.option("--before")
    @pair
    @click.option("--after", is_flag=True)
    def command(before, pair, after):
        seen.update(before=before, a=pair.a, b=pair.b_value, after=after, keys=sorted(vars(pair)))

    r = CliRunner().invoke(command, ["--a", "3", "--after", "--before", "y"])
    assert r.exit_code == 0, r.output
    assert seen == {"before": "y", "a": 3, "b": "x", "after": True, "keys": ["a", "b_value"]}
    assert [p.name for p in command.params] == ["before", "a", "b_value", "after"]  # --help order kept


def test_no_command_takes_more_than_ten_parameters():
    import inspect

    from trtq.cli import cli

    counts = {name: len(inspect.signature(c.callback).parameters) for name, c in cli.commands.items()}
    assert max(counts.values()) <= 10, counts
