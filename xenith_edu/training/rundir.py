"""The run folder's guards: a lock that one trainer holds while it writes the folder, and the
removal of the temporary files that a killed run left behind.

The lock is the system's lock on the file `.lock` in the folder (flock on POSIX, LockFileEx on
Windows, through the `filelock` package): the kernel releases it when its process ends, however
it ends, so a crash never leaves the folder locked. Where the system has no such lock (a POSIX
without flock, or a file system that refuses it), the file names its holder, and a holder of
this host that is no longer running is taken over.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import warnings
from pathlib import Path

with warnings.catch_warnings():  # where flock is missing, filelock warns; FolderLock copes
    warnings.simplefilter("ignore")
    from filelock import lock_descriptor

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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0),
                         0o666)  # O_BINARY: Windows, no newline translation
            try:
                locked = self._lock(fd)
            except BaseException:  # a failing lock: no descriptor left open
                os.close(fd)
                raise
            if not locked:
                holder = self._holder(fd) or "another process"
                os.close(fd)
                self._undo_mkdir()
                raise ValueError(f"run folder '{self.out_dir}' is in use by another trainer "
                                 f"({holder}): wait for it to end or stop it, or choose another "
                                 "--out") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # a trainer that released it removed that file: lock the new one
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        # byte 0 is the one Windows locks (and no other process may read): the name follows it
        os.write(fd, f"\npid {os.getpid()} on {socket.gethostname()}\n".encode())
        self.fd = fd

    def _lock(self, fd: int) -> bool:
        """Lock the open file `fd` without waiting: whether it is ours now."""
        try:
            return lock_descriptor(fd, blocking=False)
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        # no kernel lock here: the file names its holder; one of this host that has ended
        # (a kill -9) is taken over. Two trainers starting at the same instant may both win.
        named = re.search(r"pid (\d+) on (\S+)", self._holder(fd))
        return named is None or (named[2] == socket.gethostname()
                                 and not self._running(int(named[1])))

    @staticmethod
    def _running(pid: int) -> bool:
        """Whether process `pid` of this host runs (POSIX; elsewhere it is assumed to)."""
        if os.name != "posix":
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True  # it exists, owned by someone else
        return True

    @staticmethod
    def _holder(fd: int) -> str:
        """The holder named in the lock file open as `fd` ('' when none is)."""
        try:
            os.lseek(fd, 1, os.SEEK_SET)  # past byte 0, which a Windows holder has locked
            return os.read(fd, 200).decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # before unlocking: a waiter then sees a removed file
        except OSError:
            pass  # Windows keeps an open file: left in place, unlocked, for the next trainer
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
