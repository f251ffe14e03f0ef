"""Candidate mistakes derived from a reference by program transformation, as a mutation tester
makes them: each mutant is the reference with one change (a sign, a dropped term, a transpose...).

`mutants(spec)` turns the source of the spec's reference, and of every package function it
calls, into mutant functions, cached per exercise; `explain(spec, judged, close)` names the one
change whose outputs equal the learner's on every case, in the words of the duality table.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import math
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from ..tools.workspace import poisoned
from .changes import RULES, literal, node_changes
from .types import Spec

# Shape legend: none; this module rewrites functions, not arrays.

MAX_FUNCTIONS = 8  # the reference and the package functions it reaches, at most
MAX_MUTANTS = 900  # per exercise: the first ones, in source order, the rest are not tried
_LOCK = threading.Lock()  # a mutant is swapped into the package's modules while it runs

class Mutant(NamedTuple):
    """One change to one function: what it is, where, and the function with the change."""

    kind: str  # a key of RULES
    where: str  # "in the line that makes dS", "in what is returned"
    detail: str  # the change, short: "`x.T` became `x`"
    original: types.FunctionType  # the function changed
    changed: types.FunctionType  # the same function with the change

    def describe(self) -> str:
        return f"{RULES[self.kind]}, {self.where}: {self.detail}."


# ----------------------------------------------------------------------------------------------
# The functions a reference reaches.


def _package_function(obj: object) -> bool:
    return (isinstance(obj, types.FunctionType) and obj.__name__ != "<lambda>"
            and (obj.__module__ or "").startswith("xenith_edu.")
            and not obj.__module__.startswith(("xenith_edu.tools", "xenith_edu.exercises.engine",
                                               "xenith_edu.exercises.types")))


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def reached(fn: Callable) -> list[types.FunctionType]:
    """`fn` (unless a lambda) and the package functions it calls, breadth first."""
    start = fn if isinstance(fn, types.FunctionType) else None
    if start is None:
        return []
    found: list[types.FunctionType] = []
    queue = [start]
    while queue and len(found) < MAX_FUNCTIONS:
        f = queue.pop(0)
        if f in found:
            continue
        if f.__name__ != "<lambda>" or f is start:
            found.append(f)
        names = list(_names(f.__code__))
        for name in names:  # a module imported inside the function is not in its globals
            obj = f.__globals__.get(name, sys.modules.get(f"xenith_edu.{name}"))
            if isinstance(obj, types.ModuleType) and obj.__name__.startswith("xenith_edu"):
                queue += [getattr(obj, n) for n in names
                          if _package_function(getattr(obj, n, None))]
            elif _package_function(obj):
                queue.append(obj)
    return found


# ----------------------------------------------------------------------------------------------
# The mutants of one function, and of one exercise.


LAMBDA = "_lambda_"  # the name a lambda's def gets when it is rewritten


def _lambda_tree(f: types.FunctionType) -> ast.Module | None:
    """A lambda as `def _lambda_(args): return body`, found in its module's source by line."""
    try:
        module = ast.parse(inspect.getsource(inspect.getmodule(f)))
    except (OSError, TypeError, SyntaxError):
        return None
    code = f.__code__
    names = list(code.co_varnames[:code.co_argcount])
    found = [n for n in ast.walk(module) if isinstance(n, ast.Lambda)
             and n.lineno == code.co_firstlineno and [a.arg for a in n.args.args] == names]
    if len(found) != 1:
        return None
    body = [ast.copy_location(ast.Return(found[0].body), found[0])]
    fdef = ast.FunctionDef(name=LAMBDA, args=found[0].args, body=body, decorator_list=[],
                           returns=None, type_params=[])
    return ast.fix_missing_locations(ast.Module([ast.copy_location(fdef, found[0])], []))


def _tree(f: types.FunctionType) -> ast.Module | None:
    """The function's source as a module of one plain def, or None if it cannot be rewritten."""
    if f.__code__.co_freevars:
        return None
    try:
        tree = _lambda_tree(f) if f.__name__ == "<lambda>" else \
            ast.parse(textwrap.dedent(inspect.getsource(f)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    fdef = tree.body[0] if tree is not None and tree.body else None
    if not isinstance(fdef, ast.FunctionDef) or any(isinstance(n, ast.While | ast.Global)
                                                    for n in ast.walk(fdef)):
        return None  # a changed loop condition could run for ever
    fdef.decorator_list, fdef.returns = [], None
    for node in ast.walk(fdef):  # a change may read an array before it is written: make it 0
        if isinstance(node, ast.Attribute) and node.attr in ("empty", "empty_like"):
            node.attr = node.attr.replace("empty", "zeros")
    for a in fdef.args.args + fdef.args.kwonlyargs + fdef.args.posonlyargs:
        a.annotation = None
    return tree


def _body_nodes(tree: ast.Module) -> list[tuple[ast.AST, ast.AST | None, ast.stmt]]:
    """Every node of the function's body, in source order: (node, its parent, its statement)."""
    out: list[tuple[ast.AST, ast.AST | None, ast.stmt]] = []

    def visit(node: ast.AST, parent: ast.AST | None, stmt: ast.stmt) -> None:
        out.append((node, parent, stmt))
        for child in ast.iter_child_nodes(node):
            visit(child, node, child if isinstance(child, ast.stmt) else stmt)

    fdef = tree.body[0]
    for s in fdef.body[1:] if _docstring(fdef) else fdef.body:
        visit(s, fdef, s)
    return out


def _docstring(fdef: ast.FunctionDef) -> bool:
    first = fdef.body[0] if fdef.body else None
    return isinstance(first, ast.Expr) and isinstance(literal(first.value), str)


def _where(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.Return):
        return "in what is returned"
    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
        [stmt.target] if isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For) else []
    names = [ast.unparse(t) for t in targets]
    if names:
        return f"in the line that makes {', '.join(f'`{n}`' for n in names)}"[:90]
    return "in one line of the computation"


def _short(node: ast.AST) -> str:
    try:
        text = ast.unparse(ast.fix_missing_locations(node))
    except Exception:  # an unusual node is described by its kind alone
        return "..."
    return text if len(text) <= 60 else text[:57] + "..."


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for name, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, name, new)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if v is old:
                    value[i] = new


def _compile(tree: ast.Module, f: types.FunctionType) -> types.FunctionType | None:
    try:
        code = compile(ast.fix_missing_locations(tree), f"<a change of {f.__name__}>", "exec")
        space: dict = {}
        exec(code, f.__globals__, space)  # the module's own names, as the original reads them
    except Exception:  # a change that does not compile is no candidate
        return None
    g = space.get(LAMBDA if f.__name__ == "<lambda>" else f.__name__)
    if not isinstance(g, types.FunctionType):
        return None
    g.__defaults__, g.__kwdefaults__ = f.__defaults__, f.__kwdefaults__
    return g


def _variables(tree: ast.Module) -> list[tuple[str, int]]:
    """The function's arguments (line 0) and the names it assigns, with the line of the first."""
    fdef = tree.body[0]
    names = [(a.arg, 0) for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs]
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append((node.id, node.lineno))
    first: dict[str, int] = {}
    for name, line in names:
        first[name] = min(first.get(name, line), line)
    return list(first.items())


def _with_names(tree: ast.Module, nodes: list) -> list[tuple[int, int, str, ast.AST, ast.AST]]:
    """(node index, change index, kind, node, replacement), the changes of every node, then one
    variable read in place of another made before that line (the most numerous, tried last)."""
    plan = [(i, k, kind, node, new) for i, (node, parent, _) in enumerate(nodes)
            for k, (kind, new) in enumerate(node_changes(node, parent))]
    names = _variables(tree)
    known = {n for n, _ in names}
    for i, (node, _, stmt) in enumerate(nodes):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in known:
            plan += [(i, -1, "name", node, ast.Name(other, ast.Load()))
                     for other, line in names if other != node.id and line < stmt.lineno]
    return plan


def _definitions(tree: ast.Module) -> dict[str, str]:
    """name -> `name = value` for the names assigned once, by a short line."""
    seen: dict[str, list[str]] = {}
    for node in ast.walk(tree.body[0]):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            seen.setdefault(node.targets[0].id, []).append(_short(node))
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and "..." not in v[0]}


def function_mutants(f: types.FunctionType, limit: int) -> list[Mutant]:
    """The mutants of `f`, one change each, in source order, at most `limit`. Each change is
    made in the function's tree, compiled, and undone."""
    tree = _tree(f)
    if tree is None:
        return []
    nodes = _body_nodes(tree)
    defs = _definitions(tree)
    out: list[Mutant] = []
    for i, _, kind, node, new in _with_names(tree, nodes):
        if len(out) >= limit:
            break
        detail = f"`{_short(node)}` became `{_short(new)}`"
        if kind == "name" and node.id in defs:
            detail += f" (`{defs[node.id]}`)"
        parent = nodes[i][1]
        _replace(parent, node, new)
        try:
            g = _compile(tree, f)
        finally:
            _replace(parent, new, node)
        if g is not None:
            out.append(Mutant(kind, _where(nodes[i][2]), detail, f, g))
    return out


_CACHE: dict[str, list[Mutant]] = {}


def mutants(spec: Spec) -> list[Mutant]:
    """The exercise's mutants: of its reference and of each package function it calls."""
    if spec.id not in _CACHE:
        found: list[Mutant] = []
        for f in reached(spec.reference):
            found += function_mutants(f, MAX_MUTANTS - len(found))
        _CACHE[spec.id] = found
    return _CACHE[spec.id]


@contextmanager
def _swapped(original: types.FunctionType, changed: types.FunctionType) -> Iterator[None]:
    """`changed` in place of `original` in every package module's names, for one call."""
    with _LOCK:
        places = [vars(m) for name, m in list(sys.modules.items())
                  if name.startswith("xenith_edu") and m is not None]
        keys = [(d, k) for d in places for k, v in list(d.items()) if v is original]
        try:
            for d, k in keys:
                d[k] = changed
            yield
        finally:
            for d, k in keys:
                d[k] = original


def outputs(spec: Spec, m: Mutant, args: tuple) -> dict | None:
    """The mutant's outputs on `args` (float64), by name; None if it fails there."""
    args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)  # it may write
    try:
        with _swapped(m.original, m.changed), poisoned():  # an element it never writes: NaN
            call = m.changed if m.original is spec.reference else spec.reference
            out = call(*args)
        out = (out,) if spec.single and not isinstance(out, tuple) else tuple(out)
        return dict(zip(spec.out_names, out, strict=True))
    except Exception:  # a change that fails on this case does not explain it
        return None


# ----------------------------------------------------------------------------------------------
# Naming the change that gives the learner's answer.


def _swapped_args(spec: Spec, args: tuple) -> Iterator[tuple[str, tuple]]:
    """The learner's arguments with two of the same shape and dtype used in each other's place."""
    def alike(a: object, b: object) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return a != b
        return getattr(a, "shape", None) is not None and getattr(a, "shape", 0) == \
            getattr(b, "shape", 1) and getattr(a, "dtype", 0) == getattr(b, "dtype", 1)

    for i in range(len(args)):
        for j in range(i + 1, len(args)):
            a, b = args[i], args[j]
            if alike(a, b):
                swapped = list(args)
                swapped[i], swapped[j] = b, a
                yield (f"{RULES['swap']}: `{spec.arg_names[i]}` and `{spec.arg_names[j]}` are "
                       "used in each other's place"), tuple(swapped)


def _same(got: object, cand: object, tol: float, close: Callable) -> bool:
    """close(), where NaN and inf in the same places as the candidate's count as the same."""
    try:
        g, c = np.asarray(got, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if g.shape != c.shape:
        return False
    bad = ~np.isfinite(g)
    if not np.array_equal(bad, ~np.isfinite(c)) or not np.array_equal(g[bad], c[bad],
                                                                        equal_nan=True):
        return False
    return bool(bad.all()) or close(g[~bad], c[~bad], tol)


def _fits(spec: Spec, got: dict, cand: dict | None, tol: float, close: Callable) -> bool:
    return cand is not None and all(_same(got[n], cand[n], tol, close) for n in spec.out_names)


def _by_swap(spec: Spec, judged: list, close: Callable) -> list[str]:
    first = judged[0]
    names = dict(_swapped_args(spec, first.args64))
    found = []
    for text in names:
        ok = True
        for j in judged:
            swaps = dict(_swapped_args(spec, j.args64))
            if text not in swaps:
                continue  # the two arrays differ in shape here: no prediction on this case
            try:
                args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in swaps[text])
                cand = dict(zip(spec.out_names, spec.reference(*args), strict=True))
            except Exception:
                cand = None
            if not _fits(spec, j.got, cand, j.tol, close):
                ok = False
                break
        if ok:
            found.append(text + ".")
    return found


_PRINTS: dict[tuple[str, str], list] = {}  # (exercise, case) -> per mutant, its outputs' prints
_WEIGHTS: dict[tuple, np.ndarray] = {}
MAX_PRINTED_CASES = 256


def _case_key(args: tuple) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in args:
        if isinstance(a, np.ndarray):
            h.update(repr((a.shape, a.dtype.str)).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(repr(a).encode())
    return h.hexdigest()


def _print(out: object) -> tuple[float, float]:
    """<out, R> for fixed random weights R of out's shape, and max|out| * sum|R|: two outputs
    within 10 tol of each other (relative to max|out|) have prints within 10 tol of the bound."""
    a = np.asarray(out, dtype=np.float64)
    if a.shape not in _WEIGHTS:
        _WEIGHTS[a.shape] = np.random.default_rng(a.size).standard_normal(a.shape)
    w = _WEIGHTS[a.shape]
    if not np.all(np.isfinite(a)):
        return math.nan, math.nan
    return float(np.sum(a * w)), float(np.max(np.abs(a), initial=0.0) * np.sum(np.abs(w)))


def _printed(spec: Spec, args: tuple) -> Iterator[tuple[Mutant, dict | None]]:
    """Each mutant with the prints of its outputs on `args`, computed once per exercise and case
    (lazily: a search that stops early leaves the rest for later)."""
    key = (spec.id, _case_key(args))
    if key not in _PRINTS:
        if len(_PRINTS) >= MAX_PRINTED_CASES:
            _PRINTS.pop(next(iter(_PRINTS)))
        _PRINTS[key] = []
    table = _PRINTS[key]
    for i, m in enumerate(mutants(spec)):
        if i == len(table):
            out = outputs(spec, m, args)
            try:
                table.append(None if out is None else {n: _print(o) for n, o in out.items()})
            except (TypeError, ValueError):
                table.append(None)
        yield m, table[i]


def _may_fit(printed: dict | None, got: dict, tol: float) -> bool:
    """False only where the learner's outputs certainly differ from the mutant's."""
    if printed is None:
        return False
    for name, (p, bound) in printed.items():
        if math.isnan(p):
            continue
        try:
            g, _ = _print(got[name])
        except (TypeError, ValueError, KeyError):
            return False
        if math.isnan(g) or abs(g - p) > 10 * tol * bound * 1.01 + 1e-300:
            return False
    return True


def explain(spec: Spec, judged: list, close: Callable, most: int = 2) -> list[str]:
    """The changes of the reference whose outputs equal the learner's, every output on every
    case; `judged[0]` is the first failed case. At most `most`, each of a different kind."""
    found = _by_swap(spec, judged, close)
    kinds: set[str] = set()
    first = judged[0]
    for m, p in _printed(spec, first.args64):
        if len(found) >= most:
            break
        if m.kind in kinds or not _may_fit(p, first.got, first.tol):
            continue
        cand = outputs(spec, m, first.args64)
        if cand is None or all(close(first.exp[n], cand[n], first.tol / 10)
                               for n in first.wrong):
            continue  # fails here, or gives the right answer where the learner's is wrong
        if all(_fits(spec, j.got, outputs(spec, m, j.args64), j.tol, close) for j in judged):
            kinds.add(m.kind)
            found.append(m.describe())
    return found[:most]
