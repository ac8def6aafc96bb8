"""``<plan>.json``: what an engine was built from and for, and the checks made when loading one.

A TensorRT plan only runs on the TensorRT version that built it and is tuned for one GPU model
(TensorRT refuses another compute capability and warns about another GPU model). The JSON lets
trtq refuse a mismatching plan with a one-line message before TensorRT fails in its own words.
Pure Python: no TensorRT needed, so the checks are unit-tested on CPU.
"""

import json
from pathlib import Path
from typing import Any, Optional

from trtq.errors import ModelError

FORMAT = "trtq-plan/1"


def metadata_path(plan_path: Path) -> Path:
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + ".json")


def render_metadata(meta: dict[str, Any]) -> str:
    return json.dumps(meta, indent=2, sort_keys=True) + "\n"


def read_metadata(plan_path: Path) -> Optional[dict[str, Any]]:
    """The JSON beside the plan, or None when there is none. A broken JSON is a ModelError."""
    path = metadata_path(plan_path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(
            f"cannot read engine metadata {path} ({e.__class__.__name__})",
            "delete it or rebuild the engine with trtq build",
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(
            f"{path} is not trtq engine metadata (format {data.get('format') if isinstance(data, dict) else None!r})",
            "delete it or rebuild the engine with trtq build",
        )
    return data


def _same_release(a: str, b: str) -> bool:
    """TensorRT versions equal in major.minor.patch (the build number may differ)."""
    return str(a).split(".")[:3] == str(b).split(".")[:3]


def check_metadata(
    meta: dict[str, Any], plan_path: Path, trt_version: str, gpu_name: str, compute_capability: str
) -> None:
    """Raise ModelError when the plan was built by another TensorRT or for another GPU."""
    name = Path(plan_path).name
    fix = f"rebuild it here with trtq build (-o {name})"
    built_trt = meta.get("tensorrt_version")
    if built_trt and not _same_release(built_trt, trt_version):
        raise ModelError(
            f"{name} was built by TensorRT {built_trt} but TensorRT {trt_version} is installed "
            "(engines only load in the TensorRT version that built them)",
            fix,
        )
    built_cc = meta.get("compute_capability")
    if built_cc and str(built_cc) != str(compute_capability):
        raise ModelError(
            f"{name} was built for compute capability {built_cc} ({meta.get('gpu_name', '?')}) "
            f"but this GPU is {gpu_name} (compute capability {compute_capability})",
            fix,
        )
    built_gpu = meta.get("gpu_name")
    if built_gpu and str(built_gpu) != str(gpu_name):
        raise ModelError(
            f"{name} was built on {built_gpu} but this GPU is {gpu_name} (TensorRT tunes engines for one GPU model)",
            fix,
        )
