"""The second held-out catalogue (heldout_second.py) is well-formed, and today's checks reject it.

Only what must keep holding while the diagnosis changes is asserted: every entry is a function
with its exercise's signature, gives answers of its own (none of heldout.py's, none of another
entry's), and is rejected unless flagged "hole". How well the diagnosis names the mistakes is
measured by measure_heldout_second.py, never asserted here.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu.exercises import engine

from .heldout import HELDOUT
from .heldout_second import HELDOUT_SECOND, Wrong

FLAGS = {"rare", "hole"}
# Exercises the book no longer asks, each replaced by a derivation the text does not do: their
# entries stay in the catalogue as its author wrote them, and are left out of what is judged.
RETIRED = {
    "wq_from_rotate_half": "the torch chapter's permutation exercise, now ALiBi's slopes",
    "wk_from_hf": "the llama chapter's permutation exercise, now QK-norm's backward",
}
LIVE = [e for e in HELDOUT_SECOND if e.exercise not in RETIRED]
NOT_HOLES = [e for e in LIVE if "hole" not in e.flags]
PLAIN = [e for e in NOT_HOLES if "rare" not in e.flags]


def _ids(entries: list[Wrong]) -> list[str]:
    return [e.id for e in entries]


def test_retired_exercises_are_gone():
    """Only an exercise that no longer exists may be left out of the judging."""
    assert not set(RETIRED) & set(ex.SPECS)
    assert set(RETIRED) <= {e.exercise for e in HELDOUT_SECOND}


def test_the_catalogue_is_large_and_broad():
    exercises = {e.exercise for e in LIVE}
    assert len(LIVE) >= 90
    assert len(exercises) >= 20
    assert len({ex.SPECS[name].chapter for name in exercises}) >= 8
    assert len(set(_ids(HELDOUT_SECOND))) == len(HELDOUT_SECOND), "an id is used twice"


@pytest.mark.parametrize("entry", LIVE, ids=_ids(LIVE))
def test_every_entry_is_well_formed(entry):
    assert entry.exercise in ex.SPECS
    assert entry.flags <= FLAGS, entry.flags
    re.compile(entry.want)
    if entry.absent is not None:
        re.compile(entry.absent)


@pytest.mark.parametrize("entry", LIVE, ids=_ids(LIVE))
def test_every_entry_has_the_exercise_signature(entry):
    """The learner's function takes the exercise's arguments, by the exercise's names, and
    binds every input of the check; it answers, raises or returns a wrong value, but never
    changes its inputs (the mistake is in what it returns)."""
    spec = ex.SPECS[entry.exercise]
    assert callable(entry.fn)
    params = list(inspect.signature(entry.fn).parameters.values())
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params), params
    assert tuple(p.name for p in params) == spec.arg_names
    for case in spec.inputs():
        inspect.signature(entry.fn).bind(*case.args)
        outcome = ex.run(entry.fn, case.args)
        assert not isinstance(outcome, ex.InPlace | ex.NotCallable), (case.label, outcome)


def _no_diagnosis(spec, first, others, probes) -> list[str]:
    """In place of engine._likely: no likely mistake named (the verdict alone)."""
    return []


def verdict(spec, calls: list, monkeypatch: pytest.MonkeyPatch) -> ex.CheckResult:
    """ex.judge without the diagnosis, the costly part of a failed verdict: the diagnosis
    only words the message (engine._likely swallows its own errors), never the status, which
    test_every_entry_not_a_hole_is_rejected holds on every entry."""
    with monkeypatch.context() as m:
        m.setattr(engine, "_likely", _no_diagnosis)
        return ex.judge(spec, calls)


@pytest.mark.parametrize("entry", NOT_HOLES, ids=_ids(NOT_HOLES))
def test_every_entry_not_a_hole_is_rejected(entry, monkeypatch):
    """Rejected, with the diagnosis; and the verdict without it is the same verdict."""
    spec = ex.SPECS[entry.exercise]
    calls = [(c, ex.run(entry.fn, c.args)) for c in spec.inputs()]
    result = ex.judge(spec, calls)
    assert result.status == ex.Status.FAILED and not result.passed, result.message
    alone = verdict(spec, calls, monkeypatch)
    assert (alone.status, alone.passed) == (result.status, result.passed), alone.message


@pytest.mark.parametrize("entry", PLAIN, ids=_ids(PLAIN))
def test_plain_entries_are_rejected_on_other_draws_of_the_cases(entry, monkeypatch):
    """A mistake not flagged "rare" shows on ordinary inputs: any draw of the cases rejects it.
    The verdict alone (`verdict`): how the diagnosis words it is measure_heldout_second.py's."""
    spec = ex.SPECS[entry.exercise]
    for seed in (1, 2, 3):
        inputs = spec.inputs(np.random.default_rng(seed))
        result = verdict(spec, [(c, ex.run(entry.fn, c.args)) for c in inputs], monkeypatch)
        assert not result.passed, f"seed {seed}: {result.message}"


def _answers(fn: object, inputs: list) -> list:
    return [ex.run(fn, case.args) for case in inputs]


def _same(a: list, b: list) -> bool:
    """Whether two lists of outcomes are the same answers (raising ones are never the same)."""
    for x, y in zip(a, b, strict=True):
        xs, ys = (x if isinstance(x, tuple) else (x,)), (y if isinstance(y, tuple) else (y,))
        if len(xs) != len(ys):
            return False
        for u, v in zip(xs, ys, strict=True):
            try:
                u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                return False
            if u.shape != v.shape or not np.allclose(u, v, rtol=1e-9, atol=0, equal_nan=True):
                return False
    return True


@pytest.mark.parametrize("name", sorted({e.exercise for e in LIVE}))
def test_entries_are_new_mistakes(name):
    """No entry gives the answers of a heldout.py entry, or of another entry, on any input."""
    inputs = ex.SPECS[name].inputs()
    mine = [(e.id, _answers(e.fn, inputs)) for e in LIVE if e.exercise == name]
    first = [(f"heldout.py #{i}", _answers(h[1], inputs))
             for i, h in enumerate(HELDOUT) if h[0] == name]
    for k, (label, answers) in enumerate(mine):
        for other, theirs in mine[:k] + first:
            assert not _same(answers, theirs), f"{label} answers as {other} does"
