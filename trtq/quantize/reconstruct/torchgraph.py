"""trtq's Q/DQ model as a torch graph: the same computation, with each Q/DQ pair a quantizer.

:class:`TorchGraph` reads a Q/DQ model as trtq writes it (``rewrite.insert_qdq``: symmetric int8,
zero point 0, one QuantizeLinear feeding one DequantizeLinear) and makes

- one :class:`Step` per other node (a torch function from :mod:`~trtq.quantize.reconstruct.ops`),
- a weight quantizer for each pair on a constant (looked up by the DequantizeLinear's output name
  whenever a step reads it),
- an activation step for each pair on a computed tensor or graph input (input: the float tensor,
  output: the DequantizeLinear's output).

With every quantizer off (:meth:`TorchGraph.quantize` False) the graph computes the float model the
Q/DQ model was made from (the weights are the float initializers behind their pairs); on, it
computes what ONNX Runtime with Q/DQ semantics and TensorRT compute. :meth:`TorchGraph.run`
evaluates any run of steps on a dict of tensors, which is how a block is run alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx

from trtq.errors import ModelError
from trtq.quantize.graph import GraphIndex, attr, default_opset, has_subgraph
from trtq.quantize.reconstruct.ops import UNSUPPORTED_HINT, convert_node
from trtq.quantize.reconstruct.quantizers import classes

WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class Step:
    name: str
    op: str  # the ONNX op type, or "QDQ" for an activation pair
    inputs: list[str]
    outputs: list[str]
    fn: Callable[..., Any]
    weights: list[str] = field(default_factory=list)  # weight quantizers it reads (DQ output names)


class _ConstantArrays:
    """name -> numpy array of an initializer (None for anything else)."""

    def __init__(self, index: GraphIndex):
        self.index = index

    def get(self, name: str):
        return self.index.array(name) if self.index.is_constant(name) else None


class TorchGraph:
    """The torch form of a Q/DQ model (see the module doc)."""

    def __init__(self, model: onnx.ModelProto, device: Any = "cpu"):
        import torch

        weight_cls, act_cls = classes()
        self.device = torch.device(device)
        index = GraphIndex(model)
        opset = default_opset(model)
        self.graph_inputs = list(index.graph_inputs)
        self.graph_outputs = [o.name for o in model.graph.output]
        self.steps: list[Step] = []
        self.weights: dict[str, Any] = {}  # DQ output -> weight quantizer
        self.weight_sources: dict[str, str] = {}  # DQ output -> W's initializer name
        self.activations: dict[str, Any] = {}  # DQ output -> activation quantizer
        self.scale_names: dict[str, str] = {}  # DQ output -> the pair's scale initializer
        self.act_tensors: dict[str, str] = {}  # DQ output -> the float tensor it quantizes
        paired: set[str] = set()
        for node in index.nodes:
            if has_subgraph(node):
                raise ModelError(
                    f"reconstruct: {node.op_type} {node.name} has a subgraph: not supported", UNSUPPORTED_HINT
                )
            if node.op_type == "QuantizeLinear":
                dq = self._pair(index, node)
                paired.add(dq.name)
                scale = index.array(node.input[1])
                if index.is_constant(node.input[0]):
                    w = index.array(node.input[0])
                    self.weights[dq.output[0]] = weight_cls(
                        w, scale, int(attr(node, "axis", 1)), node.input[0], self.device
                    )
                    self.weight_sources[dq.output[0]] = node.input[0]
                    continue
                if scale.size != 1:
                    raise ModelError(
                        f"reconstruct: activation {node.input[0]} has a per-channel scale",
                        "quantize the FP32 model with trtq (per-tensor activation scales)",
                    )
                quantizer = act_cls(float(scale.reshape(-1)[0]), node.input[0], self.device)
                self.activations[dq.output[0]] = quantizer
                self.scale_names[dq.output[0]] = node.input[1]
                self.act_tensors[dq.output[0]] = node.input[0]
                self.steps.append(Step(node.name, "QDQ", [node.input[0]], [dq.output[0]], quantizer))
                continue
            if node.op_type == "DequantizeLinear":
                if node.name not in paired:
                    raise ModelError(
                        f"reconstruct: DequantizeLinear {node.name} without its QuantizeLinear",
                        "reconstruct quantizes the FP32 model itself: pass the FP32 model",
                    )
                continue
            self.steps.append(
                Step(
                    node.name,
                    node.op_type,
                    list(node.input),
                    list(node.output),
                    convert_node(node, opset, _ConstantArrays(index)),
                    [i for i in node.input if i in self.weights],
                )
            )
        self.batch_constants: dict[str, Any] = {}  # name -> (values, mask of the entries that are the batch size)
        self.batch = 0  # samples in the run going on (for batch_constants)
        self.learned_biases: dict[str, Any] = {}
        self.reads = {name: len(index.consumers.get(name, [])) for name in index.initializers}
        skip = set(self.weights) | {i.input[0] for i in index.nodes if i.op_type == "QuantizeLinear"}
        self.constants = {
            name: self._tensor(index.array(name))
            for name in index.initializers
            if name not in skip or self._read_elsewhere(index, name)
        }

    # -- construction helpers --------------------------------------------------------------------
    @staticmethod
    def _pair(index: GraphIndex, q: onnx.NodeProto) -> onnx.NodeProto:
        users = index.consumer_nodes(q.output[0])
        if len(users) != 1 or users[0].op_type != "DequantizeLinear" or q.output[0] in index.graph_outputs:
            raise ModelError(
                f"reconstruct: QuantizeLinear {q.name} does not feed exactly one DequantizeLinear",
                "pass the FP32 model: trtq places the Q/DQ pairs itself",
            )
        dq = users[0]
        for node in (q, dq):
            zp = node.input[2] if len(node.input) > 2 else ""
            if zp and (not index.is_constant(zp) or np.any(index.array(zp) != 0) or index.array(zp).dtype != np.int8):
                raise ModelError(
                    f"reconstruct: {node.name} is not symmetric int8 (zero point 0)",
                    "pass the FP32 model: trtq places the Q/DQ pairs itself",
                )
        if dq.input[1] != q.input[1]:
            raise ModelError(f"reconstruct: {q.name} and {dq.name} have different scales", UNSUPPORTED_HINT)
        return dq

    @staticmethod
    def _read_elsewhere(index: GraphIndex, name: str) -> bool:
        return any(n.op_type != "QuantizeLinear" for n in index.consumer_nodes(name))

    def _tensor(self, array: np.ndarray):
        import torch

        return torch.as_tensor(np.array(array, copy=True), device=self.device)

    # -- modes ------------------------------------------------------------------------------------
    def quantize(self, on: bool, weight_mode: str = "hard") -> None:
        """Every quantizer on (weights in ``weight_mode``: nearest, soft, hard) or off (the float model)."""
        for q in self.activations.values():
            q.enabled = on
            q.drop = 0.0
        for w in self.weights.values():
            w.mode = weight_mode if on else "float"

    # -- biases ------------------------------------------------------------------------------------
    def learn_biases(self, steps: list[Step]) -> list:
        """The float biases of the weighted layers among ``steps`` as parameters (a bias read by
        one node only), each learned once; they replace the constants."""
        import torch

        params = []
        for st in steps:
            if st.op not in ("Conv", "ConvTranspose", "Gemm") or len(st.inputs) < 3 or not st.weights:
                continue
            name = st.inputs[2]
            value = self.constants.get(name)
            if (
                value is None
                or name in self.learned_biases
                or not value.is_floating_point()
                or self.reads.get(name, 0) != 1
            ):
                continue
            param = torch.nn.Parameter(value.clone())
            self.constants[name] = param
            self.learned_biases[name] = param
            params.append(param)
        return params

    # -- running ----------------------------------------------------------------------------------
    def value(self, name: str, env: dict):
        if name in env:
            return env[name]
        quantizer = self.weights.get(name)
        if quantizer is not None:
            return quantizer()
        if name in self.constants:
            return self.constants[name]
        if name in self.batch_constants:
            values, mask = self.batch_constants[name]
            out = values.clone()
            out[mask] = self.batch
            return out
        raise ModelError(
            f"reconstruct: tensor {name} has no value (not computed before it is read)",
            "the model's nodes must be in topological order",
        )

    def run(self, steps: list[Step], env: dict, keep: set | None = None, batch: int = 0) -> dict:
        """Run ``steps`` on ``env`` (name -> tensor, updated in place) for ``batch`` samples. With
        ``keep``, tensors not in it are dropped once no later step of ``steps`` reads them (saves
        memory without autograd)."""
        self.batch = batch
        last = {}
        if keep is not None:
            for k, st in enumerate(steps):
                for n in st.inputs:
                    last[n] = k
        for k, st in enumerate(steps):
            args = [self.value(n, env) if n else None for n in st.inputs]
            while args and args[-1] is None:
                args.pop()
            out = st.fn(*args)
            if len(st.outputs) == 1:
                env[st.outputs[0]] = out
            else:
                for name, v in zip(st.outputs, out):
                    if name:
                        env[name] = v
            if keep is not None:
                for n in st.inputs:
                    if n in env and last.get(n) == k and n not in keep:
                        del env[n]
        return env

    def run_model(self, feeds: dict, batch: int = 0) -> list:
        """The whole graph on ``feeds`` (name -> tensor): the graph outputs, in order."""
        env = dict(feeds)
        self.run(self.steps, env, keep=set(self.graph_outputs), batch=batch)
        return [env[o] for o in self.graph_outputs]

    # -- shape computations -----------------------------------------------------------------------
    def shape_steps(self) -> tuple[list[int], set[str]]:
        """The steps that compute from tensor shapes and constants only (Shape and what follows it:
        a Reshape's target, say), and their outputs."""
        derived: set[str] = set()
        found = []
        for k, st in enumerate(self.steps):
            read = [n for n in st.inputs if n and n not in self.constants and n not in self.weights]
            if st.op in ("Shape", "Size") or (st.op != "QDQ" and read and all(n in derived for n in read)):
                derived.update(o for o in st.outputs if o)
                found.append(k)
        return found, derived

    def fold_shape_steps(self, probes: list[tuple[int, dict]]) -> bool:
        """Replace the shape computations by constants, or by batch constants where an entry is the
        batch size (``probes``: (samples, every tensor's value) of float runs at two batch sizes).
        False (nothing changed) when some value follows the batch otherwise."""
        found, derived = self.shape_steps()
        if not found:
            return True
        if derived & set(self.graph_outputs):
            return False
        removed = set(found)
        read = {n for k, st in enumerate(self.steps) if k not in removed for n in st.inputs}
        (b1, env1), (b2, env2) = probes
        folded: dict[str, Any] = {}
        varying: dict[str, Any] = {}
        for name in derived & read:
            v1, v2 = env1.get(name), env2.get(name)
            if v1 is None or v2 is None or v1.shape != v2.shape or v1.dtype != v2.dtype:
                return False
            if bool((v1 == v2).all()):
                folded[name] = v1
                continue
            mask = v1 != v2
            if v1.is_floating_point() or not (bool((v1[mask] == b1).all()) and bool((v2[mask] == b2).all())):
                return False
            varying[name] = (v1, mask)
        self.constants.update(folded)
        self.batch_constants.update(varying)
        self.steps = [st for k, st in enumerate(self.steps) if k not in removed]
        return True
