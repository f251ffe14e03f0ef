"""The diagnosis measured on the second catalogue (tests/exercises/unseen.py), written before the
diagnosis from the reference's mutants: every answer is rejected, most are named, none is named
wrongly (a diagnosis that names something else must not be there).
"""

from __future__ import annotations

import re

import pytest

import xenith_edu.exercises as ex

from .test_heldout import TARGET, diagnosis
from .unseen import UNSEEN


def _verdict(entry: tuple) -> ex.CheckResult:
    spec = ex.SPECS[entry[0]]
    return ex.judge(spec, [(c, ex.run(entry[1], c.args)) for c in spec.inputs()])


@pytest.mark.parametrize("i", range(len(UNSEEN)))
def test_every_unseen_answer_is_rejected(i):
    result = _verdict(UNSEEN[i])
    assert result.status == "failed" and not result.passed, result.message


def test_the_diagnosis_names_most_unseen_mistakes():
    hits = []
    for entry in UNSEEN:
        text = diagnosis(_verdict(entry))
        absent = entry[3] if len(entry) > 3 else None
        hits.append(re.search(entry[2], text) is not None
                    and (absent is None or re.search(absent, text) is None))
    rate = sum(hits) / len(hits)
    print(f"unseen diagnosis rate: {sum(hits)} of {len(hits)} ({rate:.0%})")
    assert rate >= TARGET
