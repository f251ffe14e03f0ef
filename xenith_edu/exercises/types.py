"""The exercise floor's types: a check's verdict (`Status`, `CheckResult`), its inputs (`Case`)
and the exercise itself (`Spec`). Every other module of `xenith_edu.exercises` imports these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .outcomes import Status  # one enum for the checks and the grader (the sandbox sees it)
from .progress import record

HINT_STEPS = ("a question", "the rule", "the line")
_hints_given: dict[str, int] = {}  # per exercise: how many of its hints this process has given


class Hint(str):
    """A hint's text; shown as plain text when a notebook displays it."""

    def __repr__(self) -> str:
        return str(self)


def next_hint(exercise: str, steps: tuple[str, ...]) -> Hint:
    """The next of the exercise's hints, one step further each call; the last one stays."""
    if not steps:
        return Hint(f"No hints are written for {exercise}.")
    i = min(_hints_given.get(exercise, 0), len(steps) - 1)
    _hints_given[exercise] = i + 1
    record(exercise, hint=True)
    name = f" ({HINT_STEPS[i]})" if len(steps) == len(HINT_STEPS) else ""
    last = " That was the last hint." if i + 1 == len(steps) else " Ask again for the next."
    return Hint(f"Hint {i + 1} of {len(steps)}{name} for {exercise}: {steps[i]}{last}")


def forget_hints(exercise: str | None = None) -> None:
    """Starts the hints of one exercise (or of every exercise) again from the first."""
    if exercise is None:
        _hints_given.clear()
    else:
        _hints_given.pop(exercise, None)


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one check, as data: the report and the grade CSV read these fields."""

    exercise: str
    status: Status
    passed: bool
    message: str  # what the learner reads: the verdict, the worst case, the diagnosis
    mistakes: tuple[str, ...] = ()  # the diagnosed mistakes, each as the message names it
    hints: tuple[str, ...] = ()  # the hints for this verdict: a question, the rule, the line

    def __str__(self) -> str:
        return self.message

    def hint(self) -> Hint:
        """The next hint for this exercise: a question, then the rule, then the line."""
        return next_hint(self.exercise, self.hints)


@dataclass(frozen=True)
class Case:
    """One input of a check: the arguments of the learner's function, and how to name them."""

    label: str  # what the learner reads: "float32, N=5, d=16"
    args: tuple  # the arguments of the learner's function, in order
    overflow_hint: str = ""  # said when the learner's output is NaN or inf on this case
    probe: bool = False  # an extra input for the diagnosis only, not a case of the verdict


Mistake = tuple[str, Callable[[], dict]]  # (description, () -> {output name: wrong answer})


@dataclass
class Spec:
    """One exercise: its id, the learner's signature, the reference, the cases, the diagnosis.

    The chapter is the module the spec's `cases` function lives in, the id is stored here only.
    """

    id: str  # the check's name without "check_"
    reference_name: str  # what the notebook falls back on, named in "not attempted yet"
    arg_names: tuple[str, ...]
    out_names: tuple[str, ...]
    kinds: tuple[str, ...]  # per output: "array", "float" or "int"
    reference: Callable[..., tuple]  # same arguments as the learner's function, returns a tuple
    cases: Callable[[np.random.Generator], list[Case]]  # every size and setting from the rng
    summary: str  # what the passing cases covered, for the "passed" verdict
    seed: int  # the notebook's fixed seed, so in-notebook verdicts are deterministic
    single: bool = False  # the learner's function returns one value, not a tuple
    # (args in float64, expected) -> the known mistakes and the answers each one gives
    mistakes: Callable[[tuple, dict], list[Mistake]] | None = None
    # (args in float64, expected, got, wrong output names, tol) -> likely mistakes, on one case
    diagnose: Callable[..., list[str]] | None = None
    factors: Callable[[tuple], dict[str, float]] | None = None  # named sizes: {"N = 8": 8.0}
    probes: Callable[[np.random.Generator], list[Case]] | None = None  # extra diagnosis inputs
    probe_hint: Callable[[tuple, object], str | None] | None = None  # (args, outcome) -> text
    # (args in float64) -> per output, the size of the terms it is made of: an error below
    # sqrt(tol) times that size is rounding, even where the expected output is nearly zero
    floor: Callable[[tuple], dict[str, float]] | None = None
    shape_hints: dict[str, str] = field(default_factory=dict)
    dtype_hint: str = ""
    tol: float | None = None  # overrides TOLERANCE (scalar checks)
    per_layer: tuple[str, ...] = ()  # outputs whose first axis is the layer: say which are wrong
    # (args in float64) -> per output, its additive terms (fit.Term): a wrong answer is fitted
    # as the same sum with a term missing, a sign, a scale or a slip, so unseen mistakes get a name
    terms: Callable[[tuple], dict[str, list]] | None = None
    hints: tuple[str, ...] = ()  # the rule and the line (never the answer): the 2nd and 3rd hints
    # package functions (dotted) a learner's function may call although the reference calls
    # them (RoPE's tables, say): the grader records any other call into what computes the
    # answer as "delegated"
    may_call: tuple[str, ...] = ()

    @property
    def chapter(self) -> str:
        """The chapter's slug: the name of the module that defines the cases."""
        return self.cases.__module__.rsplit(".", 1)[-1]

    def make_cases(self, rng: np.random.Generator | None = None) -> list[Case]:
        """The cases drawn from `rng`; from the fixed seed of the notebook when None."""
        return self.cases(np.random.default_rng(self.seed) if rng is None else rng)

    def inputs(self, rng: np.random.Generator | None = None) -> list[Case]:
        """The cases, then the probe inputs: everything the learner's function is called on."""
        rng = np.random.default_rng(self.seed) if rng is None else rng
        cases = self.cases(rng)
        return cases + ([] if self.probes is None else self.probes(rng))
