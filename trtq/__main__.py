import os
import signal


def _early_exit(signum, frame):  # pragma: no cover - timing dependent
    # a signal while the CLI is still being imported: nothing was started, nothing to clean up
    what = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
    os.write(2, b"trtq: " + what + b"; nothing was written\n")
    os._exit(128 + signum)


# until trtq.cli.main installs its own handlers (importing numpy/onnx takes a moment)
signal.signal(signal.SIGINT, _early_exit)
signal.signal(signal.SIGTERM, _early_exit)

from trtq.cli import main  # noqa: E402

main()
