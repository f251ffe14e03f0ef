"""The diagnosis measured on a held-out catalogue (tests/exercises/heldout.py), not tuned to it.

Every held-out answer is rejected; the share whose diagnosis names its mistake is reported.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import xenith_edu.exercises as ex

from .heldout import HELDOUT

TARGET = 0.6  # the share of held-out answers whose diagnosis must name the mistake


def diagnosis(result: ex.CheckResult) -> str:
    """The verdict without its header, its value lines and its "right" line: what it blames."""
    spec = ex.SPECS[result.exercise]
    lines = result.message.splitlines()[1:]
    keep = [ln.strip() for ln in lines
            if not any(ln.strip().startswith(f"{n} is wrong:") for n in spec.out_names)
            and not ln.strip().startswith("(") and not ln.strip().startswith("No mistake")]
    return "\n".join(keep)


def named(entry: tuple, rng: np.random.Generator | None = None) -> tuple[bool, str]:
    name, fn, want = entry[:3]
    absent = entry[3] if len(entry) > 3 else None
    spec = ex.SPECS[name]
    result = ex.judge(spec, [(c, ex.run(fn, c.args)) for c in spec.inputs(rng)])
    assert not result.passed, f"{name}: a held-out wrong answer passed"
    text = diagnosis(result)
    ok = re.search(want, text) is not None and (absent is None or not re.search(absent, text))
    return ok, result.message


@pytest.mark.parametrize("i", range(len(HELDOUT)))
def test_every_heldout_answer_is_rejected(i):
    name, fn = HELDOUT[i][:2]
    spec = ex.SPECS[name]
    result = ex.judge(spec, [(c, ex.run(fn, c.args)) for c in spec.inputs()])
    assert result.status == "failed" and not result.passed, result.message


def test_the_catalogue_is_large_and_broad():
    assert len(HELDOUT) >= 40
    assert len({e[0] for e in HELDOUT}) >= 5


def test_the_diagnosis_names_most_heldout_mistakes():
    hits = [named(e)[0] for e in HELDOUT]
    rate = sum(hits) / len(hits)
    print(f"held-out diagnosis rate: {sum(hits)} of {len(hits)} ({rate:.0%})")
    assert rate >= TARGET
