"""Diagnosis by fitting: a wrong answer explained in the reference's own terms.

Each output of a spec with `terms` is a sum of named terms; an answer that is the same sum with a
term missing, a sign flipped, a named scale, a factor left out, or one of a term's slips is named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .kit import fmt
from .types import Spec, Status
from .validate import Stop

# Shape legend: the shapes are the outputs' own; a term broadcasts to the shape of its output.

MISSING = "is missing (left out, or overwritten where += should add it)"


class Term(NamedTuple):
    """One additive term of an output in float64: its name, value, factors and known slips.

    `parts` are the factors whose product (times `sign`) is the value, so that leaving one out
    is a slip the fit tries by itself; `slips` are (what went wrong, the term with that slip),
    the value None where the slip cannot be formed on a case (its index must stay the same).
    """

    name: str
    value: np.ndarray
    parts: tuple[tuple[str, np.ndarray], ...] = ()
    slips: tuple[tuple[str, np.ndarray | None], ...] = ()
    sign: float = 1.0


def term(name: str, *parts: tuple[str, np.ndarray], sign: float = 1.0,
         slips: tuple[tuple[str, np.ndarray | None], ...] = ()) -> Term:
    """A term that is the product of its named parts (times sign)."""
    value = np.asarray(sign, dtype=np.float64)
    for _, p in parts:
        value = value * p
    return Term(name, value, tuple(parts), slips, sign)


def _without(t: Term, drop: str) -> np.ndarray:
    value = np.asarray(t.sign, dtype=np.float64)
    for name, p in t.parts:
        if name != drop:
            value = value * p
    return value


# ----------------------------------------------------------------------------------------------
# Candidates: the terms as the reference has them, and with one structural slip.


class Form(NamedTuple):
    """Which structural slip a candidate carries: ("", ...) for none."""

    kind: str  # "", "slip", "drop" (a part of one term), "drop_all" (a part of every term),
    # "slip_all" (a slip of every term that has one of that name)
    index: int = -1  # the term
    key: str | int = ""  # the slip's index or the part's name


def _forms(terms: list[Term]) -> list[Form]:
    forms = [Form("")]
    for i, t in enumerate(terms):
        forms += [Form("slip", i, j) for j in range(len(t.slips))]
        if len(t.parts) > 1:
            forms += [Form("drop", i, name) for name, _ in t.parts]
    names = [n for t in terms for n, _ in t.parts]
    forms += [Form("drop_all", -1, n) for n in dict.fromkeys(names) if names.count(n) > 1]
    said = [what for t in terms for what, _ in t.slips]
    forms += [Form("slip_all", -1, w) for w in dict.fromkeys(said) if said.count(w) > 1]
    return forms


def _columns(terms: list[Term], form: Form, shape: tuple) -> list[np.ndarray] | None:
    cols = []
    for i, t in enumerate(terms):
        value = t.value
        if form.kind == "slip" and i == form.index:
            value = t.slips[int(form.key)][1]
        elif form.kind == "drop" and i == form.index:
            value = _without(t, str(form.key))
        elif form.kind == "drop_all" and any(n == form.key for n, _ in t.parts):
            value = _without(t, str(form.key))
        elif form.kind == "slip_all" and any(w == form.key for w, _ in t.slips):
            value = next(v for w, v in t.slips if w == form.key)
        if value is None:
            return None
        try:
            cols.append(np.broadcast_to(np.asarray(value, dtype=np.float64), shape).ravel())
        except ValueError:
            return None
    return cols


# ----------------------------------------------------------------------------------------------
# Coefficients: each term's factor, snapped to a named value.


class Coef(NamedTuple):
    """A term's coefficient, symbolically: sign * factor[a] ** pa * factor[b] ** pb."""

    sign: float
    a: int = -1  # index into the case's factors, -1 for none
    pa: int = 0
    b: int = -1
    pb: int = 0


ONE, ZERO = Coef(1.0), Coef(0.0)


def _factors(spec: Spec, args: tuple) -> list[tuple[str, float]]:
    named = list(spec.factors(args).items()) if spec.factors is not None else []
    return named + [("2", 2.0)]


def _value(c: Coef, factors: list[tuple[str, float]]) -> float:
    v = c.sign
    if c.a >= 0:
        v *= factors[c.a][1] ** c.pa
    if c.b >= 0:
        v *= factors[c.b][1] ** c.pb
    return v


def _menu(factors: list[tuple[str, float]]) -> list[Coef]:
    """The coefficients a slip can give, simplest first."""
    menu = [ONE, ZERO, Coef(-1.0)]
    usable = [i for i, (_, f) in enumerate(factors) if f not in (0.0, 1.0, -1.0)]
    for s in (1.0, -1.0):
        menu += [Coef(s, i, p) for i in usable for p in (1, -1)]
    menu += [Coef(1.0, i, 1, j, -1) for i in usable for j in usable
             if i != j and factors[i][1] != factors[j][1]]
    return menu


def _snap(c: float, menu: list[Coef], factors: list[tuple[str, float]]) -> Coef | None:
    for m in menu:
        v = _value(m, factors)
        if abs(c - v) <= 1e-3 * max(abs(v), 1.0):
            return m
    return None


# ----------------------------------------------------------------------------------------------
# The fit of one output on one case, and its check on every other case.


class Fit(NamedTuple):
    form: Form
    coefs: tuple[Coef, ...]

    @property
    def size(self) -> int:
        """How many changes: the slip, then one for a whole-output scale, else one per term."""
        changed = sum(c != ONE for c in self.coefs)
        whole = len(self.coefs) > 1 and changed == len(self.coefs) and len(set(self.coefs)) == 1
        return (self.form.kind != "") + (1 if whole else changed)


def _predict(fit: Fit, terms: list[Term], factors: list, shape: tuple) -> np.ndarray | None:
    if len(terms) != len(fit.coefs):
        return None
    cols = _columns(terms, fit.form, shape)
    if cols is None or any(max(c.a, c.b) >= len(factors) for c in fit.coefs):
        return None
    return sum(_value(c, factors) * col for c, col in zip(fit.coefs, cols, strict=True)
               ).reshape(shape)


def _fits_on(got: np.ndarray, terms: list[Term], factors: list, tol: float,
             close: Callable) -> list[Fit]:
    """Every explanation of `got` by the terms on one case, simplest first."""
    g = np.asarray(got, dtype=np.float64)
    menu = _menu(factors)
    found = []
    for form in _forms(terms):
        cols = _columns(terms, form, g.shape)
        if cols is None:
            continue
        A = np.stack(cols, axis=1)  # (size of the output, terms)
        if g.size > len(terms):
            coef = np.linalg.lstsq(A, g.ravel(), rcond=None)[0]
            snapped = [_snap(float(c), menu, factors) for c in coef]
        else:  # too few numbers to fit each term: one coefficient for the whole output
            e = A.sum(axis=1)
            ee = float(e @ e)
            one = _snap(float(g.ravel() @ e) / ee, menu, factors) if ee > 0 else None
            snapped = [one] * len(terms)
        if any(s is None for s in snapped):
            continue
        fit = Fit(form, tuple(snapped))
        pred = _predict(fit, terms, factors, g.shape)
        if fit.size and pred is not None and close(g, pred, tol):
            found.append(fit)
    return sorted(found, key=lambda f: f.size)


def explain(spec: Spec, judged: list, close: Callable) -> list[str]:
    """What each wrong output of the first judged case is, in the reference's terms.

    `judged` are the engine's judged cases, the failed one first (each with args64, got, exp,
    wrong, tol). An explanation found on one case must give the learner's answer on every case.
    """
    if spec.terms is None:
        return []
    tables = []
    for j in judged:
        try:
            tables.append((j, spec.terms(j.args64), _factors(spec, j.args64)))
        except Exception:  # a case whose terms cannot be formed gives no prediction
            continue
    found = []
    for name in judged[0].wrong:
        for j, terms, factors in tables:
            if name not in j.wrong or name not in terms:
                continue
            fits = [f for f in _fits_on(j.got[name], terms[name], factors, j.tol, close)
                    if _everywhere(f, name, tables, close)]
            if fits:
                found.append(say(name, terms[name], fits[0], factors))
                break
    return found


def _everywhere(fit: Fit, name: str, tables: list, close: Callable) -> bool:
    for j, terms, factors in tables:
        if name not in terms:
            continue
        g = np.asarray(j.got[name], dtype=np.float64)
        pred = _predict(fit, terms[name], factors, g.shape)
        if pred is not None and not close(g, pred, j.tol):
            return False
    return True


# ----------------------------------------------------------------------------------------------
# Saying it.


def _phrase(c: Coef, factors: list[tuple[str, float]]) -> str:
    if c == ZERO:
        return MISSING
    flip = "has its sign flipped" if c.sign < 0 else ""
    if c.a < 0:
        return flip
    a = factors[c.a][0]
    if c.b >= 0:
        b = factors[c.b][0]
        size = (f"is {fmt(abs(_value(c, factors)))} times what it should be: it uses {b} "
                f"where {a} belongs, or {a} where {b} does")
    elif c.pa > 0:
        size = f"is {fmt(factors[c.a][1])} times too large (off by a factor of {a})"
    else:
        size = f"is {fmt(factors[c.a][1])} times too small (off by a factor of {a})"
    return f"{flip} and {size}" if flip else size


def _factor(part: str) -> str:
    """How a left-out factor is named: `1 / l` is a division, anything else a factor."""
    if part.startswith("1 / "):
        return f"the division by {part[4:]}"
    return f"the factor {part}"


def say(name: str, terms: list[Term], fit: Fit, factors: list[tuple[str, float]]) -> str:
    """One sentence: the output, its slip, the terms whose coefficient is off."""
    lines = []
    form = fit.form
    if form.kind == "slip":
        lines.append(f"in {name}, the term {terms[form.index].name}: "
                     f"{terms[form.index].slips[int(form.key)][0]}")
    elif form.kind == "drop":
        lines.append(f"in {name}, {_factor(str(form.key))} is missing from the term "
                     f"{terms[form.index].name}")
    elif form.kind == "drop_all":
        lines.append(f"in {name}, {_factor(str(form.key))} is missing from every term")
    elif form.kind == "slip_all":
        lines.append(f"in {name}, every term: {form.key}")
    changed = [(t, c) for t, c in zip(terms, fit.coefs, strict=True) if c != ONE]
    if form.kind == "" and all(c == ZERO for c in fit.coefs):
        return f"{name} is all zeros: nothing was written or accumulated into it."
    if len(terms) > 1 and len(changed) == len(terms) and len(set(fit.coefs)) == 1:
        lines.append(f"{name} as a whole {_phrase(fit.coefs[0], factors)}")
    elif len(terms) == 1 and changed:
        lines.append(f"{name} ({terms[0].name}) {_phrase(changed[0][1], factors)}")
    else:  # the terms that share a change, named together
        by_phrase: dict[str, list[str]] = {}
        for t, c in changed:
            by_phrase.setdefault(_phrase(c, factors), []).append(t.name)
        for phrase, names in by_phrase.items():
            if len(names) == 1:
                lines.append(f"in {name}, the term {names[0]} {phrase}")
            else:
                plural = phrase.replace("is ", "are ", 1).replace("has its", "have their", 1)
                lines.append(f"in {name}, the terms {', '.join(names[:-1])} and {names[-1]} "
                             f"{plural}")
    return "; ".join(lines) + "."


# ----------------------------------------------------------------------------------------------
# A shape slip the values never show: an axis of size 1 kept by keepdims=True.


def keepdims_slip(spec: Spec, outs: tuple, expected: tuple) -> None:
    """Raises Stop for an output whose shape is the expected one with a size-1 axis added."""
    for name, g, e in zip(spec.out_names, outs, expected, strict=True):
        if not (isinstance(g, np.ndarray) and isinstance(e, np.ndarray)):
            continue
        if g.ndim != e.ndim + 1 or 1 not in g.shape:
            continue
        kept = [i for i in range(g.ndim) if g.shape[i] == 1
                and g.shape[:i] + g.shape[i + 1:] == e.shape]
        if kept and e.shape != (1,) * e.ndim:
            hint = " " + spec.shape_hints[name] if name in spec.shape_hints else ""
            raise Stop(Status.FAILED, f"{name} has shape {g.shape}, expected {e.shape}: an "
                                      f"extra axis of size 1 (axis {kept[-1]}), as keepdims=True "
                                      "leaves one: reduce without keepdims (or index the axis "
                                      "away)." + hint)
