"""Helpers shared by the benchmark scripts: paths, the labelled ImageNet samples, a reference
image preprocessor, per-run configs, measured subprocesses and plain-text tables.

The benchmarks run from a checkout (``python benchmarks/<script>.py``); importing this module puts
the repository root on ``sys.path`` so ``import trtq`` works without installing the package.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def repo_env() -> dict[str, str]:
    """The environment for a child process that runs this checkout's trtq: REPO first on PYTHONPATH,
    the caller's entries kept (the GPU bundle's Python finds its packages through them)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_WORK = REPO / ".bench"
MODEL_CONFIG = BENCH_DIR / "efficientnet_lite0.yaml"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from trtq.config import PreprocessOptions, load_config  # noqa: E402
from trtq.fileio import atomic_write_text  # noqa: E402

GIB = 1024**3
MIB = 1024**2


# --------------------------------------------------------------------------------------------
# data that ships with installed packages
# --------------------------------------------------------------------------------------------

_IMAGENET_SAMPLE = re.compile(r"^imagenet_(\d+)_(\d+)\.(jpg|png)$")


def foolbox_data_dir() -> Path:
    """foolbox/data without importing foolbox (its import needs eagerpy, which we do not need)."""
    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("foolbox is not installed: pip install --no-deps foolbox")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def imagenet_samples(folder: Path | None = None) -> list[tuple[Path, int]]:
    """foolbox's labelled ImageNet images as (path, class index), in file-name order.

    The files are named ``imagenet_<NN>_<label>.jpg``; the label is the ImageNet-1k class index.
    """
    folder = foolbox_data_dir() if folder is None else Path(folder)
    out = []
    for p in sorted(folder.iterdir()):
        m = _IMAGENET_SAMPLE.match(p.name)
        if m:
            out.append((p, int(m.group(2))))
    return out


# --------------------------------------------------------------------------------------------
# preprocessing (an independent reading of trtq's PreprocessOptions, used for the ONNX Runtime
# reference cases and the labelled images)
# --------------------------------------------------------------------------------------------

_PIL_FILTERS = {
    "nearest": "NEAREST",
    "bilinear": "BILINEAR",
    "bicubic": "BICUBIC",
    "lanczos": "LANCZOS",
    "box": "BOX",
    "hamming": "HAMMING",
}


def model_preprocess(config: Path = MODEL_CONFIG) -> tuple[str, PreprocessOptions]:
    """(input name, preprocessing) of the single image input described by a trtq config."""
    cfg = load_config(config)
    ((name, source),) = cfg.data.inputs.items()
    return name, source.preprocess


def preprocess_image(path: Path, opts: PreprocessOptions) -> np.ndarray:
    """One image file -> one sample array, following the order documented in trtq.config.

    Supports what the benchmark configs use: rgb/bgr, resize none/exact/shorter/longer,
    center_crop, scale, mean/std, nchw/nhwc, float32/float16.
    """
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        im = im.convert("RGB")
    r = opts.resize
    resample = getattr(Image, _PIL_FILTERS[r.interpolation])
    if r.mode == "exact":
        h, w = (r.size[0], r.size[0]) if len(r.size) == 1 else (r.size[0], r.size[1])
        im = im.resize((w, h), resample)
    elif r.mode in ("shorter", "longer"):
        w, h = im.size
        side = min(w, h) if r.mode == "shorter" else max(w, h)
        # the other side rounds half up, in integers (as trtq documents)
        nw, nh = ((w * r.size[0] * 2 + side) // (2 * side), (h * r.size[0] * 2 + side) // (2 * side))
        im = im.resize((max(1, nw), max(1, nh)), resample)
    elif r.mode != "none":
        raise ValueError(f"resize mode {r.mode!r} is not supported by the benchmark preprocessor")
    if opts.center_crop:
        ch, cw = (opts.center_crop[0],) * 2 if len(opts.center_crop) == 1 else opts.center_crop[:2]
        w, h = im.size
        # offsets like torchvision's CenterCrop: round((W - w) / 2), half to even
        left, top = int(round((w - cw) / 2.0)), int(round((h - ch) / 2.0))
        im = im.crop((left, top, left + cw, top + ch))
    x = np.asarray(im, dtype=np.float32)
    if opts.color == "bgr":
        x = x[:, :, ::-1]
    elif opts.color == "gray":
        raise ValueError("gray is not supported by the benchmark preprocessor")
    x = x * np.float32(opts.scale)
    if opts.mean:
        x = x - np.asarray(opts.mean, dtype=np.float32)
    if opts.std:
        x = x / np.asarray(opts.std, dtype=np.float32)
    if opts.layout == "nchw":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x, dtype=np.dtype(opts.dtype))


def list_images(folder: Path) -> list[Path]:
    exts = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
    return sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in exts and p.is_file())


def prefetched_batches(
    paths: Sequence[Path], opts: PreprocessOptions, batch_size: int, ahead: int = 4, threads: int = 2
):
    """Preprocessed batches in order (the last may be shorter), decoded by ``threads`` threads
    up to ``ahead`` batches ahead of the consumer, the way trtq's loader feeds its model."""
    chunks = [list(paths[i : i + batch_size]) for i in range(0, len(paths), batch_size)]

    def load(chunk):
        return np.stack([preprocess_image(p, opts) for p in chunk])

    with ThreadPoolExecutor(threads) as pool:
        pending = [pool.submit(load, c) for c in chunks[:ahead]]
        for i in range(len(chunks)):
            batch = pending.pop(0).result()
            if i + ahead < len(chunks):
                pending.append(pool.submit(load, chunks[i + ahead]))
            yield batch


# --------------------------------------------------------------------------------------------
# per-run configs
# --------------------------------------------------------------------------------------------


def write_run_config(dest: Path, model: Path, images: Path, base: Path = MODEL_CONFIG, **sections) -> Path:
    """Copy of ``base`` with absolute model / image paths (and extra top-level sections merged)."""
    import yaml

    raw = yaml.safe_load(Path(base).read_text(encoding="utf-8"))
    raw["model"] = str(Path(model).resolve())
    ((name, source),) = raw["data"]["inputs"].items()
    source["images"] = str(Path(images).resolve())
    for key, value in sections.items():
        merged = dict(raw.get(key) or {})
        merged.update(value)
        raw[key] = merged
    atomic_write_text(dest, yaml.safe_dump(raw, sort_keys=False))
    return dest


def photo_set(work: Path, split: str, count: int, seed: int = 0) -> Path:
    """Folder holding photos 0..count-1 of a benchmarks/photos.py set (built once, then reused).

    One folder per split and seed; file names sort in photo order, so the first N files of the
    folder (``--limit N``) are the same N photos whatever size the folder has grown to.
    """
    sys.path.insert(0, str(BENCH_DIR))
    try:
        from photos import make_photo_set
    finally:
        sys.path.remove(str(BENCH_DIR))

    dest = Path(work) / "photos" / f"{split}-s{seed}"
    paths = make_photo_set(dest, count, seed, sources=split)
    if list_images(dest)[:count] != sorted(paths):
        raise SystemExit(f"{dest} holds files that are not photos 0..{count - 1} of the set: delete the folder")
    return dest


# --------------------------------------------------------------------------------------------
# measured subprocesses
# --------------------------------------------------------------------------------------------

_OOM_PATTERNS = ("MemoryError", "bad_alloc", "Unable to allocate", "Failed to allocate", "out of memory")


@dataclass
class Measured:
    status: str  # "ok", "killed", "timeout", "failed"
    seconds: float
    peak_rss: int  # bytes, of the child and everything it waited for
    cpu_seconds: float  # user + system, same scope
    returncode: int | None
    stdout: str
    stderr: str

    def label(self, mem_cap: int | None, timeout: float) -> str:
        if self.status == "killed":
            return f"killed (> {mem_cap / GIB:.0f} GB)" if mem_cap else "killed"
        if self.status == "timeout":
            return f"timeout (> {timeout:.0f} s)"
        if self.status == "failed":
            return f"failed (exit {self.returncode})"
        return "ok"


# A fresh, small interpreter that runs the measured command as its own child and reports that
# child's peak RSS: Linux starts a forked child's peak RSS at its parent's resident size and keeps
# it across exec, so a command forked straight from a large process (pytest late in the suite, a
# benchmark holding arrays) would report at least that process's size.
_LAUNCHER = r"""
import os, resource, signal, sys
cap, report, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
pid = os.fork()
if pid == 0:
    if cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        os.write(2, ("cannot run %s: %s\n" % (cmd[0], e)).encode())
        os._exit(127)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda signum, frame: os.kill(pid, signum))
while True:
    try:
        _, status, usage = os.wait4(pid, 0)
        break
    except InterruptedError:
        continue
with open(report, "w") as f:
    f.write(str(usage.ru_maxrss))
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(
    cmd: Sequence[str],
    timeout: float,
    mem_cap: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Measured:
    """Run ``cmd`` alone in a new session; return wall and CPU time, peak RSS and how it ended.

    The command runs as the child of a small launcher (``_LAUNCHER``), which reports the peak RSS
    of that very child from ``wait4`` (ru_maxrss covers the child and the descendants it waited
    for): neither earlier cases nor the size of this process leak into the figure. CPU time covers
    the launcher too (a few ms). ``mem_cap`` limits the command's address space (RLIMIT_AS);
    ``timeout`` kills the whole process group.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out_p, err_p, report = (Path(tmp) / n for n in ("out", "err", "peak"))
        launcher = [sys.executable, "-S", "-c", _LAUNCHER, str(mem_cap or 0), str(report)]
        t0 = time.perf_counter()
        with open(out_p, "wb") as out_f, open(err_p, "wb") as err_f:
            proc = subprocess.Popen(
                launcher + list(cmd), stdout=out_f, stderr=err_f, env=env, cwd=cwd, start_new_session=True
            )
            status_word, rusage, timed_out = _wait_within(proc, t0, timeout)
        seconds = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status_word)
        stdout = out_p.read_bytes().decode("utf-8", "replace")
        stderr = err_p.read_bytes().decode("utf-8", "replace")
        peak_kib = report.read_text() if report.is_file() else ""
    peak = int(peak_kib or rusage.ru_maxrss) * 1024  # KiB on Linux; the launcher's own if it was killed
    if timed_out:
        status = "timeout"
    elif rc == 0:
        status = "ok"
    elif rc in (-signal.SIGKILL, -signal.SIGABRT) or any(p in stderr for p in _OOM_PATTERNS):
        status = "killed"
    else:
        status = "failed"
    cpu = float(rusage.ru_utime + rusage.ru_stime)
    return Measured(status, seconds, peak, cpu, rc, stdout, stderr)


def _wait_within(proc: subprocess.Popen, t0: float, timeout: float):
    """(status word, rusage, timed out) of ``proc``, its process group killed past ``timeout``."""
    try:
        while True:
            pid, status_word, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                return status_word, rusage, False
            if time.perf_counter() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status_word, rusage = os.wait4(proc.pid, 0)
                return status_word, rusage, True
            time.sleep(0.05)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        os.wait4(proc.pid, 0)
        raise
    finally:
        proc.returncode = -1  # reaped here; keep Popen from waiting again


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain, aligned text table (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(r):
            numeric = bool(re.match(r"^[-+]?[\d.]+[x%]?$", c))
            parts.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b`` (float64)."""
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(na * nb, 1e-30)
