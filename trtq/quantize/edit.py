"""In-place edits of a model's initializers: read, replace, add under a free name, drop unused, and
add to a node's bias input. Shared by the float rewrites (centering) and bias correction."""

from collections.abc import Collection

import numpy as np
import onnx
from onnx import numpy_helper

from trtq.quantize.graph import subgraph_names


class InitializerEditor:
    """Edits ``model``'s initializers in place; ``nodes`` maps node names to the graph's nodes."""

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.inits = {i.name: i for i in self.graph.initializer}
        self.nodes = {n.name: n for n in self.graph.node}
        outputs = {o for n in self.graph.node for o in n.output}
        self.taken = set(self.inits) | outputs | {i.name for i in self.graph.input}

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])

    def set(self, name: str, arr: np.ndarray) -> None:
        self.inits[name].CopyFrom(numpy_helper.from_array(np.asarray(arr, order="C"), name))

    def new(self, base: str, arr: np.ndarray) -> str:
        """Add ``arr`` as an initializer named ``base`` (or ``base_2``, ... if taken); its name."""
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(arr, order="C"), name))
        self.inits[name] = self.graph.initializer[-1]  # append copies: keep the graph's own message
        return name

    def new_name(self, base: str) -> str:
        """A tensor or node name not used in the graph yet: ``base``, else ``base_2``, ..."""
        names = self.taken | set(self.nodes)
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def drop_unused(self, names: Collection[str]) -> None:
        """Remove the initializers among ``names`` that no node (subgraphs included) reads any more."""
        used = {i for n in self.graph.node for i in n.input} | subgraph_names(self.graph)
        used |= {o.name for o in self.graph.output}
        gone = {n for n in names if n and n in self.inits and n not in used}
        if not gone:
            return
        keep = [i for i in self.graph.initializer if i.name not in gone]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep)
        inputs = [i for i in self.graph.input if i.name not in gone]
        del self.graph.input[:]
        self.graph.input.extend(inputs)
        for n in gone:
            del self.inits[n]

    def add_to_bias(self, node: onnx.NodeProto, slot: int, delta: np.ndarray, dtype, label: str) -> None:
        """``node``'s bias input ``slot`` += ``delta`` (in float64, kept in the bias's dtype), or a new
        ``dtype`` initializer ``<node>/<label>`` holding ``delta`` when the node has no bias."""
        if len(node.input) > slot and node.input[slot]:
            old = self.array(node.input[slot])
            self.set(node.input[slot], (old.astype(np.float64) + delta).astype(old.dtype))
            return
        while len(node.input) <= slot:
            node.input.append("")
        node.input[slot] = self.new(f"{node.name or node.output[0]}/{label}", np.asarray(delta).astype(dtype))


__all__ = ["InitializerEditor"]
