"""Sphinx extension for the xenith-edu book: MathJax, launch buttons, student notebooks, tables.
Loaded from _config.yml (sphinx.local_extensions); needs no network at build time.

Offline MathJax: the book extra installs `django-static-mathjax`, a PyPI package that
ships the MathJax 3 distribution (its `es5/` folder: combined components and woff fonts).
When an HTML build starts, the files MathJax needs are copied into `_static/mathjax/`
of the built site and `mathjax_path` points there, so every page loads MathJax (and its
fonts, menu and accessibility modules) from the site itself, never from a CDN.

Launch buttons: the Binder and repository buttons are shown only when
`repository.url` is set in _config.yml; while it is empty they are switched off. While
live code (thebe) is off, sphinx-thebe's page scripts are left out.

Student notebooks: every notebook the site offers for download (_sources/, _downloads/) is
replaced, when the build finishes, by its student version (`xenith_edu.booktools.student`:
solutions become stubs raising NotImplementedError, a setup cell follows the title); the pages
show the solutions collapsed, without the `### BEGIN/END SOLUTION` lines. The Binder button
opens student/<chapter>.ipynb, which binder/postBuild writes; the Colab button opens the same
file on the branch `student`, which the book's workflow publishes (.github/workflows/book.yml);
the other launch services can only open the full notebook as committed: their buttons go.

The package for readers: when an HTML build starts, the wheel of the package is built offline
(`pip wheel --no-build-isolation --no-index`, from a copy of the sources, so nothing is left in
the repository) into `_static/`; it holds the chapters and their student versions (setup.py).
The directive `wheel-download` links it, with the two commands that start from it:
`pip install` of the wheel, then `xenith-edu chapters`.

Chapter tables: the directive `chapter-table` writes a table from the chapter registry
(`xenith_edu.chapters`), so no page types a chapter's number or list: `:columns: derive` gives
each chapter and what it derives (the introduction), `:columns: exercises` each chapter's
exercise checks and what the learner writes, `:columns: time` each chapter's words, exercises,
session and running time, computed from its notebook, `:columns: kinds` each chapter's
exercises by kind, read from the `:class:` of their directives (all three on the teaching page).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]  # the repository: _toc.yml, notebooks/

MATHJAX_ENTRY = "tex-chtml.js"  # TeX input, CommonHTML output (fonts as woff files)
# What tex-chtml.js loads on demand, relative to MathJax's es5/ folder: TeX extensions
# (autoload, \require), CHTML fonts, the context menu, lazy typesetting, accessibility.
MATHJAX_PARTS = ("input", "output/chtml", "ui", "a11y", "sre", "adaptors")
MATHJAX_STATIC = "mathjax"  # folder under _static/ in the built site


def mathjax_source() -> Path:
    """Return the es5/ folder of the MathJax copy shipped by django-static-mathjax."""
    spec = importlib.util.find_spec("mathjax")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        es5 = Path(root) / "static" / "mathjax" / "es5"
        if (es5 / MATHJAX_ENTRY).is_file() and (es5 / "output" / "chtml" / "fonts").is_dir():
            return es5
    raise ExtensionError(
        "MathJax not found: the book serves its own MathJax from the package "
        "django-static-mathjax; install the book extra with: pip install -e '.[book]'"
    )


def copy_mathjax(es5: Path, static_dir: Path) -> int:
    """Copy MathJax's entry script, the folders it loads from and its licence; return bytes."""
    dest = static_dir / MATHJAX_STATIC
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(es5 / MATHJAX_ENTRY, dest / MATHJAX_ENTRY)
    licence = es5.parent / "LICENSE"
    if licence.is_file():
        shutil.copy2(licence, dest / "LICENSE")
    for part in MATHJAX_PARTS:
        shutil.copytree(es5 / part, dest / part, dirs_exist_ok=True)
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def launch_settings(repository_url: str, launch_buttons: dict[str, Any]) -> dict[str, Any]:
    """Return the theme settings for a repository URL: everything off while it is empty.

    Binder works with any git host; Colab only opens notebooks from GitHub.
    """
    url = (repository_url or "").strip()
    buttons = dict(launch_buttons or {})
    if not url:
        for key in ("binderhub_url", "colab_url", "jupyterhub_url", "deepnote_url",
                    "jupyterlite_url"):
            buttons[key] = ""
        buttons["thebe"] = False
        return {"launch_buttons": buttons, "use_repository_button": False}
    if not url.startswith("https://github.com/"):
        buttons["colab_url"] = ""
    return {"launch_buttons": buttons, "use_repository_button": True}


def switch_off_thebe(app: Sphinx) -> None:
    """Unhook sphinx-thebe (loaded by Jupyter Book) while live code is off.

    Its page scripts name a CDN copy of thebe and, with Sphinx 7, are added twice, which
    raises a JavaScript error on every page; with thebe off they serve no purpose.
    """
    for event in ("env-before-read-docs", "doctree-resolved"):
        for listener in list(app.events.listeners.get(event, [])):
            name = getattr(listener.handler, "__name__", "")
            if listener.handler.__module__.startswith("sphinx_thebe") and name in (
                    "init_thebe_core", "update_thebe_context"):
                app.disconnect(listener.id)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _up5(minutes: int) -> int:
    return -(-minutes // 5) * 5  # rounded up to five minutes


def _clock(minutes: int) -> str:
    """40 -> "40 min", 65 -> "1 h 05", 120 -> "2 h"."""
    if minutes < 60:
        return f"{minutes} min"
    h, m = divmod(minutes, 60)
    return f"{h} h {m:02d}" if m else f"{h} h"


def _run_seconds(nb: dict) -> float:
    """Seconds the notebook's cells took when it was last executed (nbclient's timing)."""
    from datetime import datetime

    total = 0.0
    for cell in nb["cells"]:
        t = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in t and "shell.execute_reply" in t:
            start, end = (datetime.fromisoformat(t[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            total += (end - start).total_seconds()
    return total


def chapter_checks(c: Any) -> list[str]:
    """The exercise checks the chapter's notebook calls, in its exercise module's order."""
    import importlib

    module = importlib.import_module(c.exercises)
    names = getattr(module, "__all__", None) or sorted(
        n for n in vars(module) if n.startswith("check_"))
    notebook = (ROOT / f"{c.notebook}.ipynb").read_text(encoding="utf-8")
    return [n for n in names if n.startswith("check_") and f"{n}(" in notebook]


MINUTES_PER_EXERCISE = 20  # the teaching page's rule: an exercise writes one function ...
OUTPUTS_PER_SESSION = 12  # ... and 20 minutes more for every further 12 arrays it returns
WORDS_PER_MINUTE = 100  # slow reading: the text is mathematical


def exercise_minutes(c: Any) -> int:
    """The minutes of the chapter's exercises by the teaching page's rule."""
    import importlib

    specs = {s.id: s for s in importlib.import_module(c.exercises).SPECS}
    return sum(MINUTES_PER_EXERCISE * -(-len(specs[name[len("check_"):]].out_names)
                                        // OUTPUTS_PER_SESSION) for name in chapter_checks(c))


def time_row(c: Any) -> dict[str, Any]:
    """A chapter's words, reading time, exercises and session, by the teaching page's rule."""
    import json

    nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text(encoding="utf-8"))
    words = sum(len("".join(cell["source"]).split()) for cell in nb["cells"]
                if cell["cell_type"] == "markdown")
    reading = _up5(-(-words // WORDS_PER_MINUTE))
    exercises, minutes = len(chapter_checks(c)), exercise_minutes(c)
    return {"words": words, "reading": reading, "exercises": exercises, "minutes": minutes,
            "session": _up5(reading + minutes), "seconds": _run_seconds(nb)}


def _time_rows() -> list[str]:
    from xenith_edu import chapters

    rows = ["| chapter | words | reading and deriving | exercises | one session of "
            "| code runs in |", "| --- | --- | --- | --- | --- | --- |"]
    total = 0
    for c in chapters.CHAPTERS:
        t = time_row(c)
        total += t["session"]
        rows.append(f"| {{doc}}`/{c.notebook}` | {t['words']:,} | {_clock(t['reading'])} | "
                    f"{t['exercises']}, {_clock(t['minutes'])} | "
                    f"{_clock(t['session'])} | {t['seconds']:.0f} s |")
    rows.append(f"| the whole book | | | | {_clock(total)} | |")
    return rows


# The kind of an exercise is the class of its directive (`:class: derivation`): a derivation
# asks for what the page has not shown yet, practice for a bug, a count or a conversion.
EXERCISE_KINDS = ("derivation", "practice")
EXERCISE_DIRECTIVE = re.compile(
    r"^(?:`{3,}|:{3,})\{exercise(?:-start)?\}[ \t]*(?P<title>.*)\n"
    r"(?P<options>(?:[ \t]*:[\w-]+:.*\n)*)", re.M)
OPTION = re.compile(r"^[ \t]*:([\w-]+):[ \t]*(.*)$", re.M)


def notebook_exercises(nb: dict) -> list[dict[str, Any]]:
    """Every exercise directive of a notebook, in order: its cell, label, title and classes."""
    found = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for m in EXERCISE_DIRECTIVE.finditer("".join(cell["source"]) + "\n"):
            options = dict(OPTION.findall(m.group("options")))
            found.append({"cell": index, "label": options.get("label", ""),
                          "title": m.group("title").strip(),
                          "classes": options.get("class", "").split()})
    return found


def _kind_rows() -> list[str]:
    import json

    from xenith_edu import chapters

    rows = ["| chapter | the learner derives | practice |", "| --- | --- | --- |"]
    for c in chapters.CHAPTERS:
        nb = json.loads((ROOT / f"{c.notebook}.ipynb").read_text(encoding="utf-8"))
        kinds = {k: [e["title"] for e in notebook_exercises(nb) if k in e["classes"]]
                 for k in EXERCISE_KINDS}
        cells = ["; ".join(_cell(t) for t in kinds[k]) or "none" for k in EXERCISE_KINDS]
        rows.append(f"| {{doc}}`/{c.notebook}` | " + " | ".join(cells) + " |")
    return rows


def chapter_rows(columns: str) -> list[str]:
    """The Markdown rows of the registry's table: "derive", "exercises", "time" or "kinds"."""
    import importlib

    from xenith_edu import chapters

    def number(c: Any) -> str:
        return str(chapters.number(c.slug)) if c.numbered else ""

    if columns == "time":
        return _time_rows()
    if columns == "kinds":
        return _kind_rows()
    if columns == "derive":
        rows = ["| | chapter | what you derive |", "| --- | --- | --- |"]
        for c in chapters.CHAPTERS:
            rows.append(f"| {number(c)} | {{doc}}`/{c.notebook}` | {_cell(c.summary)} |")
        return rows
    rows = ["| | chapter | the learner writes | check |", "| --- | --- | --- | --- |"]
    for c in chapters.CHAPTERS:
        module = importlib.import_module(c.exercises)
        first = True  # a check the chapter no longer calls (a replaced one) is not listed
        for name in chapter_checks(c):
            doc = (getattr(module, name).__doc__ or "").strip().split("\n\n")[0]
            lead = f"{number(c)} | {{doc}}`/{c.notebook}`" if first else " | "
            rows.append(f"| {lead} | {_cell(doc)} | `{name}` |")
            first = False
    return rows


class ChapterTable(SphinxDirective):
    """`chapter-table`: the registry's chapters as a table (see `chapter_rows`)."""

    option_spec = {"columns": lambda arg: directives.choice(
        arg, ("derive", "exercises", "time", "kinds"))}

    def run(self) -> list[nodes.Node]:
        from xenith_edu import chapters

        self.env.note_dependency(chapters.__file__)
        columns = self.options.get("columns", "derive")
        rows = chapter_rows(columns)
        if columns in ("exercises", "time", "kinds"):  # from the notebooks: rebuilt with them
            for c in chapters.CHAPTERS:
                self.env.note_dependency(str(ROOT / f"{c.notebook}.ipynb"))
        container = nodes.container()
        source = self.get_source_info()[0]
        self.state.nested_parse(StringList(rows, source=source), self.content_offset, container)
        return container.children


# ---------------------------------------------------------------- the wheel, for readers
# what the wheel is built from (setup.py copies notebooks/ into it, with the student versions)
WHEEL_SOURCES = ("xenith_edu", "notebooks", "pyproject.toml", "setup.py", "MANIFEST.in",
                 "README.md", "_config.yml")


def wheel_name() -> str:
    """The file name of the package's wheel, from the package's one version."""
    from xenith_edu import __version__

    return f"xenith_edu-{__version__}-py3-none-any.whl"


def build_wheel(static_dir: Path) -> Path:
    """Build the package's wheel offline into `static_dir`; return its path."""
    with tempfile.TemporaryDirectory(prefix="xenith-edu-wheel-") as tmp:
        src = Path(tmp) / "src"
        for name in WHEEL_SOURCES:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, src / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(ROOT / name, src / name)
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                                "--no-build-isolation", "--no-index", "-q", "-w",
                                str(Path(tmp) / "dist"), str(src)], capture_output=True,
                               text=True)
        wheels = list((Path(tmp) / "dist").glob("*.whl"))
        if built.returncode != 0 or [w.name for w in wheels] != [wheel_name()]:
            last = (built.stderr.strip().splitlines() or ["no wheel was made"])[-1]
            raise ExtensionError(f"the package's wheel could not be built: {last}")
        static_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheels[0], static_dir / wheels[0].name))


class WheelDownload(SphinxDirective):
    """`wheel-download`: the link to the site's wheel and the commands that start from it."""

    def run(self) -> list[nodes.Node]:
        name = wheel_name()
        href = "../" * self.env.docname.count("/") + f"_static/{name}"
        link = (f'<p><a class="reference download" href="{href}" download="{name}">'
                f"<code>{name}</code></a></p>")
        commands = (f"pip install {name}           # NumPy, Matplotlib: no notebook tools\n"
                    "xenith-edu chapters --out chapters   # every chapter's student notebook\n"
                    f'pip install "{name}[lab]"    # then, to open them in JupyterLab:\n'
                    "xenith-edu lab --out chapters")
        block = nodes.literal_block(commands, commands, language="bash")
        return [nodes.raw("", link, format="html"), block]


def on_config_inited(app: Sphinx, config: Config) -> None:
    """Point MathJax at the site's own copy and derive the launch buttons."""
    config.mathjax_path = f"{MATHJAX_STATIC}/{MATHJAX_ENTRY}"  # relative to _static/
    opts = dict(config.html_theme_options or {})
    opts.update(launch_settings(opts.get("repository_url", ""), opts.get("launch_buttons", {})))
    config.html_theme_options = opts
    if not opts["launch_buttons"].get("thebe"):
        switch_off_thebe(app)


def on_builder_inited(app: Sphinx) -> None:
    """Copy MathJax into the output before any page is written."""
    if app.builder.format != "html":
        return
    size = copy_mathjax(mathjax_source(), Path(app.outdir) / "_static")
    logger.info(f"offline MathJax: {size / 1e6:.1f} MB in _static/{MATHJAX_STATIC}/")
    wheel = build_wheel(Path(app.outdir) / "_static")
    logger.info(f"the package for readers: _static/{wheel.name} "
                f"({wheel.stat().st_size / 1e6:.1f} MB)")


# ---------------------------------------------------------------- student notebooks
# Readers download, and launch buttons open, the student version of each chapter: solutions
# replaced by stubs (xenith_edu.booktools.student). The pages still show the solutions,
# collapsed, without nbgrader's marker lines.
STUDENT_DIR = "student"  # where binder/postBuild writes the student copies, repository root
STUDENT_BRANCH = "student"  # the branch where the workflow publishes them, for Colab
COLAB_BLOB = re.compile(r"^(https://colab\.research\.google\.com/github/[^/]+/[^/]+)/blob/")


def is_notebook_doc(app: Sphinx, docname: str) -> bool:
    return str(app.env.doc2path(docname)).endswith(".ipynb")


def strip_solution_markers(app: Sphinx, doctree: nodes.document) -> None:
    """`doctree-read`: drop the `### BEGIN/END SOLUTION` lines from a notebook's code blocks."""
    from xenith_edu.booktools.student import BEGIN_SOLUTION, END_SOLUTION

    if not is_notebook_doc(app, app.env.docname):
        return
    for block in doctree.findall(nodes.literal_block):
        lines = block.astext().split("\n")
        kept = [ln for ln in lines if not (BEGIN_SOLUTION.match(ln) or END_SOLUTION.match(ln))]
        if len(kept) != len(lines):
            text = "\n".join(kept)
            block.rawsource = text
            block.children = []
            block += nodes.Text(text)


def student_notebooks(app: Sphinx, exception: Exception | None) -> None:
    """`build-finished`: replace every notebook of the built site by its student version.

    The theme's .ipynb download copies the source notebook into _sources/; a {download} role
    would copy it into _downloads/<hash>/. Each copy named as a chapter notebook is rewritten
    with `make_student_versions`, from the source notebook in the repository.
    """
    import tempfile

    from xenith_edu.booktools.student import make_student_versions

    if exception is not None or app.builder.format != "html":
        return
    sources = {}
    for docname in sorted(app.env.found_docs):
        if is_notebook_doc(app, docname):
            path = Path(app.env.doc2path(docname))
            sources[path.name] = path
    built = [p for p in sorted(Path(app.outdir).rglob("*.ipynb")) if p.name in sources]
    opts = app.config.html_theme_options or {}  # the setup cell installs from this book's URL
    repository = (opts.get("repository_url", "") or "", opts.get("repository_branch", "") or "")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted({p.name for p in built}):
            (student,) = make_student_versions(sources[name], Path(tmp) / Path(name).stem,
                                               repository=repository)
            for target in (p for p in built if p.name == name):
                shutil.copyfile(student, target)
    logger.info(f"student notebooks: {len(built)} .ipynb file(s) in the site are student versions")


def student_launch_buttons(app: Sphinx, pagename: str, templatename: str,
                           context: dict[str, Any], doctree: Any) -> None:
    """`html-page-context`, after the theme: launch buttons open the student version.

    Binder builds the repository's branch and runs binder/postBuild, which writes the student
    copies into student/; the button opens student/<chapter>.ipynb there. Colab opens the same
    file on the branch STUDENT_BRANCH, which the book's workflow publishes. Other services
    (JupyterHub, ...) open a file of the repository as committed, where only the full notebook
    exists, so their buttons are removed.
    """
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        kept = []
        for button in group.get("buttons", []):
            if button.get("text") == "Binder" and "?urlpath=" in button.get("url", ""):
                base, urlpath = button["url"].split("?urlpath=", 1)
                ui = "lab/tree" if urlpath.startswith("lab/tree/") else "tree"
                student = f"{STUDENT_DIR}/{Path(pagename).name}.ipynb"
                kept.append({**button, "url": f"{base}?urlpath={ui}/{student}"})
            elif button.get("text") == "Colab" and COLAB_BLOB.match(button.get("url", "")):
                repo = COLAB_BLOB.match(button["url"]).group(1)
                student = f"{STUDENT_DIR}/{Path(pagename).name}.ipynb"
                kept.append({**button, "url": f"{repo}/blob/{STUDENT_BRANCH}/{student}"})
            elif button.get("type") == "javascript":
                kept.append(button)  # live code in the page (thebe), when switched on
        group["buttons"] = kept
    context["header_buttons"] = [g for g in context.get("header_buttons", [])
                                 if g.get("label") != "launch-buttons" or g["buttons"]]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", on_config_inited, priority=900)
    app.connect("builder-inited", on_builder_inited)
    app.add_directive("chapter-table", ChapterTable)
    app.add_directive("wheel-download", WheelDownload)
    app.connect("doctree-read", strip_solution_markers)
    app.connect("html-page-context", student_launch_buttons, priority=600)  # after the theme
    app.connect("build-finished", student_notebooks)
    # env_version: bump when a change here must re-read every page (as the title rule does)
    return {"version": "1.0", "env_version": 3, "parallel_read_safe": True,
            "parallel_write_safe": True}
