"""Accuracy of a candidate model (INT8 Q/DQ ONNX, TensorRT engine) against a reference.

* :func:`compare_models` - run both on the same batches, metrics per output
  (:class:`CompareReport`: ``to_dict()``, ``render_text()``, ``gate(options)``).
* :func:`per_layer_sensitivity` - which quantized layers cost the most accuracy.

Module map: ``metrics`` (streaming per-output sums), ``accuracy`` (the report, table, gates, task
metric lines), ``evaluate`` (running the pair of models), ``sensitivity`` (per-layer analysis),
``tasks`` (which task an output serves, its metric) with ``classify``, ``detect``, ``segment``,
``ctc`` (one task each), ``onnx_runner`` (the ONNX Runtime runner).
"""

from trtq import callable_package
from trtq.compare.accuracy import CompareReport
from trtq.compare.evaluate import check_compatible, compare_models
from trtq.compare.metrics import OutputAccumulator, OutputMetrics
from trtq.compare.sensitivity import LayerRow, per_layer_sensitivity, render_layer_table

__all__ = [
    "CompareReport",
    "LayerRow",
    "OutputAccumulator",
    "OutputMetrics",
    "check_compatible",
    "compare_models",
    "per_layer_sensitivity",
    "render_layer_table",
]

# called, the package is the Python API's trtq.compare() (trtq.api; see trtq/__init__.py)
callable_package(__name__)
