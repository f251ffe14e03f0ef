"""Sphinx extension for the xenith-edu book: offline MathJax, launch buttons, chapter titles.
Loaded from _config.yml (sphinx.local_extensions); needs no network at build time.

Offline MathJax: the book extra installs `django-static-mathjax`, a PyPI package that
ships the MathJax 3 distribution (its `es5/` folder: combined components and woff fonts).
When an HTML build starts, the files MathJax needs are copied into `_static/mathjax/`
of the built site and `mathjax_path` points there, so every page loads MathJax (and its
fonts, menu and accessibility modules) from the site itself, never from a CDN.

Launch buttons: Binder and Colab buttons (and the repository button) are shown only when
`repository.url` is set in _config.yml; while it is empty they are switched off. While
live code (thebe) is off, sphinx-thebe's page scripts are left out.

Chapter titles: a notebook titled "3. RMSNorm" keeps its number in Jupyter, and the book
shows the table of contents' number alone.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)

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


CHAPTER_NUMBER = re.compile(r"^\d+\.\s+")  # "3. RMSNorm": numbered for Jupyter readers


def strip_chapter_number(app: Sphinx, doctree: nodes.document) -> None:
    """Drop a typed "3. " from a chapter notebook's title: the book numbers chapters itself.

    The notebook keeps its number for readers who open it in Jupyter; in the book the table
    of contents adds the same number, and "3. 3. RMSNorm" would follow otherwise.
    """
    if not app.env.docname.startswith("notebooks/"):
        return
    for title in doctree.findall(nodes.title):
        text = title.children[0] if title.children else None
        if isinstance(text, nodes.Text) and CHAPTER_NUMBER.match(text):
            title.replace(text, nodes.Text(CHAPTER_NUMBER.sub("", str(text), count=1)))
        return  # only the first title, the chapter's


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


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", on_config_inited, priority=900)
    app.connect("builder-inited", on_builder_inited)
    # before Sphinx's title collector (priority 500) records the title for the navigation
    app.connect("doctree-read", strip_chapter_number, priority=400)
    # env_version: bump when a change here must re-read every page (as the title rule does)
    return {"version": "1.0", "env_version": 1, "parallel_read_safe": True,
            "parallel_write_safe": True}
