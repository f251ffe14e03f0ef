"""Student versions of the chapter notebooks: nbgrader's solution regions become stubs.
The statements, signatures and check cells stay; outputs are cleared; a book's notebooks gain
a setup cell (`setup_cell`); nothing else changes.
"""

from __future__ import annotations

import ast
import json
import os
import re
import tempfile
from pathlib import Path
from typing import IO

from ..chapters import CHAPTERS
from ..tools.notebook import read_notebook, require
from ..tools.util import atomic_write, atomic_write_text

# nbgrader's markers. Code between BEGIN and END SOLUTION becomes a stub that raises
# NotImplementedError; markdown between them becomes TEXT_STUB; hidden tests are dropped.
BEGIN_SOLUTION = re.compile(r"^(\s*)#+\s*BEGIN SOLUTION\s*$")
END_SOLUTION = re.compile(r"^\s*#+\s*END SOLUTION\s*$")
BEGIN_HIDDEN = re.compile(r"^\s*#+\s*BEGIN HIDDEN TESTS\s*$")
END_HIDDEN = re.compile(r"^\s*#+\s*END HIDDEN TESTS\s*$")
CODE_STUB = "raise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"
# sphinx-exercise solutions: a {solution} directive (one cell), or a gated pair
# {solution-start} ... {solution-end} spanning cells.
SOLUTION_DIRECTIVE = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution\}")
SOLUTION_START = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution-start\}", re.MULTILINE)
SOLUTION_END = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution-end\}", re.MULTILINE)



def _as_path(value: object, name: str) -> Path:
    if isinstance(value, str | os.PathLike):
        return Path(value)
    raise TypeError(f"{name} must be a path (str or pathlib.Path), got {type(value).__name__}")


def _strip_regions(source: str, where: str, code: bool) -> tuple[str, bool]:
    """Replace every solution region of one cell's source; drop hidden tests."""
    out: list[str] = []
    lines = source.split("\n")
    changed = False
    i = 0
    while i < len(lines):
        line = lines[i]
        begin = BEGIN_SOLUTION.match(line)
        if begin or BEGIN_HIDDEN.match(line):
            end_re = END_SOLUTION if begin else END_HIDDEN
            j = i + 1
            while j < len(lines) and not end_re.match(lines[j]):
                j += 1
            if j == len(lines):
                marker = "### END SOLUTION" if begin else "### END HIDDEN TESTS"
                raise ValueError(f"{where}: line {i + 1} opens a region that no {marker} closes")
            if begin:
                indent = begin.group(1)
                if code and not indent:
                    raise ValueError(f"{where}: the solution at line {i + 1} is not inside a "
                                     "function body; the stub that replaces it would stop the "
                                     "notebook (indent it inside the exercise's function)")
                out.append(indent + (CODE_STUB if code else TEXT_STUB))
            changed = True
            i = j + 1
            continue
        if END_SOLUTION.match(line) or END_HIDDEN.match(line):
            raise ValueError(f"{where}: line {i + 1} closes a region that was never opened")
        out.append(line)
        i += 1
    return "\n".join(out), changed


def _drop_solution_blocks(source: str) -> str:
    """The markdown `source` without its {solution} directives (fence to closing fence)."""
    out: list[str] = []
    fence = ""
    for line in source.split("\n"):
        if fence:  # inside a solution: a line of at least as many fence characters closes it
            bare = line.strip()
            if len(bare) >= len(fence) and set(bare) == {fence[0]}:
                fence = ""
            continue
        opening = SOLUTION_DIRECTIVE.match(line)
        if opening:
            fence = opening.group(1)
            continue
        out.append(line)
    return "\n".join(out)


def answer_stub(source: str, where: str = "") -> str:
    """The student version of a written answer's cell: its solution regions stubbed; a cell
    without one is the model answer itself, replaced whole by TEXT_STUB as nbgrader does,
    unless it already is a student version (it holds TEXT_STUB)."""
    text, changed = _strip_regions(source, where, code=False)
    return text if changed or TEXT_STUB in text else TEXT_STUB


def _student_notebook(nb, name: str):  # nb: nbformat.NotebookNode
    """The student version of one notebook, built in place on `nb` (a private copy)."""
    from ..grader.nbread import is_written  # the one rule of a written answer's cell

    cells = []
    in_gated = False
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index + 1}"
        source = cell.source
        if cell.cell_type == "markdown":
            if in_gated:
                in_gated = not SOLUTION_END.search(source)
                continue
            if SOLUTION_START.search(source):
                in_gated = not SOLUTION_END.search(source)
                continue
            source = _drop_solution_blocks(source)
            if not source.strip():
                continue  # a solution cell: removed from the student version
        elif in_gated:
            continue  # code inside a gated solution goes with it
        new_source, changed = _strip_regions(source, where, code=cell.cell_type == "code")
        if cell.cell_type == "markdown" and is_written(cell):  # never the model answer
            new_source = answer_stub(source, where)
            changed = changed or new_source != source
        cell.source = new_source
        if changed:
            tags = [t for t in cell.metadata.get("tags", []) if t != "hide-input"]
            if tags:
                cell.metadata["tags"] = tags
            else:
                cell.metadata.pop("tags", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
        cells.append(cell)
    if in_gated:
        raise ValueError(f"{name}: a {{solution-start}} is never closed by a {{solution-end}}")
    nb.cells = cells
    return nb


# The setup cell that opens a student notebook of the book: it does nothing where xenith_edu
# imports; in a clone of the repository it imports the clone's package; elsewhere (Colab, or a
# Binder opened from a launch button) it installs the package from the book's repository,
# `repository.url` of the book's _config.yml, read when the student versions are made.
SETUP_TAG = "setup"
REPOSITORY_BLOCK = re.compile(r"^repository:[ \t]*\n((?:[ \t]+.*(?:\n|$)|[ \t]*\n)*)", re.MULTILINE)
REPOSITORY_KEY = re.compile(r"^[ \t]+(url|branch):[ \t]*[\"']?([^\"'#\n]*?)[\"']?[ \t]*(?:#.*)?$",
                            re.MULTILINE)


def book_repository(src: Path) -> tuple[str, str] | None:
    """`(repository.url, repository.branch)` of the _config.yml of the book holding `src`.

    None when no folder from `src` up holds a _config.yml (a notebook outside a book).
    """
    start = src.resolve() if src.is_dir() else src.resolve().parent
    for folder in (start, *start.parents):
        config = folder / "_config.yml"
        if config.is_file():
            block = REPOSITORY_BLOCK.search(config.read_text(encoding="utf-8"))
            keys = dict(REPOSITORY_KEY.findall(block.group(1))) if block else {}
            return keys.get("url", "").strip(), keys.get("branch", "").strip()
    return None


# What a chapter needs beyond the core dependencies, read from its code: a module it imports, or
# a program it runs, -> the extra of xenith-edu that brings it (pyproject.toml), and the modules
# by which the setup cell sees whether that extra is installed.
EXTRA_OF = {"torch": "torch", "transformers": "hf", "tokenizers": "hf", "safetensors": "hf",
            "peft": "hf", "mpi4py": "mpi", "mpiexec": "mpi"}
EXTRA_MODULES = {"torch": ("torch",), "hf": ("transformers", "tokenizers", "safetensors", "peft"),
                 "mpi": ("mpi4py",)}
IMPORTED = re.compile(r"^[ \t]*(?:import|from)[ \t]+([A-Za-z_]\w*)", re.MULTILINE)  # unparsable
PROGRAMS = ("mpiexec",)  # programs a chapter starts, named by a string of its code
IMPORTERS = ("import_module", "__import__")


def used_modules(source: str) -> set[str]:
    """The top-level modules that the code `source` imports, and the PROGRAMS it names: read
    from its syntax tree (IPython's % and ! lines left out); by pattern if it does not parse."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set(IMPORTED.findall(source))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) in IMPORTERS:
            found.add(str(node.args[0].value).split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(p for p in PROGRAMS if node.value.rsplit("/", 1)[-1] == p)
    return found


def chapter_extras(nb) -> tuple[str, ...]:  # nb: nbformat.NotebookNode
    """The extras of xenith-edu that the code cells of notebook `nb` need, sorted."""
    found: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            found.update(EXTRA_OF[m] for m in used_modules(cell.source) if m in EXTRA_OF)
    return tuple(sorted(found))


def _extras_lines(url: str, branch: str, extras: tuple[str, ...]) -> list[str]:
    """The setup cell's check of the chapter's extras: installed from `url`, else one line."""
    if not extras:
        return []
    spec = f"[{','.join(extras)}]"
    modules = {e: EXTRA_MODULES[e] for e in extras}
    lines = ["", f"# this chapter also needs the extra {spec} of xenith-edu",
             "import importlib.util",
             f"EXTRAS = {modules!r}",
             "missing = [e for e, mods in EXTRAS.items()",
             "           if any(importlib.util.find_spec(m) is None for m in mods)]",
             "if missing:"]
    if url:
        package = f"xenith-edu[{{','.join(missing)}}] @ git+{url}" + (f"@{branch}" if branch
                                                                      else "")
        return lines + ["    import subprocess", "",
                        f"    package = f{json.dumps(package)}",
                        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
                        "                    package], check=True)",
                        "    importlib.invalidate_caches()"]
    return lines + ['    raise ImportError(f"this chapter needs the extra [{\',\'.join(missing)}] '
                    'of xenith-edu: "',
                    "                      f'pip install \"xenith-edu[{\",\".join(missing)}]\" '",
                    '                      "(or the wheel file, followed by [...])")']


def setup_cell(url: str, branch: str = "", extras: tuple[str, ...] = ()):  # -> NotebookNode
    """The setup cell: a no-op where xenith_edu imports; else it uses a clone of the book's
    repository found above the working folder, else installs the package from `url`. With
    `extras` (`chapter_extras`), it then installs those extras from `url` where they are
    missing, or names them in one line.

    With no `url` and no clone, it says in one line how to get the package.
    """
    from nbformat.v4 import new_code_cell  # only when notebooks are read or written

    if url:
        package = f"git+{url}" + (f"@{branch}" if branch else "")
        fallback = ["        import importlib", "        import subprocess", "",
                    "        # the package from the book's repository",
                    f"        package = {json.dumps(package)}",
                    '        subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
                    "                        package], check=True)",
                    "        importlib.invalidate_caches()"]
        says = "(Colab, Binder) it installs\n# it from the book's repository."
    else:
        fallback = ['        raise ImportError("this notebook needs the package xenith_edu: "',
                    '                          "run `make lab` in a clone of the book\'s "',
                    '                          "repository, or pip install the book\'s wheel "',
                    '                          "and run xenith-edu chapters") from None']
        says = "it says in one line\n# how to get it."
    lines = ["# Setup: nothing to do where xenith_edu imports; in a clone of the book's",
             f"# repository it uses the clone's package; elsewhere {says}",
             "import sys", "from pathlib import Path", "", "try:",
             "    import xenith_edu  # noqa: F401", "except ImportError:",
             "    here = Path.cwd().resolve()",
             "    clone = [p for p in (here, *here.parents)",
             "             if (p / \"xenith_edu\" / \"chapters.py\").is_file()]",
             "    if clone:",
             "        sys.path.insert(0, str(clone[0]))  # the clone's package, as it is",
             "    else:", *fallback,
             "    import xenith_edu  # noqa: F401,E402", *_extras_lines(url, branch, extras)]
    # a fixed id: the student version of a notebook is the same file every time it is made
    return new_code_cell("\n".join(lines), id="xenith-edu-setup", metadata={"tags": [SETUP_TAG]})


def add_setup_cell(nb, url: str, branch: str = "") -> None:
    """Put the setup cell first, after the title cell when the notebook opens with one; it
    names the extras that the notebook's code needs (`chapter_extras`)."""
    first = nb.cells[0] if nb.cells else None
    titled = first is not None and first.cell_type == "markdown" and first.source.startswith("# ")
    nb.cells.insert(1 if titled else 0, setup_cell(url, branch, chapter_extras(nb)))


def make_student_versions(src: Path, out: Path,
                          repository: tuple[str, str] | None = None) -> list[Path]:
    """Write student copies of the notebook `src` (or of every *.ipynb in the folder `src`).

    In each copy, code between `### BEGIN SOLUTION` and `### END SOLUTION` becomes
    `raise NotImplementedError()` at the same indentation; markdown solution regions become
    "YOUR ANSWER HERE"; cells holding a `{solution}` directive (or between `{solution-start}`
    and `{solution-end}`) are removed; `### BEGIN/END HIDDEN TESTS` regions are dropped; outputs
    are cleared. Notebooks of a book (a _config.yml above `src`) get the setup cell of
    `add_setup_cell` after their title (`repository`, `(url, branch)`, overrides the book's
    _config.yml; the book's build passes its own). The copies keep their file names, in the
    folder `out` (created if needed). Returns their paths. Raises ValueError naming what is
    wrong; nothing is written then.
    """
    require("nbformat")
    import nbformat  # only when notebooks are read or written

    src, out = _as_path(src, "src"), _as_path(out, "out")
    if not src.exists():
        raise ValueError(f"src: {src} does not exist (give a notebook .ipynb or a folder of them)")
    if src.is_file():
        if src.suffix != ".ipynb":
            raise ValueError(f"src: {src} is not a notebook (.ipynb)")
        sources = [src]
    else:
        sources = sorted(p for p in src.glob("*.ipynb") if p.is_file())
        if not sources:
            raise ValueError(f"src: no notebook (.ipynb) in the folder {src}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a folder")
    if out.resolve() in {p.parent.resolve() for p in sources}:
        raise ValueError(f"out: {out} is the folder of the source notebooks; the student "
                         "versions would overwrite the solutions (choose another folder)")

    if repository is None:
        repository = book_repository(sources[0])  # None outside a book: no setup cell
    versions = []  # transform everything first: one bad notebook writes nothing
    for path in sources:
        nb = _student_notebook(read_notebook(path), path.name)
        if repository is not None:
            add_setup_cell(nb, *repository)
        versions.append((out / path.name, nbformat.writes(nb) + "\n"))
    out.mkdir(parents=True, exist_ok=True)
    for target, text in versions:
        atomic_write_text(target, text)
    return [target for target, _ in versions]


# -- the chapters that ship with the package ---------------------------------------------------
# A wheel holds the chapter notebooks in xenith_edu/notebooks/ and their student versions in
# xenith_edu/notebooks/student/ (setup.py writes both when the wheel is built, from notebooks/);
# a clone, or an editable install of it, reads notebooks/ beside the package.
SHIPPED = "notebooks"
SHIPPED_STUDENT = "student"


def chapter_folder() -> Path:
    """The folder of the full chapter notebooks: the installed package's, else the clone's.
    Raises ValueError when there is neither (a package built without its chapters)."""
    package = Path(__file__).resolve().parents[1]
    for folder in (package / SHIPPED, package.parent / SHIPPED):
        if (folder / f"{CHAPTERS[0].slug}.ipynb").is_file():
            return folder
    raise ValueError(f"the chapters are not in this installation of xenith_edu ({package}): "
                     "install the book's wheel, or use a clone of the book's repository")


def write_chapters(out: str | Path) -> tuple[list[Path], list[Path]]:
    """Write the student version of every chapter into the folder `out` (made if needed),
    keeping each one a learner already has there. Returns (written, kept).

    The wheel's ready student versions are copied (no notebook tooling needed); in a clone
    they are made from its notebooks (the `notebooks` extra). What the chapters read is
    package data: nothing else is copied.
    """
    if isinstance(out, str) and not out.strip():  # Path("") would be the working folder
        raise ValueError("out: empty: give the folder for the chapters (\".\" for this one)")
    out = _as_path(out, "out")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} exists and is not a folder")
    folder = chapter_folder()
    names = [f"{c.slug}.ipynb" for c in CHAPTERS]
    missing = [n for n in names if not (out / n).exists()]
    ready = folder / SHIPPED_STUDENT
    if missing and not all((ready / n).is_file() for n in missing):  # a clone: make them
        with tempfile.TemporaryDirectory(prefix="xenith-edu-chapters-") as tmp:
            make_student_versions(folder, Path(tmp))
            return _copy_chapters(Path(tmp), out, missing), [out / n for n in names
                                                             if n not in missing]
    return _copy_chapters(ready, out, missing), [out / n for n in names if n not in missing]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (tools.util.atomic_write)."""

    def write(f: IO[bytes]) -> None:
        f.write(data)

    atomic_write(path, write)


def _copy_chapters(src: Path, out: Path, names: list[str]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        atomic_write_bytes(out / name, (src / name).read_bytes())
    return [out / name for name in names]


__all__ = ["add_setup_cell", "book_repository", "chapter_extras", "chapter_folder",
           "used_modules", "write_chapters",
           "make_student_versions", "setup_cell"]
