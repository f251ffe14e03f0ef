"""The run folder's guards: a lock that one trainer holds while it writes the folder, and the
removal of the temporary files that a killed run left behind.

The lock is an advisory lock (flock) on the file `.lock` in the folder: the kernel releases it
when its process ends, however it ends, so a crash never leaves the folder locked.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK = ".lock"  # in the run folder, while a trainer writes it
# the temporary files of the atomic writer (tools.util.atomic_write): ".<name>.<random>.tmp"
TEMP_PATTERNS = (".ckpt.npz.*.tmp", ".log.jsonl.*.tmp", ".loss.png.*.tmp")


class FolderLock:
    """The lock of run folder `out_dir`: `acquire()` takes it or raises ValueError naming the
    trainer that holds it (its pid and host are written in the lock file); `release()` gives
    it back and removes the lock file (and the folder, if `acquire` made it and it is empty).
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir, self.path = out_dir, out_dir / LOCK
        self.fd: int | None = None
        self.made: list[Path] = []  # the folders `acquire` made, the deepest first

    def acquire(self) -> None:
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ValueError(f"out_dir '{self.out_dir}' is a file: pass a directory for the run")
        self.made = [p for p in (self.out_dir, *self.out_dir.parents) if not p.exists()]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                self._undo_mkdir()
                raise ValueError(f"run folder '{self.out_dir}' is in use by another trainer "
                                 f"({holder}): wait for it to end or stop it, or choose another "
                                 "--out") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # a trainer that released it removed that file: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # before unlocking: a waiter then sees a removed file
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        self._undo_mkdir()

    def _undo_mkdir(self) -> None:
        for p in self.made:
            try:
                p.rmdir()  # only if empty: nothing was written
            except OSError:
                return
        self.made = []


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` is still the file open as `fd` (not removed or replaced meanwhile)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def remove_stale_temps(out_dir: Path) -> list[Path]:
    """Remove the temporary files a killed run left in `out_dir` (call it holding the lock:
    then no other trainer is writing them). Returns the files removed."""
    removed = []
    for pattern in TEMP_PATTERNS:
        for p in sorted(out_dir.glob(pattern)):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


__all__ = ["LOCK", "FolderLock", "remove_stale_temps"]
