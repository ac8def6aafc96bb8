"""Issue 29: every value a user types is parsed into a one-line error with exit 2 (usage) or 3
(invalid input), never click's multi-line usage text, an "internal error" or an out-of-memory exit 1;
and every such refusal writes nothing."""

import os

import pytest

from tests.reliability.conftest import one_line_error, run_child


def _refused(trtq, kit, args, code, *words):
    before = kit.snapshot()
    r = trtq(args)
    assert r.code == code, r
    assert one_line_error(r), r.err
    for w in words:
        assert w in r.err, r.err
    assert kit.snapshot() == before  # nothing written, nothing replaced
    return r


# ------------------------------------------------------------------------------------------------
# click's own errors and input paths
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,words",
    [
        (["calibrate", "--method", "median"], ["'median' is not one of", "see 'trtq calibrate --help'"]),
        (["calibrate", "--batch-size", "eight"], ["--batch-size must be a whole number"]),
        (["merge-stats", "--bogus"], ["No such option", "--bogus", "see 'trtq merge-stats --help'"]),
        (["merge-stats"], ["Missing argument"]),
        (["no-such-command"], ["No such command", "see 'trtq --help'"]),
    ],
)
def test_click_usage_errors_are_one_line(trtq, kit, args, words):
    _refused(trtq, kit, args, 2, *words)


def test_a_folder_given_as_an_input_file_is_invalid_input(trtq, kit):
    (kit.root / "cand.onnx").mkdir()  # compare's paths were click's (exit 2); now the runner's check
    _refused(
        trtq,
        kit,
        ["compare", "--reference", kit.model, "--candidate", kit.root / "cand.onnx", "--data", kit.data],
        3,
        "model path is a folder",
    )
    _refused(
        trtq, kit, ["merge-stats", kit.root, kit.stats, "-o", kit.root / "m.npz"], 3, "statistics file path is a folder"
    )
    _refused(
        trtq,
        kit,
        ["report", "--cache", kit.cache, "--stats", kit.root, "-o", kit.root / "r.html"],
        3,
        "statistics file path is a folder",
    )


@pytest.mark.parametrize("what", ["merge-stats shard", "report --stats", "report --cache"])
def test_an_unreadable_shard_stats_or_cache_file_is_exit_3(kit, unprivileged, what):
    """Was click's exit 2 ("Invalid value ... is not readable") with its usage text."""
    target = kit.cache if what == "report --cache" else kit.stats
    out = kit.root / ("m.npz" if what.startswith("merge") else "r.html")
    args = {
        "merge-stats shard": ["merge-stats", kit.stats, "-o", out],
        "report --stats": ["report", "--cache", kit.cache, "--stats", kit.stats, "-o", out],
        "report --cache": ["report", "--cache", kit.cache, "-o", out],
    }[what]
    os.chmod(kit.root, 0o755)
    os.chmod(target, 0)
    try:
        r = run_child(args, unprivileged)
    finally:
        os.chmod(target, 0o644)
    assert r.code == 3, r
    assert one_line_error(r) and "Permission denied" in r.err and "cannot read" in r.err, r.err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------
# numbers: the digits 0-9 only, no absurd sizes
# ------------------------------------------------------------------------------------------------

FOUR_HUNDRED_DIGITS = "9" * 400


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--shape", "x=²x3x8x8"], ["--shape x=²x3x8x8", "positive integers"]),
        (["--shape", "x=1x3x8x" + FOUR_HUNDRED_DIGITS], ["--shape", "below 2**31"]),
        (["--override-input-shape", "x=١x3x8x8"], ["--override-input-shape", "positive integer dims"]),
        # was exit 1 (out of memory) from the check run's zeros; now refused from shape inference's sizes
        (["--override-input-shape", "x=1x3x100000x100000"], ["one run at that shape needs at least", "available"]),
        (["--max-memory", FOUR_HUNDRED_DIGITS], ["--max-memory must be a size", "..."]),
        (["--max-memory", "99999999999T"], ["more than 1 EiB"]),
        (["--max-memory", "١٢G"], ["--max-memory must be a size"]),
        (["--batch-size", "١٢"], ["--batch-size must be a whole number", "digits 0-9"]),
        (["--batch-size", FOUR_HUNDRED_DIGITS], ["--batch-size", "at most 18", "..."]),
        (["--num-bins", "２０４８"], ["--num-bins must be a whole number"]),
        (["--num-bins", str(10**11)], ["num_bins must be a positive integer up to"]),
        (["--seed", "1_000"], ["--seed must be a whole number"]),
        (["--method", "percentile", "--percentile", "nan"], ["--percentile must be a finite number"]),
        (["--hist-elements", "1e3"], ["--hist-elements must be a whole number"]),
        (["--trt-version", "١٠.٣.٠"], ["not a TensorRT version"]),
        (["--shard", "١/٢", "--save-stats", "s0.npz"], ["is not I/N", "digits 0-9"]),
        (["--shard", "1/" + "1" + "0" * 26, "--save-stats", "s0.npz"], ["at most 1000000 shards"]),
    ],
)
def test_a_number_in_another_script_or_of_absurd_size_is_refused(trtq, kit, flags, words):
    """Were "internal error ... please report it" (int('²'), a 400-digit --max-memory overflowing a
    float), out of memory (exit 1) or silently read (--batch-size ١٢ ran with 12)."""
    _refused(
        trtq,
        kit,
        ["calibrate", "--model", kit.model, "--data", kit.data, "-o", kit.root / "n.cache", *flags],
        2,
        *words,
    )


def test_build_opt_level_range_and_digits(trtq, kit):
    for flag in ("--optimization-level", "--opt-level"):  # the config key's name and the former one
        for value in ("6", "٣"):
            _refused(
                trtq,
                kit,
                ["build", "--model", kit.model, "--cache", kit.cache, "-o", kit.root / "e.plan", flag, value],
                2,
                "--optimization-level must be",
            )
