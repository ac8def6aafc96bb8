"""How much of an engine runs in INT8, read from the engine inspector's layer list.

:func:`int8_coverage` is pure: it takes the inspector's layer dicts (``Name``, ``LayerType``,
``Inputs`` / ``Outputs`` with ``Name`` and ``Format/Datatype``; a plan built with detailed
profiling, which trtq build always asks for) and, optionally, each layer's profiled time, and
sorts every layer into one kind by the data types of its tensors:

- ``int8``: every input and output INT8 (``int8->int8``: the layer computes and hands on INT8);
- ``conversion``: INT8 and float tensors mixed (a Quantize that could not fuse, fp32->int8; a
  convolution whose Dequantize fused into it, int8->fp32): the edges of the INT8 regions;
- ``reformat``: the layers TensorRT inserts to change a tensor's layout or type (``LayerType``
  Reformat, ``Origin`` REFORMAT, or named "Reformatting CopyNode ...");
- ``float``: FP32 / FP16 / BF16 only;
- ``other``: no float or INT8 tensor at all (constants, shape arithmetic in int32/int64/bool),
  left out of the shares.

A ``fallback`` is a float layer between INT8 layers: walking its inputs back and its outputs
forward through float layers and reformats reaches a layer that touches INT8 on both sides. Such a
layer made TensorRT dequantize, compute in float and quantize again (an Add, Concat or Split whose
Q/DQ did not let it fuse or run in INT8). Float layers before the first INT8 layer (pre-processing)
or after the last (the head) are float by design and are not fallbacks.

Shares: ``layer_share`` is int8 layers over the counted layers (all but ``other``);
``time_share`` is the int8 layers' profiled time over the whole profiled time (every layer the
profiler reported), None without times. ``int8_copy_share`` is the profiled time of the reformats
that are INT8 on both sides (a Concat's copies, a layout change between INT8 layers): INT8 data
moved rather than computed or converted, which a placement cannot turn into int8 layers (YOLOv8n
on TensorRT 8.6: 22% of its time, mostly its C2f Concats' copies; benchmarks/README.md).
``slowest`` names the profiled layers that took longest, as [name, mean ms, kind] (kind '' for a
layer the profiler reported and the inspector did not): the hot spots, which can differ between
two builds of one file (PP-OCRv4 det's input Quantize; benchmarks/README.md, eighth session).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PROFILE_RUNS = 20  # profiled enqueues behind trtq build's time share (trt.layers.engine_coverage)
SLOWEST = 5  # slowest layers an Int8Coverage names (a build's hot spots differ between builds)
FLOATS = frozenset({"fp32", "fp16", "bf16"})
_TYPES = (
    ("int8", "int8"),
    ("fp8", "fp8"),
    ("fp16", "fp16"),
    ("half", "fp16"),
    ("bf16", "bf16"),
    ("fp32", "fp32"),
    ("float", "fp32"),
    ("int32", "int32"),
    ("int64", "int64"),
    ("bool", "bool"),
)


def datatype(entry: Any) -> str:
    """'int8' / 'fp16' / 'fp32' ... of one inspector tensor entry (its ``Format/Datatype``, long as
    'Channel major INT8 format where channel % 32 == 0' or short as 'Int8'); '' when unknown."""
    text = str(entry.get("Format/Datatype", "")).lower() if isinstance(entry, dict) else ""
    return next((name for key, name in _TYPES if key in text), "")


@dataclass
class Int8Coverage:
    layers: int  # counted layers: int8 + conversion + reformat + float
    int8_layers: int
    layer_share: float  # int8_layers / layers
    time_share: float | None = None  # int8 layers' share of the profiled time
    profiled_ms: float | None = None  # sum of the layers' mean times
    int8_copy_share: float | None = None  # reformats INT8 on both sides: share of the profiled time
    slowest: list = field(default_factory=list)  # [name, mean ms, kind] of the SLOWEST slowest profiled layers
    conversions: list[str] = field(default_factory=list)
    reformats: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # float layers between INT8 layers
    other: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _names(entries: Any) -> list[str]:
    return [str(e["Name"]) for e in entries or [] if isinstance(e, dict) and "Name" in e]


def is_reformat(layer: dict) -> bool:
    return (
        str(layer.get("LayerType", "")).lower() == "reformat"
        or str(layer.get("Origin", "")).upper() == "REFORMAT"
        or str(layer.get("Name", "")).startswith("Reformatting CopyNode")
    )


def tensor_entries(layer: dict) -> list[dict]:
    """The inspector entries (dicts with ``Name``, ``Format/Datatype``, ``Dimensions``) of a layer's
    input and output tensors."""
    return [e for e in list(layer.get("Inputs") or []) + list(layer.get("Outputs") or []) if isinstance(e, dict)]


def _tensor_types(layer: dict) -> set[str]:
    """The float / INT8 data types among a layer's input and output tensors."""
    return {datatype(e) for e in tensor_entries(layer)} & (FLOATS | {"int8"})


def layer_kind(layer: dict) -> str:
    """int8 / conversion / reformat / float / other of one inspector layer dict (module doc)."""
    types = _tensor_types(layer)
    if not types:
        return "other"
    if is_reformat(layer):
        return "reformat"
    if types == {"int8"}:
        return "int8"
    return "conversion" if "int8" in types else "float"


def _reaches_int8(start: int, step: Mapping[int, set[int]], kinds: Sequence[str]) -> bool:
    """Whether walking ``step`` (producers or consumers) from layer ``start`` through float layers
    and reformats reaches a layer that touches INT8."""
    seen, todo = {start}, list(step.get(start, ()))
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if kinds[i] in ("int8", "conversion"):
            return True
        if kinds[i] in ("float", "reformat"):
            todo.extend(step.get(i, ()))
    return False


def _fallbacks(layers: Sequence[dict], kinds: Sequence[str]) -> list[str]:
    producer = {t: i for i, layer in enumerate(layers) for t in _names(layer.get("Outputs"))}
    up: dict[int, set[int]] = {}
    down: dict[int, set[int]] = {}
    for i, layer in enumerate(layers):
        for t in _names(layer.get("Inputs")):
            if t in producer and producer[t] != i:
                up.setdefault(i, set()).add(producer[t])
                down.setdefault(producer[t], set()).add(i)
    return [
        str(layers[i].get("Name"))
        for i, kind in enumerate(kinds)
        if kind == "float" and _reaches_int8(i, up, kinds) and _reaches_int8(i, down, kinds)
    ]


_NAME_SEPARATORS = re.compile(r"[\s(),]+")


def layer_nodes(layer_name: str, nodes: Collection[str]) -> list[str]:
    """The names of ``nodes`` (ONNX node names) that an engine layer's name carries, in order.

    TensorRT names a fused layer after the layers in it: ``a + b + c`` for a fusion, ``PWN(a, b)``
    for a pointwise one (nested), ``Reformatting CopyNode for Input Tensor 0 to <layer>``, and a
    layer after the ONNX node it came from; ``(Unnamed Layer* 22) [Shuffle]`` and constant names
    match no node. A node name with spaces, commas or parentheses is not found."""
    wanted = set(nodes)
    found = [t for t in _NAME_SEPARATORS.split(str(layer_name)) if t in wanted]
    return list(dict.fromkeys(found))


def int8_coverage(layers: Sequence[Any], times: Mapping[str, float] | None = None) -> Int8Coverage | None:
    """The INT8 coverage of an engine from its inspector layer list (module doc); ``times``: each
    layer's mean profiled ms by name. None when the list has no layer detail (names only: a plan
    built without detailed profiling, or a TensorRT without the inspector)."""
    detailed = [layer for layer in layers if isinstance(layer, dict) and "Name" in layer]
    if not detailed:
        return None
    kinds = [layer_kind(layer) for layer in detailed]
    counted = sum(k != "other" for k in kinds)
    int8 = [str(layer["Name"]) for layer, k in zip(detailed, kinds) if k == "int8"]
    cov = Int8Coverage(
        layers=counted,
        int8_layers=len(int8),
        layer_share=len(int8) / counted if counted else 0.0,
        conversions=[str(layer["Name"]) for layer, k in zip(detailed, kinds) if k == "conversion"],
        reformats=[str(layer["Name"]) for layer, k in zip(detailed, kinds) if k == "reformat"],
        fallbacks=_fallbacks(detailed, kinds),
        other=kinds.count("other"),
    )
    if times:
        total = float(sum(times.values()))
        moved = [layer for layer, k in zip(detailed, kinds) if k == "reformat" and _tensor_types(layer) == {"int8"}]
        cov.profiled_ms = total
        cov.time_share = sum(float(times.get(n, 0.0)) for n in int8) / total if total > 0 else 0.0
        moved_ms = sum(float(times.get(str(layer["Name"]), 0.0)) for layer in moved)
        cov.int8_copy_share = moved_ms / total if total > 0 else 0.0
        cov.slowest = slowest_layers(times, {str(layer["Name"]): k for layer, k in zip(detailed, kinds)})
    return cov


def slowest_layers(times: Mapping[str, float], kinds: Mapping[str, str], n: int = SLOWEST) -> list[list]:
    """[name, mean ms, kind] of the ``n`` layers of ``times`` that took longest, largest first
    (kind '' for a name ``kinds`` lacks: a layer the profiler reported and the inspector did not)."""
    top = sorted(times.items(), key=lambda kv: -float(kv[1]))[:n]
    return [[str(name), round(float(ms), 4), kinds.get(str(name), "")] for name, ms in top]


__all__ = [
    "FLOATS",
    "PROFILE_RUNS",
    "Int8Coverage",
    "datatype",
    "int8_coverage",
    "is_reformat",
    "layer_kind",
    "layer_nodes",
    "slowest_layers",
    "tensor_entries",
]
