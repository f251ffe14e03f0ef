"""The one build step that pyproject.toml cannot state: the chapters go into the wheel.

When a wheel is built, the chapter notebooks of notebooks/ are copied into the package
(xenith_edu/notebooks/) and their student versions written beside them (notebooks/student/),
so that `xenith-edu chapters` works from an installed wheel without the notebook tooling. The
repository keeps one copy, notebooks/; an editable install reads it there.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithChapters(build_py):
    """build_py, then the chapters and their student versions into the built package."""

    def run(self) -> None:
        super().run()
        source = ROOT / "notebooks"
        if getattr(self, "editable_mode", False) or not any(source.glob("*.ipynb")):
            return  # editable: the clone's notebooks/ is read in place
        target = Path(self.build_lib) / "xenith_edu" / "notebooks"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for notebook in sorted(source.glob("*.ipynb")):
            shutil.copyfile(notebook, target / notebook.name)
        sys.path.insert(0, str(ROOT))  # this source's package makes the student versions
        try:
            from xenith_edu.booktools.student import make_student_versions

            make_student_versions(source, target / "student")
        finally:
            sys.path.remove(str(ROOT))


setup(cmdclass={"build_py": BuildPyWithChapters})
