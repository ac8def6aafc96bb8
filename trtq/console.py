"""The ``trtq`` console script and ``python -m trtq``: SIGINT / SIGTERM are caught before the CLI
is imported.

Importing the CLI and what it needs (click; numpy, onnx, ONNX Runtime for a command) takes a
while; a signal in that time would hit the interpreter's defaults (a
KeyboardInterrupt traceback, or a SIGTERM kill) or land inside an import. This module imports
nothing but ``os`` and ``signal`` (both loaded by the interpreter already) and installs a handler
that exits at once with one line: nothing was started, nothing is left to clean up. The CLI's own
handlers (``trtq.cli.main``) take over once it is imported. Only what runs before this module, the
interpreter's own start-up, is out of reach.
"""

import os
import signal


def _early_exit(signum, frame):  # pragma: no cover - timing dependent
    what = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
    os.write(2, b"trtq: " + what + b"; nothing was written\n")
    os._exit(128 + signum)


def install_early_handlers() -> None:
    """Until trtq.cli.main installs its own handlers."""
    signal.signal(signal.SIGINT, _early_exit)
    signal.signal(signal.SIGTERM, _early_exit)


def main() -> None:
    """Entry point of the ``trtq`` console script (pyproject ``[project.scripts]``) and of
    ``python -m trtq``: the early handlers first, then the CLI."""
    install_early_handlers()
    from trtq.cli import main as cli_main

    cli_main()
