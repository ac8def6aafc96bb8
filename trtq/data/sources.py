"""Where samples come from: image folders, image file lists and ``.npy`` shards.

A source knows how many samples it has and produces sample ``i`` (already preprocessed, shaped
like the model input without the batch dim, in the model input's dtype) on demand, from any
thread. Nothing is decoded when a source is built: folders are listed and ``.npy`` headers read.
"""

import bisect
import glob
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from trtq.config import InputSource, PreprocessOptions
from trtq.errors import ConfigError, DataError

if TYPE_CHECKING:  # PIL and the preprocessing are imported where images are read (not for .npy data)
    from PIL import Image
import contextlib

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
_EXIF_ORIENTATION = 0x0112
_SKIP_HINT = "remove it or pass --skip-bad"
_NO_PICKLE_HINT = "pickled/object .npy not supported; save with np.save(arr) of a numeric array"


class SampleError(DataError):
    """One sample cannot be used. ``skippable`` errors are recorded instead of raised with skip_bad."""

    def __init__(self, message: str, hint: Optional[str], path: str, reason: str, skippable: bool = True):
        super().__init__(message, hint)
        self.path = path
        self.reason = reason
        self.skippable = skippable


# ------------------------------------------------------------------------------------------------
# listing
# ------------------------------------------------------------------------------------------------


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def list_image_folder(
    folder: Path, skip_bad: bool = False, unreadable: Optional[list[tuple[str, str]]] = None
) -> list[str]:
    """Image files under ``folder`` (recursive), as POSIX paths relative to it, sorted.

    Extensions are matched case-insensitively; hidden files and hidden folders are ignored. A
    sub-folder that cannot be listed is an error naming it; with ``skip_bad`` it is skipped and
    ``(path, reason)`` appended to ``unreadable``.
    """
    folder = Path(folder)
    if not folder.exists():
        raise DataError(
            f"image folder not found: {folder}", "check the data path (data.inputs.<input>.images or --data)"
        )
    if not folder.is_dir():
        raise DataError(
            f"image folder is a file, not a folder: {folder}",
            "pass the folder that holds the images, or use files: for a file list",
        )
    found: list[str] = []
    errors: list[OSError] = []
    for root, dirs, files in os.walk(folder, onerror=errors.append):
        dirs[:] = [d for d in dirs if not _is_hidden(d)]
        rel_root = Path(root).relative_to(folder)
        for name in files:
            if not _is_hidden(name) and name.lower().endswith(IMAGE_EXTENSIONS):
                found.append((rel_root / name).as_posix())
    for e in errors:
        where = e.filename or str(folder)
        if not skip_bad:
            raise DataError(
                f"cannot read folder {where} (under the image folder {folder}): {e.strerror}",
                "fix its permissions, remove it, or pass --skip-bad to skip it",
            )
        log.warning("skipping folder %s: %s", where, e.strerror)
        if unreadable is not None:
            unreadable.append((f"{where}{os.sep}", f"folder not readable: {e.strerror}"))
    if not found:
        raise DataError(
            f"no images in folder {folder} (searched recursively for "
            f"{'/'.join(e[1:] for e in IMAGE_EXTENSIONS)}; hidden files are ignored)",
            "put images there or point to the folder that holds them",
        )
    found.sort()
    return found


def read_file_list(entries: Sequence[str], key: str) -> tuple[Path, list[str]]:
    """Resolve ``files:`` (image paths, or one ``.txt`` list) to (root folder, relative paths).

    A ``.txt`` list holds one path per line, relative to the list file's folder; blank lines and
    lines starting with ``#`` are ignored. Order is kept as written.
    """
    entries = [str(e) for e in entries]
    if not entries:
        raise DataError(f"{key} is empty", "list at least one image file")
    txt = [e for e in entries if e.lower().endswith(".txt")]
    if txt and len(entries) > 1:
        raise ConfigError(f"{key}: a .txt file list must be the only entry", "put all paths into the .txt file")
    if txt:
        list_path = Path(txt[0])
        if list_path.exists() and not list_path.is_file():
            raise DataError(f"file list {list_path} is not a regular file", f"check {key}")
        try:
            lines = list_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise DataError(f"file list not found: {list_path}", f"check {key}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(
                f"cannot read file list {list_path}: {e}", "save it as UTF-8 text, one path per line"
            ) from None
        root = list_path.parent
        paths: list[Path] = []
        for lineno, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            p = Path(os.path.expanduser(text))
            p = p if p.is_absolute() else root / p
            if not p.is_file():
                raise DataError(
                    f"{list_path}:{lineno}: listed image not found: {p}",
                    "fix the path (relative to the list file's folder) or remove the line",
                )
            paths.append(p)
        if not paths:
            raise DataError(f"file list {list_path} names no images", "write one image path per line")
    else:
        paths = [Path(e) for e in entries]
        for p in paths:
            if not p.is_file():
                raise DataError(f"listed image not found: {p}", f"fix or remove it in {key}")
        parents = [str(p.resolve().parent) for p in paths]
        root = Path(os.path.commonpath(parents))
    return root, [Path(os.path.relpath(p.resolve(), root.resolve())).as_posix() for p in paths]


def expand_npy(patterns: Sequence[str], key: str) -> list[Path]:
    """``.npy`` paths and globs -> files, in the order given, each glob's matches sorted."""
    out: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
            if not matches:
                raise DataError(f"{key}: the pattern {pattern} matches no files", "check the glob and the folder")
            out.extend(Path(m) for m in matches)
        else:
            p = Path(pattern)
            if not p.exists():
                raise DataError(f".npy file not found: {p}", f"check {key}")
            out.append(p)
    for p in out:
        if p.is_dir():
            raise DataError(f"{key}: {p} is a folder", "name the .npy files (a glob like folder/*.npy works)")
    return out


def npy_sample_shape(src: InputSource) -> Optional[tuple[int, ...]]:
    """The per-sample shape of the first .npy file of ``src`` (its shape without axis 0), or None
    when ``src`` is not .npy data or that file cannot be read (the source reports that later)."""
    if not src.npy:
        return None
    try:
        first = expand_npy(src.npy[:1], "npy")[0]
        return tuple(int(d) for d in np.load(first, mmap_mode="r", allow_pickle=False).shape[1:])
    except Exception:  # any failure is reported, with its fix, when the source opens the file
        return None


# ------------------------------------------------------------------------------------------------
# decoding
# ------------------------------------------------------------------------------------------------


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text or type(e).__name__


def decode_image(path: str) -> "Image.Image":
    """Fully decode ``path`` (truncation is detected) and apply its EXIF orientation."""
    from PIL import Image, ImageOps

    from trtq.fileio import non_regular_kind

    kind = non_regular_kind(path)
    if kind:  # opening a FIFO would wait for a writer forever
        raise SampleError(f"image path {path} is {kind}, not an image file", _SKIP_HINT, path, kind)
    try:
        with Image.open(path) as img:
            img.load()
            if img.mode == "I" and img.format == "PNG":
                img = img.convert("I;16")  # Pillow < 11 opens 16-bit gray PNGs as "I"
            orientation = img.getexif().get(_EXIF_ORIENTATION)
            if orientation in (2, 3, 4, 5, 6, 7, 8):
                img = ImageOps.exif_transpose(img)
            return img
    except FileNotFoundError:
        raise SampleError(
            f"image not found: {path}", "it was removed while reading; " + _SKIP_HINT, path, "not found"
        ) from None
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ... for bad files
        reason = _reason(e)
        raise SampleError(f"cannot decode image {path}: {reason}", _SKIP_HINT, path, reason) from None


# ------------------------------------------------------------------------------------------------
# sources
# ------------------------------------------------------------------------------------------------


def _target_dtype(name: str, dtype: str) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise DataError(
            f"model input {name} has dtype {dtype}, which trtq cannot feed", "export the model with a float32 input"
        ) from None


class ImageSource:
    """Images decoded with PIL and preprocessed into one sample each."""

    def __init__(
        self,
        input_name: str,
        kind: str,
        root: Path,
        rel_paths: list[str],
        preprocess: PreprocessOptions,
        sample_shape: tuple[int, ...],
        dtype: str,
        origin: str,
    ):
        self.input_name = input_name
        self.kind = kind  # "images" or "files"
        self.root = Path(root)
        self.rel_paths = rel_paths
        self.origin = origin
        self.unreadable: list[tuple[str, str]] = []  # sub-folders skipped while listing (skip_bad)
        self.sample_shape = tuple(sample_shape)
        self.dtype = _target_dtype(input_name, dtype)
        self.key = f"data.inputs.{input_name}.preprocess"
        from trtq.data.preprocess import Preprocessor

        self.preprocess = Preprocessor(preprocess, self.key)
        if self.preprocess.dtype != self.dtype and not np.can_cast(self.preprocess.dtype, self.dtype, "same_kind"):
            raise DataError(
                f"model input {input_name} takes {self.dtype} but image preprocessing makes {self.preprocess.dtype}",
                "feed this input from .npy files of that dtype",
            )

    def __len__(self) -> int:
        return len(self.rel_paths)

    def label(self, index: int) -> str:
        return str(self.root / self.rel_paths[index])

    def load(self, index: int) -> np.ndarray:
        path = self.label(index)
        img = decode_image(path)
        try:
            x = self.preprocess(img, f"image {path}")
        except SampleError:
            raise
        except DataError as e:
            raise SampleError(e.message, e.hint, path, e.message) from None
        if x.shape != self.sample_shape:
            raise SampleError(
                f"image {path} preprocesses to {_shape_str(x.shape)} but input {self.input_name} "
                f"expects {_shape_str(self.sample_shape)}",
                self._shape_hint(x.shape),
                path,
                "wrong shape",
                skippable=False,
            )
        return x if x.dtype == self.dtype else x.astype(self.dtype)

    def _shape_hint(self, got: tuple[int, ...]) -> str:
        want = self.sample_shape
        opts = self.preprocess.options
        if len(want) != 3:
            return f"images make 3-D samples (CHW or HWC); feed input {self.input_name} from .npy files"
        if sorted(got) == sorted(want):
            other = "nhwc" if opts.layout == "nchw" else "nchw"
            return f"set {self.key}.layout: {other}"
        chan = 0 if opts.layout == "nchw" else 2
        hw = (want[1], want[2]) if chan == 0 else (want[0], want[1])
        if want[chan] != got[chan] and want[chan] in (1, 3):
            return f"set {self.key}.color: {'gray' if want[chan] == 1 else 'rgb'} (gray = 1 channel, rgb/bgr = 3)"
        if want[chan] != got[chan]:
            other = "nhwc" if opts.layout == "nchw" else "nchw"
            return f"check {self.key}.layout (now {opts.layout}; the model may want {other})"
        return f"set {self.key}.center_crop or {self.key}.resize to produce {hw[0]}x{hw[1]} (h x w)"

    def identity(self) -> list[Any]:
        """Per-sample identity for fingerprints: relative path and file size (no decoding)."""
        out: list[Any] = []
        for rel in self.rel_paths:
            try:
                size = os.stat(self.root / rel).st_size
            except OSError:
                size = -1
            out.append([rel, size])
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.origin,
            "samples": len(self),
            "preprocess": asdict(self.preprocess.options),
        }


def _shape_str(shape: Sequence[int]) -> str:
    from trtq.model import format_shape

    return format_shape(shape)


class NpySource:
    """Samples along axis 0 of memory-mapped ``.npy`` files, in file order."""

    _OPEN_FILES = 8  # memory maps kept open at once (each holds a file descriptor)

    def __init__(self, input_name: str, files: list[Path], sample_shape: tuple[int, ...], dtype: str, key: str):
        self.input_name = input_name
        self.kind = "npy"
        self.files = [Path(f) for f in files]
        self.sample_shape = tuple(sample_shape)
        self.dtype = _target_dtype(input_name, dtype)
        self.key = key
        self.headers: list[tuple[tuple[int, ...], np.dtype]] = [self._check(f) for f in self.files]
        self._ends = np.cumsum([shape[0] for shape, _ in self.headers]).tolist()
        if not self._ends or self._ends[-1] == 0:
            raise DataError(f"{key}: the .npy files hold no samples", "save arrays with at least one row")
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()

    def _open(self, path: Path) -> np.ndarray:
        from trtq.fileio import non_regular_kind

        kind = non_regular_kind(path)
        if kind:
            raise DataError(f"{path} is {kind}, not an .npy file", "name regular .npy files")
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            if magic.startswith(b"PK"):
                raise DataError(f"{path} is an .npz archive, not an .npy file", "save each array with np.save")
            if magic[:1] == b"\x80":
                raise DataError(f"{path} is a pickle file", _NO_PICKLE_HINT)
            raise DataError(f"{path} is not an .npy file", "save arrays with np.save")
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            text = str(e).lower()
            if "object" in text or "pickle" in text:
                raise DataError(f"{path} holds Python objects", _NO_PICKLE_HINT) from None
            raise DataError(f"corrupt or truncated .npy file {path}: {_reason(e)}", "re-save it with np.save") from None
        except (OSError, EOFError, SyntaxError, TypeError) as e:
            raise DataError(f"corrupt or truncated .npy file {path}: {_reason(e)}", "re-save it with np.save") from None
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as e:  # numpy parses the header with Python's tokenizer: TokenError, RecursionError, ...
            raise DataError(
                f"corrupt .npy header in {path}: {type(e).__name__}: {_reason(e)}", "re-save it with np.save"
            ) from None

    def _check(self, path: Path) -> tuple[tuple[int, ...], np.dtype]:
        arr = self._open(path)
        shape, dt = tuple(arr.shape), arr.dtype
        if dt.kind == "O" or dt.hasobject:
            raise DataError(f"{path} holds Python objects", _NO_PICKLE_HINT)
        if dt.kind not in "biufc" or dt.names is not None:
            raise DataError(
                f"{path} has dtype {dt}, which is not numeric", f"save a numeric array castable to {self.dtype}"
            )
        if not np.can_cast(dt, self.dtype, "same_kind"):
            raise DataError(
                f"{path} has dtype {dt}, which cannot be cast to {self.dtype} (the dtype of input {self.input_name})",
                f"save it as {self.dtype}",
            )
        if len(shape) == 0 or shape[1:] != self.sample_shape:
            found = "a scalar" if not shape else f"samples of shape {_shape_str(shape[1:])} (array {_shape_str(shape)})"
            if shape == self.sample_shape:
                hint = "it looks like a single sample: save it with a leading sample axis (arr[None])"
            else:
                hint = f"axis 0 is the sample axis: save an array of shape [N, {_shape_str(self.sample_shape)[1:]}"
            raise DataError(
                f"{path} holds {found} but input {self.input_name} expects samples of shape "
                f"{_shape_str(self.sample_shape)}",
                hint,
            )
        del arr
        if dt.kind in "biu" and self.dtype.kind == "f":
            log.warning(
                "%s holds %s data: cast to %s for input %s as they are (no scaling; divide by 255 "
                "first if the model expects 0..1)",
                path,
                dt,
                self.dtype,
                self.input_name,
            )
        return shape, dt

    def __len__(self) -> int:
        return int(self._ends[-1])

    def _locate(self, index: int) -> tuple[int, int]:
        f = bisect.bisect_right(self._ends, index)
        start = self._ends[f - 1] if f else 0
        return f, index - start

    def label(self, index: int) -> str:
        f, row = self._locate(index)
        return f"{self.files[f]}[{row}]"

    def _cached(self, f: int) -> Optional[np.ndarray]:
        with self._lock:
            arr = self._maps.get(f)
            if arr is not None:
                self._maps.move_to_end(f)
            return arr

    def _map(self, f: int) -> np.ndarray:
        arr = self._cached(f)
        if arr is not None:
            return arr
        # one opener at a time: decode workers that all ask for a new file at once map it once (a CI
        # run once saw np.load raise SystemError in one of three threads opening the same file)
        with self._open_lock:
            arr = self._cached(f)
            if arr is None:
                arr = self._open(self.files[f])
                with self._lock:
                    self._maps[f] = arr
                    while len(self._maps) > self._OPEN_FILES:
                        self._maps.popitem(last=False)
        return arr

    def load(self, index: int) -> np.ndarray:
        f, row = self._locate(index)
        path = self.files[f]
        try:
            arr = self._map(f)
            x = np.array(arr[row], dtype=self.dtype)
        except (OSError, ValueError) as e:  # the file changed or became unreadable while reading
            raise SampleError(
                f"cannot read sample {row} of {path}: {_reason(e)}", "re-save it with np.save", str(path), _reason(e)
            ) from None
        _release_row(arr, row)
        if x.dtype.kind in "fc" and not np.isfinite(x).all():
            raise SampleError(
                f"{path} sample {row} has NaN or Inf values",
                "fix or remove that sample, or pass --skip-bad",
                f"{path}[{row}]",
                "NaN/Inf values",
            )
        return x

    def identity(self) -> list[Any]:
        return [[p.name, list(shape), str(dt)] for p, (shape, dt) in zip(self.files, self.headers)]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "npy",
            "files": [str(p) for p in self.files],
            "samples": len(self),
            "arrays": [{"shape": list(s), "dtype": str(d)} for s, d in self.headers],
        }

    def close(self) -> None:
        with self._lock:
            self._maps.clear()


_RELEASE_MARGIN = 2 << 20  # bytes either side of a row: one PMD-sized folio


def _release_row(arr: np.ndarray, row: int) -> None:
    """Drop the mapped pages of ``arr[row]`` from this process (they stay in the page cache).

    Without this, every page read through a memory map counts in the process's RSS until the map
    is closed, so RSS would grow with the size of a big ``.npy`` file. Best effort.
    """
    mm = getattr(arr, "base", None)
    if not isinstance(mm, mmap.mmap) or not hasattr(mm, "madvise") or not arr.flags.c_contiguous:
        return
    row_bytes = arr.strides[0] if arr.ndim else 0
    if row_bytes <= 0:
        return
    start_in_map = getattr(arr, "offset", 0) % mmap.ALLOCATIONGRANULARITY  # numpy maps from an aligned offset
    begin = start_in_map + row * row_bytes
    end = begin + row_bytes
    # the kernel maps more than the row it faults in (fault-around, large page-cache folios), so
    # pages next to the row, already released ones included, can be mapped again: drop a margin
    begin = max(0, begin - _RELEASE_MARGIN)
    end = min(len(mm), end + _RELEASE_MARGIN)
    page = mmap.PAGESIZE
    begin -= begin % page
    end = min(len(mm), -(-end // page) * page)
    if end > begin:
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED, begin, end - begin)


def make_source(input_name: str, src: InputSource, sample_shape: tuple[int, ...], dtype: str, skip_bad: bool = False):
    """Build the source for one model input from its config. ``skip_bad``: unreadable sub-folders
    of an image folder are skipped (listed in the source's ``unreadable``) instead of refused."""
    key = f"data.inputs.{input_name}"
    given = [k for k, v in (("images", src.images), ("files", src.files), ("npy", src.npy)) if v]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise ConfigError(
            f"{key} must set exactly one of images, files, npy (it sets {what})", "keep one data source per input"
        )
    if src.npy:
        if src.preprocess != PreprocessOptions():
            log.warning("%s.preprocess is ignored for .npy data (arrays are fed as they are)", key)
        return NpySource(input_name, expand_npy(src.npy, f"{key}.npy"), sample_shape, dtype, f"{key}.npy")
    if src.images:
        folder = Path(src.images)
        unreadable: list[tuple[str, str]] = []
        source = ImageSource(
            input_name,
            "images",
            folder,
            list_image_folder(folder, skip_bad, unreadable),
            src.preprocess,
            sample_shape,
            dtype,
            str(folder),
        )
        source.unreadable = unreadable
        return source
    root, rel = read_file_list(src.files, f"{key}.files")
    origin = src.files[0] if len(src.files) == 1 else f"{len(src.files)} files under {root}"
    return ImageSource(input_name, "files", root, rel, src.preprocess, sample_shape, dtype, str(origin))
