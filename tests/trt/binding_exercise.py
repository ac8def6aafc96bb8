"""trtq's version decisions run on a ``tensorrt`` module: the real binding (inside the
introspection subprocess, on stub libraries) or a fake of :mod:`tests.trt.fakes`.

Nothing here needs a GPU or TensorRT's libraries: the compat functions only read names and enum
members, and the subclasses trtq derives from TensorRT's logger, calibrators and profiler are
constructed and called from Python. Two results being equal means the fake answers every
decision as the real binding does. Standard library only, plus numpy where it is installed (the
calibrator module needs it), so it runs in the Python of the 8.6.0 binding too.
"""

import itertools

RECIPE_FIELDS = ("creation_flags", "builder_flags", "strongly_typed", "quantize", "quantizer_fp16", "calibrator")


def _err(e):
    return {"error": type(e).__name__, "message": str(getattr(e, "message", e))}


def _run(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # recorded: an error is a result to compare too
        return _err(e)


class _FlagRecorder:
    """Stands in for IBuilderConfig in set_builder_flags: keeps the names of the members it got."""

    def __init__(self):
        self.flags = []

    def set_flag(self, flag):
        self.flags.append(flag.name)


def _recipe(trt, compat, precision, mode, fp16):
    r = compat.plan_build(trt, precision, mode, fp16)
    out = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in zip(
            RECIPE_FIELDS,
            (r.creation_flags, r.builder_flags, r.strongly_typed, r.quantize, r.quantizer_fp16, r.calibrator),
        )
    }
    out["creation_mask"] = compat.creation_mask(trt, r.creation_flags)
    rec = _FlagRecorder()
    compat.set_builder_flags(trt, rec, r.builder_flags)
    out["flags_set"] = rec.flags
    return out


def exercise(trt):
    """Every decision trtq makes from the module alone, as plain JSON-able data."""
    from trtq.trt import compat

    out = {"version": str(compat.version_of(trt))}
    out["predicates"] = {
        name: _run(getattr(compat, name), trt)
        for name in (
            "has_weak_typing",
            "has_implicit_int8",
            "can_request_strong_typing",
            "needs_explicit_batch_flag",
            "float_grouped_conv_is_unsafe",
        )
    }
    recipes = {}
    for precision, mode, fp16 in itertools.product(("int8", "fp16", "fp32"), ("explicit", "implicit"), (False, True)):
        key = f"{precision}/{mode}/{'fp16' if fp16 else 'nofp16'}"
        recipes[key] = _run(_recipe, trt, compat, precision, mode, fp16)
    out["recipes"] = recipes
    fields = {}
    for r in recipes.values():
        if "error" in r:
            continue
        for k in ("strongly_typed", "quantize", "quantizer_fp16", "calibrator"):
            fields.setdefault(k, set()).add(bool(r[k]))
    out["recipe_fields"] = {k: sorted(v) for k, v in fields.items()}
    tactic = compat.enum_names(trt.TacticSource)
    out["tactic_sources"] = tactic
    out["tactic_masks"] = {n: _run(compat.tactic_source_mask, trt, [n.lower()]) for n in tactic}
    out["tactic_unknown"] = _run(compat.tactic_source_mask, trt, ["NO_SUCH_SOURCE"])
    out["dtypes"] = {n: compat.dtype_name(getattr(trt.DataType, n)) for n in compat.enum_names(trt.DataType)}
    severities = getattr(trt.ILogger, "Severity", trt.ILogger)
    out["severities"] = {n: compat.severity_name(getattr(severities, n)) for n in compat.enum_names(severities)}
    logger = compat.make_logger(trt)
    logger.log(severities.ERROR, "an error")
    logger.log(severities.WARNING, "a warning")
    out["logger"] = {
        "is_ilogger": isinstance(logger, trt.ILogger),
        "errors": logger.take_errors(),
        "warnings": list(logger.warnings),
    }
    out["centring"] = compat.centring_in_engines(trt) is None
    out["calibrators"] = _run(_calibrators, trt)
    out["profiler"] = _run(_profiler, trt)
    return out


def _calibrators(trt):
    try:
        import numpy  # noqa: F401  (trtq.trt.calibrator needs it)
    except ImportError:
        return "not run: numpy is not installed in this Python"
    from trtq.trt.calibrator import CALIBRATOR_CLASSES, make_cache_calibrator

    out = {}
    for algorithm, cls_name in sorted(CALIBRATOR_CLASSES.items()):

        def make(algorithm=algorithm, cls_name=cls_name):
            cal = make_cache_calibrator(trt, algorithm, b"TRT-cache", 4)
            return {
                "subclass_of": cls_name if isinstance(cal, getattr(trt, cls_name)) else None,
                "batch_size": cal.get_batch_size(),
                "batch": cal.get_batch(["x"]),
                "cache": bytes(cal.read_calibration_cache()).decode(),
                "reads": cal.cache_reads,
            }

        out[algorithm] = _run(make)
    return out


def _profiler(trt):
    try:
        import numpy  # noqa: F401  (trtq.trt.layers needs it)
    except ImportError:
        return "not run: numpy is not installed in this Python"
    from trtq.trt.layers import _profiler as make

    times = {}
    prof = make(trt, times)
    prof.report_layer_time("conv1", 0.25)
    return {"is_iprofiler": isinstance(prof, trt.IProfiler), "times": times}
