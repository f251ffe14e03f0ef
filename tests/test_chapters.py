"""The chapter registry is the one table of chapters: `_toc.yml`, the notebooks and the
exercise modules must agree with it, and no chapter number is typed anywhere else."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest

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


def _minutes(text: str) -> int:
    """'40 min' -> 40, '1 h 05' -> 65, '2 h' -> 120."""
    m = re.fullmatch(r"(?:(\d+) h)?\s*(\d+)?(?: min)?", text.strip())
    assert m, text
    return 60 * int(m.group(1) or 0) + int(m.group(2) or 0)


def test_teaching_page_reading_times_follow_its_rule() -> None:
    """book/teaching.md types each chapter's words and times: they must be the notebook's words
    (whitespace-separated, in the markdown cells) and the page's rule applied to them, so that
    a chapter edited without the table fails here."""
    rows = re.findall(r"^\| \{doc\}`/notebooks/(\w+)` \| ([\d,]+) \| ([^|]+) \| (\d+), ([^|]+) \|"
                      r" ([^|]+) \|", (ROOT / "book" / "teaching.md").read_text("utf-8"), re.M)
    assert [r[0] for r in rows] == [c.slug for c in chapters.CHAPTERS]
    up5 = lambda minutes: -(-minutes // 5) * 5  # noqa: E731  rounded up to five minutes
    for slug, words, reading, _, exercises, session in rows:
        nb = json.loads((ROOT / "notebooks" / f"{slug}.ipynb").read_text("utf-8"))
        n = sum(len("".join(c["source"]).split()) for c in nb["cells"]
                if c["cell_type"] == "markdown")
        assert int(words.replace(",", "")) == n, f"{slug}: the page says {words} words, it has {n}"
        assert _minutes(reading) == up5(-(-n // 100)), f"{slug}: reading time of {n} words"
        assert _minutes(session) == up5(_minutes(reading) + _minutes(exercises)), slug
