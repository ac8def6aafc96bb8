"""Check a model trtq made before anyone else sees it: the full ONNX checker, then one ONNX Runtime run.

Every model trtq writes or hands on (``trtq quantize``'s output, the Q/DQ model ``trtq build`` gives
TensorRT) goes through :func:`check_produced_model` first. A failure is a bug in one of trtq's
rewrites, not the user's: :class:`ProducedModelError` (exit 1) names the node where the checker or
ONNX Runtime does, and nothing is written.

The run uses the batch the caller passes (real calibration data where the command has it), else a
synthetic one at the model's declared shapes (named dims 1): it proves the model loads and runs, not
that its numbers are right; ``trtq compare`` measures those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trtq.errors import TrtqError

HINT = "this is a bug in trtq: report it with the model; --exclude on the node named may work around it"
_NODE = [
    re.compile(p)
    for p in (
        r"[Nn]ode \(([^)]+)\)",  # ONNX Runtime: "Node (X) Op (Y) ..."
        r"[Nn]ame:\s*'([^']+)'",  # ONNX Runtime: "... Reshape node. Name:'X' Status ..."
        r"[Nn]ame:\s*([^'\s,)]+)",  # onnx.checker: "node: name: X OpType: Y", "(op_type:Concat, node name: X)"
    )
]


class ProducedModelError(TrtqError):
    """trtq made a model that the ONNX checker or ONNX Runtime refuses (exit 1)."""


def node_named(text: str) -> str | None:
    """The node an ONNX checker or ONNX Runtime message names, if any."""
    for pattern in _NODE:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line (the checker and ONNX Runtime spread theirs over several)."""
    text = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return text[:400] if text else type(e).__name__


def _fail(what: str, stage: str, e: BaseException) -> ProducedModelError:
    line = _one_line(e)
    node = node_named(str(e))
    at = f" at node '{node}'" if node else ""
    return ProducedModelError(f"trtq produced an invalid model ({what}): {stage}{at}: {line}", HINT)


def synthetic_feeds(model: Any, shapes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One deterministic batch for ``model``'s inputs: the declared shape, its named or unknown dims
    taken from ``shapes`` where given, else 1 (floats from a fixed-seed normal, integers zeros)."""
    import numpy as np

    from trtq.model import input_specs

    rng = np.random.default_rng(0)
    feeds = {}
    for spec in input_specs(model):
        given = list((shapes or {}).get(spec.name) or [])
        if len(given) != len(spec.shape):
            given = [1] * len(spec.shape)
        dims = tuple(d if isinstance(d, int) else max(1, int(g)) for d, g in zip(spec.shape, given))
        dtype = np.dtype(spec.dtype) if not spec.dtype.startswith("onnx:") and spec.dtype != "bfloat16" else None
        if dtype is None:
            raise ProducedModelError(
                f"cannot make a test batch for input '{spec.name}' of type {spec.dtype}",
                "pass --data so that the check runs on a real batch",
            )
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(dims).astype(dtype)
        else:
            feeds[spec.name] = np.zeros(dims, dtype=dtype)
    return feeds


def _check_onnx(model: Any, original: Any) -> BaseException | None:
    """The full checker's complaint about ``model`` (None when it passes, or when ``original``, the
    model it was made from, draws the same complaint: then the input is at fault, not trtq)."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
        return None
    except Exception as e:
        if original is not None:
            try:
                onnx.checker.check_model(original, full_check=True)
            except Exception as e0:
                if _one_line(e0) == _one_line(e):
                    return None
        return e


def check_produced_model(model: Any, what: str, feeds: Mapping[str, Any] | None = None, original: Any = None) -> None:
    """Raise :class:`ProducedModelError` unless ``model`` passes ``onnx.checker`` (full: strict
    shape inference) and ONNX Runtime loads it and runs ``feeds`` (default :func:`synthetic_feeds`).

    ``what`` names the model in the message (e.g. ``"the Q/DQ model of resnet.onnx"``);
    ``original``: the model it was made from, whose own checker complaints are not trtq's."""
    import onnxruntime as ort

    problem = _check_onnx(model, original)
    if problem is not None:
        raise _fail(what, "the ONNX checker refuses it", problem)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # basic optimizations compute Q/DQ pairs as written (as TensorRT does); no fused int8 kernels
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise _fail(what, "ONNX Runtime cannot load it", e) from None
    batch = dict(feeds) if feeds is not None else synthetic_feeds(model)
    names = [i.name for i in session.get_inputs()]
    try:
        session.run(None, {n: batch[n] for n in names})
    except KeyError as e:
        raise ProducedModelError(f"the test batch for {what} has no array for input {e}", HINT) from None
    except Exception as e:
        raise _fail(what, "ONNX Runtime cannot run it", e) from None
