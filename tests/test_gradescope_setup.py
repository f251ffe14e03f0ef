"""The Gradescope archive's setup.sh, run end to end, offline.

A Python 3.10 or newer with venv (as Gradescope's image has once apt has run; apt is not
called when it is there) builds the autograder's virtual environment from the archive alone:
the package's wheel, and the dependencies' wheels the archive carries (`--wheels`), with
PIP_NO_INDEX=1, so that nothing can be downloaded. Then run_autograder, with nothing but that
environment, grades a submission: every point of the checks. The dependencies' wheels are made
from this environment's own installed files (tests never download).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from test_gradescope import lesson, unpack, validate

from xenith_edu.gradebook.gradescope import GRADER_EXTRA, build, package_metadata


def closure(requirements: list[tuple[str, str]]) -> set[str]:
    """The distributions of this environment that (requirement, extra) pairs need."""
    seen: set[tuple[str, str]] = set()
    todo = list(requirements)
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = metadata.distribution(req.name).metadata["Name"]
        for wanted in ("", *sorted(req.extras)):
            if (name.lower(), wanted) not in seen:
                seen.add((name.lower(), wanted))
                todo += [(r, wanted) for r in metadata.requires(name) or []]
    return {name for name, _ in seen}


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_of(name: str, out: Path) -> Path:
    """A wheel of the installed distribution `name`: its files under site-packages and its
    metadata (what lies outside, scripts, pip makes again from entry_points.txt)."""
    dist = metadata.distribution(name)
    base = Path(dist.locate_file(""))
    norm, version = re.sub(r"[-_.]+", "_", dist.metadata["Name"]), dist.version
    info = f"{norm}-{version}.dist-info"
    files: dict[str, Path] = {}
    for f in dist.files or []:
        if str(f).startswith("..") or "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        target = str(f)
        if f.parts[0].endswith(".dist-info"):
            if f.name in ("RECORD", "WHEEL", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            target = "/".join((info, *f.parts[1:]))
        if (base / f).is_file():
            files[target] = base / f
    path = out / f"{norm}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for target, source in files.items():
            data = source.read_bytes()
            z.writestr(target, data)
            record.append(f"{target},sha256={_digest(data)},{len(data)}")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/WHEEL,,",
                                                f"{info}/RECORD,,"]) + "\n")
    return path


def dependency_wheels(out: Path) -> Path:
    """The wheels of the package's dependencies with the grader's extra, from this
    environment: what `pip download "xenith-edu[notebooks]"` would give a teacher."""
    out.mkdir()
    own = [line.split(":", 1)[1].strip() for line in package_metadata().splitlines()
           if line.startswith("Requires-Dist:")]  # the archive's wheel's, not this install's
    names = closure([(r, GRADER_EXTRA) for r in own]) - {"xenith-edu"}
    assert {"numpy", "filelock", "nbformat", "ipython"} <= names
    for name in sorted(names):
        wheel_of(name, out)
    return out


def test_setup_sh_builds_the_autograder_offline_and_run_autograder_grades(tmp_path):
    (tmp_path / "teacher").mkdir()
    nbformat.write(lesson(), str(tmp_path / "teacher" / "lesson.ipynb"))
    archive = tmp_path / "autograder.zip"
    build(tmp_path / "teacher", archive, wheels=dependency_wheels(tmp_path / "wheels"))
    root = unpack(archive, tmp_path / "autograder")
    shims = tmp_path / "bin"  # python3 as on the image; an apt-get that says it was called
    shims.mkdir()
    # a script, not a link: the environment's python links to the interpreter itself, as on
    # an image (a link to a link outside the sandbox's read-only folders would not run there)
    real = os.path.realpath(sys._base_executable)
    (shims / "python3").write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    (shims / "python3").chmod(0o755)
    (shims / "apt-get").write_text(f"#!/bin/sh\ntouch {tmp_path / 'apt-called'}\nexit 1\n")
    (shims / "apt-get").chmod(0o755)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "XENITH_AUTOGRADER_ROOT": str(root), "PIP_NO_INDEX": "1",
           "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not (tmp_path / "apt-called").exists()
    python = root / "xenith-venv" / "bin" / "python"
    where = subprocess.run([str(python), "-I", "-c", "import xenith_edu, nbformat, numpy; "
                            "print(xenith_edu.__file__); print(nbformat.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert all(line.startswith(str(root / "xenith-venv")) for line in where.split())
    sub = root / "submission"
    sub.mkdir()
    nbformat.write(lesson(), str(sub / "lesson.ipynb"))
    env.pop("PIP_NO_INDEX")
    graded = subprocess.run(["bash", str(root / "run_autograder")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert graded.returncode == 0, graded.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    assert results["score"] == 4.0, results["output"]  # 3 + 1; the written answer by hand


def test_the_archive_s_wheel_states_the_dependencies_of_the_package_s_files(tmp_path):
    """In a clone, the wheel's metadata is the pyproject's (an editable install's own record
    may predate a dependency added since); its version is the files'."""
    import tomllib

    import xenith_edu

    project = tomllib.loads((Path(xenith_edu.__file__).parents[1] / "pyproject.toml")
                            .read_text(encoding="utf-8"))["project"]
    lines = package_metadata().splitlines()
    core = [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert core == project["dependencies"]
    assert {line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Provides-Extra:")} == set(project["optional-dependencies"])
    assert f"Version: {xenith_edu.__version__}" in lines


def test_a_folder_of_wheels_without_one_is_refused_in_one_line(tmp_path):
    (tmp_path / "teacher").mkdir()
    nbformat.write(lesson(), str(tmp_path / "teacher" / "lesson.ipynb"))
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "absent"):
        with pytest.raises(ValueError, match=r"^wheels: no wheel \(\.whl\) in [^\n]*$"):
            build(tmp_path / "teacher", tmp_path / "a.zip", wheels=folder)
    assert not (tmp_path / "a.zip").exists()
