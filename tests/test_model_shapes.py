"""trtq.model.infer_shapes: ONNX shape inference with the weights taking part by type and shape
only. Its types and shapes must equal onnx's own inference on the full model, including where a
small initializer's values decide a shape (Reshape) and where an old model lists its initializers
as graph inputs; input_shapes must act as editing the inputs would."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtq.model import LIGHT_INITIALIZER, calibratable_tensors, infer_shapes


def _model(ir_inputs: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3)).astype(np.float32), "w")  # 864 < LIGHT
    w2 = numpy_helper.from_array(rng.standard_normal((64, 32, 1, 1)).astype(np.float32), "w2")  # 2048: large
    fc = numpy_helper.from_array(rng.standard_normal((64 * 4 * 4, 10)).astype(np.float32), "fc")  # large
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")  # its values decide a shape
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2]),
        helper.make_node("Reshape", ["c2", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["y"]),
    ]
    inits = [w, w2, fc, shape]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])]
    if ir_inputs:  # IR 3: initializers listed as graph inputs too
        inputs += [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in inits]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=3 if ir_inputs else 8)


def _types(model: onnx.ModelProto, skip=()) -> dict:
    g = model.graph
    return {
        vi.name: vi.type.SerializeToString()
        for vi in list(g.value_info) + list(g.output) + list(g.input)
        if vi.name not in skip
    }


@pytest.mark.parametrize("ir_inputs", [False, True])
def test_types_and_shapes_equal_onnx_inference_on_the_full_model(ir_inputs):
    m = _model(ir_inputs)
    weights = {i.name for i in m.graph.initializer}
    light = infer_shapes(m)
    assert _types(light, weights) == _types(onnx.shape_inference.infer_shapes(m), weights)
    y = next(vi for vi in light.graph.output if vi.name == "y")
    assert [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim] == ["N", 10]
    # only the large float initializers left the graph; the Reshape target stayed with its values
    kept = {i.name for i in light.graph.initializer}
    assert kept == {"w", "shape"} and LIGHT_INITIALIZER > 32 * 3 * 3 * 3
    assert len(m.graph.initializer) == 4  # the caller's model is untouched


def test_input_shapes_act_as_editing_the_inputs():
    m = _model()
    edited = onnx.ModelProto()
    edited.CopyFrom(m)
    dims = edited.graph.input[0].type.tensor_type.shape
    dims.ClearField("dim")
    for d in (5, 3, 16, 16):
        dims.dim.add().dim_value = d
    weights = {i.name for i in m.graph.initializer}
    expect = _types(onnx.shape_inference.infer_shapes(edited), weights)
    assert _types(infer_shapes(m, input_shapes={"x": (5, 3, 16, 16)}), weights) == expect
    flat = next(vi for vi in infer_shapes(m, input_shapes={"x": (5, 3, 16, 16)}).graph.value_info if vi.name == "flat")
    assert [d.dim_value for d in flat.type.tensor_type.shape.dim] == [5, 1024]


def test_calibratable_tensors_never_names_a_weight():
    assert calibratable_tensors(_model()) == ["x", "c1", "r1", "c2", "flat", "y"]
    assert calibratable_tensors(_model(ir_inputs=True)) == ["x", "c1", "r1", "c2", "flat", "y"]
