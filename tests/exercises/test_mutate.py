"""Diagnoses from the reference: mutants of every exercise's reference, and the naming of the one
that gives a learner's answer.

The learners here are themselves program transformations of each reference (one change each,
drawn with a seed): whatever a hand-written table says first, a rejected mutant is never left
with "no mistake fits", and a named change reproduces the learner's outputs on every case.
"""

from __future__ import annotations

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu.exercises import engine, mutate

# Shape legend: none; the learners are functions.


def _learner(spec: ex.Spec, m: mutate.Mutant):
    """The mutant as a learner who computes in float64 and casts back to the inputs' dtype."""
    def learner(*args):
        dtype = next((a.dtype for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f"),
                     None)
        args64 = tuple(engine._as64(a) for a in args)
        out = mutate.outputs(spec, m, args64)
        if out is None:
            raise ValueError("this change fails here")
        out = tuple(o.astype(dtype) if isinstance(o, np.ndarray) and dtype is not None
                    and o.dtype.kind == "f" else o for o in out.values())
        return out[0] if spec.single else out
    return learner


def _verdict(spec: ex.Spec, fn, rng=None) -> ex.CheckResult:
    return ex.judge(spec, [(c, ex.run(fn, c.args)) for c in spec.inputs(rng)])


@pytest.mark.parametrize("name", sorted(ex.SPECS))
def test_every_reference_has_mutants_of_several_kinds(name):
    found = mutate.mutants(ex.SPECS[name])
    assert len({m.kind for m in found}) >= 2, [m.describe() for m in found]
    assert all(m.describe().endswith(".") and m.kind in mutate.RULES for m in found)


@pytest.mark.parametrize("name", sorted(ex.SPECS))
def test_a_rejected_mutant_is_never_left_without_a_diagnosis(name):
    spec = ex.SPECS[name]
    found = mutate.mutants(spec)
    rng = np.random.default_rng(sum(map(ord, name)))
    picked = [found[i] for i in rng.choice(len(found), size=min(3, len(found)), replace=False)]
    for m in picked:
        result = _verdict(spec, _learner(spec, m))
        if result.passed or "Likely mistake" in result.message:
            continue  # an equivalent change on these cases, or a diagnosis was given
        lines = result.message.splitlines()
        assert engine.CANNOT not in result.message or any(
            "contains NaN" in ln or "inf" in ln or "should be" in ln for ln in lines), \
            f"{m.describe()}\n{result.message}"


def test_a_named_change_reproduces_the_answer_on_every_case():
    spec = ex.SPECS["rmsnorm_backward"]

    def learner(dy, x, w, eps):  # the projection reads dy, not dy * w
        xhat = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        rstd = xhat / np.where(x == 0, 1, x)
        proj = np.mean(dy * xhat, axis=-1, keepdims=True)
        return ((rstd * (dy * w - xhat * proj)).astype(x.dtype),
                np.sum(dy * xhat, axis=0).astype(x.dtype))

    result = _verdict(spec, learner)
    assert "one array is read in place of another" in result.message, result.message
    assert "`g` became `dy`" in result.message, result.message


def test_eps_outside_the_root_is_named():
    spec = ex.SPECS["rmsnorm_backward"]

    def learner(dy, x, w, eps):
        rstd = 1.0 / (np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + eps)
        xhat, g = x * rstd, dy * w
        dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
        return dx.astype(x.dtype), np.sum(dy * xhat, axis=0).astype(x.dtype)

    result = _verdict(spec, learner)
    assert "eps is on the wrong side of the square root" in result.message, result.message


def test_swapped_arguments_are_named():
    spec = ex.SPECS["adamw_update"]

    def learner(p, g, m, v, t, lr, b1, b2, eps, wd):
        return ex.SPECS["adamw_update"].reference(p, g, m, v, t, lr, b2, b1, eps, wd)

    result = _verdict(spec, learner)
    assert "`beta1` and `beta2` are used in each other's place" in result.message, result.message


def test_a_failing_mutant_search_never_hides_the_verdict(monkeypatch):
    def broken(spec):
        raise RuntimeError("no mutants today")

    monkeypatch.setattr(mutate, "mutants", broken)
    spec = ex.SPECS["attention_backward"]
    result = _verdict(spec, lambda dout, q, k, v: tuple(-a for a in spec.reference(dout, q, k, v)))
    assert result.status == "failed" and result.message.startswith("[failed] attention_backward")
