"""The built site offers only student notebooks; its pages show solutions without markers.
Reuses the book build of tests/test_book.py (`built_book`); the setup cell is tested alone.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_book import HTML, ROOT, built_book  # noqa: F401  (the fixture: one build, shared)

from xenith_edu import chapters
from xenith_edu.booktools.student import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    SETUP_TAG,
    book_repository,
    chapter_extras,
    make_student_versions,
    setup_cell,
)

MARKER = b"BEGIN SOLUTION"
# The one page that teaches the markers to teachers (its toy example, no chapter's solution).
DOCUMENTS_THE_MARKERS = {"book/teaching.html", "_sources/book/teaching.md"}


def solution_lines(nb: nbformat.NotebookNode) -> list[str]:
    """The first code line inside each solution region of a notebook."""
    found = []
    for cell in nb.cells:
        lines = cell.source.split("\n") if cell.cell_type == "code" else []
        for i, line in enumerate(lines[:-1]):
            if BEGIN_SOLUTION.match(line) and not END_SOLUTION.match(lines[i + 1]):
                found.append(lines[i + 1].strip())
    return found


def page_text(path: Path) -> str:
    """A rendered page as text: tags dropped, entities decoded (code is split into spans)."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def students(tmp_path_factory) -> dict[str, Path]:
    """The student version of every chapter, made from the repository's notebook."""
    out = tmp_path_factory.mktemp("student")
    return {p.name: p for p in make_student_versions(ROOT / "notebooks", out)}


# ---------------------------------------------------------------- the built site


def test_no_file_of_the_site_holds_a_solution_marker(built_book: Path) -> None:  # noqa: F811
    files = [p for p in built_book.rglob("*") if p.is_file()]
    marked = sorted(str(p.relative_to(built_book)) for p in files if MARKER in p.read_bytes())
    assert set(marked) <= DOCUMENTS_THE_MARKERS, f"solution markers in {marked}"
    print(f"{len(files)} files under _build/html checked; markers only in {marked}")


def test_every_notebook_of_the_site_is_a_student_version(
        built_book: Path, students) -> None:  # noqa: F811
    built = sorted(built_book.rglob("*.ipynb"))
    assert built, "the site offers no notebook"
    for path in built:
        rel = path.relative_to(built_book)
        assert path.name in students, f"{rel}: a notebook that is no chapter"
        assert path.read_text(encoding="utf-8") == students[path.name].read_text(
            encoding="utf-8"), f"{rel} is not the student version of notebooks/{path.name}"


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=[c.slug for c in chapters.CHAPTERS])
def test_each_chapter_downloads_its_student_version_and_shows_its_solutions(
        built_book: Path, students, c) -> None:  # noqa: F811
    page = built_book / f"{c.notebook}.html"
    links = re.findall(r'href="([^"]+\.ipynb)"', page.read_text(encoding="utf-8"))
    assert links, f"{page.name}: no .ipynb download"
    for href in links:
        nb = nbformat.read(str((page.parent / href).resolve()), as_version=4)
        text = json.dumps(nb)
        assert "BEGIN SOLUTION" not in text and "NotImplementedError" in text, href
        assert SETUP_TAG in nb.cells[1].metadata.get("tags", []), f"{href}: no setup cell"
    # the page still shows each solution (collapsed), only the marker lines are gone
    source = nbformat.read(str(ROOT / f"{c.notebook}.ipynb"), as_version=4)
    shown = page_text(page)
    for line in solution_lines(source):
        assert line in shown, f"{page.name}: the solution line {line!r} is not on the page"


def test_launch_buttons_open_the_student_version() -> None:
    """Binder opens student/<chapter>.ipynb (binder/postBuild writes it), Colab the same file on
    the branch the workflow publishes; other services are removed."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from xenith_book import STUDENT_BRANCH, STUDENT_DIR, student_launch_buttons
    finally:
        sys.path.pop(0)
    binder = "https://mybinder.org/v2/gh/someone/xenith-edu/main"
    context = {"header_buttons": [
        {"label": "download-buttons", "buttons": [{"text": ".ipynb", "url": "x"}]},
        {"label": "launch-buttons", "buttons": [
            {"type": "link", "text": "Binder",
             "url": f"{binder}?urlpath=lab/tree/notebooks/rmsnorm.ipynb"},
            {"type": "link", "text": "Colab", "url": "https://colab.research.google.com/github/"
             "someone/xenith-edu/blob/main/notebooks/rmsnorm.ipynb"}]}]}
    student_launch_buttons(None, "notebooks/rmsnorm", "page.html", context, None)
    download, launch = context["header_buttons"]
    assert download["buttons"] == [{"text": ".ipynb", "url": "x"}]
    assert [b["text"] for b in launch["buttons"]] == ["Binder", "Colab"]
    assert launch["buttons"][0]["url"] == f"{binder}?urlpath=lab/tree/{STUDENT_DIR}/rmsnorm.ipynb"
    assert launch["buttons"][1]["url"] == ("https://colab.research.google.com/github/someone/"
                                           f"xenith-edu/blob/{STUDENT_BRANCH}/{STUDENT_DIR}/"
                                           "rmsnorm.ipynb")
    postbuild = (ROOT / "binder" / "postBuild").read_text(encoding="utf-8")
    assert f"xenith-edu chapters --out {STUDENT_DIR}" in postbuild
    assert '".[mpi,torch,hf]"' in postbuild  # the torch and llama chapters run on Binder
    workflow = (ROOT / ".github" / "workflows" / "book.yml").read_text(encoding="utf-8")
    assert f"git push -qf origin {STUDENT_BRANCH}" in workflow
    # the student versions come from the package as pip installs it (its core dependencies
    # alone: `student` would need the notebooks extra)
    assert 'xenith-edu chapters --out "$RUNNER_TEMP/student"' in workflow
    assert f"cp \"$RUNNER_TEMP\"/student/*.ipynb {STUDENT_DIR}/" in workflow
    only_other = {"header_buttons": [{"label": "launch-buttons", "buttons": [
        {"type": "link", "text": "JupyterHub", "url": "https://hub.example.org/x"}]}]}
    student_launch_buttons(None, "notebooks/rmsnorm", "page.html", only_other, None)
    assert only_other["header_buttons"] == []  # no empty launch menu


# ---------------------------------------------------------------- the setup cell


def run_cell(source: str, monkeypatch, importable: bool) -> list[list[str]]:
    """Run a setup cell's code; return the commands it ran (subprocess.run is recorded, and
    "installs" the package: `import xenith_edu` fails until it has run)."""
    ran: list[list[str]] = []

    def install(cmd, **kw):
        ran.append(cmd)
        sys.modules.pop("xenith_edu", None)  # installed: the import now finds the package

    monkeypatch.setattr(subprocess, "run", install)
    if not importable:
        monkeypatch.setitem(sys.modules, "xenith_edu", None)  # `import xenith_edu` fails
    exec(compile(source, "setup cell", "exec"), {})
    return ran


REAL_RUN = subprocess.run  # run_cell replaces subprocess.run while a test runs


def run_alone(source: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a setup cell in a Python without site-packages (-S), in `cwd`: xenith_edu is absent
    unless the cell finds it."""
    return REAL_RUN([sys.executable, "-S", "-c", source + "\nprint(xenith_edu.__file__)"],
                    cwd=cwd, capture_output=True, text=True, timeout=60, env={})


def test_setup_cell_does_nothing_where_xenith_edu_imports(monkeypatch) -> None:
    cell = setup_cell("https://github.com/someone/xenith-edu", "main")
    assert run_cell(cell.source, monkeypatch, importable=True) == []
    assert SETUP_TAG in cell.metadata["tags"]
    for url in ("https://github.com/someone/xenith-edu", ""):
        assert max(len(line) for line in setup_cell(url, "main").source.split("\n")) <= 88


def test_setup_cell_installs_from_the_repository_where_it_does_not_import(
        monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # no clone of the repository above
    cell = setup_cell("https://github.com/someone/xenith-edu", "main")
    (cmd,) = run_cell(cell.source, monkeypatch, importable=False)
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert cmd[-1] == "git+https://github.com/someone/xenith-edu@main"


def test_setup_cell_uses_the_package_of_a_clone_above(tmp_path) -> None:
    package = tmp_path / "clone" / "xenith_edu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "chapters.py").write_text("")
    (tmp_path / "clone" / "student").mkdir()
    for url in ("", "https://github.com/someone/xenith-edu"):
        ran = run_alone(setup_cell(url, "main").source, tmp_path / "clone" / "student")
        assert ran.returncode == 0, ran.stderr
        assert Path(ran.stdout.strip()) == (package / "__init__.py").resolve()


def test_setup_cell_without_a_repository_says_how_to_install(monkeypatch, tmp_path) -> None:
    cell = setup_cell("", "main")
    assert run_cell(cell.source, monkeypatch, importable=True) == []
    assert "install" not in cell.source.split("try:")[0]  # the comment promises no install
    ran = run_alone(cell.source, tmp_path)
    assert ran.returncode == 1
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: this notebook needs the package xenith_edu")
    assert "make lab" in last


def test_the_setup_cell_reads_the_books_repository(tmp_path) -> None:
    (tmp_path / "notebooks").mkdir()
    assert book_repository(tmp_path / "notebooks") is None  # outside a book: no setup cell
    (tmp_path / "_config.yml").write_text(
        'title: t\nrepository:\n  url: "https://github.com/o/r"  # the book\n'
        "  branch: teach\n  path_to_book: ''\nlaunch_buttons:\n  url: nope\n")
    assert book_repository(tmp_path / "notebooks") == ("https://github.com/o/r", "teach")
    (tmp_path / "_config.yml").write_text('repository:\n  url: ""\n  branch: main\n')
    assert book_repository(tmp_path / "notebooks" / "x.ipynb") == ("", "main")
    config = (ROOT / "_config.yml").read_text(encoding="utf-8")
    url = re.search(r'^repository:\n  url: "([^"]*)"', config, re.MULTILINE).group(1)
    assert book_repository(ROOT / "notebooks")[0] == url


def test_each_student_chapter_opens_with_the_setup_cell(students) -> None:
    """Cell 2, after the title; the student copies run top to bottom in test_classroom.py."""
    url, branch = book_repository(ROOT / "notebooks")
    for name, path in students.items():
        nb = nbformat.read(str(path), as_version=4)
        assert nb.cells[0].source.startswith("# "), name
        extras = chapter_extras(nbformat.read(str(ROOT / "notebooks" / name), as_version=4))
        assert nb.cells[1].source == setup_cell(url, branch, extras).source, name
        assert sum(SETUP_TAG in c.metadata.get("tags", []) for c in nb.cells) == 1, name
