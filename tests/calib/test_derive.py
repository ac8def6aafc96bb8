"""Ranges derived from a Relu/Clip input (trtq.calib.collect.derive) equal the measured ones."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from trtq.calib.collect.accumulators import AbsMaxAccumulator
from trtq.calib.collect.derive import abs_max, derive_extremes, monotone_links


def _model(opset: int):
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    inits = []
    if opset >= 11:
        inits = [
            numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
            numpy_helper.from_array(np.array(1.25, np.float32), "hi"),
        ]
        nodes += [
            helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
            helper.make_node("Clip", ["r", "", "hi"], ["rc"]),  # chain: Relu -> Clip, no lower bound
            helper.make_node("ReduceMin", ["x"], ["m"], keepdims=0),
            helper.make_node("Clip", ["x", "m"], ["dyn"]),
        ]  # bound computed at run time: measured
    else:
        nodes += [
            helper.make_node("Clip", ["x"], ["c"], min=-0.5, max=1.25),
            helper.make_node("Clip", ["r"], ["rc"], max=1.25),
        ]
    outs = [o for n in nodes for o in n.output]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), outs


def test_links_and_derived_ranges_match_onnx_runtime():
    for opset in (6, 13):
        model, outs = _model(opset)
        tensors = ["x"] + outs
        links = monotone_links(model, tensors)
        assert set(links) == {"r", "c", "rc"}, opset  # ReduceMin and the run-time-bound Clip are measured
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(opset)
        measured, partial = AbsMaxAccumulator(), AbsMaxAccumulator()
        for _ in range(3):
            x = (rng.normal(size=(4, 5)) * 2).astype(np.float32)
            values = dict(zip(outs, sess.run(outs, {"x": x})), x=x)
            measured.update_batch(values)
            partial.update_batch({k: v for k, v in values.items() if k not in links})
        derived = derive_extremes(partial.extremes, links)
        for name in links:
            assert abs_max(derived[name]) == measured.maxima[name], (opset, name)
            assert derived[name] == measured.extremes[name]


def test_links_need_a_calibrated_input():
    model, outs = _model(13)
    assert "rc" not in monotone_links(model, ["x", "rc"])  # its input r is not calibrated
    assert monotone_links(model, ["x", "r"]) == {"r": ("x", 0.0, float("inf"))}
