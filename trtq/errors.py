"""Error hierarchy. Each class carries the process exit code the CLI maps it to.

Every error renders as one line: what went wrong, then how to fix it (the hint).
"""

from typing import Optional


class TrtqError(Exception):
    """An operation failed (exit 1)."""

    exit_code = 1

    def __init__(self, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.message}; {self.hint}" if self.hint else self.message
        # one line always, whatever a file name or config key holds: every character str.splitlines
        # breaks at (\x1c-\x1e, \x85, \u2028 ... too, not only \r and \n) is escaped
        return text.translate(_LINE_BREAKS)


_LINE_BREAKS = {
    ord("\r"): "\\r",
    ord("\n"): "\\n",
    **{c: f"\\x{c:02x}" for c in (0x0B, 0x0C, 0x1C, 0x1D, 0x1E, 0x85)},
    **{c: f"\\u{c:04x}" for c in (0x2028, 0x2029)},
}


class UsageError(TrtqError):
    """Bad command-line usage (exit 2)."""

    exit_code = 2


class ConfigError(UsageError):
    """Invalid configuration file, environment variable or option value (exit 2)."""


class InputError(TrtqError):
    """Invalid input: data, model or cache (exit 3)."""

    exit_code = 3


class DataError(InputError):
    """Calibration / evaluation data is missing, corrupt or does not fit the model."""


class ModelError(InputError):
    """The ONNX model (or engine) is missing, corrupt or unsupported."""


class CacheError(InputError):
    """A calibration cache or statistics file is missing, corrupt, foreign or stale."""


class EnvironmentMissing(TrtqError):
    """A runtime requirement (TensorRT, cuda-python, a GPU) is missing (exit 4)."""

    exit_code = 4
