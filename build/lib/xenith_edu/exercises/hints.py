"""Hints in three steps, the rule, the line, the formula, given one at a time when asked for.

`hint("rmsnorm_backward")` (or `result.hint()` on a check's verdict) gives the next step; the
count is kept per exercise in the process. A spec may carry its own three; otherwise generic ones.
"""

from __future__ import annotations

import numpy as np

from .types import Hint, Spec, forget_hints, next_hint

# Shape legend: none; the hints are text.


def formula(name: str, term_names: list[str]) -> str:
    """`name = t1 + t2 - t3`, an output as the sum of its named terms."""
    out = ""
    for text in term_names:
        if not out:
            out = text
        elif text.startswith("-"):
            out += f" - {text[1:].strip()}"
        else:
            out += f" + {text}"
    return f"{name} = {out}"


def _formulas(spec: Spec) -> str:
    """Each output as the sum of the spec's terms, on the notebook's first case."""
    if spec.terms is None:
        return ""
    args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                 else a for a in spec.make_cases()[0].args)
    terms = spec.terms(args)
    return "; ".join(formula(n, [t.name for t in terms[n]]) for n in spec.out_names
                     if n in terms)


def steps(spec: Spec) -> tuple[str, ...]:
    """The spec's own hints, or three generic ones built from its names and its terms."""
    if spec.hints:
        return spec.hints
    outs = ", ".join(spec.out_names)
    rule = ("Say what each output is before coding it. A gradient is the upstream gradient "
            "times the local derivative of the forward step that used the input; an input used "
            "twice sums both terms (fan-in accumulates); a broadcast in the forward is a sum in "
            "the backward, and a sum is a broadcast.")
    line = (f"Take the outputs one at a time ({outs}): for each, find the forward line that "
            "made the array it differentiates, and write its backward line right under it, "
            "with the same axes; the verdict names the first output that is wrong.")
    try:
        written = _formulas(spec)
    except Exception:  # a hint must never fail the learner's notebook
        written = ""
    formula_step = (f"In the reference's terms: {written}." if written else
                    f"The reference is {spec.reference_name}: compare it with your code, one "
                    "output at a time.")
    return (rule, line, formula_step)


def hint(exercise: str) -> Hint:
    """The next hint for `exercise` (its id, as in check_<id>): the rule, the line, the formula."""
    from . import SPECS  # the registry imports every chapter, and each chapter this floor

    if exercise not in SPECS:
        raise ValueError(f"exercise: no exercise is called {exercise!r}; the ids are the names "
                         "of the checks without check_, e.g. 'rmsnorm_backward'")
    return next_hint(exercise, steps(SPECS[exercise]))


__all__ = ["forget_hints", "formula", "hint", "steps"]
