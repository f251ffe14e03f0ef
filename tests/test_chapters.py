"""The chapter registry is the one table of chapters: `_toc.yml`, the notebooks and the
exercise modules must agree with it, and no chapter number is typed anywhere else."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import book_extension

from xenith_edu import chapters

ROOT = Path(__file__).resolve().parents[1]
CHAPTER_NUMBER = re.compile(r"[Cc]hapters? \d")


def toc_notebooks() -> list[tuple[str, bool]]:
    """(file, numbered) for every notebook of _toc.yml, in the book's order."""
    out, numbered = [], False
    for line in (ROOT / "_toc.yml").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*numbered:\s*(\w+)", line)
        if m:
            numbered = m.group(1) == "true"
        m = re.match(r"^\s*-\s*file:\s*(notebooks/\S+?)(\.ipynb)?\s*$", line)
        if m:
            out.append((m.group(1), numbered))
    return out


def test_registry_and_toc_agree() -> None:
    listed = toc_notebooks()
    assert [f for f, _ in listed] == [c.notebook for c in chapters.CHAPTERS], (
        "_toc.yml and xenith_edu/chapters.py list different chapters or orders")
    for (f, numbered), c in zip(listed, chapters.CHAPTERS, strict=True):
        assert numbered == c.numbered, f"{f}: numbered in _toc.yml is {numbered}, registry {c}"


def test_every_notebook_is_a_registered_chapter() -> None:
    on_disk = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert on_disk == sorted(c.slug for c in chapters.CHAPTERS)


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_chapter_opens_with_its_registered_title(c: chapters.Chapter) -> None:
    nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text(encoding="utf-8"))
    first = "".join(nb["cells"][0]["source"]).splitlines()[0]
    assert first == f"# {c.title}", (
        f"{c.notebook}: first heading {first!r}, the registry says {c.title!r}")


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_registered_modules_and_exercises_import(c: chapters.Chapter) -> None:
    for m in c.modules:
        importlib.import_module(f"xenith_edu.{m}")
    importlib.import_module(c.exercises)


def test_every_chapter_says_what_it_derives() -> None:
    assert [c.slug for c in chapters.CHAPTERS if not c.summary.strip()] == []


def test_numbers_come_from_the_order() -> None:
    numbered = [c.slug for c in chapters.CHAPTERS if c.numbered]
    assert [chapters.number(s) for s in numbered] == list(range(1, len(numbered) + 1))
    with pytest.raises(ValueError, match="no chapter 'nope'"):
        chapters.chapter("nope")


def test_no_chapter_numbers_are_typed_in_the_package_or_tests() -> None:
    files = subprocess.run(["git", "ls-files", "xenith_edu", "tests"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    files += subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "xenith_edu",
                             "tests"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.split()
    hits = [f"{f}:{i}" for f in files if f.endswith(".py") and (ROOT / f).is_file()
            for i, line in enumerate((ROOT / f).read_text(encoding="utf-8").splitlines(), 1)
            if CHAPTER_NUMBER.search(line)]
    assert len(hits) <= 3, f"chapter numbers typed by hand: {hits}"


def test_going_further_comes_after_the_main_path() -> None:
    flags = [c.going_further for c in chapters.CHAPTERS]
    assert flags == sorted(flags), "a going-further chapter sits before a chapter of the main path"
    assert chapters.CHAPTERS[flags.index(True) - 1].slug != "backward", flags
    assert flags.index(True) > [c.slug for c in chapters.CHAPTERS].index("training")


def book_texts() -> list[tuple[str, str]]:
    """(where, text) of every notebook cell and every book page: what a reader reads."""
    out = [(f"book/{p.name}", p.read_text("utf-8")) for p in sorted((ROOT / "book").glob("*.md"))]
    for c in chapters.CHAPTERS:
        nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text("utf-8"))
        out += [(f"{c.notebook}, cell {i}", "".join(cell["source"]))
                for i, cell in enumerate(nb["cells"])]
    out.append(("_toc.yml", (ROOT / "_toc.yml").read_text("utf-8")))
    return out


def numbered_table_cells(text: str) -> list[str]:
    """Bare numbers in a "chapter" column of a Markdown table: chapter numbers typed by hand."""
    hits, column = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|"):
            column = None
        elif column is None:
            column = next((i for i, c in enumerate(cells) if c.lower() == "chapter"), -1)
        elif 0 <= column < len(cells) and re.fullmatch(r"\d+", cells[column]):
            hits.append(line.strip())
    return hits


def test_no_chapter_numbers_are_typed_in_notebooks_or_book_pages() -> None:
    """The book numbers chapters from the registry (its toc, its tables): prose names titles."""
    hits = [f"{where}: {m.group(0)!r}" for where, text in book_texts()
            for m in re.finditer(r"[Cc]hapters? \d+|[Cc]h\. ?\d+", text)]
    hits += [f"{where}: {row!r}" for where, text in book_texts()
             for row in numbered_table_cells(text)]
    assert hits == [], f"chapter numbers typed by hand: {hits}"
    assert CHAPTER_NUMBER.search("as chapter 8 showed") and not CHAPTER_NUMBER.search(
        "as the training chapter showed")
    assert numbered_table_cells("| step | chapter |\n| --- | --- |\n| CE | 1 |\n") == ["| CE | 1 |"]
    assert numbered_table_cells("| step | from |\n| --- | --- |\n| CE | 1 |\n") == []


def test_chapters_name_the_rules_by_the_duality_tables_rows() -> None:
    """One vocabulary on every page: "the matmul row", "the used-twice row"..., never numbered
    rules (the notation page derives the same rows again, under their names)."""
    hits = [f"{where}: {m.group(0)!r}" for where, text in book_texts()
            for m in re.finditer(r"\b[Rr]ules? [123]\b|\b[Tt]hree rules\b", text)]
    assert hits == [], f"numbered rules on the pages: {hits}"


def _teaching_ext():
    return book_extension()


def test_teaching_page_times_are_computed_from_the_notebooks() -> None:
    """The teaching page's table is the `chapter-table` of `:columns: time`: the page types no
    count and no time, and its rule is the extension's."""
    ext = _teaching_ext()
    page = (ROOT / "book" / "teaching.md").read_text("utf-8")
    assert "```{chapter-table}\n:columns: time\n```" in page
    assert not re.search(r"^\| \{doc\}`/notebooks/", page, re.M), "a typed table of chapters"
    assert f"at {ext.WORDS_PER_MINUTE} words a minute" in page.replace("\n", " ")
    flat = page.replace("\n", " ")
    assert f"plus {ext.MINUTES_PER_EXERCISE} minutes for each exercise" in flat
    assert f"{ext.MINUTES_PER_EXERCISE} more for every further {ext.OUTPUTS_PER_SESSION}" in flat
    rows = ext.chapter_rows("time")
    assert len(rows) == 2 + len(chapters.CHAPTERS) + 1
    for c, row in zip(chapters.CHAPTERS, rows[2:], strict=False):
        t = ext.time_row(c)
        nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text("utf-8"))
        words = sum(len("".join(x["source"]).split()) for x in nb["cells"]
                    if x["cell_type"] == "markdown")
        assert t["words"] == words and f"| {words:,} |" in row, c.slug
        assert t["reading"] % 5 == 0 and t["reading"] * ext.WORDS_PER_MINUTE >= words, c.slug
        assert t["minutes"] >= ext.MINUTES_PER_EXERCISE * t["exercises"], c.slug
        assert t["session"] == t["reading"] + t["minutes"] + (-(t["reading"] + t["minutes"]) % 5)
        assert t["exercises"] >= 1 and t["seconds"] > 0, c.slug
    assert [ext._clock(m) for m in (40, 60, 65, 120)] == ["40 min", "1 h", "1 h 05", "2 h"]


# ---------------------------------------------------------------- derive first, then read


def _exercises(c: chapters.Chapter) -> tuple[dict, list[dict]]:
    nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text("utf-8"))
    return nb, _teaching_ext().notebook_exercises(nb)


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_every_exercise_says_its_kind_and_every_chapter_asks_for_a_derivation(
        c: chapters.Chapter) -> None:
    kinds = _teaching_ext().EXERCISE_KINDS
    _, found = _exercises(c)
    assert found, f"{c.slug}: no exercise"
    unsorted = [e["label"] for e in found if len(set(e["classes"]) & set(kinds)) != 1]
    assert unsorted == [], f"{c.slug}: exercises without exactly one kind of {kinds}: {unsorted}"
    assert any("derivation" in e["classes"] for e in found), f"{c.slug}: no derivation"


def test_the_kind_parser_reads_a_directive() -> None:
    nb = {"cells": [{"cell_type": "markdown", "source": [
        "Text.\n\n```{exercise} Write it\n:label: ex-a\n:class: derivation\n\nDo.\n```"]}]}
    assert _teaching_ext().notebook_exercises(nb) == [
        {"cell": 0, "label": "ex-a", "title": "Write it", "classes": ["derivation"]}]


def _backward_functions(c: chapters.Chapter) -> list[str]:
    """The `*_backward` functions of the modules the chapter derives."""
    names = []
    for module in c.modules:
        mod = importlib.import_module(f"xenith_edu.{module}")
        names += [n for n, f in vars(mod).items() if n.endswith("_backward") and callable(f)
                  and getattr(f, "__module__", "").startswith(mod.__name__)]
    return names


@pytest.mark.parametrize("c", [c for c in chapters.CHAPTERS if c.modules], ids=lambda c: c.slug)
def test_the_package_s_answer_is_not_used_before_the_learner_derives_it(
        c: chapters.Chapter) -> None:
    """The chapter's first derivation comes before any call of a backward it derives."""
    nb, found = _exercises(c)
    first = min(e["cell"] for e in found if "derivation" in e["classes"])
    calls = [(i, name) for name in _backward_functions(c)
             for i, cell in enumerate(nb["cells"])
             if cell["cell_type"] == "code" and re.search(rf"\b{name}\(", "".join(cell["source"]))]
    early = sorted((i, name) for i, name in calls if i < first)
    assert early == [], f"{c.slug}: the package's backward runs before the exercise: {early}"


@pytest.mark.parametrize("c", chapters.CHAPTERS, ids=lambda c: c.slug)
def test_gated_solutions_are_collapsed_and_answer_an_exercise_above(c: chapters.Chapter) -> None:
    nb, found = _exercises(c)
    for i, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        m = re.search(r"\{solution-start\}[ \t]*(\S+)\n((?:[ \t]*:[\w-]+:.*\n)*)", text)
        if cell["cell_type"] != "markdown" or not m:
            continue
        assert ":class: dropdown" in m.group(2), f"{c.slug}, cell {i}: not collapsed"
        above = [e["label"] for e in found if e["cell"] < i]
        assert m.group(1) in above, f"{c.slug}, cell {i}: answers {m.group(1)}, not above"


# where the machine that executed a notebook would show in its outputs: its Python's packages,
# a virtual environment, a home or a temporary folder (a warning's file name, a printed path)
MACHINE_PATH = re.compile(r"site-packages|[/\\]\.venv[/\\]|(?<![\w.~])/(?:home|root|tmp|Users)/"
                          r"|[A-Z]:\\\\Users")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.stem)
def test_no_output_shows_a_path_of_the_machine_that_executed_it(path: Path) -> None:
    """A committed output is the book's text: a path of the author's machine in it (a warning
    raised from an installed package, a temporary folder printed) means a cell leaks where it
    ran, and nbval fails on every other machine."""
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for out in cell.get("outputs", []):
            hit = MACHINE_PATH.search(json.dumps(out))
            assert hit is None, f"cell {i}: {json.dumps(out)[max(0, hit.start() - 80):][:200]}"
