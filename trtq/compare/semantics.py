"""When a Q/DQ model scores differently under ONNX Runtime's int8 kernels than under Q/DQ semantics.

ONNX Runtime's extended graph optimizations replace Q/DQ pairs by its own int8 kernels (on x86
without VNNI they multiply uint8 x int8 with 16-bit intermediate sums, which saturate). TensorRT
computes the Q/DQ pairs as written. Both scores are deterministic on the same samples, so any gap
is the runtimes' doing; :data:`AGREEMENT_GAP` and :data:`SQNR_GAP_DB` only leave room for the
small rounding differences two correct implementations have.
"""

from trtq.compare.tasks import reported_apart

AGREEMENT_GAP = 0.01  # top-1 agreement, and any task metric (detection F1, mask IoU, ...)
SQNR_GAP_DB = 1.0
SHORT = {"qdq": "the Q/DQ semantics (what TensorRT computes)", "onnxruntime": "ONNX Runtime's int8 kernels"}


def _gap(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) > AGREEMENT_GAP


def semantics_gaps(main, other, semantics: str, other_semantics: str) -> list[str]:
    """One line per output whose score differs by more than the gaps between two CompareReports
    of the same candidate (``main``: run with ``semantics``, the one the user asked for)."""
    lines = []
    by_name = {o.name: o for o in other.outputs}
    for o in main.outputs:
        p = by_name.get(o.name)
        if p is None:
            continue
        parts = []
        if (
            o.top1_agreement is not None
            and p.top1_agreement is not None
            and abs(o.top1_agreement - p.top1_agreement) > AGREEMENT_GAP
        ):
            parts.append(f"top-1 agreement {o.top1_agreement:.4f} vs {p.top1_agreement:.4f}")
        task, other_task = o.task, p.task
        if (
            task is not None
            and other_task is not None
            and reported_apart(task.task)
            and _gap(task.value, other_task.value)
        ):
            parts.append(f"{task.gate_label} {task.value:.4f} vs {other_task.value:.4f}")
        if (
            o.sqnr_db is not None
            and p.sqnr_db is not None
            and abs(o.sqnr_db - p.sqnr_db) > SQNR_GAP_DB
            and o.sqnr_db != p.sqnr_db
        ):  # inf == inf: no gap
            parts.append(f"SQNR {o.sqnr_db:.2f} vs {p.sqnr_db:.2f} dB")
        if parts:
            lines.append(
                f"{o.name}: {' and '.join(parts)} under {SHORT[semantics]} vs {SHORT[other_semantics]}: "
                "the two compute this Q/DQ model differently (compare --semantics picks the one reported)"
            )
    return lines
