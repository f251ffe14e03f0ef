"""A notebook file read with nbformat, the `notebooks` extra, imported only when asked for:
a missing extra, or a file that is not a notebook, is one line saying what to do.
"""

from __future__ import annotations

from pathlib import Path

from .util import one_line

NOTEBOOKS_EXTRA = "notebooks"  # the extra of xenith-edu that brings the notebook tooling


def require(*modules: str) -> None:
    """Import the notebook machinery, or say in one line which extra to install."""
    import importlib  # only when notebooks are read or written

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise ImportError(f"notebooks need the package {name}, which the extra "
                              f"[{NOTEBOOKS_EXTRA}] of xenith-edu installs: pip install "
                              f"\"xenith-edu[{NOTEBOOKS_EXTRA}]\"") from None


def read_notebook(path: Path):  # -> nbformat.NotebookNode
    """The notebook at `path`, read and validated (version 4)."""
    require("nbformat")
    import nbformat  # only when notebooks are read or written

    try:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # invalid JSON, not a notebook, unsupported version...
        raise ValueError(f"{path.name} is not a valid notebook: {one_line(exc)[:200]}") from None
    return nb
