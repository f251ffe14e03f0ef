"""What the exercise tests share: running a check, mutants with one switch, the catalogue tests.

Each chapter's test module holds a from-scratch implementation with switches that introduce one
mistake at a time (RIGHT, MUTANTS); `catalogue_tests` turns them into tests: every right answer
passes, every mutant fails with the words of its diagnosis.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import xenith_edu.exercises as ex


def sig(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def run(name: str, fn: object, rng: np.random.Generator | None = None) -> ex.CheckResult:
    """The verdict of exercise `name` on `fn`: the notebook's check, or the grader's path."""
    if rng is None:
        return getattr(ex, f"check_{name}")(fn)
    return ex.check(ex.SPECS[name], fn, rng)


def kw(fn: Callable, **switches) -> Callable:
    """`fn` with keyword switches set: one mistake of the catalogue."""
    def learner(*args):
        return fn(*args, **switches)
    learner.__name__ = f"my_{fn.__name__}"
    return learner


def raising(exc: BaseException) -> Callable:
    def learner(*args):
        raise exc
    return learner


def contains(message: str, word: str) -> bool:
    """A plain substring, or a regular expression when `word` starts with "re:"."""
    if word.startswith("re:"):
        return re.search(word[3:], message) is not None
    return word in message


def assert_rejected(name: str, fn: object, words: list[str], absent: list[str] = (),
                    rng: np.random.Generator | None = None) -> ex.CheckResult:
    result = run(name, fn, rng)
    assert result.status == "failed" and not result.passed, result.message
    assert result.message.startswith(f"[failed] {name}"), result.message
    for word in words:
        assert contains(result.message, word), f"{word!r} not in:\n{result.message}"
    for word in absent:  # a wrong diagnosis would send the learner the wrong way
        assert not contains(result.message, word), f"{word!r} in:\n{result.message}"
    return result


def catalogue_tests(right: dict[str, tuple], mutants: list[tuple]) -> tuple[Callable, ...]:
    """Tests of one chapter's catalogue: right answers pass on the notebook's and random cases;
    every mutant is rejected with its diagnosis on the notebook's cases and on random ones."""

    @pytest.mark.parametrize("name", sorted(right))
    @pytest.mark.parametrize("which", range(max(len(v) for v in right.values())))
    @pytest.mark.parametrize("seed", [None, 1, 2, 3])
    def test_right_answers_pass(name, which, seed, capsys):
        if which >= len(right[name]):
            pytest.skip("one right answer only")
        rng = None if seed is None else np.random.default_rng(seed)
        result = run(name, right[name][which], rng)
        assert result.status == "passed" and result.passed, result.message
        assert result.exercise == name
        assert result.message.startswith(f"[passed] {name}: all ")
        assert capsys.readouterr().out.strip() == result.message

    @pytest.mark.parametrize("name,fn,words,absent",
                             [(m[0], m[1], m[2], m[3] if len(m) > 3 else []) for m in mutants],
                             ids=[f"{m[0]}-{i}" for i, m in enumerate(mutants)])
    @pytest.mark.parametrize("seed", [None, 7])
    def test_mutant_is_rejected_with_its_diagnosis(name, fn, words, absent, seed):
        rng = None if seed is None else np.random.default_rng(seed)
        assert_rejected(name, fn, words, absent, rng)

    def test_the_catalogue_covers_the_chapter():
        chapter = {s.chapter for n, s in ex.SPECS.items() if n in right}
        assert len(chapter) == 1
        assert set(right) == {n for n, s in ex.SPECS.items() if s.chapter in chapter}

    return test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis, \
        test_the_catalogue_covers_the_chapter
