"""The book's tooling: the student versions of the chapter notebooks, and the chapters written
from the installed package into a learner's folder (`student.py`; nbformat is the `notebooks`
extra, imported only when a notebook is read or written).
"""

from __future__ import annotations


def __getattr__(name: str):
    # imported on first use: the names need the notebook tooling, an extra
    if name in ("make_student_versions", "write_chapters"):
        from . import student  # on first use (see above)

        return getattr(student, name)
    raise AttributeError(f"module 'xenith_edu.booktools' has no attribute {name!r}")


__all__ = ["make_student_versions", "write_chapters"]
