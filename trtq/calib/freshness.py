"""Is this calibration cache for this model? (provenance checks used by quantize and build)

A cache written by ``trtq calibrate`` has ``<cache>.json`` beside it with the model's sha256 and the
exact amax per tensor. A cache whose provenance names another model is refused unless the user
passes ``--allow-stale``. Caches from elsewhere (TensorRT, ONNX Runtime) have no provenance: they
are accepted with a warning, and the quantizer still refuses one that shares no tensor with the model.
"""

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from trtq.errors import CacheError
from trtq.fileio import sha256_file
from trtq.model import model_sha256

log = logging.getLogger(__name__)


def provenance_matches_cache(provenance: Mapping, amax: Mapping[str, float]) -> bool:
    """True when the JSON describes this cache (same tensors, amax equal to float32 precision)."""
    recorded = provenance.get("amax")
    if not isinstance(recorded, dict) or set(recorded) != set(amax):
        return False
    for name, value in amax.items():
        ref = recorded[name]
        if not isinstance(ref, (int, float)):
            return False
        if not math.isclose(float(ref), float(value), rel_tol=1e-6, abs_tol=1e-30):
            return False
    return True


def check_cache_for_model(
    cache_path: Path, model_path: Path, allow_stale: bool = False, amax: Optional[Mapping[str, float]] = None
) -> Optional[dict]:
    """Raise CacheError if the cache's provenance names another model; return the provenance.

    ``amax`` (the cache's table) lets the check notice a JSON that no longer describes the cache
    (the cache was overwritten by another tool): such provenance is ignored with a warning.
    """
    from trtq.calib.cache import read_provenance

    prov = read_provenance(Path(cache_path))
    if prov is None:
        log.warning(
            "%s has no provenance file (%s.json): cannot check it was made for %s",
            cache_path,
            Path(cache_path).name,
            model_path,
        )
        return None
    if amax is not None and not provenance_matches_cache(prov, amax):
        log.warning(
            "%s.json does not describe %s any more (the cache was rewritten); provenance ignored",
            cache_path,
            cache_path,
        )
        return None
    model = prov.get("model") if isinstance(prov.get("model"), dict) else {}
    recorded = model.get("sha256")
    actual = model_sha256(model_path)  # its external-data files included
    if recorded and recorded != actual and "external_data" not in model and recorded == sha256_file(model_path):
        log.warning(
            "%s.json predates the hashing of external data: %s's weights files cannot be checked",
            cache_path,
            Path(model_path).name,
        )
        return prov
    if recorded and recorded != actual:
        if allow_stale:
            log.warning("%s was made for another model (--allow-stale given): using it anyway", cache_path)
            return prov
        raise CacheError(
            f"{cache_path} was calibrated for a different model "
            f"(sha256 {recorded[:12]}..., {Path(model_path).name} is {actual[:12]}...)",
            "re-run trtq calibrate for this model, or pass --allow-stale to use it anyway",
        )
    return prov
