"""``quantize --attention int8`` against the default (attention float) on the zoo files that have
attention cores: Q/DQ vs FP32 output SQNR (the worst output, ONNX Runtime, Q/DQ semantics) from one
trtq cache per file (the zoo test's own data and steps, tests/zoo/zoo_steps.py), with the number of
attention MatMuls each leaves float:

    python benchmarks/zoo_attention.py [--only SUBSTRING]   (needs the zoo: scripts/zoo_env.sh)
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.zoo_placements import run, worst, zoo_entries
from tests.zoo import zoo_steps


def attention_float(step) -> int:
    """Attention MatMuls a quantize --json report leaves float."""
    left = (step.report or {}).get("left_float") or []
    return sum(1 for item in left if str(item.get("reason", "")).startswith("attention"))


def main() -> None:
    zoo, entries = zoo_entries(__doc__)
    print(f"{'file':40s} {'float dB':>9s} {'int8 dB':>8s} {'diff':>7s} {'attention float':>16s}")
    for entry in entries:
        with tempfile.TemporaryDirectory() as work:
            case = zoo_steps.run_case(entry, zoo, Path(work), run)
            step_f, problem_f, sqnr_f = zoo_steps.placement_check(case, "shared", run)
            if attention_float(step_f) == 0:
                continue  # no attention core: both settings write the same file
            step_i, problem_i, sqnr_i = zoo_steps.placement_check(case, "shared", run, ("--attention", "int8"))
        f, i = worst(sqnr_f), worst(sqnr_i)
        note = "".join(f"  ({p})" for p in (problem_f, problem_i) if p)
        counts = f"{attention_float(step_f)} -> {attention_float(step_i)}"
        print(f"{entry['file']:40s} {f:9.2f} {i:8.2f} {i - f:7.2f} {counts:>16s}{note}", flush=True)


if __name__ == "__main__":
    main()
