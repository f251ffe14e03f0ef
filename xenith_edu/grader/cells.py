"""A notebook's code cells as Jupyter runs them: IPython's own input transformation turns
magics and shell escapes into calls of `get_ipython()`, and no Python line is changed.

Inside the sandbox `get_ipython()` is `Shell`: a magic that only shows or configures
(%matplotlib, %%html) does nothing, one that times runs its code once (%time, %%capture), and
any other, and every shell escape (!pip), is noted as "magic not available while grading",
which the learner's row shows: none is dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable

UNAVAILABLE = "magic not available while grading"
# magics that only display or configure: a no-op here
QUIET = frozenset({"matplotlib", "config", "load_ext", "reload_ext", "autoreload", "aimport",
                   "precision", "pinfo", "pinfo2", "psearch", "pdoc", "pdef", "who", "whos",
                   "html", "HTML", "markdown", "latex", "javascript", "js", "svg", "pprint",
                   "xmode", "colors", "pdb", "doctest_mode", "notebook", "env", "history",
                   "alias_magic", "lsmagic", "magic", "quickref", "page"})
RUNS = frozenset({"time", "timeit", "capture", "prun"})  # magics that run their code once
_manager = None


def transform(source: str) -> str:
    """The Python IPython runs for a cell's `source` (its own TransformerManager)."""
    global _manager
    if _manager is None:
        from IPython.core.inputtransformer2 import TransformerManager  # on first cell only

        _manager = TransformerManager()
    return _manager.transform_cell(source)


class Shell:
    """What `get_ipython()` is while a learner's notebook runs in the sandbox."""

    def __init__(self, namespace: dict, note: Callable[[str], None]) -> None:
        self.user_ns = namespace
        self._note = note

    def _run(self, code: str) -> object:
        if code.strip():
            try:
                return eval(compile(code, "<magic>", "eval"), self.user_ns)
            except SyntaxError:
                exec(compile(code, "<magic>", "exec"), self.user_ns)
        return None

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> object:
        if name in RUNS:
            words = line.split()
            while words and words[0].startswith("-"):  # timeit's options: -n 10 -r 3
                words = words[2:] if words[0] in ("-n", "-r") else words[1:]
            return self._run(" ".join(words))
        if name not in QUIET:
            self._note(f"%{name} {line}".strip())
        return None

    def run_cell_magic(self, name: str, line: str, cell: str) -> object:
        if name in RUNS:
            exec(compile(transform(cell), "<magic>", "exec"), self.user_ns)
        elif name not in QUIET:
            self._note(f"%%{name} {line}".strip())
        return None

    def system(self, cmd: str) -> None:
        self._note(f"!{cmd}")

    def getoutput(self, cmd: str, split: bool = True) -> list:
        self._note(f"!{cmd}")
        return []

    def run_cell(self, *args, **kwargs) -> None:
        self._note("run_cell")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs) -> None:
            self._note(f"get_ipython().{name}")

        return unavailable
