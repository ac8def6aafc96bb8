"""Defects 2 and 6: outputs onto special files, folders, read-only folders and a full disk.

Every output-writing command (calibrate, calibrate --from-stats, quantize, build) is checked: the
run is refused or fails with one line, exit 2 (bad target) or 1 (cannot write), the previous
outputs are byte-identical and no temporary file is left.
"""

import os
import stat

import pytest

from tests.reliability.conftest import (
    fill_up,
    one_line_error,
    remount_read_only,
    run_child,
    temp_leftovers,
    tmpfs,
)
from trtq.errors import UsageError
from trtq.fileio import atomic_write_bytes


def commands(kit, out_dir):
    """(name, args, outputs) for every output-writing command, writing into out_dir."""
    return [
        (
            "calibrate",
            ["calibrate", "--model", kit.model, "--data", kit.data, "-o", out_dir / "c.cache", "--method", "max"],
            ["c.cache", "c.cache.json"],
        ),
        (
            "calibrate-save-stats",
            [
                "calibrate",
                "--model",
                kit.model,
                "--data",
                kit.data,
                "-o",
                out_dir / "c.cache",
                "--method",
                "max",
                "--save-stats",
                out_dir / "s.npz",
            ],
            ["c.cache", "s.npz"],
        ),
        (
            "from-stats",
            ["calibrate", "--from-stats", kit.stats, "-o", out_dir / "c.cache", "--method", "percentile"],
            ["c.cache", "c.cache.json"],
        ),
        ("quantize", ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", out_dir / "q.onnx"], ["q.onnx"]),
    ]


COMMANDS = ["calibrate", "calibrate-save-stats", "from-stats", "quantize"]


def _pick(kit, out_dir, name):
    return next(c for c in commands(kit, out_dir) if c[0] == name)


# ------------------------------------------------------------------------------------------------
# special files and folders as targets
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMMANDS)
def test_fifo_target_is_refused_and_kept(trtq, kit, name):
    out_dir = kit.root / "out"
    out_dir.mkdir()
    _, args, outputs = _pick(kit, out_dir, name)
    fifo = out_dir / outputs[-1]
    os.mkfifo(fifo)
    r = trtq(args)
    assert r.code == 2, r
    assert one_line_error(r) and "FIFO" in r.err and "not a regular file" in r.err, r.err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in out_dir.iterdir()) == [fifo.name]


def test_dev_null_target_stays_a_device(trtq, kit):
    for args in (
        ["quantize", "--model", kit.model, "--cache", kit.cache, "-o", "/dev/null"],
        ["calibrate", "--model", kit.model, "--data", kit.data, "-o", "/dev/null"],
    ):
        r = trtq(args)
        assert r.code == 2 and one_line_error(r) and "device node" in r.err, r
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not os.path.exists("/dev/null.json")


def test_build_target_checked_before_tensorrt(trtq, kit):
    fifo = kit.root / "e.plan"
    os.mkfifo(fifo)
    r = trtq(["build", "--model", kit.model, "--cache", kit.cache, "-o", fifo])
    assert r.code == 2 and one_line_error(r) and "FIFO" in r.err, r
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_provenance_path_that_is_a_folder(trtq, kit):
    """`-o c.cache` where `c.cache.json` is a folder: was an internal error after the whole run."""
    out = kit.root / "new.cache"
    (kit.root / "new.cache.json").mkdir()
    r = trtq(["calibrate", "--model", kit.model, "--data", kit.data, "-o", out])
    assert r.code == 2 and one_line_error(r) and "new.cache.json is a folder" in r.err, r
    assert not out.exists() and (kit.root / "new.cache.json").is_dir()


def test_output_below_a_file_is_refused(trtq, kit):
    r = trtq(["quantize", "--model", kit.model, "--cache", kit.cache, "-o", kit.model / "q.onnx"])
    assert r.code == 1 and one_line_error(r) and "is a file, not a folder" in r.err, r


def test_atomic_write_refuses_special_files(tmp_path):
    """The library guard under the CLI check: os.replace would swap a regular file in."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):
        atomic_write_bytes(fifo, b"x")
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError, match="folder"):
        atomic_write_bytes(tmp_path / "d", b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not temp_leftovers(tmp_path)


def test_atomic_write_errors_are_one_line(tmp_path):
    """OS errors of the write itself (the folder was fine when the command started)."""
    from trtq.errors import TrtqError

    folder = tmp_path / "fs"
    with tmpfs(folder, "64k"):
        (folder / "old").write_bytes(b"previous")
        fill_up(folder)
        with pytest.raises(TrtqError, match="cannot write .*old: No space left on device; free disk space"):
            atomic_write_bytes(folder / "old", b"new" * 10000)
        remount_read_only(folder)
        with pytest.raises(TrtqError, match="cannot write .*new: Read-only file system; write to a folder"):
            atomic_write_bytes(folder / "new", b"new")
        assert (folder / "old").read_bytes() == b"previous" and not temp_leftovers(folder)


def test_render_cache_never_writes_an_unusable_scale():
    from trtq.calib.cache import CalibrationTable, render_cache
    from trtq.errors import CacheError

    for amax in (0.0, 1e-40, 1e30):
        with pytest.raises(CacheError, match="scale would be"):
            render_cache(CalibrationTable("10.3.0", "MinMaxCalibration", {"t": amax}))


# ------------------------------------------------------------------------------------------------
# read-only folder
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMMANDS + ["build"])
def test_read_only_file_system(trtq, kit, tmp_path, name):
    out_dir = tmp_path / "ro"
    with tmpfs(out_dir, "1m"):
        if name == "build":
            args, outputs = ["build", "--model", kit.model, "--cache", kit.cache, "-o", out_dir / "e.plan"], []
        else:
            _, args, outputs = _pick(kit, out_dir, name)
        for o in outputs:
            (out_dir / o).write_bytes(b"previous " + o.encode())
        remount_read_only(out_dir)
        r = trtq(args)
        assert r.code == 1, r
        assert one_line_error(r) and "not writable (read-only file system)" in r.err, r.err
        for o in outputs:
            assert (out_dir / o).read_bytes() == b"previous " + o.encode()


def test_read_only_folder_by_permissions(kit, unprivileged):
    """chmod 555 (root needs its DAC capabilities dropped for this to mean anything)."""
    out_dir = kit.root / "locked"
    out_dir.mkdir()
    (out_dir / "q.onnx").write_bytes(b"previous")
    os.chmod(kit.root, 0o755)
    os.chmod(out_dir, 0o555)
    try:
        r = run_child(["quantize", "--model", kit.model, "--cache", kit.cache, "-o", out_dir / "q.onnx"], unprivileged)
    finally:
        os.chmod(out_dir, 0o755)
    assert r.code == 1 and one_line_error(r) and "is not writable" in r.err, r
    assert (out_dir / "q.onnx").read_bytes() == b"previous"


# ------------------------------------------------------------------------------------------------
# disk full
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMMANDS)
def test_disk_full_keeps_the_previous_outputs(trtq, kit, tmp_path, name):
    out_dir = tmp_path / "small"
    with tmpfs(out_dir, "128k"):
        _, args, outputs = _pick(kit, out_dir, name)
        r = trtq(args)  # a first run that fits
        assert r.code == 0, r
        before = {o: (out_dir / o).read_bytes() for o in outputs}
        fill_up(out_dir)
        if name == "quantize":
            args = args + ["--per-tensor"]  # another result, so a kept file is really the old one
        else:
            args = [a if a not in ("max", "percentile") else "mse" for a in args]
        r = trtq(args)
        assert r.code == 1, r
        assert one_line_error(r) and "No space left on device" in r.err and "free disk space" in r.err, r.err
        assert {o: (out_dir / o).read_bytes() for o in outputs} == before
        assert not temp_leftovers(out_dir)


def test_file_size_limit_in_a_child(kit, tmp_path):
    """Disk full without mount privileges: RLIMIT_FSIZE makes the write fail with EFBIG."""
    resource = pytest.importorskip("resource")
    import signal

    out = tmp_path / "q.onnx"
    out.write_bytes(b"previous")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    r = run_child(["quantize", "--model", kit.model, "--cache", kit.cache, "-o", out], preexec_fn=limit)
    assert r.code == 1 and one_line_error(r) and "File too large" in r.err, r
    assert out.read_bytes() == b"previous" and not temp_leftovers(tmp_path)
