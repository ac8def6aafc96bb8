"""trtq's command line, the only package that imports click and prints:

* ``commands``: the Click commands, one pipeline step each;
* ``flags``: the option groups the commands share, and the types that read flags;
* ``settings``: ``-v`` / ``-q`` / ``--json``, the config (registered names checked), the data flags
  merged into it, the one declaration of what a command reads and writes;
* ``text``: what the commands print;
* ``process``: the process around a command (stdout guard, signal handlers and watchdog, one line
  and an exit code for every failure).

Both entry points, the ``trtq`` console script and ``python -m trtq``, go through
trtq.console.main, which installs early signal handlers before it imports this package.
"""

from collections.abc import Sequence
from typing import Optional

from trtq.cli.commands import cli


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the CLI as the trtq process (``argv`` None: the real process and its command line)."""
    from trtq.cli import process

    process.main(cli, argv)
