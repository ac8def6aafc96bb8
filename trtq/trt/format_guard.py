"""Find tensors an engine stores padded to many times their size (pure; no TensorRT).

TensorRT's INT8 kernels like channel-vectorized layouts: 4 or 32 channels per element. A tensor
with fewer channels than the vector is padded with zeros, so a 3-channel image stored 32 channels
wide takes 32/3 = 10.7 times its bytes, written by the Quantize that fills it and read by the
convolution after it. Whether a build picks such a layout for a network's first layer varies from
build to build; where it does, the padded copy can be the slowest layer of the engine
(benchmarks/README.md, docs/decisions.md D38). TensorRT 8.6's algorithm selector, the API that
could forbid the layout, offers no choices at all at builder optimization level 0 (the build then
fails), and TensorRT 11 removed it; so trtq reads the layouts of the engine it built instead
(:func:`padded_tensors` on the engine inspector's layer list) and builds again while one is padded
(``build.layout_rebuilds``, :func:`trtq.pipeline.build.build_network`). A rebuild can win at most
the time of the layers that write or read the padded tensor, so it is asked for only where those
layers take ``MIN_SHARE`` of the engine's profiled time or more (:class:`LayoutCheck`).
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trtq.trt.coverage import tensor_entries

WASTE = 8.0  # stored / real size at which a layout counts as padded: 3 or 4 channels in 32, 1 in 8
MIN_SHARE = 0.02  # profiled time share of the padded tensors' layers below which a rebuild cannot pay

_WORDS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16, "thirty-two": 32}
_WIDE = re.compile(r"\b([a-z-]+) wide channel vectorized")
_MULTIPLE = re.compile(r"channel % (\d+) == 0")


@dataclass(frozen=True)
class PaddedTensor:
    layer: str
    tensor: str
    dims: tuple[int, ...]
    format: str
    ratio: float  # stored channels / real channels

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dims": list(self.dims), "ratio": round(self.ratio, 2)}


def vector_width(fmt: str) -> int:
    """Channels per stored element of an inspector 'Format/Datatype' text ('Thirty-two wide channel
    vectorized row major Int8 format' -> 32, 'Channel major FP16 format where channel % 8 == 0' -> 8),
    1 for unvectorized or unknown formats."""
    text = fmt.lower()
    m = _WIDE.search(text)
    if m:
        return _WORDS.get(m.group(1), 1)
    m = _MULTIPLE.search(text)
    return int(m.group(1)) if m else 1


def padding_ratio(dims: Sequence[int], width: int) -> float:
    """Stored / real size of a tensor whose channel dim (index 1) is padded to a multiple of ``width``."""
    if width <= 1 or len(dims) < 2 or dims[1] <= 0:  # a dynamic dim (-1): nothing to judge by
        return 1.0
    channels = int(dims[1])
    return -(-channels // width) * width / channels


def padded_tensors(layers: Sequence[Any], waste: float = WASTE) -> list[PaddedTensor]:
    """Every input or output of the inspector's layer dicts stored at ``waste`` times its size or
    more, each tensor once (first where it appears); [] for names-only lists."""
    found: dict[str, PaddedTensor] = {}
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        for entry in tensor_entries(layer):
            fmt = str(entry.get("Format/Datatype", ""))
            dims = tuple(int(d) for d in entry.get("Dimensions") or ())
            ratio = padding_ratio(dims, vector_width(fmt))
            name = str(entry.get("Name", ""))
            if ratio >= waste and name not in found:
                found[name] = PaddedTensor(str(layer.get("Name", "")), name, dims, fmt, ratio)
    return list(found.values())


def padded_share(layers: Sequence[Any], times: Mapping[str, float], padded: Sequence[PaddedTensor]) -> float:
    """Share of the profiled time (``times``: layer name -> mean ms) spent in the layers that write or
    read a tensor of ``padded``: what a build without the padding could win at most."""
    names = {p.tensor for p in padded}
    touching = {
        str(layer.get("Name", ""))
        for layer in layers
        if isinstance(layer, dict) and any(str(e.get("Name", "")) in names for e in tensor_entries(layer))
    }
    total = float(sum(times.values()))
    return sum(float(ms) for name, ms in times.items() if name in touching) / total if total > 0 else 0.0


@dataclass
class LayoutCheck:
    """What one engine's layouts say (:func:`check_layouts`), with the profile they came from, which
    trtq build hands on to its INT8 coverage so the engine is loaded and profiled once."""

    padded: list[PaddedTensor]
    share: float  # profiled time share of the layers that write or read a padded tensor
    times: dict[str, float] = field(default_factory=dict)
    inspected: list = field(default_factory=list)

    def worth_rebuilding(self, min_share: float = MIN_SHARE) -> bool:
        return bool(self.padded) and self.share >= min_share

    def same_layouts(self, other: "LayoutCheck") -> bool:
        """The same tensors padded in the same formats as ``other`` (another build's check)."""
        return {(p.tensor, p.format) for p in self.padded} == {(p.tensor, p.format) for p in other.padded}

    def record(self, rebuilds: int) -> dict[str, Any]:
        """The plan metadata's ``layout_rebuilds``."""
        return {"rebuilds": rebuilds, "padded": [p.to_dict() for p in self.padded], "share": round(self.share, 4)}


def check_layouts(inspected: Sequence[Any], times: Mapping[str, float], waste: float = WASTE) -> LayoutCheck:
    """The padded tensors of an engine's inspector list and the time share of their layers."""
    padded = padded_tensors(inspected, waste)
    return LayoutCheck(padded, padded_share(inspected, times, padded) if padded else 0.0, dict(times), list(inspected))
