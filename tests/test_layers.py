"""The package's layout holds: floors as folders, imports running one way, no cycles, and every
function and module short enough to read (CONTRIBUTING.md, "Where code goes").

Imports are read from the source with `ast`, inside functions and under TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "xenith_edu"

# The floors, lowest first. A module may import its own floor and the floors below it.
COMPONENTS = ("softmax_ce", "swiglu", "rmsnorm", "attention", "rope", "embedding", "linear",
              "flash_attention", "bias", "qk_norm", "rope_scaling", "geglu",
              "lora")
FLOORS = ("tools", "components", "model", "training", "exercises", "grader", "booktools",
          "gradebook", "cli")
TOP_LEVEL = {f"{c}.py" for c in COMPONENTS} | {"chapters.py", "__init__.py", "__main__.py"}
MAX_FUNCTION, MAX_MODULE = 60, 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(("xenith_edu",) + parts)] = path
    return out


MODULES = _modules()


def floor(module: str) -> int | None:
    """The floor of a module of the package; None for the registry and the package itself."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("chapters", "__main__"):
        return None
    if parts[1] in COMPONENTS:
        return FLOORS.index("components")
    return FLOORS.index(parts[1])


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    names = [f"{stem}.{a.name}" for a in node.names]
    return [n if n in MODULES else stem for n in names]


def imports(module: str) -> set[str]:
    """Every package module that `module` imports, wherever the import statement stands."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.update(_resolve(module, node))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: imports(m) for m in MODULES}


def test_the_top_of_the_package_holds_only_the_components_and_the_registry() -> None:
    plain = {p.name for p in PACKAGE.glob("*.py")}
    assert plain - TOP_LEVEL == set()
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FLOORS) - {"components"}


def test_imports_run_down_only() -> None:
    up = [f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
          if floor(m) is not None and floor(t) is not None and floor(t) > floor(m)]
    assert up == []


def test_no_import_cycles() -> None:
    # The package's __init__ files gather their floor's names; a module importing its own
    # package's __init__ is not a cycle of code, so only module-to-module edges count here.
    graph = {m: {t for t in ts if not MODULES[t].name == "__init__.py"
                 or not m.startswith(t + ".")} for m, ts in GRAPH.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]) if t in path else t)
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_functions_and_modules_are_short(module: str) -> None:
    source = MODULES[module].read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MAX_MODULE
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION]
    assert long == []


def test_every_import_inside_a_function_says_why() -> None:
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    said = lines[inner.lineno - 1] + (lines[inner.lineno - 2]
                                                      if inner.lineno > 1 else "")
                    if "#" not in said:
                        silent.append(f"{module}:{inner.lineno}")
    assert silent == []
