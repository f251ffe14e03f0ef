"""The grading journal: one JSON line per learner, appended and synced as soon as it is known.
The CSV is built from it, so a grader killed at any point loses at most the learners in flight.

The first line names the teacher's exercises; `--resume` keeps the learners whose submission
has not changed since, and grades only the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import threading
from pathlib import Path

from ..grader.roster import walk
from .outfiles import write_text
from .regrade import Tally

VERSION = 3


def fingerprint(path: Path) -> str:
    """A hash of the learner's files (names and bytes), from `roster.walk`: regular files
    only, opened without following a link and never blocking; a submission over a limit is
    hashed from its listing alone."""
    found = walk(path)
    h = hashlib.sha256(json.dumps([found.folders, found.unreadable, found.over]).encode())
    folder = path.is_dir() and not path.is_symlink()
    for rel, size in found.files:
        h.update(b"F" + rel.encode() + b"\0" + str(size).encode() + b"\0")
        if found.over is None:
            h.update(_digest(os.path.join(path, rel) if folder else str(path), size))
    return h.hexdigest()


def _digest(path: str, size: int) -> bytes:
    """The sha256 of at most `size` bytes of the regular file at `path`, or of its absence."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b"gone"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return b"not a file"
        h = hashlib.sha256()
        while size > 0 and (chunk := f.read(min(size, 1 << 20))):
            h.update(chunk)
            size -= len(chunk)
        return h.digest()


class Journal:
    """An append-only file of learner records, safe to call from several threads."""

    def __init__(self, path: Path, exercises_key: str, resume: bool,
                 seed: int | None = None, regrade: set[str] = frozenset()) -> None:
        """`seed`: the assignment's case seed (None: the journal's when resuming, else a fresh
        random one); kept in the first line, so that a resumed run draws the same cases.
        `regrade`: the learners (journal keys) graded again although kept."""
        self.path = path
        self.key = exercises_key
        self.kept: dict[str, dict] = {}
        self.regrade = set(regrade)
        self.resumed = resume
        self.tally = Tally()  # who is graded again, and why
        self._lock = threading.Lock()
        self.seed = seed
        lines: list[str] = []
        if resume:
            for record in self._read(seed):
                self.kept[record["learner"]] = record
        if self.seed is None:
            self.seed = secrets.randbits(63)
        lines.insert(0, json.dumps({"journal": VERSION, "exercises": exercises_key,
                                    "seed": self.seed}))
        if resume:
            lines += [json.dumps(r) for r in self.kept.values()]
        write_text(path, "\n".join(lines) + "\n")  # drops a line torn by a kill

    def _read(self, seed: int | None) -> list[dict]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        lines = text.splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except ValueError:
            head = {}
        if head.get("journal") != VERSION or head.get("exercises") != self.key:
            raise ValueError(f"--resume: {self.path.name} was written for other exercises (or "
                             "another version of the grader); run without --resume to start "
                             "over")
        kept = head.get("seed")
        if isinstance(kept, int) and seed is not None and seed != kept:
            raise ValueError(f"--resume: {self.path.name} holds cases drawn with seed {kept}, "
                             f"not {seed}: resume without --seed, or start over")
        self.seed = kept if isinstance(kept, int) else seed
        records = []
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # the last line, cut short when the grader was killed
            if isinstance(record, dict) and isinstance(record.get("learner"), str) and \
                    isinstance(record.get("rows"), list) and \
                    all(isinstance(r, list) and len(r) == 6 for r in record["rows"]):
                records.append(record)
        return records

    def done(self, learner: str, print_: str) -> dict | None:
        """The kept record of `learner` if its submission is unchanged and the teacher did not
        name it to grade again, else None."""
        record = None if learner in self.regrade else self.kept.get(learner)
        return record if record is not None and record.get("fingerprint") == print_ else None

    def append(self, record: dict) -> None:
        line = (json.dumps(record) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
