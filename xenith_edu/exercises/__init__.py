"""Exercise checks: one `check_*` function per exercise of the book, called from the notebooks.

`engine` holds what every check shares (cases, running the learner's function, judging,
diagnosing, the grade log); each chapter's exercises live in the module named by the chapter's
slug in `xenith_edu.chapters` (`xenith_edu.exercises.rmsnorm`, ...). Each chapter module
defines `SPECS` (a list of `Spec`) and one `check_<id>(fn)` per spec (its `__all__`, if any,
lists what this package re-exports; else every `check_*` name).
This package collects them in the registry's order: `SPECS` (id -> Spec), `CHECKS` (id ->
(chapter slug, check function)) and every `check_*` name.

To add a chapter's exercises: write `xenith_edu/exercises/<slug>.py` with its `SPECS`, its
`check_*` functions; the chapter's registry row makes this package import it.
The spec's chapter is the module it is defined in, and its id is stored in the spec only.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

from ..chapters import CHAPTERS
from .engine import GRADE_LOG_ENV, Case, CheckResult, Spec, check, judge
from .outcomes import InPlace, NotCallable, Opaque, Raised, run

SPECS: dict[str, Spec] = {}
CHECKS: dict[str, tuple[str, Callable[[Callable], CheckResult]]] = {}


def _collect() -> list[str]:
    """Imports each registered chapter's exercise module and gathers its specs and checks."""
    names = []
    for chapter in CHAPTERS:
        if importlib.util.find_spec(chapter.exercises) is None:
            continue  # a chapter without exercises
        module = importlib.import_module(chapter.exercises)
        for spec in module.SPECS:
            if spec.id in SPECS:
                raise ValueError(f"exercise id {spec.id!r} is defined twice")
            if spec.chapter != chapter.slug:
                raise ValueError(f"exercise {spec.id!r} is in the {chapter.slug} module but "
                                 f"its cases come from {spec.chapter}")
            SPECS[spec.id] = spec
            CHECKS[spec.id] = (chapter.slug, getattr(module, f"check_{spec.id}"))
        public = getattr(module, "__all__", None)
        for name in public or [n for n in vars(module) if n.startswith("check_")]:
            globals()[name] = getattr(module, name)
            names.append(name)
    return names


__all__ = ["CHECKS", "SPECS", "GRADE_LOG_ENV", "Case", "CheckResult", "InPlace", "NotCallable",
           "Opaque", "Raised", "Spec", "check", "judge", "run"] + _collect()
