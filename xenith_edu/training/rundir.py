"""The rules of every folder a command writes (`train`, `from-hf`, `to-hf`), in one place: the
lock that one writer holds, the overwrite rule, the temporary names and their sweep, the
replacement of a whole folder (built beside it, then swapped in), and the one line of a write
that failed.

The lock is the system's lock on the file `.lock` in the folder (flock on POSIX, LockFileEx on
Windows, through the `filelock` package): the kernel releases it when its process ends, however
it ends, so a crash never leaves the folder locked. Where the system has no such lock (a POSIX
without flock, or a file system that refuses it), the file names its holder, and a holder of
this host that is no longer running is taken over.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import socket
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..tools.util import interrupts_held, one_line

with warnings.catch_warnings():  # where flock is missing, filelock warns; FolderLock copes
    warnings.simplefilter("ignore")
    from filelock import lock_descriptor

LOCK = ".lock"  # in the run folder, while a trainer writes it
CHECKPOINT = "ckpt.npz"  # a run folder's checkpoint: its presence makes the folder a run
# Every temporary name a command makes: the atomic writer's files (tools.util.atomic_write) and
# the folders built beside the one they replace, ".<name>.<12 hex digits>.tmp" both
TEMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{12}\.tmp$")
# and, whatever their middle, those of the run's own files (older versions named them so)
RUN_TEMP = re.compile(r"^\.(?P<name>ckpt\.npz|log\.jsonl|loss\.png)\.[^/]+\.tmp$")


def check_start(resume: object, init: object, names: tuple[str, str] = ("init", "resume")
                ) -> None:
    """A run starts (from scratch, or from the weights of checkpoint `init`) or continues
    (`resume`), never both: ValueError in the words `names` (the command line's options)."""
    if init is not None and resume is not None:
        raise ValueError(f"{names[0]} starts a new run and {names[1]} continues one: give only "
                         "one")


def check_run_dir(out_dir: str | Path, resume: str | Path | None, overwrite: bool) -> Path:
    """The run directory `out_dir`, after the overwrite policy: never replace a run by accident.

    A directory that already holds a checkpoint is only written into when resuming that very
    run, or with `overwrite`. Raises ValueError saying which option to use.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out_dir '{out_dir}' is a file: pass a directory for the run")
    ckpt_path = out_dir / CHECKPOINT
    same_run = resume is not None and Path(resume).resolve() in (ckpt_path.resolve(),
                                                                 out_dir.resolve())
    if ckpt_path.exists() and not overwrite and not same_run:
        raise ValueError(f"out_dir '{out_dir}' already holds a run ({CHECKPOINT}): resume it "
                         "(--resume), choose another directory (--out), or replace it "
                         "(--overwrite)")
    return out_dir


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
    """Remove the temporary files and folders a killed command left in `out_dir` (call it
    holding the lock: then no other writer is making them). Returns what was removed."""
    return [p for p in _temps(out_dir, lambda name: True) if _remove_tree(p)]


def remove_stale_builds(target: Path) -> list[Path]:
    """Remove the folders a killed command built beside `target` to replace it (call it holding
    `target`'s lock). Returns what was removed."""
    return [p for p in _temps(target.parent, lambda name: name == target.name)
            if _remove_tree(p)]


def _temps(folder: Path, named: Callable[[str], bool]) -> list[Path]:
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []  # no folder, or not ours to read: nothing to sweep
    return [p for p in entries
            if (m := TEMP.match(p.name) or RUN_TEMP.match(p.name)) and named(m["name"])]


def _remove_tree(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return True
    except OSError:
        return False


def temp_name(target: Path) -> Path:
    """A fresh temporary name beside `target`, of the form the sweep removes."""
    return target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"


@contextmanager
def locked(out_dir: Path) -> Iterator[FolderLock]:
    """Hold `out_dir`'s lock (a second writer stops at once with one line), sweep what a killed
    command left there, and, however the block ends, sweep again and release."""
    lock = FolderLock(out_dir)
    lock.acquire()
    try:
        remove_stale_temps(out_dir)
        remove_stale_builds(out_dir)
        yield lock
    finally:
        remove_stale_temps(out_dir)
        lock.release()


def cannot_write(folder: Path, e: OSError, kept: str) -> OSError:
    """The one line of a write into `folder` that failed (a full disk, a read-only folder):
    the folder, why, what is kept, what to do."""
    why = e.strerror or one_line(e)
    return OSError(f"cannot write into '{folder}' ({why}): {kept}; free some space (or make "
                   "the folder writable) and run again")


_RENAME_EXCHANGE = 2  # renameat2's flag: swap two names in one step


def _exchange(a: Path, b: Path) -> bool:
    """Swap folders `a` and `b` atomically (Linux renameat2); False where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):  # TypeError: Windows has no CDLL(None)
        return False
    at_cwd = -100  # AT_FDCWD: the paths are read as given
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # a file system or kernel without it: two renames instead
    raise OSError(code, os.strerror(code), str(b))


def replace_folder(target: Path, build: Path) -> None:
    """Put the folder `build` (made beside `target`, at `temp_name(target)`) in place of
    `target`, in one step where the system can (else two renames, with the interrupts held
    between them), then remove the old one. A kill in between leaves the old folder or the new
    one at `target`, and a temporary name that the next command's sweep removes. (Without the
    swap, a kill between the two renames leaves the old folder as `.<name>.<hex>.old`, which
    no sweep removes: nothing is lost.)"""
    with interrupts_held():
        if target.exists() and _exchange(build, target):
            old = build  # the old folder now has the temporary name
        else:
            old = temp_name(target).with_suffix(".old")
            if target.exists():
                os.rename(target, old)
            os.rename(build, target)
    _remove_tree(old)


__all__ = ["CHECKPOINT", "LOCK", "TEMP", "FolderLock", "cannot_write", "check_run_dir", "locked",
           "remove_stale_builds", "remove_stale_temps", "replace_folder", "temp_name"]
