"""Small helpers the whole package shares: the one atomic writer, the hold on interrupts it
uses, the one-line error formatter, and a fast transposed copy. Nothing here knows about the
model.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# Ctrl-C, and `kill` (a time limit, docker stop)
HELD_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
_holding = threading.local()  # whether the main thread is inside `interrupts_held` already


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the block runs, then deliver the first that came.

    A file being written is finished, and the program knows it was written, before the
    interrupt stops it: an interrupt inside NumPy's zip writer would otherwise leave it half
    closed and turn the clean stop into an error. Only the main thread takes signals, so
    elsewhere (and inside a block that holds them already) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread() or getattr(_holding, "on", False):
        yield
        return
    came: list[tuple[int, object]] = []
    previous: dict[int, Any] = {}  # signal number -> the handler it had
    _holding.on = True
    try:
        for s in HELD_SIGNALS:
            if signal.getsignal(s) is not None:  # None: a handler set outside Python, left be
                previous[s] = signal.signal(s, lambda signum, frame: came.append((signum, frame)))
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _holding.on = False
        if came:
            _deliver(*came[0], previous[came[0][0]])


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a Slurm time limit, `docker stop`), raised where Ctrl-C raises
    KeyboardInterrupt: the same clean stop (the last good file intact, no temporary file left),
    then the conventional exit status 128 + 15."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM raises `Terminated` in the main thread, as Ctrl-C raises
    KeyboardInterrupt, so that a command cleans up the same way for both (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _deliver(signum: int, frame: object, handler: object) -> None:
    """What `signum` would have done had it not been held: call its handler, or end the
    process by its default action."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call write(f) on a temporary file next to `path`, then rename it onto `path`.

    A crash or an error mid-write leaves any previous file at `path` untouched and no temporary
    file behind; Ctrl-C and SIGTERM wait until the file is written (`interrupts_held`). The
    file gets the usual permissions (0666 less the umask), as `open` gives.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with interrupts_held():
        _write_then_rename(path, write)


def _write_then_rename(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    tmp = None
    try:
        while tmp is None:
            # the name is known before the file exists: an interrupt that lands just after
            # os.open made the file, before its result is kept, still finds it below
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                tmp = None  # another writer's, by one chance in 2**48: not ours to remove
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            _remove(tmp)
        raise


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gone already (or never made)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8, newlines as given) to `path` atomically."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def one_line(message: object) -> str:
    """`message` (an exception or any text) folded onto one line; an exception's type if empty."""
    text = " ".join(str(message).split())
    if not text and isinstance(message, BaseException):
        return type(message).__name__
    return text


def copy_transposed(dst: Any, src: Any, block: int = 64) -> None:
    """dst[...] = src.T for 2-D arrays, by blocks of `block` rows of src: each block is read
    in order and written within a few cache lines a row, where the plain assignment walks one
    side a whole column at a time (several times slower on a model's weight matrices)."""
    if dst.shape != src.shape[::-1]:
        raise ValueError(f"dst has shape {dst.shape}, src.T has {src.shape[::-1]}")
    for i in range(0, src.shape[0], block):
        dst[:, i:i + block] = src[i:i + block].T

