"""Every figure has a caption: in the chapters and in the book's pages, found, not listed.

A figure in a chapter is a code cell whose outputs hold an image; its caption is the markdown
cell right after it, opening with "**Figure N.**", N counting the chapter's figures from 1. A
figure in a page is a `{figure}` directive, whose body is its caption, or a Markdown image
outside a fenced block, which needs a "**Figure N.**" paragraph right after it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PAGES = sorted((ROOT / "book").glob("*.md"))
CAPTION = re.compile(r"^\*\*Figure (\d+)\.\*\*\s+\S")
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]+\)|<img\b", re.IGNORECASE)


def _has_image(cell: dict) -> bool:
    return any(k.startswith("image/") for o in cell.get("outputs", [])
               for k in o.get("data", {}))


def _text(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def notebook_problems(cells: list[dict]) -> list[str]:
    """What is wrong with the chapter's figures and captions, cell by cell."""
    problems, n = [], 0
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and _has_image(cell):
            n += 1
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            m = CAPTION.match(_text(nxt)) if nxt and nxt["cell_type"] == "markdown" else None
            if m is None:
                problems.append(f"cell {i}: a figure without a caption after it")
            elif int(m.group(1)) != n:
                problems.append(f"cell {i + 1}: the caption says Figure {m.group(1)}, it is "
                                f"figure {n}")
        elif cell["cell_type"] == "markdown" and CAPTION.match(_text(cell)):
            prev = cells[i - 1] if i else None
            if not (prev and prev["cell_type"] == "code" and _has_image(prev)):
                problems.append(f"cell {i}: a caption with no figure above it")
        if cell["cell_type"] == "markdown":
            problems += [f"cell {i}: {p}" for p in page_problems(_text(cell))]
    return problems


def page_problems(text: str) -> list[str]:
    """Figures of a Markdown page (or cell) without a caption."""
    problems = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        fence = re.match(r"^(`{3,}|~{3,})(.*)$", line)
        if fence:
            mark, info = fence.groups()
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].strip().startswith(mark) and
                        set(lines[j].strip()) == set(mark[0])), len(lines))
            if info.strip().startswith("{figure}"):
                body = [b for b in lines[i + 1:end] if b.strip() and not b.startswith(":")]
                if not body:
                    problems.append(f"line {i + 1}: a figure directive without a caption")
            i = end + 1
            continue
        if IMAGE.search(line):
            after = next((lines[j].strip() for j in range(i + 1, len(lines))
                          if lines[j].strip()), "")
            if not CAPTION.match(after):
                problems.append(f"line {i + 1}: an image without a caption")
        i += 1
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_figure_of_a_chapter_has_its_caption(path: Path) -> None:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert notebook_problems(cells) == []


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_every_figure_of_a_page_has_its_caption(path: Path) -> None:
    assert page_problems(path.read_text(encoding="utf-8")) == []


def _fig() -> dict:
    return {"cell_type": "code", "source": "plt.show()",
            "outputs": [{"output_type": "display_data", "data": {"image/png": "x"}}]}


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "source": text}


def test_the_finder_finds_what_it_must() -> None:
    """The rule can fail: each kind of missing or wrong caption is reported."""
    ok = [_fig(), _md("**Figure 1.** A plot."), _md("text"), _fig(), _md("**Figure 2.** B.")]
    assert notebook_problems(ok) == []
    assert notebook_problems([_fig(), _md("text")])  # no caption
    assert notebook_problems([_fig()])  # the last cell
    assert notebook_problems([_fig(), _md("**Figure 2.** A.")])  # the wrong number
    assert notebook_problems([_md("**Figure 1.** Nothing above.")])  # an orphan caption
    assert notebook_problems([_md("![a plot](x.png)\n\nthen text")])  # an image in a cell
    assert page_problems("```{figure} a.png\n:name: f\n```\n")  # a directive, no caption
    assert page_problems("```{figure} a.png\n:name: f\n\nThe caption.\n```\n") == []
    assert page_problems("text\n![a](b.png)\n\nmore\n")
    assert page_problems('<img src="b.png" alt="a">\n')  # an HTML image
    assert page_problems("![a](b.png)\n\n**Figure 1.** The caption.\n") == []
    assert page_problems("```text\n![a](b.png)\n```\n") == []  # an example, not a figure
