"""trtq: ONNX model + representative data -> calibrated, fast INT8 TensorRT engine.

The Python API (trtq.api), imported on first use so that ``import trtq`` stays cheap:
``trtq.calibrate(model, data, method="mse")`` -> a ``trtq.Calibration`` (``.amax``,
``.write_cache(path)``), ``trtq.quantize(model, calibration)`` -> ``onnx.ModelProto``,
``trtq.compare(model, candidate, data)`` -> the dict of ``trtq compare --json``.

``trtq.quantize`` and ``trtq.compare`` are also the packages of those domains: Python sets a
subpackage as an attribute of its parent when it is imported, so the packages themselves are
callable (:func:`callable_package`) and a call runs the API's function of their name.
"""

import sys

__version__ = "0.1.0"

__all__ = ["Calibration", "__version__", "calibrate", "compare", "quantize"]

_FUNCTIONS = ("Calibration", "calibrate")
_PACKAGES = ("quantize", "compare")  # subpackages that are the API's functions of the same name


def _api(name: str):
    from trtq import api

    return getattr(api, name)


class _CallablePackage(type(sys)):  # types.ModuleType, without importing types
    """A package of trtq (quantize, compare) whose call is trtq.api's function of the same name."""

    def __call__(self, *args, **kwargs):
        return _api(self.__name__.rpartition(".")[2])(*args, **kwargs)


def callable_package(name: str) -> None:
    """Make the imported package ``name`` (trtq.quantize, trtq.compare) callable as the API's function."""
    sys.modules[name].__class__ = _CallablePackage


def __getattr__(name: str):
    """The API's names on first use (PEP 562); trtq.quantize / trtq.compare import their package."""
    if name in _FUNCTIONS:
        return _api(name)
    # `import` sets the attribute as it imports (`from trtq import ...` would ask this function again)
    if name == "quantize":
        import trtq.quantize

        return trtq.quantize
    if name == "compare":
        import trtq.compare

        return trtq.compare
    raise AttributeError(f"module 'trtq' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_FUNCTIONS, *_PACKAGES})
