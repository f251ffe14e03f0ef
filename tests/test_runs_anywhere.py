"""Chapters run from any folder: what they read is package data, never a path of the repository.
The chapters that used to break (memory, training) and one more run, full and student, from an
empty folder outside the repository; the training chapter's long cells are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from xenith_edu import chapters
from xenith_edu.classroom.student import SETUP_TAG, make_student_versions

ROOT = Path(__file__).resolve().parents[1]
# a string literal in a chapter's code that names a file of the repository, not of the package
REPO_PATH = re.compile(r"""["'](\.\./|\./|runs/|benchmarks/|notebooks/|tests/)""")
# the training chapter trains for a minute: of it, the first code cell (the imports), the setup
# cell and the cells that read the shipped run
READS_SHIPPED = re.compile(r"\b(shipped|book_run)\b")


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_no_chapter_names_a_file_of_the_repository(c: chapters.Chapter) -> None:
    nb = nbformat.read(str(ROOT / f"{c.notebook}.ipynb"), as_version=4)
    hits = [line.strip() for cell in code_cells(nb) for line in cell.source.splitlines()
            if REPO_PATH.search(line.split("#")[0])]
    assert hits == [], f"{c.slug} reads files of the repository (make them package data): {hits}"


def test_the_check_finds_a_repository_path() -> None:
    assert REPO_PATH.search('json.loads(Path("../benchmarks/memory.json").read_text())')
    assert REPO_PATH.search("read_log('runs/book/log.jsonl')")
    assert not REPO_PATH.search('shipped("memory.json")')


def shortened(nb: nbformat.NotebookNode, slug: str) -> nbformat.NotebookNode:
    """The training chapter without its long cells; any other chapter whole."""
    if slug != "training":
        return nb
    first = code_cells(nb)[0] if SETUP_TAG not in code_cells(nb)[0].metadata.get("tags", []) \
        else code_cells(nb)[1]
    nb.cells = [cell for cell in nb.cells if cell.cell_type == "code" and (
        cell is first or SETUP_TAG in cell.metadata.get("tags", [])
        or READS_SHIPPED.search(cell.source))]
    assert len(nb.cells) >= 4, "the training chapter no longer reads its shipped run"
    return nb


@pytest.mark.parametrize("version", ["full", "student"])
@pytest.mark.parametrize("slug", ["memory", "training", "attention"])
def test_chapter_runs_from_an_empty_folder(slug: str, version: str, tmp_path: Path) -> None:
    path = ROOT / f"{chapters.chapter(slug).notebook}.ipynb"
    if version == "student":
        (path,) = make_student_versions(path, tmp_path / "student")
    nb = shortened(nbformat.read(str(path), as_version=4), slug)
    empty = tmp_path / "empty"
    empty.mkdir()
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(empty)}}).execute()
    assert list(empty.iterdir()) == [], f"{slug} wrote into the working folder"
