"""Issue 34's engine table for several models at once, the builds dealt out to every GPU of the host.

benchmarks/gpu/engines.sh builds one model's engines one after the other on one GPU. On a host with
several GPUs this script keeps each GPU busy with its own queue (one `run_builds.py` process per
GPU: builds never share a GPU), then benches each model's plans together on one GPU and scores
each variant's first engine against FP32 ONNX Runtime (`trtq compare`):

    python benchmarks/gpu/engine_pool.py SPEC.json OUTDIR [--builds 3] [--deadline S] [--final]
        [--gpus N] [--only det,rec] [--dry-run]

SPEC (paths relative to the spec file):

    {"det": {"model": "det/model.onnx", "cache": "det/mse.cache", "opt": 0,
             "build": ["--shape", "x=1x3x640x640"],
             "variants": {"trtq-shared": {"placement": "shared"}, "trtq-tuned": {"file": "det/tuned.qdq.onnx"},
                          "implicit": {}, "modelopt": {"file": "det/modelopt.onnx"}, "fp16": {}},
             "compare": ["--data", "det/pages", "--preprocess", "imagenet", "--shape", "x=1x3x640x640"],
             "cost": {"implicit": 190, "fp16": 75, "trtq-shared": 22}}}

Variants: `trtq-*` with a placement (`trtq quantize --placement`) or a Q/DQ file made beforehand,
`implicit` (the cache, `--mode implicit`), `modelopt` (a file, lowered by `--fix-qdq`), `fp16`. All
INT8 variants build with `--fp16`. Builds run round by round (every variant's first build before
any second), each job to the GPU with the least estimated seconds queued (`cost`, default 60).
--deadline: no build starts after that many seconds (run_builds.py); a later call with the same
OUTDIR builds only the missing plans (a call stays under the device's 10-minute limit). A model is
benched once all its plans exist, or with --final whatever exists. Results in OUTDIR/NAME: plans,
build JSON and logs, bench.json, VARIANT.compare.txt, table.txt (benchmarks/gpu/placement_table.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_COST = 60.0


def load_spec(path: Path) -> dict:
    """The spec with every file path made absolute (relative to the spec's folder)."""
    spec = json.loads(path.read_text())
    base = path.resolve().parent

    def absolute(p: str) -> str:
        return str((base / p).resolve())

    for m in spec.values():
        m["model"] = absolute(m["model"])
        if "cache" in m:
            m["cache"] = absolute(m["cache"])
        for v in m["variants"].values():
            if "file" in v:
                v["file"] = absolute(v["file"])
        m["compare"] = [absolute(a) if (base / a).exists() else a for a in m.get("compare", [])]
    return spec


def variant_args(name: str, m: dict, v: dict, plans: Path) -> list:
    """`trtq build` arguments of one variant, without -o and --json."""
    needs = {"implicit": ("cache", m), "modelopt": ("file", v)}.get(name)
    if needs and needs[0] not in needs[1]:
        raise SystemExit(f"engine_pool: variant {name} needs a {needs[0]!r} in the spec")
    if name.startswith("trtq-"):
        args = ["--model", str(plans / f"{name}.qdq.onnx"), "--fp16"]
    elif name == "implicit":
        args = ["--model", m["model"], "--cache", m["cache"], "--mode", "implicit", "--fp16"]
    elif name == "modelopt":
        args = ["--model", v["file"], "--fix-qdq", "--fp16"]
    elif name == "fp16":
        args = ["--model", m["model"], "--precision", "fp16"]
    else:
        raise SystemExit(f"engine_pool: unknown variant {name} (trtq-*, implicit, modelopt, fp16)")
    return args + ["--optimization-level", str(m.get("opt", 0))] + list(m.get("build", []))


def jobs(spec: dict, out: Path, builds: int) -> list:
    """(job line, estimated seconds) for every plan not built yet, round by round."""
    todo = []
    for b in range(1, builds + 1):
        for name, m in spec.items():
            plans = out / name
            for v, opts in m["variants"].items():
                plan = plans / f"{v}.{b}.plan"
                if plan.exists():
                    continue
                argv = ["build"] + variant_args(v, m, opts, plans) + ["-o", str(plan), "--json"]
                line = shlex.join([f"{name}/{v}.{b}.build"] + argv)
                todo.append((line, float(m.get("cost", {}).get(v, DEFAULT_COST))))
    return todo


def deal(todo: list, gpus: int) -> list:
    """Each job, in order, to the GPU with the least estimated seconds queued so far."""
    queues: list = [[] for _ in range(gpus)]
    load = [0.0] * gpus
    for line, cost in todo:
        g = min(range(gpus), key=lambda i: load[i])
        queues[g].append(line)
        load[g] += cost
    return queues


def make_qdq(spec: dict, out: Path) -> None:
    """The Q/DQ file of each trtq-* variant: a placement written by `trtq quantize`, or a copy."""
    for name, m in spec.items():
        plans = out / name
        plans.mkdir(parents=True, exist_ok=True)
        for v, opts in m["variants"].items():
            target = plans / f"{v}.qdq.onnx"
            if not v.startswith("trtq-") or target.exists():
                continue
            if "file" in opts:
                target.write_bytes(Path(opts["file"]).read_bytes())
                continue
            cmd = [sys.executable, "-m", "trtq", "quantize", "--model", m["model"], "--cache", m["cache"]]
            cmd += ["--placement", opts.get("placement", "shared"), "-o", str(target), "-q"]
            subprocess.run(cmd, check=True, cwd=ROOT)


def gpu_env(g: int) -> dict:
    return dict(os.environ, CUDA_VISIBLE_DEVICES=str(g), CUDA_MODULE_LOADING="EAGER")


def build_all(queues: list, out: Path, deadline) -> None:
    """One run_builds.py process per GPU with jobs, all at once; returns when every one has ended."""
    with contextlib.ExitStack() as stack:
        procs = []
        for g, lines in enumerate(queues):
            if not lines:
                continue
            job_file = out / f"jobs.gpu{g}.txt"
            job_file.write_text("\n".join(lines) + "\n")
            cmd = [sys.executable, str(HERE / "run_builds.py"), str(job_file), str(out)]
            cmd += ["--deadline", str(deadline)] if deadline is not None else []
            log = stack.enter_context(open(out / f"builds.gpu{g}.txt", "a"))
            procs.append(subprocess.Popen(cmd, env=gpu_env(g), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        for p in procs:
            p.wait()


def score(name: str, m: dict, out: Path, g: int, want: int) -> None:
    """One `trtq bench` of the model's plans, `trtq compare` of each variant's first plan, the table;
    only once ``want`` plans exist."""
    d = out / name
    plans = sorted(d.glob("*.plan"))
    if not plans:
        print(f"{name}: no plan built (see {out / 'failures.txt'} and the build logs)", flush=True)
        return
    if len(plans) < want:
        print(f"{name}: {len(plans)} of {want} plans; bench after the missing builds (or --final)", flush=True)
        return
    env, trtq, paths = gpu_env(g), [sys.executable, "-m", "trtq"], [str(p) for p in plans]
    with open(d / "bench.json", "w") as o, open(d / "bench.log", "w") as e:
        subprocess.run(trtq + ["bench", "--duration", "3", "--json"] + paths, stdout=o, stderr=e, env=env, cwd=ROOT)
    for first in sorted(d.glob("*.1.plan")):
        v = first.name[: -len(".1.plan")]
        with open(d / f"{v}.compare.txt", "w") as o:
            cmd = trtq + ["compare", "--reference", m["model"], "--candidate", str(first)] + m.get("compare", [])
            subprocess.run(cmd, stdout=o, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    with open(d / "table.txt", "w") as o:
        cmd = [sys.executable, str(HERE / "placement_table.py"), str(d), str(d / "bench.json")] + paths
        subprocess.run(cmd, stdout=o, stderr=subprocess.STDOUT, cwd=ROOT)


def score_all(spec: dict, out: Path, gpus: int, builds: int, final: bool) -> None:
    """Each GPU benches its share of the models one after the other (benches never share a GPU);
    a model waits for all its plans unless ``final``."""
    names = list(spec)

    def worker(g: int) -> None:
        for name in names[g::gpus]:
            score(name, spec[name], out, g, 0 if final else len(spec[name]["variants"]) * builds)

    threads = [threading.Thread(target=worker, args=(g,)) for g in range(min(gpus, len(names)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def gpu_count() -> int:
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 1
    return max(1, sum(1 for line in listed.splitlines() if line.startswith("GPU ")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=None, help="no build starts after this many seconds")
    ap.add_argument("--final", action="store_true", help="bench every model, whatever plans exist")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all that nvidia-smi lists)")
    ap.add_argument("--only", default="", help="comma-separated model names of the spec")
    ap.add_argument("--dry-run", action="store_true", help="write the Q/DQ files, print each GPU's jobs, build nothing")
    args = ap.parse_args(argv)
    spec = load_spec(args.spec)
    if args.only:
        spec = {k: v for k, v in spec.items() if k in args.only.split(",")}
    gpus = args.gpus or gpu_count()
    args.out.mkdir(parents=True, exist_ok=True)
    make_qdq(spec, args.out)
    queues = deal(jobs(spec, args.out, args.builds), gpus)
    for g, lines in enumerate(queues):
        print(f"GPU {g}: " + " ".join(line.split(" ", 1)[0] for line in lines), flush=True)
    if args.dry_run:
        for lines in queues:
            print("\n".join(lines))
        return 0
    build_all(queues, args.out, args.deadline)
    score_all(spec, args.out, gpus, args.builds, args.final)
    for name in spec:
        table = args.out / name / "table.txt"
        if table.is_file():
            text = table.read_text()
            print(f"== {name}\n" + text[text.find("median over builds") :], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
