"""Atomic file output and hashing.

Every artefact trtq writes goes through here: the data is written to a temporary file in the
destination folder and moved into place with ``os.replace``, so readers (and Makefiles) never see
a partial file, and an interrupted run leaves the previous version untouched.

Only regular files are ever replaced: a destination that is a folder, a device node, a FIFO or a
socket is refused (``os.replace`` would swap a regular file in for ``/dev/null``). An operating
system error while writing (disk full, read-only folder) becomes a one-line
:class:`~trtq.errors.TrtqError` naming the file. Temporary files in flight are registered, so a
second Ctrl-C (which exits at once) can still remove them (:func:`remove_pending_temp_files`).
"""

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Optional, Union

from trtq.errors import TrtqError, UsageError

PathLike = Union[str, "os.PathLike[str]"]

_pending: set[str] = set()
_pending_lock = threading.RLock()  # re-entrant: the signal handler runs on the thread that may hold it
# while the CLI runs a command: the outputs its guard declared (trtq.outputs.guard); None: no check
_declared: Optional[set[str]] = None


def _output_key(path: PathLike) -> str:
    return os.path.normcase(os.path.realpath(os.path.expanduser(str(path))))


@contextlib.contextmanager
def only_declared_outputs() -> Iterator[None]:
    """While the block runs (the CLI runs one command in it), :func:`atomic_path` writes only the
    paths given to :func:`declare_outputs` (by the command's guard, trtq.outputs.guard): a writer
    that no declaration names is refused before it creates anything."""
    global _declared
    previous, _declared = _declared, set()
    try:
        yield
    finally:
        _declared = previous


def declare_outputs(paths: Iterable[PathLike]) -> None:
    """Paths the running command may write (no effect outside :func:`only_declared_outputs`)."""
    if _declared is not None:
        _declared.update(_output_key(p) for p in paths)


def _check_declared(dest: PathLike) -> None:
    if _declared is not None and _output_key(dest) not in _declared:
        raise TrtqError(
            f"internal error: {dest} is not an output this command declared; nothing was written",
            "please report it (trtq.outputs: every file a command writes is declared and checked)",
        )


def non_regular_kind(path: PathLike) -> str:
    """'' when ``path`` does not exist or is a regular file (through symlinks), else what it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def require_input_file(path: Path, error: type, noun: str, missing_hint: str, file_hint: str) -> None:
    """``error`` (one line naming ``noun`` and ``path``) unless ``path`` is an existing regular file:
    missing (``missing_hint``), a folder or a device, FIFO or socket (``file_hint``)."""
    if not path.exists():
        raise error(f"{noun} not found: {path}", missing_hint)
    if path.is_dir():
        raise error(f"{noun} path is a folder, not a file: {path}", file_hint)
    if not path.is_file():
        raise error(f"{noun} {path} is not a regular file (a device, FIFO or socket)", file_hint)


def check_writable_target(dest: PathLike) -> None:
    """UsageError when ``dest`` exists and is not a regular file (it would be replaced)."""
    kind = non_regular_kind(dest)
    if kind:
        raise UsageError(
            f"output path {dest} is {kind}, not a regular file",
            "give an output file path (trtq only replaces regular files)",
        )


def write_error(dest: PathLike, err: OSError) -> TrtqError:
    """One-line error for an OS failure while writing ``dest`` (exit 1), with the fix."""
    reason = err.strerror or type(err).__name__
    code = err.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        hint = "free disk space (or raise the quota), or write to another folder with -o"
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "write to a folder you can write to (-o), or fix its permissions"
    elif code in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST):
        hint = "a path component is a file where a folder is needed (or the other way round); choose another -o"
    else:
        hint = "check the output folder and the disk"
    return TrtqError(f"cannot write {dest}: {reason}", hint)


@contextlib.contextmanager
def atomic_path(dest: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success move it onto ``dest``.

    On any exception (KeyboardInterrupt included) the temporary file is removed and ``dest``
    is left as it was. OSError while writing becomes a TrtqError naming ``dest``.
    """
    dest = Path(dest)
    _check_declared(dest)
    check_writable_target(dest)
    folder = dest.parent if str(dest.parent) else Path(".")
    # the name is registered before the file exists, so a signal at any point between creating it
    # and the try below still finds it in _pending (the CLI removes those when it unwinds)
    tmp_path = folder / f".{dest.name}.{secrets.token_hex(4)}.tmp"
    tmp = str(tmp_path)
    with _pending_lock:
        _pending.add(tmp)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:  # not created (O_EXCL: never someone else's file)
        _forget(tmp)
        raise write_error(dest, e) from None
    except BaseException:  # a signal: the file may exist already
        _discard_temp(tmp)
        raise
    # The name leaves _pending only once the file is gone (moved into place or removed): a second
    # exception raised inside the clean-up (a re-sent signal) leaves it for the CLI's backstop.
    try:
        yield tmp_path
        check_writable_target(dest)  # may have appeared while writing
        # created 0600 above; give the file the mode a plain open() would (0666 minus umask)
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, dest)
    except BaseException as e:
        _discard_temp(tmp)
        if isinstance(e, OSError):
            raise write_error(dest, e) from None
        raise
    _forget(tmp)


def _forget(tmp: str) -> None:
    with _pending_lock:
        _pending.discard(tmp)


def _discard_temp(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    _forget(tmp)


def remove_pending_temp_files() -> None:
    """Remove the temporary files of writes in progress (for an immediate exit). Never raises."""
    with _pending_lock:
        names = list(_pending)
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name)
        _forget(name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(dest: PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(dest: PathLike, text: str) -> None:
    atomic_write_bytes(dest, text.encode("utf-8"))


def sha256_file(path: PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
