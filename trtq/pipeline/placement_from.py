"""``quantize.placement_from`` (``--placement-from``): the Q/DQ placement a ``build --tune-placement``
search kept, read from its engine's metadata (``tuning.chosen``: placement, nodes left float,
attention setting) and applied to quantize's options. The tuned Q/DQ file can then be written again
without searching again: for TensorRT 11 (explicit INT8 only), for another GPU, or to ship the ONNX.

The file may be the engine (its ``.plan.json`` beside it is read), that JSON, or ``build --json``'s
output. Every node the search left float must exist in the model being quantized: a search of
another model is refused, not half applied."""

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

from trtq.errors import ModelError, UsageError
from trtq.formatting import first_few
from trtq.quantize.fused import PLACEMENTS
from trtq.trt.metadata import FORMAT, read_metadata

log = logging.getLogger(__name__)

ATTENTION = ("float", "int8")
FIX = "pass the engine (or its .plan.json) that trtq build --tune-placement wrote"


def engine_metadata(path: Path) -> dict[str, Any]:
    """The trtq engine metadata in ``path``: a plan (its JSON beside it), the JSON itself, or
    ``build --json``'s output (its ``metadata``). ModelError for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"--placement-from: {path} does not exist or is not a file", FIX)
    try:
        with path.open("rb") as f:
            head = f.read(1)  # a plan may be hundreds of MB: only its first byte tells it from JSON
    except OSError as e:
        raise ModelError(f"--placement-from: cannot read {path} ({e.__class__.__name__})", FIX) from None
    if head != b"{":  # a plan: the metadata is beside it
        meta = read_metadata(path)
        if meta is None:
            raise ModelError(f"--placement-from: {path} has no {path.name}.json beside it", FIX)
        return meta
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"--placement-from: cannot read {path} as JSON ({e.__class__.__name__})", FIX) from None
    if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
        data = data["metadata"]  # build --json
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"--placement-from: {path} is not trtq engine metadata", FIX)
    return data


def tuned_choice(path: Path) -> dict[str, Any]:
    """``tuning.chosen`` of the engine metadata at ``path``, checked: an INT8 placement of a known
    kind, a list of node names, an attention setting."""
    name = Path(path).name
    tuning = engine_metadata(path).get("tuning")
    if not isinstance(tuning, dict) or not isinstance(tuning.get("chosen"), dict):
        raise ModelError(
            f"--placement-from: {name} records no placement search (built without --tune-placement)",
            "build with --tune-placement first, or set --placement / --exclude yourself",
        )
    chosen = tuning["chosen"]
    if chosen.get("precision", "int8") != "int8":
        raise ModelError(
            f"--placement-from: the search of {name} kept the {chosen.get('precision')} engine without Q/DQ "
            "(INT8 did not pay): there is no INT8 placement to apply",
            "build --precision fp16, or tune again with --tune-float report to keep the best INT8 engine",
        )
    left = chosen.get("left_float")
    if (
        chosen.get("placement") not in PLACEMENTS
        or not isinstance(left, list)
        or not all(isinstance(n, str) for n in left)
        or chosen.get("attention", "float") not in ATTENTION
    ):
        raise ModelError(f"--placement-from: {name} has a malformed tuning.chosen record", FIX)
    return chosen


def with_tuned_placement(options: Any, model: Any) -> Any:
    """``options`` (QuantizeOptions) with the placement, attention setting and float nodes of
    ``options.placement_from`` applied (``exclude`` keeps the user's patterns and gains the nodes
    by exact name, an anchored regex where a name is also an op type); ``options`` unchanged when
    it names no file."""
    if not options.placement_from:
        return options
    path = Path(options.placement_from)
    chosen = tuned_choice(path)
    names = {n.name for n in model.graph.node}
    missing = [n for n in chosen["left_float"] if n not in names]
    if missing:
        raise ModelError(
            f"--placement-from: {path.name} was tuned on another model: {len(missing)} of the nodes it "
            f"leaves float are not in this one ({first_few(missing, 3)})",
            "pass the engine tuned for this model, or tune it with build --tune-placement",
        )
    placement = chosen["placement"]
    attention = chosen.get("attention") or options.attention
    if options.placement not in ("auto", placement):
        log.warning(
            "quantize.placement %s is replaced by %s, the placement %s kept", options.placement, placement, path.name
        )
    log.info(
        "placement from %s: %s, %d node(s) float, attention %s",
        path.name,
        placement,
        len(chosen["left_float"]),
        attention,
    )
    op_types = {n.op_type for n in model.graph.node}  # a node named like an op type: an anchored regex
    exclude = tuple(options.exclude) + tuple(f"^{re.escape(n)}$" if n in op_types else n for n in chosen["left_float"])
    return dataclasses.replace(options, placement=placement, attention=attention, exclude=exclude)


def refuse_with_search(options: Any) -> None:
    """``--placement-from`` applies a finished search; ``--tune-placement`` runs a new one."""
    if options.placement_from:
        raise UsageError(
            "--placement-from applies the placement an earlier search kept, --tune-placement searches again",
            "pass one of them",
        )
