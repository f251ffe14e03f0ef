"""Hints that ask first: a question, then the rule, then the line, keyed to the last diagnosis.

`hint("rmsnorm_backward")` (or `result.hint()` on a check's verdict) gives the next step; the
count is kept per exercise in the process and starts again when the diagnosis changes. No hint
names the reference function or shows its source.
"""

from __future__ import annotations

from .changes import RULES
from .types import Hint, Spec, forget_hints, next_hint

# Shape legend: none; the hints are text.

# A question per kind of change the diagnosis can name: what to look at, not what to write.
QUESTIONS = {
    "sign": "Where does a minus sign enter the forward, and which gradient must carry it?",
    "term": "Which operations does this array feed in the forward? Each path gives the "
            "gradient one term: are they all there?",
    "factor": "What is this array multiplied by in the forward? Does its gradient keep every "
              "other factor?",
    "divide": "Is this quantity multiplied or divided in the forward?",
    "transpose": "What shape must this gradient have, and which transpose gives that shape?",
    "operands": "In a product X W, on which side of dY does each gradient keep its factor?",
    "axis": "Along which axis did the forward copy or sum? The backward sums or copies along "
            "that same axis.",
    "keepdims": "What shape does the row statistic have when it is broadcast back over the row?",
    "everyaxis": "Which axis does this sum run along, and which axes must it keep?",
    "mean": "Is this a mean or a sum in the forward? What does a mean divide by?",
    "constant": "Which constant appears in this line of the forward, and what is its value?",
    "boundary": "At the boundary itself, which side of the rule applies: < or <=?",
    "init": "What must an accumulator hold before anything is added to it?",
    "accumulate": "Is this gradient written once, or does it collect from several places?",
    "scatter": "What does `a[i] += b` do when the index i repeats?",
    "broadcast": "Is this a column (N, 1) or a row? Along which axis is it copied?",
    "swap": "Which array belongs in each place? Check each name against the derivation.",
    "name": "Which array belongs in this line? Check each name against the derivation.",
    "sqrt": "Where is the square root in the forward?",
    "eps": "Where exactly does eps enter: inside the square root, or after it?",
    "outputs": "In which order does the check expect the outputs?",
}
RULE = ("A gradient is the upstream gradient times the local derivative of the forward step "
        "that used the input; an input used twice sums both terms (fan-in accumulates); a "
        "broadcast in the forward is a sum in the backward, and a sum is a broadcast.")
LINE = ("Take the outputs one at a time: for each, find the forward line that made the array it "
        "differentiates, and write its backward line right under it, with the same axes.")


def parse(text: str) -> tuple[str, str, str] | None:
    """(kind, where, detail) of a diagnosis that names one change of the reference, else None."""
    for kind, rule in RULES.items():
        if text.startswith(rule + ", "):
            where, _, detail = text[len(rule) + 2:].partition(": ")
            return kind, where, detail.rstrip(".")
    return None


def _from_change(kind: str, where: str, detail: str) -> tuple[str, str, str]:
    old, _, new = detail.partition("` became `")
    line = (f"{where[0].upper()}{where[1:]}, your answer has `{new.strip('`').split('` (')[0]}` "
            f"where the derivation has `{old.strip('`')}`.") if new else f"{where}: {detail}."
    return (f"{QUESTIONS[kind]} Look {where}.", f"The rule: {RULES[kind]}.", line)


def steps(spec: Spec, mistakes: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Three hints, a question, the rule, the line: from the diagnosis `mistakes` if it names
    a change, else the spec's own rule and line (its first two hints), else generic ones."""
    named = parse(mistakes[0]) if mistakes else None
    if named is not None:
        return _from_change(*named)
    outs = ", ".join(spec.out_names)
    if mistakes:
        question = (f"The check says: {mistakes[0].split(': ')[0].rstrip('.')}. Which line of "
                    "your code makes that, and what does the derivation say it should be?")
    else:
        question = (f"Which of {outs} is wrong first (the verdict names it), and which forward "
                    "line made the array it is the gradient of?")
    rule, line = (spec.hints[0], spec.hints[1]) if len(spec.hints) >= 2 else (RULE, LINE)
    return (question, rule, line)


_LADDERS: dict[str, tuple[str, ...]] = {}  # per exercise: the ladder of its last verdict


def keep(exercise: str, ladder: tuple[str, ...]) -> None:
    """The ladder of the exercise's last verdict; a new diagnosis starts it from its question."""
    if _LADDERS.get(exercise) != ladder:
        forget_hints(exercise)
    _LADDERS[exercise] = ladder


def hint(exercise: str) -> Hint:
    """The next hint for `exercise` (its id, as in check_<id>): a question, the rule, the line."""
    from . import SPECS  # the registry imports every chapter, and each chapter this floor

    if exercise not in SPECS:
        raise ValueError(f"exercise: no exercise is called {exercise!r}; the ids are the names "
                         "of the checks without check_, e.g. 'rmsnorm_backward'")
    return next_hint(exercise, _LADDERS.get(exercise) or steps(SPECS[exercise]))


__all__ = ["forget_hints", "hint", "keep", "parse", "steps"]
