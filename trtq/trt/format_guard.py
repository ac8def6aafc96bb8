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
(``build.layout_rebuilds``, :func:`trtq.pipeline.build.build_network`).
"""

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

WASTE = 8.0  # stored / real size at which a layout counts as padded: 3 or 4 channels in 32, 1 in 8

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
        for entry in list(layer.get("Inputs") or []) + list(layer.get("Outputs") or []):
            if not isinstance(entry, dict):
                continue
            fmt = str(entry.get("Format/Datatype", ""))
            dims = tuple(int(d) for d in entry.get("Dimensions") or ())
            ratio = padding_ratio(dims, vector_width(fmt))
            name = str(entry.get("Name", ""))
            if ratio >= waste and name not in found:
                found[name] = PaddedTensor(str(layer.get("Name", "")), name, dims, fmt, ratio)
    return list(found.values())
