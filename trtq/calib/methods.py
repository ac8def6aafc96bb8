"""The calibration methods: one registry, one row a method.

A row (:class:`Method`) says how the method turns a tensor's statistics into its ``amax``, what it
needs (histograms or the max alone, one model pass or two) and the TensorRT cache header it is
written under. Everything that names methods reads this table: ``trtq calibrate --method``'s
choices, the check of ``calibrate.method`` (``METHODS.get``), the cache's algorithm header
(trtq.calib.cache), the passes a calibration takes (trtq.pipeline.calibrate), ``--backend
tensorrt`` and the report (its data and, embedded as JSON, its page). A new method is one function
and one :func:`register` call (:data:`METHODS` is a trtq.registry.Registry).

Importing this module imports no numpy (``trtq --help`` reads the names); the rules themselves are
in trtq.calib.stats and trtq.calib.search.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from trtq.errors import ConfigError
from trtq.registry import Registry

# smallest amax written: a tensor that was (all but) zero on every sample still needs scale > 0
MIN_AMAX = 1e-8


@dataclass(frozen=True)
class Method:
    """One range method."""

    name: str
    # one tensor's amax: (counts, max_value, percentile) -> amax; counts over [0, max_value]
    # (None where ``histogram`` is False)
    amax: Callable[[Any, float, float], float]
    histogram: bool  # needs histograms; False: the max alone
    # model passes it needs: 1 (the max, or one-pass power-of-two histograms that grow with the data,
    # trtq.calib.collect.one_pass) or 2 (the max, then histograms over the fixed edges [0, max])
    passes: int
    algorithm: str  # the TensorRT cache header (calibrator) it is written under
    tensorrt: bool = False  # TensorRT's own calibrators compute it (trtq calibrate --backend tensorrt)
    # every tensor of one bin count at once: (counts, maxima) -> amax or None (the per-tensor rule
    # then), the same amax as ``amax`` (trtq.calib.search)
    search: Callable[[list, list], list] | None = None
    drops_zeros: bool = False  # the exact zeros are left out of bin 0 (TensorRT's EntropyCalibration2)

    @property
    def one_pass(self) -> bool:
        """It can run on one-pass histograms over power-of-two ranges."""
        return self.passes == 1

    def describe(self) -> dict[str, Any]:
        """The row as JSON data (the report page embeds the table)."""
        return {
            "name": self.name,
            "histogram": self.histogram,
            "passes": self.passes,
            "algorithm": self.algorithm,
            "tensorrt": self.tensorrt,
        }


METHODS: Registry[Method] = Registry("calibrate.method")


def register(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS` (the order of registration is the order shown everywhere)."""
    if method.passes not in (1, 2) or (not method.histogram and method.passes != 1):
        raise ValueError(f"method {method.name}: passes must be 1 or 2, and 1 without histograms")
    return METHODS.register(method)


def tensorrt_method(algorithm: str) -> str:
    """The method TensorRT's calibrator of this cache header computes (its entropy calibrator for
    a header no TensorRT method writes, as TensorRT reads such caches)."""
    computed = [m for m in METHODS.rows() if m.tensorrt]
    found = next((m for m in computed if m.algorithm == algorithm), None)
    return (found or next(m for m in computed if m.algorithm == "EntropyCalibration2")).name


# --------------------------------------------------------------------------------------------
# the methods
# --------------------------------------------------------------------------------------------


def _max(counts: Any, max_value: float, percentile: float) -> float:
    return float(max_value)


def _entropy(counts: Any, max_value: float, percentile: float) -> float:
    from trtq.calib.stats import entropy_amax

    return entropy_amax(counts, max_value)


def _entropy_search(counts: list, maxima: list) -> list:
    from trtq.calib import search
    from trtq.calib.stats import NUM_QUANTIZED_BINS, TIE_ABS

    return [
        None if i is None else (i + 0.5) * (m / c.size)
        for c, m, i in zip(counts, maxima, search.entropy_choices(counts, NUM_QUANTIZED_BINS, TIE_ABS))
    ]


def _percentile(counts: Any, max_value: float, percentile: float) -> float:
    from trtq.calib.stats import percentile_amax

    return percentile_amax(counts, max_value, percentile)


def _mse(counts: Any, max_value: float, percentile: float) -> float:
    from trtq.calib.stats import mse_amax

    return mse_amax(counts, max_value)


def _mse_search(counts: list, maxima: list) -> list:
    from trtq.calib import search

    return search.mse_amax_many(counts, maxima)


# percentile and mse have no TensorRT calibrator: a cache with the EntropyCalibration2 header is
# read by TensorRT's entropy calibrator (the values are used as given); the real method is kept in
# the provenance JSON.
register(Method("max", _max, histogram=False, passes=1, algorithm="MinMaxCalibration", tensorrt=True))
register(
    Method(
        "entropy",
        _entropy,
        histogram=True,
        passes=2,
        algorithm="EntropyCalibration2",
        tensorrt=True,
        search=_entropy_search,
        drops_zeros=True,
    )
)
register(Method("percentile", _percentile, histogram=True, passes=1, algorithm="EntropyCalibration2"))
register(Method("mse", _mse, histogram=True, passes=1, algorithm="EntropyCalibration2", search=_mse_search))


# --------------------------------------------------------------------------------------------
# statistics -> amax
# --------------------------------------------------------------------------------------------


def compute_amax(
    method: str, counts, max_value: float, percentile: float = 99.99, zeros: int = 0, top: float | None = None
) -> float:
    """amax of one tensor by ``method`` (one without histograms ignores ``counts``, which may be None).

    ``zeros``: how many of bin 0's values were exactly zero; ``entropy`` leaves them out of the
    distribution (TensorRT's EntropyCalibration2 behaviour), the other methods count them.
    ``top``: the histogram's upper edge when it is not ``max_value`` (see :func:`compute_all`)."""
    m = METHODS.find(method)
    if m is not None and not m.histogram:
        return float(m.amax(None, max_value, percentile))
    if top is not None:
        if m is not None and not m.one_pass:
            raise ValueError(f"{method} needs histograms over [0, max], not power-of-two ranges")
        return min(compute_amax(method, counts, top, percentile, zeros), float(max_value))
    m = _method(method)
    if counts is None:
        raise ValueError(f"method '{method}' needs a histogram")
    if m.drops_zeros and zeros:
        from trtq.calib.stats import without_zeros

        counts = without_zeros(counts, zeros)
    return m.amax(counts, max_value, percentile)


def _method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"unknown calibration method '{name}'", "use one of: " + ", ".join(METHODS.names()))
    return METHODS.get(name)


def compute_all(
    method: str,
    maxima: Mapping[str, float],
    counts: Mapping[str, Any] | None,
    percentile: float = 99.99,
    zeros: Mapping[str, int] | None = None,
    tops: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """amax for every tensor of ``maxima`` (same order). ``counts`` may be None for a method without
    histograms; ``zeros``: exact zeros per tensor (see :func:`compute_amax`), none when omitted.

    ``tops``: the histograms' upper edges when they are not the maxima (one-pass histograms over
    power-of-two ranges, trtq.calib.collect.one_pass): the search runs over ``[0, top]`` and its
    result is capped at the max (a range past the max clips nothing and only coarsens the step). A
    two-pass method (entropy: TensorRT's search over ``[0, max]``) refuses them."""
    m = _method(method)
    if tops is not None and m.histogram:
        if not m.one_pass:
            raise ValueError(f"{method} needs histograms over [0, max], not power-of-two ranges")
        raw = compute_all(method, {n: float(tops[n]) for n in maxima}, counts, percentile, zeros)
        return {n: min(float(raw[n]), float(mx)) for n, mx in maxima.items()}
    if m.histogram:
        if counts is None:
            raise ValueError(f"method '{method}' needs histograms")
        missing = [n for n in maxima if n not in counts]
        if missing:
            raise ValueError(f"no histogram for {len(missing)} tensor(s), e.g. '{missing[0]}'")
    if m.search is not None:
        return _search_all(m, maxima, counts, zeros or {})
    return {
        name: compute_amax(
            method, None if counts is None else counts.get(name), mx, percentile, int((zeros or {}).get(name, 0))
        )
        for name, mx in maxima.items()
    }


def _search_all(
    m: Method, maxima: Mapping[str, float], counts: Mapping[str, Any], zeros: Mapping[str, int]
) -> dict[str, float]:
    """``m.search`` over all tensors at once: the same amax as :func:`compute_amax` tensor by
    tensor. Tensors with max 0, an empty histogram, a bin count other than the first's or counts
    too large for the exact sums take the per-tensor path."""
    from trtq.calib.stats import NUM_QUANTIZED_BINS, check_hist, without_zeros

    batch: dict[str, tuple[Any, float]] = {}
    for name, mx in maxima.items():
        c, top = check_hist(counts[name], mx)
        if m.drops_zeros and zeros.get(name):
            c = without_zeros(c, zeros[name])
        first = next(iter(batch.values()), (c, top))[0]
        if top > 0 and c.size == first.size and c.size >= NUM_QUANTIZED_BINS and int(c.sum()) > 0:
            batch[name] = (c, top)
    names_ = list(batch)
    solved = dict(zip(names_, m.search([batch[n][0] for n in names_], [batch[n][1] for n in names_])))
    out: dict[str, float] = {}
    for name, mx in maxima.items():  # the order of maxima
        a = solved.get(name)
        out[name] = a if a is not None else compute_amax(m.name, counts[name], mx, 99.99, int(zeros.get(name, 0)))
    return out


def finalize_amax(amax: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """amax floored at :data:`MIN_AMAX` (a tensor that was zero, or all but zero, on every sample:
    an untrained BatchNorm's 1e-10 activations would otherwise refuse the whole cache), and the
    names floored."""
    floored = [name for name, a in amax.items() if not a >= MIN_AMAX]
    return {name: (a if a >= MIN_AMAX else MIN_AMAX) for name, a in amax.items()}, floored
