"""``trtq bench``'s step: time TensorRT engines (trtq.trt.bench), and profile them layer by layer
(trtq.trt.layers) when asked."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtq.errors import ModelError


def bench(cfg: Any, plans: Sequence[Path], *, layers: bool = False) -> tuple[list, list | None]:
    """(timings, layer profiles or None) of ``plans``, as ``cfg.bench`` says. The paths are checked
    before TensorRT is loaded: a wrong path is the user's first problem."""
    from trtq.fileio import non_regular_kind

    for p in plans:
        if not Path(p).exists():
            raise ModelError(f"engine not found: {p}", "check the path, or build it with trtq build")
        if non_regular_kind(p):
            raise ModelError(f"engine path {p} is {non_regular_kind(p)}", "pass a .plan file from trtq build")
        if not os.access(p, os.R_OK):
            raise ModelError(f"cannot read engine {p}: permission denied", "fix its permissions")
    from trtq.trt.bench import bench_plans

    results = bench_plans([Path(p) for p in plans], cfg.bench)
    if not layers:
        return results, None
    from trtq.trt.layers import profile_layers

    return results, [profile_layers(Path(p)) for p in plans]
