"""Closing for objects that hold one session or engine: the runners of compare (ONNX Runtime) and
trt (TensorRT), which may not import each other."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T", bound="ClosesOnExit")


class ClosesOnExit:
    """Mixin: ``close()`` lets go of the object held in the attribute named by ``_held`` (calling
    its own ``close`` when it has one), and ``with obj:`` closes ``obj`` on the way out."""

    _held = "_held_object"

    def close(self) -> None:
        held = getattr(self, self._held, None)
        setattr(self, self._held, None)
        close = getattr(held, "close", None)
        if close is not None:
            close()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
