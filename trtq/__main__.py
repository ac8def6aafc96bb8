"""``python -m trtq``: the same entry as the ``trtq`` console script (trtq.console)."""

from trtq.console import main

main()
