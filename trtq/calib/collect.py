"""Run the FP32 model in ONNX Runtime with the activations to calibrate exposed as outputs.

The collector streams: each ``run`` returns only the current batch's tensors; statistics are kept by
the accumulators in :mod:`trtq.calib.stats`, never the activations.
"""
import logging
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx

from trtq.errors import DataError, ModelError
from trtq.model import calibratable_tensors

log = logging.getLogger(__name__)


def select_tensors(model: onnx.ModelProto, requested: Sequence[str] = ()) -> List[str]:
    """The tensors to calibrate: all calibratable ones, or the requested subset (validated)."""
    available = calibratable_tensors(model)
    if not requested:
        if not available:
            raise ModelError("the model has no float activations to calibrate", "check the model")
        return available
    known = set(available)
    unknown = [t for t in requested if t not in known]
    if unknown:
        raise DataError(
            f"--tensors names {len(unknown)} tensor(s) that are not float activations of the model: "
            + ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else ""),
            "list them with: trtq inspect-cache CACHE --model MODEL, or omit --tensors",
        )
    wanted = set(requested)
    return [t for t in available if t in wanted]


def _with_outputs(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """A copy of the model whose graph outputs are exactly ``tensors`` (types from inference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception:
        inferred = m
    typed = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    typed.update({vi.name: vi for vi in inferred.graph.input})
    del m.graph.output[:]
    for name in tensors:
        if name in typed and typed[name].type.tensor_type.elem_type:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(typed[name])
            # drop shapes: ORT only needs the type, and inferred shapes can be wrong for exotic ops
            vi.type.tensor_type.ClearField("shape")
            m.graph.output.append(vi)
        else:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return m


def default_providers() -> List[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class OrtCollector:
    """ONNX Runtime session that returns the chosen activations for one batch at a time."""

    def __init__(self, model: onnx.ModelProto, tensors: Sequence[str], providers: Sequence[str] = ()):
        import onnxruntime as ort

        self.tensors = list(tensors)
        exposed = _with_outputs(model, self.tensors)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # Exposed intermediate tensors stop ORT from fusing them away; ENABLE_ALL is still safe.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Every activation is an output here, copied out to numpy on each run: ORT's arena would
        # keep a second copy of all of them alive between runs (measured on EfficientNet-Lite0,
        # batch 8: 1540 -> 1318 MiB peak RSS, no slower).
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        use = list(providers) or default_providers()
        try:
            self.session = ort.InferenceSession(exposed.SerializeToString(), opts, providers=use)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(
                f"ONNX Runtime cannot load the model: {first}",
                "check the model runs in ONNX Runtime (opset, custom ops)",
            ) from None
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, arrays: Dict[str, np.ndarray], valid: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Activations for one batch; only the first ``valid`` rows along the batch axis when given.

        A tensor is treated as batched when its leading dim equals the batch's leading dim.
        """
        batch = next(iter(arrays.values())).shape[0] if arrays else None
        feeds = {name: arrays[name] for name in self.input_names}
        try:
            values = self.session.run(self.tensors, feeds)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(f"ONNX Runtime failed to run the model: {first}", "check the input shapes") from None
        out = {}
        for name, value in zip(self.tensors, values):
            value = np.asarray(value)
            if valid is not None and valid < (batch or 0) and value.ndim > 0 and value.shape[0] == batch:
                # rows past `valid` are padding repeats of the last sample: keep them out of the stats
                value = value[:valid]
            out[name] = value
        return out
