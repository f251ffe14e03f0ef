"""Each exercise declares what a learner may call (`Spec.may_call`, in the exercise's own
module), and the grader reads that declaration and nothing else: no table of exercises in the
grader, a declared name is a real package function the reference calls, and declaring or not
declaring any traced function of any exercise is exactly what moves it out of or into what the
sandbox watches.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xenith_edu.exercises import SPECS
from xenith_edu.grader import delegation

DECLARED = [(spec.id, name) for spec in SPECS.values() for name in spec.may_call]


def resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_the_exercises_that_share_a_function_with_their_reference_declare_it():
    assert ("silu_grad", "xenith_edu.swiglu.sigmoid") in DECLARED
    assert ("attention_bias_backward", "xenith_edu.attention.causal_mask") in DECLARED


@pytest.mark.parametrize("exercise,name", DECLARED)
def test_a_declared_name_is_a_package_function_the_reference_calls(exercise, name):
    assert callable(resolve(name)), name  # a typo would allow nothing, silently
    assert name in delegation.traced(exercise), f"{exercise} declares {name}, never called"
    assert name not in delegation.targets(SPECS[exercise])


def test_the_grader_keeps_no_table_of_exercises():
    ids = set(SPECS)
    for value in vars(delegation).values():
        if isinstance(value, dict) and value is not SPECS:  # the catalogue itself
            assert not ids & set(value), "a per-exercise table in the grader"


TRACED = sorted({(spec.id, name) for spec in SPECS.values()
                 for name in delegation.traced(spec.id)
                 if not name.startswith(delegation.MAY_CALL_ALWAYS)
                 and not name.endswith("_forward") and "<locals>" not in name})


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(TRACED), st.booleans())
def test_the_declaration_alone_decides_whether_a_traced_call_is_watched(pick, declare):
    """Any exercise, any package function its reference calls: declared in the Spec, the
    sandbox does not watch it; not declared, it does."""
    exercise, name = pick
    spec = SPECS[exercise]
    rest = tuple(n for n in spec.may_call if n != name)
    changed = dataclasses.replace(spec, may_call=(*rest, name) if declare else rest)
    assert (name in delegation.targets(changed)) is not declare
    assert not delegation.may_call(changed, name) is not declare
