#!/usr/bin/env python3
"""Fetch the TensorRT Python bindings trtq is checked against into a cache folder.

    python scripts/fetch_trt_bindings.py [--cache DIR] [--only 8.6.0,10.x,11.4] [--newest]

One folder per version under the cache (default ``$TRTQ_TRT_BINDINGS`` or
``~/.cache/trtq-trt-bindings``; never inside the repository): ``tensorrt/__init__.py`` and
``tensorrt/tensorrt.so`` from the release's wheel, and ``binding.json`` (version, package, wheel,
Python tag, sha256). tests/trt/test_binding_conformance.py imports them on stub libraries; the
tests skip without them. Running it again only checks what is there. One line per version; exit
status 1 when any version could not be fetched.

Sources (the smallest real one for each):
- 10.x / 11.4: ``tensorrt-cu12-bindings`` (a ~1.3 MB wheel, bindings only) for this Python.
- 8.6.0: no bindings-only package has it (``tensorrt-bindings`` starts at 8.6.1). The ``tensorrt``
  8.6.0 wheel (~820 MB, cp36-cp310 only) holds ``tensorrt/tensorrt.so``: it is taken from the GPU
  bundle's cache (``$TRTQ_BUNDLE_CACHE``, default ``~/.cache/trtq-gpu-bundle``, cp39) when it is
  there and its hash matches the wheel's RECORD, else downloaded, the two files kept and the wheel
  deleted. Its Python (3.10 ... 3.6) is ``$TRTQ_TRT86_PYTHON``, one on PATH, the bundle's 3.9, or
  Debian 11's python3.9 packages unpacked into the cache with apt-get (``--no-debian-python``
  turns that off).
"""

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PINNED = {
    "8.6.0": ("tensorrt", "8.6.0"),
    "10.x": ("tensorrt-cu12-bindings", "10.16.1.11"),  # the newest 10.x when this was written
    "11.4": ("tensorrt-cu12-bindings", "11.4.0.106"),
}
OLD_PYTHONS = ("3.10", "3.9", "3.8", "3.7", "3.6")  # the Pythons the 8.6.0 wheel exists for
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64")
DEBIAN_SUITE = "bullseye"  # Debian 11: python3.9
DEBIAN_PACKAGES = ("python3.9-minimal", "libpython3.9-minimal", "libpython3.9-stdlib", "libffi7")


class FetchError(Exception):
    pass


def cache_root(arg):
    return Path(arg or os.environ.get("TRTQ_TRT_BINDINGS") or Path.home() / ".cache" / "trtq-trt-bindings")


def pip(*args):
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.splitlines() if x.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
        raise FetchError("pip " + args[0] + ": " + (lines[0] if lines else f"exit {proc.returncode}"))
    return proc.stdout


def sha256_record(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def newest(package, case):
    out = pip("index", "versions", package)
    m = re.search(r"Available versions: (.*)", out)
    if not m:
        raise FetchError(f"pip index versions {package}: no versions listed")
    prefix = case[:-2] + "." if case.endswith(".x") else case + "."
    versions = [v.strip() for v in m.group(1).split(",") if v.strip().startswith(prefix)]
    if not versions:
        raise FetchError(f"{package} has no {case} release")
    return max(versions, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v)))


# ------------------------------------------------------------------------------------------------
# wheels
# ------------------------------------------------------------------------------------------------


def extract(wheel, inner, dest):
    """tensorrt.so and __init__.py of the wheel's package folder ``inner`` -> dest/tensorrt/,
    each checked against the wheel's RECORD."""
    with zipfile.ZipFile(wheel) as z:
        record_name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        record = {row[0]: row[1] for row in csv.reader(io.StringIO(z.read(record_name).decode())) if len(row) > 1}
        (dest / "tensorrt").mkdir(parents=True, exist_ok=True)
        for name in ("tensorrt.so", "__init__.py"):
            data = z.read(f"{inner}/{name}")
            if record.get(f"{inner}/{name}") != sha256_record(data):
                raise FetchError(f"{wheel.name}: {inner}/{name} does not match the wheel's RECORD")
            (dest / "tensorrt" / name).write_bytes(data)
        return hashlib.sha256(z.read(f"{inner}/tensorrt.so")).hexdigest()


def download(package, version, tmp, python_version=None):
    args = ["download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(tmp)]
    if python_version:
        args += ["--python-version", python_version, "--implementation", "cp"]
        for p in PLATFORMS:
            args += ["--platform", p]
    pip(*args, f"{package}=={version}")
    wheels = sorted(Path(tmp).glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip download {package}=={version}: no wheel")
    return wheels[0]


def bundle_binding(dest):
    """The 8.6.0 cp39 binding from the GPU bundle's cache, checked against its RECORD; True if used."""
    root = Path(os.environ.get("TRTQ_BUNDLE_CACHE") or Path.home() / ".cache" / "trtq-gpu-bundle")
    for trt in (root / "trt", root / "stage-rest" / "trtq-rig" / "trt"):
        record = trt / "tensorrt-8.6.0.dist-info" / "RECORD"
        if not record.is_file() or not (trt / "tensorrt" / "tensorrt.so").is_file():
            continue
        rows = {r[0]: r[1] for r in csv.reader(io.StringIO(record.read_text())) if len(r) > 1}
        files = {n: (trt / "tensorrt" / n).read_bytes() for n in ("tensorrt.so", "__init__.py")}
        if all(rows.get(f"tensorrt/{n}") == sha256_record(d) for n, d in files.items()):
            (dest / "tensorrt").mkdir(parents=True, exist_ok=True)
            for n, d in files.items():
                (dest / "tensorrt" / n).write_bytes(d)
            return hashlib.sha256(files["tensorrt.so"]).hexdigest(), str(trt)
    return None


# ------------------------------------------------------------------------------------------------
# a Python for the 8.6.0 binding
# ------------------------------------------------------------------------------------------------


def python_version(cmd):
    try:
        out = subprocess.run(
            [cmd, "-c", "import sys, ctypes, json; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def write_wrapper(root, path):
    """An executable that runs an unpacked Debian python3.9 tree."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        "# python3.9 from an unpacked Debian tree (scripts/fetch_trt_bindings.py)\n"
        f"R='{root}'\n"
        'export PYTHONHOME="$R/usr"\n'
        'export LD_LIBRARY_PATH="$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu'
        '${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n'
        'exec "$R/usr/bin/python3.9" "$@"\n',
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def debian_mirror():
    """The Debian mirror the system's apt sources name (deb822 or one-line form)."""
    for src in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")) + [Path("/etc/apt/sources.list")]:
        if src.is_file():
            m = re.search(r"^URIs:\s*(\S+/debian)\s*$", src.read_text(), re.M) or re.search(
                r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s", src.read_text(), re.M
            )
            if m:
                return m.group(1)
    raise FetchError("no Debian mirror in /etc/apt: cannot fetch python3.9")


def debian_python(cache):
    """python3.9 from Debian 11 packages (apt-get download, dpkg -x) unpacked under the cache."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise FetchError(f"{tool} is missing: cannot fetch python3.9")
    root, work = cache / "python3.9" / "root", cache / "python3.9" / "apt"
    if not (root / "usr" / "bin" / "python3.9").is_file():
        shutil.rmtree(root, ignore_errors=True)
        (work / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (work / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (work / "status").write_text("")
        (work / "sources.list").write_text(f"deb {debian_mirror()} {DEBIAN_SUITE} main\n")
        opts = [
            f"-oDir::Etc::SourceList={work / 'sources.list'}",
            "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={work / 'lists'}",
            f"-oDir::State::status={work / 'status'}",
            f"-oDir::Cache={work}",
            "-oAPT::Architecture=amd64",
            "-oDebug::NoLocking=1",
            "-qq",
        ]
        for step in (["update"], ["download", *DEBIAN_PACKAGES]):
            proc = subprocess.run(["apt-get", *opts, *step], cwd=work, capture_output=True, text=True)
            if proc.returncode != 0:
                raise FetchError(f"apt-get {step[0]} ({DEBIAN_SUITE}): {proc.stderr.strip()[-300:]}")
        for deb in sorted(work.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        shutil.rmtree(work, ignore_errors=True)
    return write_wrapper(root, cache / "python3.9" / "bin" / "python")


def old_python(cache, allow_debian):
    """(command, "3.9") for a Python the 8.6.0 wheel exists for."""
    candidates = []
    if os.environ.get("TRTQ_TRT86_PYTHON"):
        candidates.append(os.environ["TRTQ_TRT86_PYTHON"])
    candidates += [shutil.which(f"python{v}") for v in OLD_PYTHONS]
    mine = cache / "python3.9" / "bin" / "python"
    candidates.append(str(mine) if mine.is_file() else None)
    bundle = Path(os.environ.get("TRTQ_BUNDLE_CACHE") or Path.home() / ".cache" / "trtq-gpu-bundle") / "py39"
    if (bundle / "usr" / "bin" / "python3.9").is_file():
        candidates.append(str(write_wrapper(bundle, cache / "python3.9-bundle" / "bin" / "python")))
    for cmd in candidates:
        if cmd:
            v = python_version(cmd)
            if v in OLD_PYTHONS:
                return str(Path(cmd).absolute()), v
    if not allow_debian:
        raise FetchError("no Python 3.6-3.10 for the 8.6.0 binding (set TRTQ_TRT86_PYTHON)")
    cmd = debian_python(cache)
    v = python_version(str(cmd))
    if v not in OLD_PYTHONS:
        raise FetchError(f"the Debian python3.9 in {cmd.parent.parent} does not run")
    return str(cmd), v


# ------------------------------------------------------------------------------------------------
# one version
# ------------------------------------------------------------------------------------------------


def present(dest):
    meta = dest / "binding.json"
    so = dest / "tensorrt" / "tensorrt.so"
    if not (meta.is_file() and so.is_file()):
        return None
    info = json.loads(meta.read_text())
    if hashlib.sha256(so.read_bytes()).hexdigest() != info.get("sha256"):
        return None
    if info.get("python") and python_version(info["python"]) is None:
        return None
    return info


def fetch(case, cache, use_newest, allow_debian):
    package, version = PINNED[case]
    if use_newest and package != "tensorrt":
        version = newest(package, case)
    dest = cache / version
    info = present(dest)
    if info is not None:
        return f"{version}: cached in {dest} ({info['package']} {info['python_tag']})"
    tmp_dest = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=cache))
    try:
        python = None
        running = "{}.{}".format(*sys.version_info[:2])
        source = ""
        if package == "tensorrt" and running not in OLD_PYTHONS:
            python, pyver = old_python(cache, allow_debian)
        else:
            pyver = running
        tag = "cp" + pyver.replace(".", "")
        got = bundle_binding(tmp_dest) if package == "tensorrt" and tag == "cp39" else None
        if got is not None:
            sha, source = got[0], f"the GPU bundle cache {got[1]}"
            wheel = f"tensorrt-{version}-cp39-none-manylinux_2_17_x86_64.whl"
        else:
            with tempfile.TemporaryDirectory(dir=cache) as wtmp:
                w = download(package, version, wtmp, pyver if python else None)
                inner = "tensorrt" if package == "tensorrt" else "tensorrt_bindings"
                sha, wheel, source = extract(w, inner, tmp_dest), w.name, "pip download"
        info = {
            "version": version,
            "package": package,
            "wheel": wheel,
            "python_tag": tag,
            "python": python,
            "sha256": sha,
            "source": source,
        }
        (tmp_dest / "binding.json").write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp_dest.chmod(0o755)
        tmp_dest.rename(dest)
    finally:
        shutil.rmtree(tmp_dest, ignore_errors=True)
    via = f"; Python {python}" if python else ""
    return f"{version}: fetched into {dest} ({package} {tag}, from {source}{via})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="cache folder (default $TRTQ_TRT_BINDINGS or ~/.cache/trtq-trt-bindings)")
    ap.add_argument("--only", default=",".join(PINNED), help="comma-separated cases: " + ", ".join(PINNED))
    ap.add_argument("--newest", action="store_true", help="the newest 10.x / 11.4.x on the index instead of the pins")
    ap.add_argument("--no-debian-python", action="store_true", help="never fetch python3.9 for the 8.6.0 binding")
    args = ap.parse_args(argv)
    cache = cache_root(args.cache).absolute()
    cache.mkdir(parents=True, exist_ok=True)
    failed = 0
    for case in [c.strip() for c in args.only.split(",") if c.strip()]:
        if case not in PINNED:
            print(f"{case}: unknown case (choose from {', '.join(PINNED)})")
            failed += 1
            continue
        try:
            print(fetch(case, cache, args.newest, not args.no_debian_python), flush=True)
        except (FetchError, OSError, subprocess.CalledProcessError, zipfile.BadZipFile, KeyError) as e:
            print(f"{PINNED[case][1]}: not fetched: {e}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
