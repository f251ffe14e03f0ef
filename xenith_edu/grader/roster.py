"""The class: the exercises of the teacher's notebooks, and each learner's notebooks.
The teacher's copy is the source of truth: its check cells say what is graded, and how the
learner's function is called.

A submission is foreign input: `walk` reads only regular files and folders, follows no link,
bounds the depth, the count and the bytes (from lstat, before anything is read), and takes any
bytes as a name. What it cannot read is listed, never opened.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .names import canonical, fold
from .statuses import Row

CHECK_CELL = re.compile(r"\bcheck_(\w+)\s*\(\s*([A-Za-z_]\w*)\s*\)")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # holds notebooks/ in a checkout
UNREADABLE = Row.UNREADABLE  # statuses of a submission the walk refuses, in part or whole
OVER_LIMIT = Row.OVER_LIMIT
COLLISION = Row.COLLISION
MAX_FOLDER = 200 * 2**20  # bytes of regular files in one submission
MAX_ENTRIES = 5000  # files and folders in one submission
MAX_DEPTH = 16  # folders inside folders


@dataclass(frozen=True)
class Exercise:
    """One exercise of the teacher's notebook: its check's id and the learner's function."""

    id: str
    fn: str


def _specs() -> dict:
    from ..exercises import SPECS  # only when the teacher's notebooks are read

    return SPECS


def instructor_exercises(path: Path) -> list[Exercise]:
    """The exercises a teacher's notebook checks, in order: one per `check_<id>(<fn>)` call."""
    from ..tools.notebook import read_notebook  # nbformat: only when notebooks are read

    specs = _specs()
    found: list[Exercise] = []
    for cell in read_notebook(path).cells:
        if cell.cell_type != "code":
            continue
        for ex_id, fn in CHECK_CELL.findall(cell.source):
            if ex_id not in specs:
                raise ValueError(f"{path.name} calls check_{ex_id}, which xenith_edu.exercises "
                                 "does not define")
            if all(e.id != ex_id for e in found):
                found.append(Exercise(ex_id, fn))
    return found


def chapter_notebooks() -> list[Path]:
    """The book's chapter notebooks, in the registry's order, where this checkout has them."""
    from ..chapters import CHAPTERS  # only when the teacher's notebooks are read

    paths = [PACKAGE_ROOT / f"{c.notebook}.ipynb" for c in CHAPTERS]
    return [p for p in paths if p.is_file()]


def teacher_files(instructor: Path | None) -> list[Path]:
    """The teacher's notebooks: `instructor`'s, or the book's chapter notebooks."""
    return _instructor(instructor)


def _instructor(instructor: Path | None) -> list[Path]:
    if instructor is None:
        paths = chapter_notebooks()
        if not paths:
            raise ValueError("instructor: the chapter notebooks are not next to the package; "
                             "give the teacher's notebooks with --instructor DIR")
        return paths
    if instructor.is_file() and instructor.suffix == ".ipynb":
        return [instructor]
    if instructor.is_dir():
        paths = sorted(p for p in instructor.glob("*.ipynb") if p.is_file())
        if paths:
            return paths
    raise ValueError(f"instructor: {instructor} is neither a notebook nor a folder of notebooks")


def display(name: str | bytes) -> str:
    """A file name as text that any CSV or JSON can hold: bytes that are not UTF-8 escaped."""
    raw = name if isinstance(name, bytes) else os.fsencode(name)
    return raw.decode("utf-8", "backslashreplace")


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a link, not followed"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device")):
        if test(mode):
            return what
    return "not a regular file"


@dataclass
class Walk:
    """What a submission holds, from lstat alone: nothing has been opened."""

    files: list[tuple[str, int]] = field(default_factory=list)  # (relative path, bytes)
    folders: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # "name (a named pipe)", ...
    over: str | None = None  # the limit the submission is over, if any


def walk(source: Path) -> Walk:
    """The regular files and folders of a submission (a notebook or a folder), in order."""
    out = Walk()
    try:
        st = os.lstat(source)
    except OSError as exc:
        out.unreadable.append(f"{display(source.name)} ({exc.strerror})")
        return out
    if stat.S_ISREG(st.st_mode):
        out.files.append((display(source.name), st.st_size))
        if st.st_size > MAX_FOLDER:
            out.over = f"{display(source.name)} holds more than {MAX_FOLDER >> 20} MiB"
    elif stat.S_ISDIR(st.st_mode):
        _walk_folder(os.fsencode(source), out)
    else:
        out.unreadable.append(f"{display(source.name)} ({_kind(st.st_mode)})")
    return out


def _entries(folder: bytes, out: Walk, budget: list[int]) -> list:
    found = []
    with os.scandir(folder) as it:
        for entry in it:
            budget[0] -= 1
            if budget[0] < 0:
                out.over = f"the submission holds more than {MAX_ENTRIES} files and folders"
                break
            found.append(entry)
    return sorted(found, key=lambda e: e.name)


def _walk_folder(root: bytes, out: Walk) -> None:
    stack, budget, total = [(b"", 0)], [MAX_ENTRIES], 0
    while stack and out.over is None:
        rel, depth = stack.pop()
        try:
            entries = _entries(os.path.join(root, rel) if rel else root, out, budget)
        except OSError as exc:
            out.unreadable.append(f"{display(rel)}/ ({exc.strerror})")
            continue
        subfolders = []
        for e in entries:
            path = os.path.join(rel, e.name) if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
                text = path.decode("utf-8")
            except OSError as exc:
                out.unreadable.append(f"{display(path)} ({exc.strerror})")
                continue
            except UnicodeDecodeError:
                out.unreadable.append(f"{display(path)} (a name that is not UTF-8)")
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > MAX_DEPTH:
                    out.over = f"folders are nested more than {MAX_DEPTH} deep"
                    return
                out.folders.append(text)
                subfolders.append((path, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > MAX_FOLDER:
                    out.over = f"the submission holds more than {MAX_FOLDER >> 20} MiB"
                    return
                out.files.append((text, st.st_size))
            else:
                out.unreadable.append(f"{text} ({_kind(st.st_mode)})")
        stack += reversed(subfolders)


class Problem(NamedTuple):
    """Why an entry of the submissions folder is not graded: its row's status and message."""

    status: str
    text: str


def submissions(root: Path, skip: set[Path]) -> list[tuple[str, Path | None, Problem | None]]:
    """(learner, notebook or folder, problem) for every entry of the submissions folder.
    Two entries that would be the same learner (`dup.ipynb` and `dup/`) are graded apart,
    under their file names, and a row of the shared name says so."""
    found = []
    skipped = {os.path.realpath(p) for p in skip}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "__")) or os.path.realpath(entry) in skipped:
            continue
        name = canonical(display(entry.name))
        try:
            mode = os.lstat(entry).st_mode
        except OSError as exc:
            found.append((name, None, Problem(UNREADABLE, f"{name}: {exc.strerror}")))
            continue
        if stat.S_ISLNK(mode):
            found.append((name, None, Problem(Row.NOTEBOOK_ERROR,
                                              f"a symbolic link, not graded: {name}")))
        elif stat.S_ISDIR(mode):
            found.append((name, entry, None))
        elif stat.S_ISREG(mode) and entry.suffix == ".ipynb":
            found.append((canonical(display(entry.stem)), entry, None))
        elif stat.S_ISREG(mode):
            found.append((canonical(display(entry.stem)), None, Problem(Row.NOTEBOOK_ERROR,
                                                             f"not a notebook: {name}")))
        else:
            found.append((name, None, Problem(UNREADABLE, f"{name} is {_kind(mode)}: neither "
                                              "a notebook nor a folder, not opened")))
    return _apart(found)


def _apart(found: list) -> list:
    """The entries with one learner name each: names that are one learner's, with or without
    case (`dup.ipynb` and `dup/`, `Ann` and `ann`), are renamed apart, and reported."""
    count: dict[str, list[str]] = {}
    for learner, source, _ in found:
        count.setdefault(fold(learner), []).append(_label(learner, source))
    out, taken = [], {fold(learner) for learner, _, _ in found
                      if len(count[fold(learner)]) == 1}
    for learner, source, problem in found:
        key = fold(learner)
        if len(count[key]) > 1:
            new = _label(learner, source)
            while fold(new) in taken or (fold(new) != key and fold(new) in count):
                new += "'"
            if key not in taken:
                out.append((learner, None, Problem(COLLISION, (
                    f"{len(count[key])} submissions would be the learner {learner}: "
                    f"{', '.join(count[key])}; each is graded apart, under its own name (names "
                    "equal with or without case are one learner's)"))))
                taken.add(key)
            learner = new
        taken.add(fold(learner))
        out.append((learner, source, problem))
    return out


def _label(learner: str, source: Path | None) -> str:
    if source is None:
        return learner + " (not graded)"
    return canonical(display(source.name)) + ("/" if source.is_dir() else "")


def learner_notebooks(source: Path) -> list[str]:
    """The learner's notebooks, as paths relative to the learner's copy."""
    return [rel for rel, _ in walk(source).files if rel.endswith(".ipynb") and
            ".ipynb_checkpoints" not in rel.split("/")[:-1]]


def match(teacher: list[str], mine: list[str]) -> dict[str, str | None]:
    """Teacher's notebook name -> the learner's notebook of that name (or the only one)."""
    by_name: dict[str, str] = {}
    for rel in mine:
        by_name.setdefault(rel.rsplit("/", 1)[-1], rel)
    if len(teacher) == 1 and len(mine) == 1:
        return {teacher[0]: mine[0]}
    return {name: by_name.get(name) for name in teacher}



def teacher_sources(instructor: Path | None, teacher: list[tuple[str, list[Exercise]]]
                    ) -> list[str]:
    """The code cells of the teacher's notebooks that are graded."""
    from ..tools.notebook import read_notebook  # nbformat: only when notebooks are read

    names = {name for name, _ in teacher}
    return [cell.source for p in _instructor(instructor) if p.name in names
            for cell in read_notebook(p).cells if cell.cell_type == "code"]


def teacher_exercises(instructor: Path | None, entries: list) -> list[tuple[str, list[Exercise]]]:
    teacher = [(p.name, instructor_exercises(p)) for p in _instructor(instructor)]
    teacher = [(name, ex) for name, ex in teacher if ex]
    if instructor is None:  # the book's chapters: only those the class handed in
        names = {rel.rsplit("/", 1)[-1] for _, src, _ in entries if src is not None
                 for rel in learner_notebooks(src)}
        teacher = [(name, ex) for name, ex in teacher if name in names]
        if not teacher:
            raise ValueError("no submitted notebook is named as a chapter notebook (such as "
                             "rmsnorm.ipynb); name them so, or give --instructor")
    if not teacher:
        raise ValueError("instructor: the teacher's notebooks call no check_<id>(<function>)")
    return teacher
