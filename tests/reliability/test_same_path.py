"""Defect 1: an output path that is an input (by any name) or another output is refused with exit 2
before anything is written."""

import os

import pytest

from tests.reliability.conftest import one_line_error


def _refused(trtq, kit, args, *words):
    before = kit.snapshot()
    r = trtq(args)
    assert r.code == 2, r
    assert one_line_error(r), r.err
    for w in words:
        assert w in r.err, r.err
    assert kit.snapshot() == before  # nothing written, nothing replaced
    return r


def test_quantize_output_onto_the_model(trtq, kit):
    _refused(
        trtq,
        kit,
        ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.model],
        "the output model",
        "is the model",
        "another output path",
    )


def test_quantize_output_onto_the_cache_and_its_provenance(trtq, kit):
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.cache], "is the cache")
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.prov], "provenance")


def test_quantize_output_through_a_symlink_and_a_hard_link(trtq, kit):
    link = kit.root / "link.onnx"
    link.symlink_to(kit.model)
    _refused(trtq, kit, ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", link], "is the model")
    hard = kit.root / "hard.onnx"
    os.link(kit.model, hard)
    _refused(trtq, kit, ["quantize", "--model", hard, "--cache", kit.cache, "-o", kit.model], "is the model")
    # through a path with .. in it
    _refused(
        trtq,
        kit,
        ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.root / "sub" / ".." / "m.onnx"],
        "is the model",
    )


@pytest.mark.parametrize("target", ["model", "data", "stats_out"])
def test_calibrate_output_onto_an_input_or_the_other_output(trtq, kit, target):
    base = ["calibrate", "--model", kit.model, "--data", kit.data]
    if target == "model":
        args = base + ["-o", kit.model]
    elif target == "data":
        args = base + ["-o", kit.data]
    else:
        args = base + ["-o", kit.cache, "--save-stats", kit.cache]
    _refused(trtq, kit, args, "same file")


def test_calibrate_outputs_onto_the_config_and_the_stats_input(trtq, kit):
    cfg = kit.root / "cfg.yaml"
    cfg.write_text("model: m.onnx\ndata:\n  inputs:\n    x:\n      npy: [x.npy]\n")
    _refused(trtq, kit, ["calibrate", "--config", cfg, "-o", cfg], "config file")
    _refused(trtq, kit, ["calibrate", "--from-stats", kit.stats, "-o", kit.stats], "statistics file")
    _refused(trtq, kit, ["calibrate", "--from-stats", kit.stats, "--model", kit.model, "-o", kit.model], "is the model")
    # the provenance JSON is an output too: -o X where X.json is the model
    odd = kit.root / "odd.onnx.json"
    os.link(kit.model, odd)
    _refused(
        trtq,
        kit,
        ["calibrate", "--model", kit.model, "--data", kit.data, "-o", kit.root / "odd.onnx"],
        "provenance file",
    )


def test_build_outputs_checked_before_tensorrt(trtq, kit):
    base = ["build", "--model", kit.model, "--cache", kit.cache]
    _refused(trtq, kit, base + ["-o", kit.model], "the engine", "is the model")
    _refused(trtq, kit, base + ["-o", kit.root / "e.plan", "--timing-cache", kit.cache], "timing cache")


def test_a_fresh_output_still_works(trtq, kit):
    out = kit.root / "q.onnx"
    r = trtq(["quantize", "--model", kit.model, "--cache", kit.cache, "-o", out])
    assert r.code == 0, r
    assert out.stat().st_size > 0


# ------------------------------------------------------------------------------------------------
# issue 29: report, merge-stats, --keep-batches, outputs inside an input folder, external data
# ------------------------------------------------------------------------------------------------


def _json_inputs(kit):
    compare = kit.root / "compare.json"
    compare.write_text('{"outputs": []}')
    quantize = kit.root / "quantize.json"
    quantize.write_text('{"left_float": []}')
    bench = kit.root / "bench.json"
    bench.write_text('[{"plan": "e.plan", "median_ms": 1.0}]')
    return compare, quantize, bench


@pytest.mark.parametrize("target", ["cache", "provenance", "stats", "compare", "quantize", "bench"])
def test_report_output_onto_each_of_its_inputs(trtq, kit, target):
    """report -o was never checked: --cache x.cache -o x.cache turned the cache into HTML."""
    compare, quantize, bench = _json_inputs(kit)
    out = {
        "cache": kit.cache,
        "provenance": kit.prov,
        "stats": kit.stats,
        "compare": compare,
        "quantize": quantize,
        "bench": bench,
    }[target]
    _refused(
        trtq,
        kit,
        [
            "report",
            "--cache",
            kit.cache,
            "--stats",
            kit.stats,
            "--compare",
            compare,
            "--quantize",
            quantize,
            "--bench",
            bench,
            "-o",
            out,
        ],
        "same file",
        "destroy the input",
    )


def _two_shards(trtq, kit):
    for i in (0, 1):
        r = trtq(
            [
                "calibrate",
                "--model",
                kit.model,
                "--data",
                kit.data,
                "--shard",
                f"{i}/2",
                "--save-stats",
                kit.root / f"h{i}.npz",
                "-q",
            ]
        )
        assert r.code == 0, r
    return kit.root / "h0.npz", kit.root / "h1.npz"


def test_merge_stats_output_onto_a_shard_by_any_name(trtq, kit):
    """merge-stats h0 h1 -o h0 destroyed shard 0; through a symlink or hard link it exited 0."""
    h0, h1 = _two_shards(trtq, kit)
    (kit.root / "out").mkdir()
    link, hard = kit.root / "link.npz", kit.root / "hard.npz"
    link.symlink_to(h0)
    os.link(h1, hard)
    for out in (h0, kit.root / "out" / ".." / "h1.npz", link, hard):
        _refused(trtq, kit, ["merge-stats", h0, h1, "-o", out], "is the shard file", "same file")


@pytest.mark.parametrize("target", ["model", "save-stats"])
def test_keep_batches_is_an_output(trtq, kit, target):
    """--keep-batches was not an output to the checker: pointed at --model it overwrote the model."""
    from tests.data.helpers import image_folder

    image_folder(kit.root / "imgs", 4, 8, 8)
    stats = kit.root / "p.npz"
    keep = kit.model if target == "model" else stats
    _refused(
        trtq,
        kit,
        [
            "calibrate",
            "--model",
            kit.model,
            "--data",
            kit.root / "imgs",
            "--preprocess",
            "unit",
            "--method",
            "entropy",
            "--shard",
            "0/2",
            "--save-stats",
            stats,
            "--keep-batches",
            keep,
        ],
        "kept batches file",
        "is the model" if target == "model" else "are the same file",
    )


def test_kept_batches_read_by_pass_2_are_an_input(trtq, kit):
    h0, _ = _two_shards(trtq, kit)
    _refused(
        trtq,
        kit,
        [
            "calibrate",
            "--model",
            kit.model,
            "--data",
            kit.data,
            "--method",
            "max",
            "--shard",
            "0/2",
            "--ranges",
            h0,
            "--keep-batches",
            kit.root / "k.bin",
            "--save-stats",
            kit.root / "k.bin",
        ],
        "is the kept batches file",
    )


@pytest.mark.parametrize("where", ["an image", "a new file", "a subfolder", "through a symlinked folder"])
def test_calibrate_output_inside_its_image_folder(trtq, kit, where):
    """calibrate -o imgs/a.jpg --data imgs overwrote an image of its own data and wrote a .json there."""
    from tests.data.helpers import image_folder

    imgs = kit.root / "imgs"
    image_folder(imgs, 3, 8, 8)
    (imgs / "sub").mkdir()
    (kit.root / "alias").symlink_to(imgs)
    out = {
        "an image": imgs / sorted(p.name for p in imgs.glob("*.png"))[0],
        "a new file": imgs / "c.cache",
        "a subfolder": imgs / "sub" / "c.cache",
        "through a symlinked folder": kit.root / "alias" / "c.cache",
    }[where]
    _refused(
        trtq,
        kit,
        ["calibrate", "--model", kit.model, "--data", imgs, "--preprocess", "unit", "-o", out],
        "is inside the data folder of input 'x'",
    )


def test_output_matched_by_an_input_glob(trtq, kit):
    (kit.root / "shards").mkdir()
    (kit.root / "shards" / "a.npy").write_bytes(kit.data.read_bytes())
    _refused(
        trtq,
        kit,
        [
            "calibrate",
            "--model",
            kit.model,
            "--data",
            kit.root / "shards" / "*.npy",
            "-o",
            kit.root / "shards" / "b.npy",
            "--save-stats",
            kit.root / "s2.npz",
        ],
        "which this command reads",
    )


def test_the_models_external_data_is_an_input(trtq, kit):
    import onnx

    ext = kit.root / "ext.onnx"
    onnx.save(onnx.load(str(kit.model)), str(ext), save_as_external_data=True, location="ext.weights", size_threshold=0)
    _refused(
        trtq,
        kit,
        ["quantize", "--model", ext, "--cache", kit.cache, "-o", kit.root / "ext.weights"],
        "external data of the model",
    )


def test_the_users_model_is_protected_under_a_shape_override(trtq, kit):
    """--override-input-shape runs a rewritten copy: the file the user named is still an input."""
    _refused(
        trtq,
        kit,
        [
            "quantize",
            "--model",
            kit.model,
            "--cache",
            kit.cache,
            "-o",
            kit.model,
            "--override-input-shape",
            "x=2x3x8x8",
        ],
        "is the model",
    )


@pytest.mark.parametrize("command", ["report", "merge-stats"])
def test_folder_and_fifo_outputs_of_report_and_merge_stats(trtq, kit, command):
    folder = kit.root / "outdir"
    folder.mkdir()
    fifo = kit.root / "fifo"
    os.mkfifo(fifo)
    base = (
        ["report", "--cache", kit.cache, "-o"]
        if command == "report"
        else ["merge-stats", *_two_shards(trtq, kit), "-o"]
    )
    _refused(trtq, kit, base + [folder], "is a folder")
    _refused(trtq, kit, base + [fifo], "FIFO")
