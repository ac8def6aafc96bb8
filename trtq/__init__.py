"""trtq: ONNX model + representative data -> calibrated, fast INT8 TensorRT engine."""

__version__ = "0.1.0"
