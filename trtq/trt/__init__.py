"""Everything that touches TensorRT or cuda-python.

Importing this package (or any module in it) never imports ``tensorrt`` or ``cuda``: they are
loaded on first use through :mod:`trtq.trt.compat`, which turns a missing install or GPU into
:class:`trtq.errors.EnvironmentMissing` (exit 4).

Modules:
  compat      the one place TensorRT 8.6 / 10.x / 11.x differences are decided
  cuda        small cuda-python wrapper: device buffers, streams, events, device info
  metadata    ``<plan>.json`` written beside every engine, and the checks made when loading one
  build       ONNX (+ calibration cache) -> engine plan (explicit Q/DQ, implicit, fp16, fp32)
  calibrator  TensorRT calibrators: cache-only (implicit builds) and data-fed (--backend tensorrt)
  runtime     TrtRunner: run a plan on host numpy arrays
  bench       CUDA-event timing of one or more plans
  format_guard  tensors an engine stores padded to many times their size (inspector list; pure)
"""
