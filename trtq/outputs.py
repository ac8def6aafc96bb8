"""Checks on a command's output paths before any work starts.

A command's outputs must not be one of its inputs (the same file by any name: symlinks and hard
links included), must not collide with each other, must be regular files (or not exist yet), and
must go into a folder trtq can write to. Everything is checked up front, so a refused run writes
nothing and a long calibration does not die at its last step.
"""
import glob
import os
from pathlib import Path
from typing import Optional
from collections.abc import Iterable, Mapping, Sequence

from trtq.errors import TrtqError, UsageError
from trtq.fileio import check_writable_target

Labelled = Sequence[tuple[str, Optional[str]]]  # (what, path) pairs; None paths are skipped


def _identity(path: str) -> tuple:
    """What makes two paths the same file: (dev, inode) when it exists, else the resolved path."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.normcase(os.path.realpath(path)))


def _same(a: str, b: str) -> bool:
    ia, ib = _identity(a), _identity(b)
    if ia == ib:
        return True
    # one exists, the other not: compare resolved paths as well
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _writable_folder(path: str) -> Optional[str]:
    """None when the folder of ``path`` exists (or can be created) and is writable, else why not."""
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"folder {probe} is not writable" + (" (read-only file system)" if _read_only_fs(probe) else "")
    return None


def _read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_outputs(inputs: Labelled, outputs: Labelled) -> None:
    """Refuse outputs that are inputs, duplicates, non-regular files or in unwritable folders.

    UsageError (exit 2) for same-file and non-regular targets; TrtqError (exit 1) for a folder
    that cannot be written.
    """
    ins = [(what, str(p)) for what, p in inputs if p]
    outs = [(what, str(p)) for what, p in outputs if p]
    for what, path in outs:
        check_writable_target(path)
        for in_what, in_path in ins:
            if _same(path, in_path):
                raise UsageError(
                    f"the {what} {path} is the {in_what} {in_path} (the same file); writing it would destroy the input",
                    "choose another output path",
                )
    for i, (what, path) in enumerate(outs):
        for other_what, other in outs[i + 1:]:
            if _same(path, other):
                raise UsageError(f"the {what} and the {other_what} are the same file: {path}",
                                 "give them different paths")
    for what, path in outs:
        problem = _writable_folder(path)
        if problem:
            raise TrtqError(f"cannot write the {what} {path}: {problem}",
                            "write to a folder you can write to (-o), or fix its permissions")


def data_files(inputs: Mapping) -> list[tuple[str, str]]:
    """(what, path) for the files named by ``data.inputs`` (npy files and globs, file lists)."""
    out: list[tuple[str, str]] = []
    for name, src in inputs.items():
        for pattern in getattr(src, "npy", ()) or ():
            matches = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
            out.extend((f"data file of input '{name}'", m) for m in matches)
        for entry in getattr(src, "files", ()) or ():
            out.append((f"data file of input '{name}'", str(entry)))
    return out


def existing(paths: Iterable[tuple[str, Optional[str]]]) -> Labelled:
    return [(w, p) for w, p in paths if p]
