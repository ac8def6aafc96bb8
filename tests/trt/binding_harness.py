"""Import the real TensorRT Python bindings on stub libraries and describe them (CPU only).

The binding wheels (``scripts/fetch_trt_bindings.py`` puts them in :func:`cache_dir`) hold
``tensorrt.so`` but not ``libnvinfer`` and the other libraries it links. Those are only needed to
resolve symbols at import: pybind11 declares every class, signature and enum value without calling
into them. :func:`build_stubs` makes, for one binding, small shared libraries that export exactly
the symbols the binding imports (``nm -D --undefined-only``) under the names it links
(``readelf -d``: NEEDED); :func:`describe` imports the binding on them in a subprocess (versions
never meet in one interpreter, and the 8.6.0 binding needs the Python it was built for) and
returns :mod:`tests.trt.binding_introspect`'s JSON.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
CASES = ("8.6.0", "10.x", "11.4")  # the versions trtq supports, one conformance case each
ENV_CACHE = "TRTQ_TRT_BINDINGS"
FETCH_HINT = "python scripts/fetch_trt_bindings.py"

# libraries every Linux process has: their symbols are not stubbed
SYSTEM_LIBS = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so")
# which TensorRT library defines an imported symbol, by name (the loader only needs each symbol
# in some library the binding links; the split follows the headers that declare them)
PROVIDERS = (
    ("libnvonnxparser", re.compile(r"NvOnnxParser")),
    ("libnvinfer_plugin", re.compile(r"^initLibNvInferPlugins$")),
    ("libnvparsers", re.compile(r"nvuffparser|nvcaffeparser")),
    ("libnvinfer", re.compile(r".")),
)


# read when the tests are collected: tests/conftest.py hides TRTQ_* variables from each test
_CACHE_SETTING = os.environ.get(ENV_CACHE)


def cache_dir() -> Path:
    return Path(_CACHE_SETTING or Path.home() / ".cache" / "trtq-trt-bindings")


@dataclass(frozen=True)
class Binding:
    case: str  # "8.6.0" | "10.x" | "11.4"
    version: str  # the full version, e.g. "10.16.1.11"
    root: Path  # holds tensorrt/__init__.py and tensorrt/tensorrt.so
    python_tag: str  # cp39, cp311 ...
    python: Optional[str]  # an interpreter for that tag when it is not the running one

    @property
    def so(self) -> Path:
        return self.root / "tensorrt" / "tensorrt.so"


def _matches(case: str, version: str) -> bool:
    if case.endswith(".x"):
        return version.split(".")[0] == case.split(".")[0]
    return version == case or version.startswith(case + ".")


def _key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.]", version))


def find_binding(case: str, root: Optional[Path] = None) -> Optional[Binding]:
    """The newest cached binding for a case, or None."""
    root = root or cache_dir()
    found = []
    for meta in Path(root).glob("*/binding.json"):
        try:
            info = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if _matches(case, str(info.get("version", ""))) and (meta.parent / "tensorrt" / "tensorrt.so").is_file():
            found.append(Binding(case, info["version"], meta.parent, info.get("python_tag", ""), info.get("python")))
    return max(found, key=lambda b: _key(b.version)) if found else None


def running_tag() -> str:
    return f"cp{sys.version_info[0]}{sys.version_info[1]}"


def interpreter(b: Binding) -> Optional[list]:
    """The command that runs the binding's Python, or None when there is none here."""
    if b.python_tag == running_tag():
        return [sys.executable]
    if b.python and Path(b.python).is_file() and os.access(b.python, os.X_OK):
        return [b.python]
    return None


def skip_reason(case: str) -> Optional[str]:
    b = find_binding(case)
    if b is None:
        return f"no TensorRT {case} binding in {cache_dir()} (run {FETCH_HINT})"
    if interpreter(b) is None:
        return f"the TensorRT {b.version} binding is for {b.python_tag} and no such Python is here (run {FETCH_HINT})"
    for tool in ("nm", "readelf", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (binutils / gcc build the stub libraries)"
    return None


# ------------------------------------------------------------------------------------------------
# stub libraries
# ------------------------------------------------------------------------------------------------


def needed(so: Path) -> list:
    out = subprocess.run(["readelf", "-d", "--wide", str(so)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def undefined(so: Path) -> list:
    """(name, version or "", weak) of every undefined dynamic symbol."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        kind, sym = parts
        name, _, version = sym.partition("@")
        syms.append((name, version.lstrip("@"), kind.lower() == "w"))
    return syms


def _system_symbols(libs: list) -> set:
    """Symbols the binding's system libraries define (dlopen is libc's in glibc >= 2.34 ...)."""
    paths = []
    listing = (
        subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout if shutil.which("ldconfig") else ""
    )
    for lib in libs:
        m = re.search(rf"^\s*{re.escape(lib)} \(libc6,x86-64[^)]*\) => (\S+)", listing, re.M)
        if m:
            paths.append(m.group(1))
    names: set = set()
    for p in paths:
        out = subprocess.run(["nm", "-D", "--defined-only", p], capture_output=True, text=True).stdout
        names.update(line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip())
    return names


def stub_plan(so: Path) -> dict:
    """library soname -> sorted symbol names its stub must export."""
    libs = needed(so)
    trt_libs = [lib for lib in libs if not SYSTEM_LIBS.match(lib)]
    system = _system_symbols([lib for lib in libs if SYSTEM_LIBS.match(lib)])
    plan: dict = {lib: [] for lib in trt_libs}
    for name, version, weak in undefined(so):
        if weak or version or name.startswith(("Py", "_Py")) or name in system:
            continue  # optional, versioned (glibc, libstdc++), the interpreter's, or a system library's
        if name.startswith(("_ZTI", "_ZTS", "_ZTV")):
            raise RuntimeError(f"{so} imports the C++ type data {name}: the stub libraries only make functions")
        for stem, rule in PROVIDERS:
            lib = next((x for x in trt_libs if x.startswith(stem + ".so")), None)
            if lib and rule.search(name):
                plan[lib].append(name)
                break
        else:
            raise RuntimeError(f"{so} imports {name} and links none of {', '.join(s for s, _ in PROVIDERS)}")
    return {lib: sorted(names) for lib, names in plan.items()}


def build_stubs(so: Path, out: Path) -> dict:
    """Compile the stub libraries for ``so`` into ``out``; returns :func:`stub_plan`'s plan.

    Every stub function returns NULL; none runs while the binding is imported and described."""
    plan = stub_plan(so)
    out.mkdir(parents=True, exist_ok=True)
    for lib, names in plan.items():
        src = out / f"{lib}.c"
        body = [f"/* stub for {lib}: exports what {so.name} imports; every function returns NULL */"]
        body += [f"void *{n}(void) {{ return 0; }}" for n in names]
        src.write_text("\n".join(body) + "\n", encoding="utf-8")
        script = out / f"{lib}.map"
        script.write_text("{ global: " + "".join(f"{n}; " for n in names) + "local: *; };\n", encoding="utf-8")
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-O1",
                "-o",
                str(out / lib),
                str(src),
                f"-Wl,-soname,{lib}",
                f"-Wl,--version-script={script}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    return plan


def exported(lib: Path) -> list:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())


# ------------------------------------------------------------------------------------------------
# the description
# ------------------------------------------------------------------------------------------------


class HarnessError(RuntimeError):
    pass


@cache
def describe(case: str) -> dict:
    """The binding surface of the cached ``case`` (see binding_introspect), with trtq's decisions
    run on it under ``exercised``."""
    b = find_binding(case)
    if b is None:
        raise HarnessError(f"no binding for {case}")
    cmd = interpreter(b)
    if cmd is None:
        raise HarnessError(f"no Python for {b.python_tag}")
    with tempfile.TemporaryDirectory(prefix="trtq-stubs-") as tmp:
        plan = build_stubs(b.so, Path(tmp))
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = tmp + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env.pop("PYTHONPATH", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        proc = subprocess.run(
            cmd + [str(REPO / "tests" / "trt" / "binding_introspect.py"), str(b.root), str(REPO)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    if proc.returncode != 0:
        raise HarnessError(
            f"importing the TensorRT {b.version} binding failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    doc = json.loads(proc.stdout)
    doc["stubs"] = plan
    doc["binding"] = {"root": str(b.root), "python_tag": b.python_tag}
    return doc


def snapshot_path(version: str) -> Path:
    return REPO / "tests" / "trt" / "surfaces" / f"{version}.json"


def main(argv: Optional[list] = None) -> int:
    """``python -m tests.trt.binding_harness [--write-snapshots]``: one line per cached binding
    (its surface size); with --write-snapshots, (re)write tests/trt/surfaces/<version>.json, the
    part the fakes are made from."""
    from tests.trt.surface_snapshot import fake_surface

    write = "--write-snapshots" in (argv if argv is not None else sys.argv[1:])
    status = 0
    for case in CASES:
        why = skip_reason(case)
        if why:
            print(f"{case}: {why}")
            status = 1
            continue
        doc = describe(case)
        line = f"{case}: TensorRT {doc['version']} (Python {doc['python']}): {len(doc['module'])} names"
        if write:
            path = snapshot_path(doc["version"])
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(fake_surface(doc), indent=1, sort_keys=True) + "\n", encoding="utf-8")
            line += f", snapshot {path.relative_to(REPO)}"
        print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
