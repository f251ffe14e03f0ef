"""Every exercise slot asks for a derivation, but one: the rotate-half permutation of the RoPE
chapter. An exercise whose answer only moves numbers (a permutation of indices, or the
entries of an input rearranged) is found from its reference's answers, not from a list.
"""

from __future__ import annotations

import numpy as np

import xenith_edu.exercises as ex

ONE_PERMUTATION = {"rope_permutation"}  # the RoPE chapter's: the book asks it once


def _is_permutation(a: np.ndarray) -> bool:
    return a.dtype.kind in "iu" and a.ndim == 1 and np.array_equal(np.sort(a), np.arange(a.size))


def _moves_entries(out: np.ndarray, args: tuple) -> bool:
    """Whether `out` is the entries of one of the float inputs, rearranged."""
    if out.dtype.kind != "f" or out.size < 2:
        return False
    values = np.sort(out.reshape(-1))
    return any(isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size == out.size
               and np.array_equal(np.sort(a.reshape(-1)), values) for a in args)


def rearranges(spec: ex.Spec) -> bool:
    """On every notebook case, every output of the reference only moves numbers."""
    for case in spec.make_cases():
        outs = spec.reference(*case.args)
        for o in outs:
            o = np.asarray(o)
            if not (_is_permutation(o) or _moves_entries(o, case.args)):
                return False
    return True


def test_only_one_exercise_is_a_rearrangement() -> None:
    assert {name for name, spec in ex.SPECS.items() if rearranges(spec)} == ONE_PERMUTATION


def test_the_finder_sees_a_rearrangement() -> None:
    """The rule can fail: a transpose of an input, and an index permutation, are found."""
    w = np.random.default_rng(0).standard_normal((4, 6))
    assert _moves_entries(w.T[::-1].copy(), (w, 3))
    assert not _moves_entries(2 * w, (w, 3))
    assert _is_permutation(np.array([2, 0, 1]))
    assert not _is_permutation(np.array([2, 2, 1]))
