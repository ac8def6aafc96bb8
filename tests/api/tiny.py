"""A two-input ONNX model and a config that feeds it from .npy files, for the API's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def two_input_model(path: Path) -> str:
    """``y = Relu(MatMul(a + 2 b, W))``: inputs a, b of shape [N, 4, 16] (float32), W [16, 16]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.linspace(-1, 1, 256, dtype=np.float32).reshape(16, 16), "W")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    nodes = [
        helper.make_node("Mul", ["b", "two"], ["b2"], name="scale"),
        helper.make_node("Add", ["a", "b2"], ["s"], name="add"),
        helper.make_node("MatMul", ["s", "W"], ["m"], name="matmul"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4, 16]) for n in ("a", "b")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16])
    graph = helper.make_graph(nodes, "two", inputs, [output], [w, two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return str(path)


def write_npy_config(folder: Path, model: str, arrays: dict[str, np.ndarray], method: str) -> Path:
    """A config whose data.inputs read each array from its own .npy file."""
    lines = [f"model: {model}", "data:", "  inputs:"]
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
        lines += [f"    {name}:", f"      npy: [{folder / f'{name}.npy'}]"]
    lines += ["calibrate:", f"  method: {method}"]
    config = folder / "config.yaml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config
