"""The class: the exercises of the teacher's notebooks, and each learner's notebooks.
The teacher's copy is the source of truth: its check cells say what is graded, and how the
learner's function is called.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CHECK_CELL = re.compile(r"\bcheck_(\w+)\s*\(\s*([A-Za-z_]\w*)\s*\)")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # holds notebooks/ in a checkout


@dataclass(frozen=True)
class Exercise:
    """One exercise of the teacher's notebook: its check's id and the learner's function."""

    id: str
    fn: str


def _specs() -> dict:
    from ..exercises import SPECS

    return SPECS


def instructor_exercises(path: Path) -> list[Exercise]:
    """The exercises a teacher's notebook checks, in order: one per `check_<id>(<fn>)` call."""
    from .student import _read_notebook

    specs = _specs()
    found: list[Exercise] = []
    for cell in _read_notebook(path).cells:
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
    from ..chapters import CHAPTERS

    paths = [PACKAGE_ROOT / f"{c.notebook}.ipynb" for c in CHAPTERS]
    return [p for p in paths if p.is_file()]


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


def submissions(root: Path, skip: set[Path]) -> list[tuple[str, Path | None, str]]:
    """(learner, notebook or folder, problem) for every entry of the submissions folder."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "__")) or entry.resolve() in skip:
            continue
        if entry.is_symlink():
            found.append((entry.stem, None, f"a symbolic link, not graded: {entry.name}"))
        elif entry.is_dir():
            found.append((entry.name, entry, ""))
        elif entry.suffix == ".ipynb":
            found.append((entry.stem, entry, ""))
        elif entry.is_file():
            found.append((entry.stem, None, f"not a notebook: {entry.name}"))
    return found


def learner_notebooks(source: Path) -> list[str]:
    """The learner's notebooks, as paths relative to the learner's copy."""
    if source.is_file():
        return [source.name]
    out = []
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files):
            full = Path(root) / name
            if name.endswith(".ipynb") and not full.is_symlink():
                out.append(full.relative_to(source).as_posix())
    return out


def match(teacher: list[str], mine: list[str]) -> dict[str, str | None]:
    """Teacher's notebook name -> the learner's notebook of that name (or the only one)."""
    by_name: dict[str, str] = {}
    for rel in mine:
        by_name.setdefault(rel.rsplit("/", 1)[-1], rel)
    if len(teacher) == 1 and len(mine) == 1:
        return {teacher[0]: mine[0]}
    return {name: by_name.get(name) for name in teacher}



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
