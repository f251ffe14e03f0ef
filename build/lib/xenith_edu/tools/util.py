"""Small helpers the whole package shares: the one atomic writer and the one-line error formatter.
Nothing here knows about the model; every module that writes a file or prints an error uses these.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

_UMASK = os.umask(0o022)  # read the process umask (the only way is to set it) ...
os.umask(_UMASK)  # ... and put it back at once


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call write(f) on a temporary file next to `path`, then rename it onto `path`.

    A crash or an error mid-write leaves any previous file at `path` untouched. The file gets
    the usual permissions (0666 less the umask), not mkstemp's 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8, newlines as given) to `path` atomically."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def one_line(message: object) -> str:
    """`message` (an exception or any text) folded onto one line; an exception's type if empty."""
    text = " ".join(str(message).split())
    if not text and isinstance(message, BaseException):
        return type(message).__name__
    return text
