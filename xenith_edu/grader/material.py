"""The learner's material from the exercise catalogue: the helpers a teacher's notebook imports
(a forward to differentiate, a buggy backward to fix), shipped to the sandbox as source alone.

The catalogue is not in the sandbox: its chapter modules hold the checks' references. What a
teacher's notebook imports from them, `from xenith_edu.exercises.backward import stack_forward`,
is cut out here, with the module-level names it needs and nothing else, so that the learner's
notebook runs as in the book while no reference is there to call or read.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from .cells import transform

CATALOGUE = "xenith_edu.exercises"


def imported(sources: list[str]) -> dict[str, set[str]]:
    """{catalogue module: names} that these code cells import from the catalogue's modules."""
    wanted: dict[str, set[str]] = {}
    for source in sources:
        try:
            tree = ast.parse(transform(source))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.startswith(CATALOGUE + "."):
                wanted.setdefault(node.module, set()).update(a.name for a in node.names)
    return wanted


def _path(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _used(node: ast.AST) -> set[str]:
    """The names a definition reads when it runs (annotations are never evaluated)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        parts = [*node.body, *node.args.defaults, *node.args.kw_defaults, *node.decorator_list]
    else:
        parts = [node]
    return {n.id for p in parts if p is not None for n in ast.walk(p)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _absolute(node: ast.ImportFrom, module: str) -> str:
    base = module.split(".")[:-node.level] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _cut(module: str, names: set[str], found: dict[str, list[str]]) -> None:
    """Add to `found[module]` the source of `names` and of what they need, recursively."""
    path = _path(module)
    if path is None:
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defs, imports = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defs[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    defs[t.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom) and \
                getattr(node, "module", None) != "__future__":
            for a in node.names:
                imports[(a.asname or a.name).split(".")[0]] = (node, a)
    todo, keep, lines = list(names), set(), found.setdefault(module, [])
    never = withheld(module)
    while todo:
        name = todo.pop()
        if name in keep or name in never:
            continue  # a withheld name: the sandbox's placeholder stands for it
        keep.add(name)
        if name in defs:
            todo += sorted(_used(defs[name]) - keep)
        elif name in imports:
            lines.append(_import_line(*imports[name], module, found))
    source = path.read_text(encoding="utf-8").split("\n")
    seen: set[int] = set()
    for node in tree.body:
        if id(node) not in seen and any(defs.get(n) is node for n in keep):
            seen.add(id(node))  # whole lines, from the first decorator (@dataclass) on
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            lines.append("\n".join(source[first - 1:node.end_lineno]))


SPEC_PARTS = ("reference", "cases", "probes", "mistakes", "diagnose", "factors", "probe_hint",
              "floor", "terms")


def withheld(module: str) -> set[str]:
    """The names of a catalogue module that never enter the sandbox, whatever a teacher's
    cell imports: its checks, its exercises (Spec objects), and each exercise's reference,
    case generator, probes, mistake list, diagnosis, fit terms."""
    import importlib  # the catalogue's module itself, imported to read its exercises

    from ..exercises.types import Spec  # the catalogue's record of an exercise

    try:
        mod = importlib.import_module(module)
    except ImportError:
        return set()
    out = {n for n in vars(mod) if n.startswith("check_")}
    for name, value in vars(mod).items():
        inside = value.values() if isinstance(value, dict) else \
            value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, Spec) for v in inside):  # an exercise, or a table of them
            out.add(name)
    from ..exercises import SPECS  # every exercise's parts, wherever they are defined
    for spec in SPECS.values():
        for part in SPEC_PARTS:
            fn = getattr(spec, part, None)
            if callable(fn) and getattr(fn, "__module__", None) == module:
                out.add(getattr(fn, "__name__", ""))
        named = spec.reference_name  # the catalogue's function that computes the answer
        if named.startswith(module + ".") and re.fullmatch(r"\w+", named[len(module) + 1:]):
            out.add(named[len(module) + 1:])
    return out


def _import_line(node: ast.stmt, alias: ast.alias, module: str, found: dict) -> str:
    if isinstance(node, ast.Import):
        return f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
    origin = _absolute(node, module)
    if origin.startswith(CATALOGUE + ".") or origin == CATALOGUE:
        _cut(origin, {alias.name}, found)  # cut from that module of the catalogue too
    return f"from {origin} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")


def material(sources: list[str]) -> dict[str, str]:
    """{catalogue module: the source of what these teacher's cells import from it}."""
    found: dict[str, list[str]] = {}
    for module, names in imported(sources).items():
        _cut(module, names, found)
    return {m: "from __future__ import annotations\n\n" + "\n\n".join(dict.fromkeys(lines))
            for m, lines in found.items()}
