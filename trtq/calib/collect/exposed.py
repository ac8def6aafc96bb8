"""Run the FP32 model in ONNX Runtime with the activations to calibrate exposed as outputs.

The collector streams: each ``run`` returns only the current batch's tensors; statistics are kept by
the accumulators in :mod:`trtq.calib.stats`, never the activations.
"""

import logging
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import onnx

from trtq.errors import ConfigError, DataError, ModelError
from trtq.formatting import first_few
from trtq.model import calibratable_tensors, infer_shapes

log = logging.getLogger(__name__)


def select_tensors(model: onnx.ModelProto, requested: Sequence[str] = ()) -> list[str]:
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
            + first_few(unknown),
            "list them with: trtq inspect-cache CACHE --model MODEL, or omit --tensors",
        )
    wanted = set(requested)
    return [t for t in available if t in wanted]


def _with_outputs(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """A copy of the model whose graph outputs are exactly ``tensors`` (types from inference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        inferred = infer_shapes(m)
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


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def check_providers(requested: Sequence[str]) -> list[str]:
    """The requested providers, or ConfigError naming one this ONNX Runtime does not have (ONNX
    Runtime itself would print a banner and fall back to CPU)."""
    if not requested:
        return []
    import onnxruntime as ort

    available = ort.get_available_providers()
    for name in requested:
        if name not in available:
            raise ConfigError(
                f"ONNX Runtime provider '{name}' is not available here", "available: " + ", ".join(available)
            )
    return list(requested)


class OrtCollector:
    """ONNX Runtime session that returns the chosen activations for one batch at a time.

    Activations are written by ONNX Runtime straight into buffers allocated on the first batch and
    reused for every later batch of the same input shapes (I/O binding): no per-batch allocation or
    copy of the full set of activations. The arrays returned by :meth:`run`
    are therefore only valid until the next call. Tensors that are model inputs come from the
    feed itself.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        tensors: Sequence[str],
        providers: Sequence[str] = (),
        optimized: Optional[bytes] = None,
    ):
        import onnxruntime as ort

        self.tensors = list(tensors)
        graph_inputs = {i.name for i in model.graph.input}
        self._from_session = [t for t in self.tensors if t not in graph_inputs]
        # optimized: a group of trtq.calib.collect.budgeted, already ONNX Runtime's optimized graph; run as it
        # is, and keep no buffers or arena between calls (the groups of a batch must not add up)
        self._reuse = optimized is None
        exposed = _with_outputs(model, self._from_session) if optimized is None else None
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # Exposed intermediate tensors stop ORT from fusing them away; ENABLE_ALL is still safe.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimized is not None:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            opts.enable_cpu_mem_arena = False
        # ORT's worker threads spin for a while after each run by default; here the statistics
        # threads run right after it on the same cores, so let them sleep instead.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        use = list(providers) or default_providers()
        try:
            blob = optimized if optimized is not None else exposed.SerializeToString()
            self.session = ort.InferenceSession(blob, opts, providers=use)
        except Exception as e:
            raise ModelError(
                f"ONNX Runtime cannot load the model: {_first_line(e)}",
                "check the model runs in ONNX Runtime (opset, custom ops)",
            ) from None
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self._binding = None
        self._bound_key = None
        self._buffers: list[np.ndarray] = []

    def _run_session(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not self._from_session:
            return []
        key = tuple((n, a.shape, a.dtype.str) for n, a in feeds.items())
        if self._binding is not None and key == self._bound_key:
            for name, a in feeds.items():
                self._binding.bind_cpu_input(name, a)
            try:
                self.session.run_with_iobinding(self._binding)
                return self._buffers
            except Exception:
                # an output shape changed with the data (data-dependent shapes): allocate again
                self._binding = None
        try:
            values = self.session.run(self._from_session, feeds)
        except Exception as e:
            raise ModelError(
                f"ONNX Runtime failed to run the model: {_first_line(e)}", "check the input shapes"
            ) from None
        if not self._reuse:
            return values
        # ONNX Runtime's own arrays become the bound buffers: no copy, no second set in memory
        # (copying them into numpy-allocated buffers was measured slower and larger: decisions.md D22)
        self._buffers = [np.ascontiguousarray(v) for v in values]
        self._bound_key = key
        if all(b.size > 0 for b in self._buffers):
            binding = self.session.io_binding()
            for name, buf in zip(self._from_session, self._buffers):
                binding.bind_output(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            self._binding = binding
        return self._buffers

    def run(self, arrays: dict[str, np.ndarray], valid: Optional[int] = None) -> dict[str, np.ndarray]:
        """Activations for one batch; only the first ``valid`` rows along the batch axis when given.

        A tensor is treated as batched when its leading dim equals the batch's leading dim. The
        arrays are views of reused buffers: valid until the next call.
        """
        batch = next(iter(arrays.values())).shape[0] if arrays else None
        feeds = {name: np.ascontiguousarray(arrays[name]) for name in self.input_names}
        produced = dict(zip(self._from_session, self._run_session(feeds)))
        out = {}
        for name in self.tensors:
            value = produced[name] if name in produced else np.asarray(arrays[name])
            if valid is not None and valid < (batch or 0) and value.ndim > 0 and value.shape[0] == batch:
                # rows past `valid` are padding repeats of the last sample: keep them out of the stats
                value = value[:valid]
            out[name] = value
        return out


def observe(
    model: onnx.ModelProto, observers: Sequence[Any], batches, providers: Sequence[str] = (), label: str = ""
) -> None:
    """One ONNX Runtime pass of ``model`` over ``batches`` exposing every tensor the observers name
    (``observer.tensors``); each batch's values go to every ``observer.add(values)`` (valid only
    during that call: the collector reuses its buffers). ``label``: the pass's name in the progress
    (trtq.progress: one unit a batch)."""
    from trtq import progress

    tensors = sorted({t for o in observers for t in o.tensors})
    if not tensors:
        return
    collector = OrtCollector(model, tensors, providers)
    for batch in progress.counted(label or "reading activations", batches, getattr(batches, "num_batches", None)):
        values = collector.run(batch.arrays, batch.valid)
        for o in observers:
            o.add(values)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
