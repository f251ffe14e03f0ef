"""The third way in: `pip install` of the wheel, then `xenith-edu chapters`.

A fresh virtual environment that holds only the wheel and its core dependencies (the wheel's
own Requires-Dist, followed through their dependencies; this environment's copies, linked in,
since tests never download) imports the package and every component, trains the small preset,
writes the student notebooks of every chapter from the wheel, and names in one line the extra
that a command it cannot run needs. The notebook tooling, PyTorch and JupyterLab are proved
absent there. The wheel's chapters are the repository's notebooks, byte for byte (one source),
and an editable install finds them in the clone.
"""

from __future__ import annotations

import html
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import book_extension, clone_lock
from packaging.requirements import Requirement
from test_book import built_book  # noqa: F401  (the fixture: one build, shared)

import xenith_edu
from xenith_edu import chapters
from xenith_edu.booktools.student import SETUP_TAG, make_student_versions

ROOT = Path(__file__).resolve().parents[1]
# what a learner's core install must not have: the notebook tooling and the extras
ABSENT = ("nbformat", "nbclient", "ipykernel", "jupyterlab", "torch", "transformers",
          "tokenizers", "mpi4py", "pytest", "hypothesis")


SOURCES = book_extension().WHEEL_SOURCES  # what the wheel is built from: the book's list


def clone_entries() -> set[str]:
    """What the clone holds, the files that packaging tools leave (build/, *.egg-info) too."""
    return {p.name for p in ROOT.iterdir()} | {f"xenith_edu/{p.name}" for p in
                                               (ROOT / "xenith_edu").iterdir()}


LEFT_BY_THE_BUILD: set[str] = set()  # what building the wheel added to the clone (nothing)


def build_wheel(out: Path) -> Path:
    """The wheel, built offline as the book's build makes it (from a copy of the sources:
    nothing left in the clone; an editable install may have left its *.egg-info already, and
    that is not the build's)."""
    with clone_lock():  # no other test's process writes into the clone meanwhile
        before = clone_entries()
        wheel = book_extension().build_wheel(out / "dist")  # the book's recipe
        LEFT_BY_THE_BUILD.update(clone_entries() - before)
    return wheel


def core_requirements(wheel: Path) -> list[str]:
    """The wheel's dependencies outside any extra, as its metadata states them."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(name).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines
            if line.startswith("Requires-Dist:")]
    return [str(r) for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(requirements: list[str]) -> set[str]:
    """The distributions of this environment that `requirements` need, transitively."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = metadata.distribution(req.name).metadata["Name"].lower()
        if name not in seen:
            seen.add(name)
            todo.extend(metadata.requires(name) or [])
    return seen


def link_distributions(names: set[str], folder: Path) -> None:
    """A folder holding links to just these distributions' files (packages and metadata)."""
    folder.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (folder / top).exists() and (base / top).exists():
                (folder / top).symlink_to(base / top)


def fresh_venv(where: Path, deps: Path) -> Path:
    """A virtual environment without pip or site packages but a .pth to `deps`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    (Path(site.stdout.strip()) / "core_deps.pth").write_text(f"{deps}\n")
    return python


def pip_install(python: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", *args], check=True, capture_output=True)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "VIRTUAL_ENV", "COV_"))}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def learner(tmp_path_factory, wheel) -> Path:
    """The bin/ folder of a fresh environment holding the wheel and its core dependencies."""
    root = tmp_path_factory.mktemp("learner")
    link_distributions(closure(core_requirements(wheel)), root / "deps")
    python = fresh_venv(root / "venv", root / "deps")
    pip_install(python, str(wheel))
    return python.parent


def run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=clean_env(),
                          text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the wheel


def test_the_core_dependencies_are_what_the_numpy_chapters_need(wheel) -> None:
    core = {Requirement(r).name for r in core_requirements(wheel)}
    assert core == {"numpy", "matplotlib", "tqdm", "threadpoolctl", "filelock"}
    assert not core & set(ABSENT)


def test_the_wheel_holds_the_chapters_as_the_repository_has_them(wheel, tmp_path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for c in chapters.CHAPTERS:
            shipped = z.read(f"xenith_edu/notebooks/{c.slug}.ipynb")
            assert shipped == (ROOT / f"{c.notebook}.ipynb").read_bytes(), c.slug
        made = make_student_versions(ROOT / "notebooks", tmp_path / "student")
        for path in made:
            assert z.read(f"xenith_edu/notebooks/student/{path.name}") == path.read_bytes()
    extra = {n for n in names if n.startswith("xenith_edu/notebooks/")} - {
        f"xenith_edu/notebooks/{p}{c.slug}.ipynb" for c in chapters.CHAPTERS
        for p in ("", "student/")}
    assert extra == set()
    assert LEFT_BY_THE_BUILD == set()


# ---------------------------------------------------------------- a learner's environment


def test_the_learners_environment_has_only_the_core(learner, tmp_path) -> None:
    probe = ("import importlib.util, json\n"
             f"print(json.dumps([m for m in {ABSENT!r} if importlib.util.find_spec(m)]))\n"
             "import numpy, matplotlib, tqdm, threadpoolctl, filelock\n")
    ran = run(learner, tmp_path, "python", "-c", probe)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []


def test_the_wheel_imports_every_component_and_trains(learner, tmp_path) -> None:
    code = ("import importlib, pathlib, xenith_edu as xe\n"
            "from xenith_edu import chapters\n"
            "assert 'learner' in str(pathlib.Path(xe.__file__).resolve()), xe.__file__\n"
            "for c in chapters.CHAPTERS:\n"
            "    for m in c.modules:\n"
            "        importlib.import_module('xenith_edu.' + m)\n"
            "print(xe.__version__, xe.TrainConfig.__name__, len(xe.exercises.CHECKS))")
    ran = run(learner, tmp_path, "python", "-c", code)
    assert ran.returncode == 0, ran.stderr
    version = run(learner, tmp_path, "xenith-edu", "--version")
    assert version.stdout == f"xenith-edu {ran.stdout.split()[0]}\n"
    trained = run(learner, tmp_path, "xenith-edu", "train", "--preset", "small", "--steps", "3",
                  "--eval-every", "3", "--eval-batches", "1", "--no-progress", "--sample-chars",
                  "20", "--out", "run")
    assert trained.returncode == 0, trained.stderr
    assert "after 3 steps" in trained.stdout
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "ckpt.npz", "log.jsonl", "loss.png"]


def test_the_wheel_writes_the_student_notebooks(learner, tmp_path) -> None:
    ran = run(learner, tmp_path, "xenith-edu", "chapters", "--out", "chapters")
    assert ran.returncode == 0, ran.stderr
    written = sorted((tmp_path / "chapters").iterdir())
    assert [p.name for p in written] == sorted(f"{c.slug}.ipynb" for c in chapters.CHAPTERS)
    for path in written:
        nb = json.loads(path.read_text(encoding="utf-8"))
        text = path.read_text(encoding="utf-8")
        assert "BEGIN SOLUTION" not in text and "NotImplementedError" in text, path.name
        assert SETUP_TAG in nb["cells"][1]["metadata"]["tags"], path.name
        assert all(not c.get("outputs") for c in nb["cells"]), path.name


@pytest.mark.parametrize(("command", "extra"), [
    (("student", "x.ipynb", "--out", "s"), "notebooks"),
    (("lab", "--out", "c"), "lab"),
])
def test_a_command_without_its_extra_says_which_in_one_line(learner, tmp_path, command,
                                                            extra) -> None:
    (tmp_path / "x.ipynb").write_text("{}")
    ran = run(learner, tmp_path, "xenith-edu", *command)
    assert ran.returncode == 1 and ran.stderr.count("\n") == 1, ran.stderr
    assert f'pip install "xenith-edu[{extra}]"' in ran.stderr
    assert "Traceback" not in ran.stderr


# ---------------------------------------------------------------- an editable install


def test_an_editable_install_finds_the_chapters_of_its_clone(wheel, tmp_path) -> None:
    src = tmp_path / "clone"
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name)
    # the core, the build backend, and the notebook tooling that makes student versions
    deps = closure(core_requirements(wheel)) | closure(["setuptools", "nbformat"])
    link_distributions(deps, tmp_path / "deps")
    python = fresh_venv(tmp_path / "venv", tmp_path / "deps")
    pip_install(python, "--no-build-isolation", "-e", str(src))
    ran = run(python.parent, tmp_path, "xenith-edu", "chapters", "--out", "mine")
    assert ran.returncode == 0, ran.stderr
    assert len(list((tmp_path / "mine").iterdir())) == len(chapters.CHAPTERS)
    assert not (src / "xenith_edu" / "notebooks").exists()  # read in place, not copied



# ---------------------------------------------------------------- the book serves it


def test_the_site_serves_the_wheel_and_its_chapters_are_the_pages_downloads(
        built_book: Path) -> None:  # noqa: F811
    """The how-to-use page links the site's wheel; the student notebook in the wheel is the
    one each chapter page offers for download, byte for byte."""
    (wheel,) = (built_book / "_static").glob("xenith_edu-*.whl")
    assert wheel.name == f"xenith_edu-{xenith_edu.__version__}-py3-none-any.whl"
    page = (built_book / "book" / "how_to_use.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))  # code is split into spans
    assert f'href="../_static/{wheel.name}"' in page and f"pip install {wheel.name}" in text
    with zipfile.ZipFile(wheel) as z:
        for c in chapters.CHAPTERS:
            downloads = [p for p in built_book.rglob(f"{c.slug}.ipynb")]
            assert downloads, c.slug
            shipped = z.read(f"xenith_edu/notebooks/student/{c.slug}.ipynb")
            assert all(p.read_bytes() == shipped for p in downloads), c.slug


def test_every_module_a_chapter_imports_is_the_cores_or_named_by_an_extra(wheel) -> None:
    """A chapter's imports are the standard library's, the package's, a core dependency's, or
    a module that `EXTRA_OF` maps to an extra (which its setup cell then names)."""
    from xenith_edu.booktools.student import EXTRA_OF, used_modules

    provides = metadata.packages_distributions()
    core = closure(core_requirements(wheel))
    uncovered = {}
    for c in chapters.CHAPTERS:
        nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text(encoding="utf-8"))
        for cell in (c for c in nb["cells"] if c["cell_type"] == "code"):
            for module in used_modules("".join(cell["source"])):
                dists = {d.lower() for d in provides.get(module, [])}
                if not (module in sys.stdlib_module_names or module == "xenith_edu"
                        or dists & core or module in EXTRA_OF):
                    uncovered.setdefault(c.slug, set()).add(module)
    assert uncovered == {}
    assert {"numpy", "matplotlib"} <= core  # the check reads the core it should


def test_the_wheel_builds_with_only_the_declared_build_requirements(tmp_path) -> None:
    """What pip does from a git URL (Colab, Binder): build in an environment that holds only
    pyproject.toml's build-system requirements; the chapters and student versions are made."""
    tomllib = pytest.importorskip("tomllib")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    link_distributions(closure(requires), tmp_path / "deps")
    python = fresh_venv(tmp_path / "venv", tmp_path / "deps")
    src = tmp_path / "src"
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "wheel", "--no-deps",
                    "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"),
                    str(src)], check=True, capture_output=True, env=clean_env())
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        student = [n for n in z.namelist() if n.startswith("xenith_edu/notebooks/student/")]
    assert len(student) == len(chapters.CHAPTERS)
