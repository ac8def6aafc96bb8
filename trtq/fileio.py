"""Atomic file output and hashing.

Every artefact trtq writes goes through here: the data is written to a temporary file in the
destination folder and moved into place with ``os.replace``, so readers (and Makefiles) never see
a partial file, and an interrupted run leaves the previous version untouched.
"""
import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_path(dest: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success move it onto ``dest``.

    On any exception (KeyboardInterrupt included) the temporary file is removed and ``dest``
    is left as it was.
    """
    dest = Path(dest)
    folder = dest.parent if str(dest.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 minus umask)
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(dest: PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
