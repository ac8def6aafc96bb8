"""Which calibrated tensors the Q/DQ model quantizes, and at which range: from ``trtq quantize
--json``.

The JSON's ``activations`` (tensor -> amax, read from the Q/DQ model it wrote) answers directly;
a JSON without it (written before trtq listed them) names the model in ``output``, which is read
with :func:`trtq.qdq_info.read_qdq` when it is still there. Centred activations
(``--center-activations``) carry ``x - shift`` into a quantizer of range ``amax``: the values of
the calibrated tensor that clip are those above ``shift + amax``.

Without a quantize JSON nothing says which tensors run in INT8 (an implicit TensorRT build picks
them itself): the report then counts clipping over every calibrated tensor and says so.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _from_model(quantize: dict, json_path: Path) -> tuple[dict[str, float] | None, str]:
    out = quantize.get("output")
    if not isinstance(out, str) or not out:
        return None, f"{json_path} names no Q/DQ model"
    candidates = [Path(out)] if Path(out).is_absolute() else [Path(out), json_path.parent / out]
    for path in candidates:
        if path.is_file():
            import onnx

            from trtq.qdq_info import read_qdq

            try:
                model = onnx.load(str(path), load_external_data=False)
            except Exception as e:  # a file that is not ONNX: say so, do not guess
                return None, f"{path} could not be read as ONNX ({type(e).__name__})"
            return dict(read_qdq(model).activations), f"read from {path}"
    return None, f"its Q/DQ model {out} is not there"


def quantized_ranges(quantize: dict, json_path: Path) -> tuple[dict[str, float] | None, str]:
    """``({tensor: the |x| above which it clips}, how it was found)``; ``None`` with the reason
    when the JSON does not say which tensors are quantized."""
    acts = quantize.get("activations")
    if isinstance(acts, dict):
        ranges = {str(k): a for k, a in ((k, _number(v)) for k, v in acts.items()) if a is not None}
        how = "from the quantize JSON"
    else:
        ranges, how = _from_model(quantize, Path(json_path))
        if ranges is None:
            log.warning("%s: %s; the clip list covers every calibrated tensor", json_path, how)
            return None, how
    for c in quantize.get("centred") or ():
        if isinstance(c, dict) and isinstance(c.get("tensor"), str):
            shift, amax = _number(c.get("shift")), _number(c.get("amax"))
            if shift is not None and amax is not None:
                ranges[c["tensor"]] = shift + amax
    return ranges, how
