"""Sharded calibration: ``--shard I/N``, ``--ranges``, and ``trtq merge-stats``.

Calibration is a reduction over the samples, and both statistics trtq keeps are exactly mergeable:
``max|x|`` by ``max``, and histograms over fixed edges by integer addition. So a data set can be
split into N shards calibrated by N processes (a CI matrix, a Slurm array, Kubernetes jobs, Ray
tasks), and the merged statistics give the same cache, byte for byte, as one process:

1. pass 1 per shard: ``trtq calibrate --shard I/N --save-stats ranges-I.npz`` (max only)
2. ``trtq merge-stats ranges-*.npz -o ranges.npz`` (max of maxima)
3. pass 2 per shard: ``trtq calibrate --shard I/N --ranges ranges.npz --save-stats hist-I.npz``
   (histograms over the merged edges)
4. ``trtq merge-stats hist-*.npz -o stats.npz`` (sum of counts), then
   ``trtq calibrate --from-stats stats.npz --method M`` for any method.

Shard ``I`` (0-based) holds the samples at positions ``p % N == I`` of the data set's sample order
(sorted paths, or the seeded shuffle), whatever the order of files on disk. Every shard file
records, in its statistics meta, the full data set's fingerprint (sample list, order and
preprocessing), the model's sha256, the trtq version and ``shard: {index, count, pass,
ranges_sha256}``; merging refuses files that disagree on any of them, duplicate or missing shards,
and pass-2 shards that used other ranges.
"""

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from trtq.errors import CacheError, UsageError

PASS_RANGES = "ranges"
PASS_HISTOGRAM = "histogram"
PASS_ONE = "one-pass"  # mse / percentile: power-of-two histograms, complete in one pass (trtq.calib.collect.one_pass)

# the digits 0-9 only (re.ASCII: \d would take other scripts' digits, which int() reads)
_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$", re.ASCII)
MAX_SHARDS = 1_000_000  # shard files merge-stats may be given; a data set has at least as many samples


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N <= MAX_SHARDS``; UsageError otherwise (N is checked
    against the data set's samples once the data is known: :func:`prepare_shard`)."""
    m = _SHARD_RE.match(str(text))
    shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
    if not m:
        raise UsageError(
            f"--shard {shown!r} is not I/N (two whole numbers, digits 0-9)",
            "pass the 0-based shard index and the shard count, e.g. --shard 0/4",
        )
    if len(m.group(2)) > 7 or int(m.group(2)) > MAX_SHARDS:
        raise UsageError(f"--shard {shown}: at most {MAX_SHARDS} shards", "split the data into fewer shards")
    index, count = int(m.group(1)) if len(m.group(1)) <= 7 else MAX_SHARDS, int(m.group(2))
    if count < 1 or not 0 <= index < count:
        raise UsageError(
            f"--shard {shown}: the index must be in 0..N-1 and N at least 1",
            f"e.g. --shard 0/{max(count, 1)} ... --shard {max(count, 1) - 1}/{max(count, 1)}",
        )
    return index, count


def ranges_sha256(maxima: dict[str, float]) -> str:
    """Identity of a set of histogram edges: tensor names and their float64 maxima."""
    import numpy as np

    h = hashlib.sha256()
    h.update(json.dumps(list(maxima), ensure_ascii=True).encode("utf-8"))
    h.update(np.array([float(v) for v in maxima.values()], dtype="<f8").tobytes())
    return h.hexdigest()


def shard_meta(meta: dict, path: Optional[Path] = None) -> Optional[dict]:
    """The ``shard`` entry of a statistics file's meta, checked (None when there is none): ``index``
    an integer in 0..count-1 (null once merged), ``count`` an integer in 1..MAX_SHARDS, ``pass`` one
    of the three, ``ranges_sha256`` text or null. CacheError naming ``path`` otherwise: a file is
    never trusted for a count to allocate by, nor for an index to read as a number."""
    s = meta.get("shard")
    if s is None:
        return None

    def bad(what: str) -> CacheError:
        return CacheError(
            f"{path or 'the statistics file'} is not a valid shard file ({what})",
            "re-run trtq calibrate --shard I/N --save-stats for it",
        )

    if not isinstance(s, dict):
        raise bad("its shard entry is not a mapping")
    count, index = s.get("count"), s.get("index")
    if not _whole(count) or not 1 <= count <= MAX_SHARDS:
        raise bad(f"shard count {_shown(count)}, expected a whole number in 1..{MAX_SHARDS}")
    if index is not None and (not _whole(index) or not 0 <= index < count):
        raise bad(f"shard index {_shown(index)}, expected a whole number in 0..{count - 1}")
    if s.get("pass") not in (PASS_RANGES, PASS_HISTOGRAM, PASS_ONE):
        raise bad(f"pass {_shown(s.get('pass'))}")
    if not (s.get("ranges_sha256") is None or isinstance(s.get("ranges_sha256"), str)):
        raise bad("ranges_sha256 is not text")
    data = meta.get("data")
    if data is not None and not isinstance(data, dict):
        raise bad("its data entry is not a mapping")
    for key in ("samples", "skipped"):
        value = (data or {}).get(key)
        if value is not None and (not _whole(value) or value < 0):
            raise bad(f"data.{key} {_shown(value)}")
    return s


def _get(meta: dict, section: str, key: str):
    """``meta[section][key]``, None where either is missing or not a mapping (a file's meta)."""
    value = meta.get(section)
    return value.get(key) if isinstance(value, dict) else None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def statistics_key(num_bins: int, one_pass: bool, hist_elements: int) -> dict:
    """Every setting that shapes a statistics file's numbers (besides model, data, version and
    tensors, compared on their own): the histogram edges, the bin count and, for one-pass
    histograms, the per-sample element cap (a stride past it). Shards merge only when it is equal;
    the method is not in it (mse / percentile shards hold the same histograms, entropy / max the same
    maxima and counts), nor the collector, --max-memory or the batch size (same integers)."""
    return {
        "edges": "pow2" if one_pass else "linear",
        "num_bins": int(num_bins),
        "hist_elements": int(hist_elements) if one_pass else None,
    }


# ------------------------------------------------------------------------------------------------
# consistency checks between statistics files
# ------------------------------------------------------------------------------------------------


def _preprocess_of(meta: dict):
    options = _get(meta, "data", "options")
    inputs = options.get("inputs") if isinstance(options, dict) else None
    if not isinstance(inputs, dict):
        return {}
    return {str(name): src.get("preprocess") if isinstance(src, dict) else None for name, src in sorted(inputs.items())}


def check_same_origin(path: Path, meta: dict, ref_path: Path, ref: dict) -> None:
    """CacheError naming the first difference in model, data set, preprocessing, version or tensors."""
    fix = "calibrate every shard with the same trtq version, model, data and flags"
    a_model = _get(meta, "model", "sha256")
    b_model = _get(ref, "model", "sha256")
    if a_model != b_model:
        raise CacheError(
            f"{path} holds statistics of another model than {ref_path} (sha256 {str(a_model)[:12]} vs "
            f"{str(b_model)[:12]})",
            fix,
        )
    a_data = _get(meta, "data", "fingerprint")
    b_data = _get(ref, "data", "fingerprint")
    if a_data != b_data:
        if _preprocess_of(meta) != _preprocess_of(ref):
            raise CacheError(f"{path} was calibrated with other preprocessing than {ref_path}", fix)
        raise CacheError(f"{path} was calibrated on another data set (sample list or order) than {ref_path}", fix)
    if meta.get("trtq_version") != ref.get("trtq_version"):
        raise CacheError(
            f"{path} was written by trtq {meta.get('trtq_version')}, {ref_path} by trtq {ref.get('trtq_version')}", fix
        )
    if list(meta.get("tensors") or []) != list(ref.get("tensors") or []):
        raise CacheError(f"{path} covers other tensors than {ref_path}", "pass the same --tensors to every shard")


def check_same_statistics(path: Path, meta: dict, ref_path: Path, ref: dict) -> None:
    """CacheError naming the first setting of :func:`statistics_key` two shard files differ in."""
    a_key, b_key = meta.get("statistics"), ref.get("statistics")
    if a_key != b_key:
        a_key, b_key = (k if isinstance(k, dict) else {} for k in (a_key, b_key))
        keys = sorted(set(a_key) | set(b_key))
        diff = next((k for k in keys if a_key.get(k) != b_key.get(k)), "settings")
        raise CacheError(
            f"{path} was calibrated with other statistics settings than {ref_path} ({diff}: "
            f"{_shown(a_key.get(diff))} vs {_shown(b_key.get(diff))})",
            "calibrate every shard with the same --num-bins and --hist-elements",
        )


def check_ranges_fit(ranges_path: Path, meta: dict, model_sha: str, fingerprint: str, tensors: Sequence[str]) -> None:
    """The ``--ranges`` file must come from this model, data set, trtq version and tensor list."""
    from trtq import __version__

    fix = "merge the pass-1 shards of this run (trtq merge-stats) and pass that file as --ranges"
    if _get(meta, "model", "sha256") != model_sha:
        raise CacheError(f"--ranges {ranges_path} holds ranges of another model", fix)
    if _get(meta, "data", "fingerprint") != fingerprint:
        raise CacheError(f"--ranges {ranges_path} was measured on another data set or preprocessing", fix)
    if meta.get("trtq_version") != __version__:
        raise CacheError(
            f"--ranges {ranges_path} was written by trtq {meta.get('trtq_version')}, this is {__version__}", fix
        )
    if list(meta.get("tensors") or []) != list(tensors):
        raise CacheError(f"--ranges {ranges_path} covers other tensors than this run", "pass the same --tensors")
    s = shard_meta(meta, ranges_path)
    if s is not None and s.get("index") is not None and s["count"] > 1:
        raise CacheError(
            f"--ranges {ranges_path} is shard {s.get('index')}/{s.get('count')} of pass 1, not the merge", fix
        )


# ------------------------------------------------------------------------------------------------
# merge
# ------------------------------------------------------------------------------------------------


class MergeResult:
    def __init__(self, output: Path, shards: int, pass_name: str, samples: int, tensors: int):
        self.output, self.shards, self.pass_name = output, shards, pass_name
        self.samples, self.tensors = samples, tensors

    def to_dict(self) -> dict:
        return {
            "output": str(self.output),
            "shards": self.shards,
            "pass": self.pass_name,
            "samples": self.samples,
            "tensors": self.tensors,
        }


class Merged:
    """The N shards of one pass merged: what a statistics file holds (``tops`` for one-pass
    histograms), the shard count and the pass."""

    def __init__(
        self, maxima: dict, counts: dict, zeros: dict, tops: Optional[dict], meta: dict, shards: int, pass_name: str
    ):
        self.maxima, self.counts, self.zeros, self.tops, self.meta = maxima, counts, zeros, tops, meta
        self.shards, self.pass_name = shards, pass_name


def merge_shards(paths: Sequence[Path]) -> Merged:
    """Merge the N shard files of one pass (trtq.pipeline.calibrate.merge_stats writes the result).

    Pass ``ranges``: maxima by max (counts stay empty); pass ``histogram``: maxima must be the same
    edges in every shard, counts and exact-zero counts add up; one pass: each tensor's histograms
    raised to the widest range, then added. The meta is the shards' with ``data.samples`` /
    ``data.skipped`` summed and ``shard.index`` null (merged).
    """
    import numpy as np

    loaded = _load_shards([Path(p) for p in paths])
    count, pass_name = _check_shards(loaded)
    st0 = loaded[0][1]
    names = list(st0.maxima)
    if pass_name == PASS_ONE:
        return _merge_one_pass(loaded, names, count)
    if pass_name == PASS_RANGES:
        maxima = {n: max(st.maxima[n] for _, st, _ in loaded) for n in names}
    else:
        maxima = dict(st0.maxima)  # same edges in every shard (ranges_sha256 checked above)
    counts = {n: np.zeros(st0.num_bins, dtype=np.int64) for n in names}
    zeros = {n: 0 for n in names}
    if pass_name == PASS_HISTOGRAM:
        for _, st, _ in loaded:
            for n in names:
                counts[n] += st.counts[n]
                zeros[n] += st.zeros.get(n, 0)
    return Merged(maxima, counts, zeros, None, _merged_meta(loaded, count), count, pass_name)


def _load_shards(paths: list[Path]) -> list:
    """(path, StatsFile, shard meta) of each file; CacheError for one that is no unmerged shard."""
    from trtq.calib.stats import load_stats

    if not paths:
        raise UsageError(
            "no statistics files to merge", "pass the shard files, e.g. trtq merge-stats part-*.npz -o merged.npz"
        )
    loaded = []
    for p in paths:
        st = load_stats(p)
        s = shard_meta(st.meta, p)
        if s is None or s.get("index") is None:
            what = "a merged file" if s is not None else "not a shard (no --shard)"
            raise CacheError(f"{p} is {what}", "merge the files written by trtq calibrate --shard I/N --save-stats")
        loaded.append((p, st, s))
    return loaded


def _check_shards(loaded: list) -> tuple[int, Optional[str]]:
    """(shard count, pass) of shards of one origin, split, pass, bin count and statistics, each
    once and none missing; CacheError naming the first difference otherwise."""
    p0, st0, s0 = loaded[0]
    count, pass_name = s0["count"], s0.get("pass")
    seen: dict[int, Path] = {}
    for p, st, s in loaded:
        check_same_origin(p, st.meta, p0, st0.meta)
        if s["count"] != count:
            raise CacheError(
                f"{p} is shard {s.get('index')}/{s.get('count')} but {p0} is of {count} shards",
                "merge the shards of one split",
            )
        if s.get("pass") != pass_name:
            raise CacheError(
                f"{p} is from pass {s.get('pass')}, {p0} from pass {pass_name}",
                "merge the shards of one pass at a time",
            )
        if st.num_bins != st0.num_bins:
            raise CacheError(
                f"{p} has {st.num_bins} histogram bins, {p0} has {st0.num_bins}", "use the same --num-bins"
            )
        check_same_statistics(p, st.meta, p0, st0.meta)
        index = s["index"]
        if index in seen:
            raise CacheError(f"shard {index}/{count} given twice: {seen[index]} and {p}", "pass each shard once")
        seen[index] = p
        if pass_name == PASS_HISTOGRAM and s.get("ranges_sha256") != s0.get("ranges_sha256"):
            raise CacheError(
                f"{p} was histogrammed over other ranges than {p0}",
                "run pass 2 of every shard with the same --ranges file",
            )
    if len(seen) < count:  # the first few missing: at most len(seen) + 5 steps, whatever the count
        missing: list[int] = []
        for i in range(count):
            if i not in seen:
                missing.append(i)
                if len(missing) == 5:
                    break
        raise CacheError(
            f"missing shard(s) {', '.join(f'{i}/{count}' for i in missing)}"
            + (" ..." if count - len(seen) > 5 else ""),
            "pass all N shard files: the merged statistics must cover every sample",
        )
    return count, pass_name


def _merged_meta(loaded: list, count: int) -> dict:
    """The first shard's meta with the samples / skipped of all shards summed, shard index null."""
    s0 = loaded[0][2]
    meta = json.loads(json.dumps(loaded[0][1].meta))
    data = meta.setdefault("data", {})
    data["samples"] = sum(_get(st.meta, "data", "samples") or 0 for _, st, _ in loaded)  # checked by shard_meta
    data["skipped"] = sum(_get(st.meta, "data", "skipped") or 0 for _, st, _ in loaded)
    meta["shard"] = {"index": None, "count": count, "pass": s0.get("pass"), "ranges_sha256": s0.get("ranges_sha256")}
    return meta


def _merge_one_pass(loaded: list, names: list, count: int) -> Merged:
    """One-pass shards: each tensor's histograms raised to the widest range, then added."""
    from trtq.calib.collect.one_pass import Pow2Histograms, merge_into

    p0, st0, _ = loaded[0]
    total = Pow2Histograms(names, st0.num_bins)
    for p, st, _ in loaded:
        if st.tops is None:
            raise CacheError(f"{p} holds histograms over [0, max], not one-pass ones", "merge the shards of one run")
        merge_into(total, st.maxima, st.tops, st.counts, st.zeros)
    return Merged(total.maxima, total.counts, total.zeros, total.tops, _merged_meta(loaded, count), count, PASS_ONE)


# ------------------------------------------------------------------------------------------------
# one shard's run (called by trtq.pipeline.calibrate)
# ------------------------------------------------------------------------------------------------


def prepare_shard(
    batcher,
    shard: Optional[tuple[int, int]],
    ranges: Optional[Path],
    opts,
    model_path: Path,
    tensors: Sequence[str],
    one_pass: bool = False,
) -> tuple[str, Optional[dict[str, float]]]:
    """Restrict ``batcher`` to the shard; returns (pass name, the merged maxima for pass 2 or None).
    ``one_pass``: the method histograms in one pass (mse / percentile), so there is no pass 2."""
    from trtq.calib.stats import load_stats
    from trtq.errors import DataError
    from trtq.model import model_sha256

    if shard is None:
        raise UsageError("--ranges is for pass 2 of a sharded calibration", "pass --shard I/N with it")
    if not opts.save_stats:
        raise UsageError("--shard writes statistics, not a cache", f"pass --save-stats part-{shard[0]}.npz")
    if shard[1] > batcher.num_samples:  # some shards would have no samples
        raise DataError(
            f"--shard {shard[0]}/{shard[1]}: {shard[1]} shards but the data set has {batcher.num_samples} "
            "samples, so some shards have no samples",
            f"use at most {batcher.num_samples} shards",
        )
    batcher.take_shard(*shard)
    if batcher.num_samples == 0:
        raise DataError(
            f"shard {shard[0]}/{shard[1]} has no samples (the data set has {batcher.total_samples})",
            f"use at most {batcher.total_samples} shards",
        )
    if one_pass:
        if ranges is not None:
            raise UsageError(
                f"--method {opts.method} histograms in one pass: a shard has no pass 2 (--ranges)",
                "merge the shards' files (trtq merge-stats) and run trtq calibrate --from-stats",
            )
        return PASS_ONE, None
    if ranges is None:
        return PASS_RANGES, None
    st = load_stats(Path(ranges))
    check_ranges_fit(Path(ranges), st.meta, model_sha256(model_path), batcher.fingerprint(), tensors)
    lacking = [n for n in tensors if n not in st.maxima]
    if lacking:
        raise CacheError(
            f"--ranges {ranges} has no range for tensor '{lacking[0]}'",
            "merge the pass-1 shards of this run (trtq merge-stats) and pass that file as --ranges",
        )
    return PASS_HISTOGRAM, {n: st.maxima[n] for n in tensors}
