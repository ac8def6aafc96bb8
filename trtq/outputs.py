"""What a command reads and writes, declared once, and the one guard every command runs before it
writes anything.

Each CLI command builds one :class:`Declared` (docs/internals.md, "Inputs and outputs"): the files
it reads (the model and its external-data files, a cache and its provenance JSON, statistics, data
files and file lists), the folders and globs whose files it reads (an image folder, ``x/*.npy``),
and every file it writes, side files included (a cache's ``.json``, a plan's ``.json``, statistics,
kept batches, a timing cache, HTML). :func:`guard` refuses, before any work:

- an output that is an input or another output: the same file by any name (a ``..`` path, a
  symlink, a hard link), or a file inside an input folder or matched by an input glob (exit 2);
- an output that exists and is not a regular file: a folder, device, FIFO or socket (exit 2);
- an output whose folder trtq cannot write (exit 1).

Then it hands the outputs to :func:`trtq.fileio.declare_outputs`: while the CLI runs a command,
``fileio.atomic_path`` writes only declared paths, so a writer that skipped the declaration fails
(an internal error, nothing written) instead of overwriting what it was never checked against.
"""

import fnmatch
import glob
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trtq.errors import TrtqError, UsageError
from trtq.fileio import check_writable_target, declare_outputs


@dataclass(frozen=True)
class Declared:
    """What one command reads and writes; ``(what, path)`` pairs, ``what`` as the messages name it."""

    inputs: tuple[tuple[str, str], ...] = ()  # files it reads
    folders: tuple[tuple[str, str], ...] = ()  # folders whose files it reads (recursively), and globs
    models: tuple[tuple[str, str], ...] = ()  # ONNX models it reads: the file and its external data
    outputs: tuple[tuple[str, str], ...] = ()  # every file it writes, side files included

    @classmethod
    def of(
        cls,
        inputs: Iterable[tuple[str, Optional[object]]] = (),
        folders: Iterable[tuple[str, Optional[object]]] = (),
        models: Iterable[tuple[str, Optional[object]]] = (),
        outputs: Iterable[tuple[str, Optional[object]]] = (),
    ) -> "Declared":
        """Pairs whose path is None or empty are left out; paths become strings."""

        def keep(pairs):
            return tuple((what, str(p)) for what, p in pairs if p is not None and str(p))

        return cls(keep(inputs), keep(folders), keep(models), keep(outputs))

    def input_files(self) -> list[tuple[str, str]]:
        """The files read: ``inputs``, each model and the external-data files it names."""
        from trtq.model import external_data_files

        files = list(self.inputs)
        for what, model in self.models:
            files.append((what, model))
            files.extend((f"external data of the {what}", str(p)) for p in external_data_files(model))
        return files


def _identity(path: str) -> tuple:
    """What makes two paths the same file: (dev, inode) when it exists, else the resolved path."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", _resolved(path))


def _resolved(path: str) -> str:
    return os.path.normcase(os.path.realpath(os.path.expanduser(path)))


def _same(a: str, b: str) -> bool:
    ia, ib = _identity(a), _identity(b)
    if ia == ib:
        return True
    # one exists, the other not: compare resolved paths as well
    return _resolved(a) == _resolved(b)


def _inside(path: str, folder: str) -> bool:
    """``path`` is in ``folder`` or below it (resolved: through symlinks and ``..``), or ``folder``
    is a glob that ``path`` matches."""
    if glob.has_magic(folder):
        return fnmatch.fnmatch(_resolved(path), _resolved(folder)) or fnmatch.fnmatch(
            os.path.abspath(path), os.path.abspath(os.path.expanduser(folder))
        )
    top = _resolved(folder)
    if not os.path.isdir(top):
        return False
    parent = _resolved(os.path.dirname(os.path.abspath(path)) or ".")
    return parent == top or parent.startswith(top.rstrip(os.sep) + os.sep)


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


def guard(declared: Declared) -> None:
    """The one check every command runs before it writes anything (see the module docstring).

    UsageError (exit 2) for an output that is an input, inside an input folder, another output, or
    an existing non-regular file; TrtqError (exit 1) for a folder that cannot be written. Then the
    outputs are the only paths this command may write (:func:`trtq.fileio.declare_outputs`).
    """
    folders, outs = declared.folders, declared.outputs
    ins = declared.input_files() if outs else []  # a command that writes nothing needs no model scan
    for what, path in outs:
        check_writable_target(path)
        for in_what, in_path in ins:
            if _same(path, in_path):
                raise UsageError(
                    f"the {what} {path} is the {in_what} {in_path} (the same file); writing it would destroy the input",
                    "choose another output path",
                )
        for in_what, folder in folders:
            if _inside(path, folder):
                where = "matches" if glob.has_magic(folder) else "is inside"
                raise UsageError(
                    f"the {what} {path} {where} the {in_what} {folder}, which this command reads",
                    "write it to another folder",
                )
    for i, (what, path) in enumerate(outs):
        for other_what, other in outs[i + 1 :]:
            if _same(path, other):
                raise UsageError(
                    f"the {what} and the {other_what} are the same file: {path}", "give them different paths"
                )
    for what, path in outs:
        problem = _writable_folder(path)
        if problem:
            raise TrtqError(
                f"cannot write the {what} {path}: {problem}",
                "write to a folder you can write to (-o), or fix its permissions",
            )
    declare_outputs(path for _, path in outs)


def data_paths(inputs: Mapping) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(files, folders) that ``data.inputs`` reads: .npy files and their globs (a glob is a 'folder':
    an output it matches would be read next time), image folders, listed images and file lists
    (the images a .txt list names, relative to its folder, as trtq.data.sources reads them)."""
    files: list[tuple[str, str]] = []
    folders: list[tuple[str, str]] = []
    for name, src in inputs.items():
        what = f"data of input '{name}'"
        images = getattr(src, "images", None)
        if images:
            folders.append((f"data folder of input '{name}'", str(images)))
        for pattern in getattr(src, "npy", ()) or ():
            pattern = os.path.expanduser(str(pattern))
            if glob.has_magic(pattern):
                folders.append((f"data files of input '{name}'", pattern))
                files.extend((f"data file of input '{name}'", m) for m in sorted(glob.glob(pattern)))
            else:
                files.append((f"data file of input '{name}'", pattern))
        for entry in getattr(src, "files", ()) or ():
            files.append((f"{what}", str(entry)))
            if str(entry).lower().endswith(".txt"):
                files.extend((f"image listed in {entry}", p) for p in _listed(Path(entry)))
    return files, folders


def _listed(list_path: Path) -> list[str]:
    """The paths a .txt file list names (relative to its folder); [] when it cannot be read (the
    data layer reports that)."""
    if not list_path.is_file():  # missing, or a FIFO (reading would block): the data layer reports it
        return []
    try:
        lines = list_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        text = line.strip()
        if text and not text.startswith("#"):
            p = Path(os.path.expanduser(text))
            out.append(str(p if p.is_absolute() else list_path.parent / p))
    return out
