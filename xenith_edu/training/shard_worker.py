"""A worker process of `ProcessShards`: `python -m xenith_edu.training.shard_worker`.
It computes one shard of each batch for the caller that started it (see `processes.py`).
"""

from __future__ import annotations

import os
import signal
import sys

from .processes import serve


def main() -> None:
    """Serve the caller on stdin and stdout; Ctrl-C is the caller's to handle, not ours."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller stops us when it stops
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")  # the replies' own stream, and ...
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # ... anything printed goes to stderr
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
