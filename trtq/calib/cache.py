"""TensorRT calibration cache (``calibration.cache``): read, write, headers, provenance.

Format (what TensorRT's calibrators write and read back)::

    TRT-<version code>-<Algorithm>
    <tensor name>: <scale as big-endian IEEE-754 float32, hex>

* ``scale = amax / 127`` (symmetric int8); ``amax 1.0`` -> ``3c010204``.
* Version code: 8.x/9.x ``major*1000 + minor*100 + patch`` (8.6.0 -> ``8600``); 10.x and later
  ``major*10000 + minor*100 + patch`` (10.3.0 -> ``100300``). TensorRT rejects a cache whose header
  does not match its calibrator and, by reports, one of another major version, so the amax values
  are kept neutral and the header is rendered for the TensorRT that will read the file.
* Names are ONNX value names and may contain ``:`` and spaces: an entry is split on its LAST
  ``": "``.
* Every line ends with ``\\n``, the last one included. Caches written by TensorRT 8.4, 10.3, 10.9
  and 10.13 (checked in public repositories) all end with a newline after the last entry; this
  module writes the same. TensorRT prints the scale with ``std::hex`` and no padding, so a zero
  scale appears as ``0``; this module writes 8 digits always and reads 1 to 8.
* Real TensorRT caches can hold ``7f800000`` (+inf) for tensors it could not range (e.g. the
  output of ``Log`` of zeros). Such a file is refused by default (nothing can be quantized from
  an infinite scale); ``read_cache(..., allow_nonfinite=True)`` keeps it for inspection.
* Every scale read for use must be usable (:func:`scale_problem`): 8 hex digits, finite, a normal
  float32 between ``MIN_SCALE`` and ``MAX_SCALE``. A zero, denormal or huge scale quantizes a
  tensor to a constant (every input gives the same output), so such a cache is refused naming
  the tensor; inspection keeps it and lists the entry as unusable.

ONNX Runtime's ``write_calibration_table`` also writes a text file named ``calibration.cache`` in
another format: no header, one ``<name> <decimal amax>`` per line, names sorted (it writes
``calibration.json`` and ``calibration.flatbuffers`` beside it). :func:`read_cache` reads that text
form too (``source_format="onnxruntime"``, no version, algorithm ``"unknown"``).
"""

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from trtq.errors import CacheError, ConfigError
from trtq.fileio import atomic_write_bytes, atomic_write_text, require_input_file

INT8_MAX = 127

# the range of scales a cache may hold for use: trtq floors amax at 1e-8 (scale 7.9e-11) for
# tensors that were always zero; above 1e8 (amax 1.3e10) no float32 activation is plausible
MIN_SCALE = 1e-11
MAX_SCALE = 1e8
_FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32

ALGORITHMS = ("EntropyCalibration2", "EntropyCalibration", "MinMaxCalibration", "LegacyCalibration")
UNKNOWN_ALGORITHM = "unknown"  # tables read from ONNX Runtime's format record no algorithm
# the algorithm each method's cache is written under: trtq.calib.methods (its registry's
# ``algorithm``)

# TensorRT 10.16 is the newest release with calibrators (TensorRT 11 removed implicit
# quantization and IInt8Calibrator), so it is the newest that reads a calibration cache at all.
DEFAULT_TRT_VERSION = "10.16.0"

# major.minor[.patch[.build]], optionally a pip suffix (.post1, rc2, ...) and a local label (+cuda12)
_VERSION_RE = re.compile(
    r"^\s*(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?(?:\.\d+)?(?:[.-]?(?:post|dev|rc|a|b)\d*)?(?:\+[0-9a-z.]+)?\s*$",
    re.IGNORECASE | re.ASCII,  # \d: the digits 0-9 only (int() would read other scripts' digits)
)
_HEADER_RE = re.compile(r"^TRT-(\d+)-(\S+)$", re.ASCII)
_HEX_RE = re.compile(r"^[0-9a-fA-F]{1,8}$")
_DECIMAL_RE = re.compile(r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|nan)$", re.IGNORECASE | re.ASCII)
_TRT_ENTRY_RE = re.compile(r"^.+: [0-9a-fA-F]{1,8}$")


# --------------------------------------------------------------------------------------------
# versions
# --------------------------------------------------------------------------------------------


def parse_trt_version(text: str) -> tuple[int, int, int]:
    """``"8.6.1"`` / ``"10.3"`` / ``"11.4.0"`` / ``"10.13.3.9"`` -> ``(major, minor, patch)``.

    A fourth (build) component, pip suffixes such as ``.post1`` and local labels (``+cuda12``)
    are ignored. ConfigError when
    the text is not a version or cannot be written as a cache version code.
    """
    m = _VERSION_RE.match(str(text)) if text is not None else None
    if not m:
        raise ConfigError(f"not a TensorRT version: {text!r}", "give major.minor[.patch], e.g. --trt-version 10.3.0")
    major, minor, patch = (int(g) if g is not None else 0 for g in m.groups())
    if major < 1 or major > 99:
        raise ConfigError(f"not a TensorRT version: {text!r} (major {major})", "e.g. --trt-version 8.6.1")
    if patch > 99 or (major < 10 and minor > 9) or minor > 99:
        raise ConfigError(
            f"TensorRT version {text!r} cannot be written as a cache version code",
            "minor must be 0-9 before TensorRT 10 and 0-99 after; patch 0-99",
        )
    return major, minor, patch


def version_code(version: str) -> str:
    """Cache header code: ``"8.6.0"`` -> ``"8600"``, ``"10.3.0"`` -> ``"100300"``."""
    major, minor, patch = parse_trt_version(version)
    if major < 10:
        return str(major * 1000 + minor * 100 + patch)
    return str(major * 10000 + minor * 100 + patch)


def decode_version_code(code: str) -> str:
    """``"8600"`` -> ``"8.6.0"``, ``"100300"`` -> ``"10.3.0"`` (ValueError when not a code)."""
    text = str(code)
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise ValueError(f"not a TensorRT version code: {code!r}")
    n = int(text)
    if 1000 <= n < 10000:
        return f"{n // 1000}.{(n // 100) % 10}.{n % 100}"
    if 100000 <= n < 1000000:
        return f"{n // 10000}.{(n // 100) % 100}.{n % 100}"
    raise ValueError(f"not a TensorRT version code: {code!r}")


def installed_trt_version() -> Optional[str]:
    """Version of the installed ``tensorrt`` Python package as ``"M.m.p"``, or None. Never raises.

    Reads package metadata (or, for installs without it, the ``__version__`` line of the
    package's ``__init__.py``) so that TensorRT and CUDA are not loaded just to learn a version.
    """
    try:
        return _installed_trt_version()
    except Exception:  # a broken install must not break calibrate or inspect-cache
        return None


def resolve_trt_version(requested: Optional[str]) -> str:
    """The TensorRT version a cache is written for: ``requested``, else the installed one, else
    :data:`DEFAULT_TRT_VERSION` (ConfigError on garbage)."""
    version = requested or installed_trt_version() or DEFAULT_TRT_VERSION
    parse_trt_version(version)  # raises ConfigError on garbage
    return version


def _installed_trt_version() -> Optional[str]:
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.find_spec("tensorrt")
    if spec is None:
        return None
    raw: Optional[str] = None
    for dist in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11", "tensorrt_lean", "tensorrt_dispatch"):
        try:
            raw = md.version(dist)
            break
        except md.PackageNotFoundError:
            continue
    if raw is None and spec.origin and spec.origin.endswith(".py"):
        text = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        raw = m.group(1) if m else None
    if raw is None:
        return None
    major, minor, patch = parse_trt_version(raw)
    return f"{major}.{minor}.{patch}"


def header_line(trt_version: str, algorithm: str) -> str:
    """``TRT-<code>-<Algorithm>`` (no newline)."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown calibration algorithm '{algorithm}'", "known: " + ", ".join(ALGORITHMS))
    return f"TRT-{version_code(trt_version)}-{algorithm}"


# --------------------------------------------------------------------------------------------
# scales
# --------------------------------------------------------------------------------------------


def scale_of(amax: float) -> float:
    """``amax / 127`` rounded to float32 (the value a cache stores)."""
    try:
        return struct.unpack(">f", struct.pack(">f", float(amax) / INT8_MAX))[0]
    except OverflowError:
        raise CacheError(f"amax {amax!r} is too large for a float32 scale") from None


def scale_hex(amax: float) -> str:
    """The 8 lowercase hex digits a cache stores for ``amax``: ``1.0`` -> ``"3c010204"``."""
    try:
        return struct.pack(">f", float(amax) / INT8_MAX).hex()
    except OverflowError:
        raise CacheError(f"amax {amax!r} is too large for a float32 scale") from None


def hex_to_scale(text: str) -> float:
    """Parse 1 to 8 hex digits (TensorRT drops leading zeros) as a big-endian float32."""
    if not _HEX_RE.match(text):
        raise ValueError(f"not a hex float32: {text!r}")
    return struct.unpack(">f", bytes.fromhex(text.zfill(8)))[0]


def scale_problem(scale: float) -> Optional[str]:
    """None when ``scale`` can quantize a tensor, else what is wrong with it (for messages)."""
    if math.isnan(scale) or math.isinf(scale):
        return f"{scale} (not finite)"
    if scale < 0:
        return f"{scale!r} (negative)"
    if scale == 0:
        return "0 (every value would quantize to 0)"
    if scale < _FLOAT32_TINY:
        return f"{scale!r} (a denormal float32: every value would quantize to the same level)"
    if scale < MIN_SCALE:
        return f"{scale!r} (below {MIN_SCALE:g}: implausibly small)"
    if scale > MAX_SCALE:
        return f"{scale!r} (above {MAX_SCALE:g}: every value would quantize to 0)"
    return None


# --------------------------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------------------------


@dataclass
class CalibrationTable:
    """amax per tensor (ordered as in the file or as the caller gave them) plus the header."""

    trt_version: Optional[str]
    algorithm: str
    amax: dict[str, float] = field(default_factory=dict)
    source_format: str = "tensorrt"

    @property
    def scales(self) -> dict[str, float]:
        """``amax / 127`` rounded to float32, per tensor."""
        return {name: scale_of(a) for name, a in self.amax.items()}


def render_cache(table: CalibrationTable, trt_version: Optional[str] = None) -> bytes:
    """Bytes of a TensorRT cache for ``table`` with the header for ``trt_version`` (default: the
    table's version, else DEFAULT_TRT_VERSION). Entries keep the table's order."""
    version = trt_version or table.trt_version or DEFAULT_TRT_VERSION
    lines = [header_line(version, table.algorithm)]
    for name, amax in table.amax.items():
        if not isinstance(name, str) or not name:
            raise CacheError(f"cannot write an empty tensor name to a calibration cache: {name!r}")
        if "\n" in name or "\r" in name:
            raise CacheError(f"tensor name {name!r} contains a line break and cannot be written to a calibration cache")
        a = float(amax)
        if not math.isfinite(a) or a < 0:
            raise CacheError(
                f"amax of tensor '{name}' is {a!r}; a calibration cache needs a finite value >= 0",
                "check the statistics of that tensor",
            )
        problem = scale_problem(scale_of(a))
        if problem:
            raise CacheError(
                f"amax of tensor '{name}' is {a!r}: its scale would be {problem}", "check the statistics of that tensor"
            )
        lines.append(f"{name}: {scale_hex(a)}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_cache(path: Union[str, Path], table: CalibrationTable, trt_version: Optional[str] = None) -> None:
    """Write :func:`render_cache` output atomically."""
    atomic_write_bytes(path, render_cache(table, trt_version))


def _bad(path: Path, lineno: int, what: str, hint: str) -> CacheError:
    return CacheError(f"{path} line {lineno}: {what}", hint)


_TRT_HINT = "each line after the header must be '<tensor name>: <hex scale>'; re-create the cache with trtq calibrate"
_ORT_HINT = "each line of an ONNX Runtime table must be '<tensor name> <decimal amax>'"


def read_cache(path: Union[str, Path], allow_nonfinite: bool = False) -> CalibrationTable:
    """Read a TensorRT cache, or ONNX Runtime's text calibration table. CacheError on any problem,
    naming the file and line. ``allow_nonfinite`` keeps Inf/NaN scales (for inspection only)."""
    path = Path(path)
    require_input_file(
        path,
        CacheError,
        "calibration cache",
        "check the path, or create it with trtq calibrate",
        "pass the calibration.cache file",
    )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CacheError(
            f"cannot read calibration cache {path}: {e.strerror}", "check its permissions (trtq needs to read it)"
        ) from None
    if not data.strip():
        raise CacheError(f"calibration cache {path} is empty", "re-create it with trtq calibrate")
    binary_hint = (
        "pass the text calibration.cache; an engine (.plan), ONNX model or ONNX Runtime "
        "calibration.flatbuffers is not a cache"
    )
    if b"\x00" in data:
        raise CacheError(
            f"{path} is binary data, not a calibration cache (NUL byte at offset {data.index(0)})", binary_hint
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CacheError(
            f"{path} is binary data, not a calibration cache (not UTF-8 at offset {e.start})", binary_hint
        ) from None
    lines = text.split("\n")
    ends_with_newline = lines[-1] == ""
    if ends_with_newline:
        lines.pop()
    numbered = [(i + 1, ln[:-1] if ln.endswith("\r") else ln) for i, ln in enumerate(lines)]
    numbered = [(n, ln) for n, ln in numbered if ln.strip()]
    if not numbered:  # only (Unicode) whitespace, e.g. form feeds or \x1c separators
        raise CacheError(f"calibration cache {path} is empty (whitespace only)", "re-create it with trtq calibrate")
    first_no, first = numbered[0]
    if first.startswith("TRT-"):
        return _read_trt(path, first_no, first, numbered[1:], ends_with_newline, allow_nonfinite)
    if _TRT_ENTRY_RE.match(first):
        raise _bad(
            path,
            first_no,
            "missing header line 'TRT-<version>-<Algorithm>'",
            "a TensorRT cache starts with a header such as TRT-8600-EntropyCalibration2; "
            "add it or re-create the cache with trtq calibrate",
        )
    return _read_ort(path, numbered, allow_nonfinite)


def _check_value(path: Path, n: int, name: str, value: float, what: str, allow_nonfinite: bool, hint: str) -> None:
    if math.isnan(value) or math.isinf(value):
        if not allow_nonfinite:
            raise _bad(
                path,
                n,
                f"{what} of tensor '{name}' is {value} (not finite)",
                "TensorRT writes this for tensors it could not range; remove that line or re-calibrate",
            )
    elif value < 0:
        raise _bad(path, n, f"{what} of tensor '{name}' is negative ({value!r})", hint)
    elif not allow_nonfinite:
        problem = scale_problem(value / INT8_MAX if what == "amax" else value)
        if problem:
            raise _bad(
                path,
                n,
                f"scale of tensor '{name}' is {problem}",
                "re-calibrate, or remove that line (its consumers then stay float)",
            )


def _read_trt(
    path: Path, header_no: int, header: str, entries, ends_with_newline: bool, allow_nonfinite: bool
) -> CalibrationTable:
    m = _HEADER_RE.match(header.strip())
    if not m:
        raise _bad(
            path,
            header_no,
            f"malformed header {header[:60]!r}",
            "expected TRT-<version code>-<Algorithm>, e.g. TRT-8600-EntropyCalibration2",
        )
    code, algorithm = m.groups()
    if algorithm not in ALGORITHMS:
        raise _bad(
            path,
            header_no,
            f"unknown calibration algorithm '{algorithm}' in header",
            "known algorithms: " + ", ".join(ALGORITHMS),
        )
    try:
        version: Optional[str] = decode_version_code(code)
    except ValueError:
        raise _bad(
            path,
            header_no,
            f"unknown TensorRT version code '{code}' in header",
            "expected e.g. 8600 (TensorRT 8.6.0) or 100300 (TensorRT 10.3.0)",
        ) from None
    amax: dict[str, float] = {}
    seen_at: dict[str, int] = {}
    for k, (n, line) in enumerate(entries):
        is_last = k == len(entries) - 1
        if ": " not in line:
            what = "truncated entry" if is_last and not ends_with_newline else "malformed entry"
            raise _bad(path, n, f"{what} {line[:80]!r}", _TRT_HINT)
        name, hx = line.rsplit(": ", 1)
        hx = hx.strip()
        if not name:
            raise _bad(path, n, "empty tensor name", _TRT_HINT)
        if not _HEX_RE.match(hx):
            raise _bad(path, n, f"bad hex scale {hx[:20]!r} for tensor '{name}'", _TRT_HINT)
        if is_last and not ends_with_newline and len(hx) < 8:
            raise _bad(path, n, f"truncated entry {line[:80]!r} (file ends mid-line)", "re-create the cache")
        if len(hx) != 8 and not allow_nonfinite:
            raise _bad(
                path,
                n,
                f"scale {hx!r} of tensor '{name}' is not 8 hex digits (a usable scale always is)",
                "re-calibrate, or remove that line (its consumers then stay float)",
            )
        _note_entry(path, n, name, seen_at)
        scale = hex_to_scale(hx)
        _check_value(path, n, name, scale, "scale", allow_nonfinite, _TRT_HINT)
        amax[name] = scale * INT8_MAX
    if not amax:
        raise _bad(path, header_no, "the cache has a header but no entries", "re-create it with trtq calibrate")
    return CalibrationTable(trt_version=version, algorithm=algorithm, amax=amax, source_format="tensorrt")


def _note_entry(path: Path, n: int, name: str, seen_at: dict[str, int]) -> None:
    """Remember that ``name`` is on line ``n``; CacheError when an earlier line has it already."""
    if name in seen_at:
        raise _bad(path, n, f"duplicate tensor '{name}' (first on line {seen_at[name]})", "keep one entry per tensor")
    seen_at[name] = n


def _read_ort(path: Path, entries, allow_nonfinite: bool) -> CalibrationTable:
    amax: dict[str, float] = {}
    seen_at: dict[str, int] = {}
    for n, line in entries:
        parts = line.rstrip().rsplit(" ", 1)
        if len(parts) != 2 or not parts[0] or not _DECIMAL_RE.match(parts[1]):
            if n == entries[0][0]:
                raise CacheError(
                    f"{path} is not a calibration cache (line {n}: {line[:60]!r})",
                    "expected a TensorRT cache (TRT-<version>-<Algorithm> header) or an ONNX Runtime "
                    "calibration table ('<name> <amax>' lines)",
                )
            raise _bad(path, n, f"malformed entry {line[:80]!r}", _ORT_HINT)
        name, value_text = parts
        _note_entry(path, n, name, seen_at)
        value = float(value_text)
        _check_value(path, n, name, value, "amax", allow_nonfinite, _ORT_HINT)
        amax[name] = value
    return CalibrationTable(trt_version=None, algorithm=UNKNOWN_ALGORITHM, amax=amax, source_format="onnxruntime")


# --------------------------------------------------------------------------------------------
# provenance: <cache>.json
# --------------------------------------------------------------------------------------------


def provenance_path(cache_path: Union[str, Path]) -> Path:
    return Path(str(cache_path) + ".json")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON data")


def write_provenance(cache_path: Union[str, Path], data: dict[str, Any]) -> Path:
    """Write ``data`` to ``<cache>.json`` atomically (sorted keys, indent 2). Floats are written
    with ``repr``, so they read back bit-exact. Returns the JSON path."""
    try:
        text = json.dumps(data, sort_keys=True, indent=2, allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as e:
        raise ValueError(f"provenance must be plain JSON data without NaN/Inf: {e}") from None
    out = provenance_path(cache_path)
    atomic_write_text(out, text + "\n")
    return out


def read_provenance(cache_path: Union[str, Path]) -> Optional[dict]:
    """The dict beside the cache, None when there is none; CacheError when it is unreadable."""
    p = provenance_path(cache_path)
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CacheError(
            f"provenance file {p} is corrupt ({type(e).__name__})",
            "delete it and re-run trtq calibrate to re-create it",
        ) from None
    if not isinstance(data, dict):
        raise CacheError(
            f"provenance file {p} does not hold a JSON object", "delete it and re-run trtq calibrate to re-create it"
        )
    return data
