"""Cases with no hole: every check rejects a function that is right on only part of an axis.

Each transformation below turns a spec's own reference into a function that agrees with it on
one part of an axis its inputs have (one sequence, small magnitudes, one dtype, square or
non-square trailing shapes, small sizes) and is wrong on the rest. The rule is declared once,
here, for every spec: if the spec's arguments have the axis at all, its cases must reach the
part where the function is wrong, on the notebook's seed and on the grader's hidden draws.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu.exercises import engine

# Shape legend: L the leading axis of the array arguments (batch, positions or rows).

SEEDS = [None, 11, 12, 13, 14, 15]  # the notebook's cases, then hidden draws


@pytest.fixture(autouse=True)
def _verdicts_only(monkeypatch):
    """These tests ask whether a check rejects, not what it diagnoses: no search of mutants."""
    monkeypatch.setattr(engine, "from_mutants", lambda *args, **kw: [])


def _floats(args: tuple) -> list[np.ndarray]:
    return [a for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f"]


def _lead(args: tuple) -> int:
    """The leading size L shared by the 2-D or larger float arrays (0 if there is none)."""
    big = [a for a in _floats(args) if a.ndim >= 2]
    return big[0].shape[0] if big else 0


def _first_row_only(args: tuple) -> tuple:
    """Every array whose leading axis is L replaced by its first row repeated L times."""
    L = _lead(args)
    return tuple(np.repeat(a[:1], L, axis=0) if isinstance(a, np.ndarray) and a.ndim >= 1
                 and a.shape[0] == L and L > 1 else a for a in args)


def _spoil(out: tuple) -> tuple:
    """The reference's outputs made wrong by one percent (ints by one)."""
    return tuple(o + 1 if isinstance(o, int | np.integer) else
                 (np.asarray(o) * 1.01 + 0.01).astype(np.asarray(o).dtype)
                 if isinstance(o, np.ndarray) else o * 1.01 + 0.01 for o in out)


def _max_abs(args: tuple) -> float:
    """The largest magnitude of the float arrays."""
    return max((float(np.max(np.abs(a))) for a in _floats(args) if a.size), default=0.0)


def _smallest_array(args: tuple) -> float:
    """The magnitude of the smallest float array (its largest entry)."""
    return min((float(np.max(np.abs(a))) for a in _floats(args) if a.size), default=0.0)


def _square(args: tuple) -> bool:
    return any(a.ndim >= 2 and a.shape[-1] == a.shape[-2] for a in _floats(args))


def _largest_dim(args: tuple) -> int:
    return max((max(a.shape) for a in args if isinstance(a, np.ndarray) and a.ndim), default=0)


# name -> (applies to the args of a case, right on these args?). A transformation that applies
# to a spec is held to it: some case of every draw falls where the function is wrong.
PARTS: dict[str, tuple[Callable[[tuple], bool], Callable[[tuple], bool]]] = {
    "float64 only": (lambda a: bool(_floats(a)),
                     lambda a: all(x.dtype == np.float64 for x in _floats(a))),
    "float32 only": (lambda a: bool(_floats(a)),
                     lambda a: all(x.dtype == np.float32 for x in _floats(a))),
    "magnitudes up to 10 only": (lambda a: bool(_floats(a)), lambda a: _max_abs(a) <= 10),
    "magnitudes from 0.5 only": (lambda a: bool(_floats(a)), lambda a: _smallest_array(a) >= 0.5),
    "non-square trailing shapes only": (lambda a: any(x.ndim >= 2 for x in _floats(a)),
                                        lambda a: not _square(a)),
    "sizes up to 8 only": (lambda a: _largest_dim(a) > 0, lambda a: _largest_dim(a) <= 8),
    "sizes from 3 only": (lambda a: _largest_dim(a) > 0,
                          lambda a: min(min(x.shape) for x in a if isinstance(x, np.ndarray)
                                        and x.ndim) >= 3),
}

# Where an axis cannot exist for a spec, said once with the reason (nothing else is exempt).
EXEMPT: dict[tuple[str, str], str] = {
    ("rope_freq_grad", "float64 only"): "omega is a float64 parameter: the exercise is float64",
}

# Holes still open, by spec: each entry is asserted to be a hole still (a test below), so it
# is removed the day the spec's cases reach that part of the axis.
KNOWN_HOLES: dict[str, tuple[str, ...]] = {}


def _partial(spec: ex.Spec, right_here: Callable[[tuple], bool]) -> Callable:
    def learner(*args):
        out = spec.reference(*args)
        out = out if right_here(args) else _spoil(out)
        return out[0] if spec.single else out
    return learner


def _first_sequence(spec: ex.Spec) -> Callable:
    def learner(*args):
        out = spec.reference(*_first_row_only(args))
        return out[0] if spec.single else out
    return learner


def _verdict(spec: ex.Spec, fn: Callable, seed: int | None) -> ex.CheckResult:
    rng = None if seed is None else np.random.default_rng(seed)
    return ex.judge(spec, [(c, ex.run(fn, c.args)) for c in spec.inputs(rng)])


def _applies(spec: ex.Spec, applies: Callable[[tuple], bool]) -> bool:
    return any(applies(c.args) for c in spec.make_cases())


@pytest.mark.parametrize("part", sorted(PARTS))
@pytest.mark.parametrize("name", sorted(ex.SPECS))
def test_a_function_right_on_part_of_an_axis_is_rejected(name, part):
    spec = ex.SPECS[name]
    applies, right_here = PARTS[part]
    if not _applies(spec, applies) or (name, part) in EXEMPT:
        pytest.skip(EXEMPT.get((name, part), "the spec's inputs have no such axis"))
    fn = _partial(spec, right_here)
    verdicts = [_verdict(spec, fn, seed).passed for seed in SEEDS]
    if part in KNOWN_HOLES.get(name, ()):
        assert any(verdicts), f"{name} now rejects a function right on {part}: not a hole"
    else:
        assert not any(verdicts), f"{name}, right on {part}, passes (seeds {SEEDS})"


@pytest.mark.parametrize("name", sorted(ex.SPECS))
def test_a_function_that_copies_the_first_sequence_is_rejected(name):
    spec = ex.SPECS[name]
    if not _applies(spec, lambda a: _lead(a) > 0):
        pytest.skip("the spec has no array with a leading axis")
    fn = _first_sequence(spec)
    for seed in SEEDS:
        result = _verdict(spec, fn, seed)
        assert not result.passed, f"{name}: the first sequence copied passes (seed {seed})"
