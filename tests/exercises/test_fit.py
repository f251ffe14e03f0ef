"""The diagnosis by fitting (exercises/fit.py), the keepdims shape slip and the three hints.

The terms of every spec add up to its reference; a wrong answer is named in those terms only when
the same change explains every case; hints come one step at a time, per exercise.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu.exercises import fit
from xenith_edu.exercises.engine import CANNOT
from xenith_edu.exercises.memory import _budget_mistakes
from xenith_edu.exercises.types import HINT_STEPS

from .heldout import _att, _rms
from .helpers import kw

# Shape legend: N positions, d width, B batch, H heads, S positions, hd head width.

WITH_TERMS = sorted(n for n, s in ex.SPECS.items() if s.terms is not None)


def _as64(args: tuple) -> tuple:
    return tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                 else a for a in args)


@pytest.mark.parametrize("name", WITH_TERMS)
@pytest.mark.parametrize("seed", [None, 11])
def test_the_terms_add_up_to_the_reference(name, seed):
    spec = ex.SPECS[name]
    for case in spec.make_cases(None if seed is None else np.random.default_rng(seed)):
        args = _as64(case.args)
        with np.errstate(all="ignore"):
            expected = dict(zip(spec.out_names, spec.reference(*args), strict=True))
            terms = spec.terms(args)
        assert set(terms) <= set(spec.out_names)
        for out, ts in terms.items():
            e = np.asarray(expected[out], dtype=np.float64)
            total = sum(np.broadcast_to(t.value, e.shape) for t in ts)
            scale = max(float(np.max(np.abs(e))) if e.size else 0.0, 1.0)
            assert np.max(np.abs(total - e)) <= 1e-10 * scale, (name, out, case.label)
            for t in ts:  # a slip keeps the output's shape, or cannot be formed (None)
                for what, v in t.slips:
                    assert v is None or np.broadcast_to(v, e.shape).shape == e.shape, what


def test_the_spec_of_the_brief_expose_their_terms():
    assert {"rmsnorm_backward", "softmax_cross_entropy", "swiglu_backward",
            "attention_backward", "softmax_merge"} <= set(WITH_TERMS)


def _verdict(name, fn, rng=None):
    spec = ex.SPECS[name]
    return ex.judge(spec, [(c, ex.run(fn, c.args)) for c in spec.inputs(rng)])


@pytest.mark.parametrize("seed", [None, 5])
def test_a_missing_factor_is_named_from_the_terms(seed):
    rng = None if seed is None else np.random.default_rng(seed)
    result = _verdict("rmsnorm_backward", kw(_rms, first_rstd=False), rng)
    assert "the factor rstd is missing from the term rstd * dy * w" in result.message


def test_a_flipped_term_and_a_scale_are_named():
    result = _verdict("attention_backward", kw(_att, rowsum_sign=-1.0))
    assert "the term -(P * rowsum(P * dP)) @ k / sqrt(hd) has its sign flipped" in result.message
    result = _verdict("attention_backward", kw(_att, dk_noscale=True))
    assert re.search(r"dk (as a whole )?is [\d.]+ times too large", result.message) and \
        "sqrt(hd)" in result.message, result.message


def test_a_term_over_the_wrong_axis_is_named():
    result = _verdict("attention_backward", kw(_att, rowsum_axis=-2))
    assert "its row sum runs over the queries (axis=-2)" in result.message


def test_a_ratio_of_two_sizes_is_named():
    def by_v(logits, targets):
        loss, d = ex.SPECS["softmax_cross_entropy"].reference(logits, targets)
        return loss, (d * logits.shape[0] / logits.shape[1]).astype(logits.dtype)

    result = _verdict("softmax_cross_entropy", by_v)
    assert "uses V = " in result.message or "where V = " in result.message, result.message


def test_a_fit_that_holds_on_one_case_only_names_nothing():
    # the mean term is missing on the first case only; elsewhere the answer is noise
    first = ex.SPECS["rmsnorm_backward"].make_cases()[0].args[1]

    def learner(dy, x, w, eps):
        dx, dw = _rms(dy, x, w, eps)
        if x.shape == first.shape and np.array_equal(x, first):
            rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
            return rstd * dy * w, dw
        return dx + 0.3 * np.sin(7 * x), dw

    result = _verdict("rmsnorm_backward", learner)
    assert not result.passed
    assert "is missing" not in result.message and CANNOT in result.message


@pytest.mark.parametrize("name", [n for n in WITH_TERMS if ex.SPECS[n].probes is None])
def test_noise_gets_no_name(name):
    spec = ex.SPECS[name]
    rng = np.random.default_rng(3)

    def noisy(o):
        if isinstance(o, np.ndarray):
            return o + rng.standard_normal(np.shape(o)).astype(o.dtype)
        if isinstance(o, (int, np.integer)):  # a count: off by a random amount
            return o + int(rng.integers(1, 10**6))
        return o * (1.0 + 0.3 * rng.standard_normal())  # a number

    def noise(*args):
        out = spec.reference(*args)
        made = tuple(noisy(o) for o in (out if isinstance(out, tuple) else (out,)))
        return made[0] if spec.single else made

    result = _verdict(name, noise)
    assert not result.passed
    assert "Likely mistake" not in result.message, result.message


def test_all_zeros_is_said_as_such():
    result = _verdict("softmax_rowsum", lambda dout, out: np.zeros(dout.shape[:-1], dout.dtype))
    assert "D is all zeros" in result.message


def test_a_kept_axis_of_size_one_is_named_keepdims():
    result = _verdict("softmax_rowsum", lambda dout, out: np.sum(dout * out, -1, keepdims=True))
    assert "keepdims=True" in result.message
    assert "a sum over the positions missing" not in result.message
    assert "D has shape (" in result.message


def test_the_keepdims_rule_leaves_other_shapes_alone():
    spec = ex.SPECS["softmax_rowsum"]
    e = np.zeros((2, 3))
    for g in (np.zeros((2, 3, 2)), np.zeros((3, 2)), np.zeros((2, 3)), [0.0]):
        fit.keepdims_slip(spec, (g,), (e,))  # raises nothing
    with pytest.raises(ex.engine.Stop):
        fit.keepdims_slip(spec, (np.zeros((2, 1, 3)),), (e,))


@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4, 5, 6])
def test_no_two_budget_mistakes_give_the_same_answer(seed):
    spec = ex.SPECS["kv_cache_budget"]
    cases = spec.make_cases(None if seed is None else np.random.default_rng(seed))
    for case in cases[:3]:  # the last case fits nothing: every mistake gives 0 there
        exp = {"S": spec.reference(*case.args)[0]}
        answers = [make().get("S") for _, make in _budget_mistakes(case.args, exp)]
        # on an exact multiple, rounding up gives the answer itself: that mistake is not seen
        answers = [a for a in answers if a is not None and a != exp["S"]]
        assert len(set(answers)) == len(answers) >= 7, case.label
        assert case.args[-1] != 2


def test_the_kv_budget_names_one_mistake_only():
    def no_values(b, L, B, H, hd, i):
        return b // (L * B * H * hd * i)

    def no_itemsize(b, L, B, H, hd, i):
        return b // (2 * L * B * H * hd)

    one, two = _verdict("kv_cache_budget", no_values), _verdict("kv_cache_budget", no_itemsize)
    assert "values are missing" in one.message and "bytes per number" not in one.message
    assert "bytes per number" in two.message and "values are missing" not in two.message


def test_rope_pairs_shifted_by_one_are_named():
    def shifted(du, cos, sin):
        a, b = du[..., 1::2], du[..., 0::2]  # the odd element taken as the pair's first
        out = np.empty_like(du)
        c, s = cos.astype(du.dtype), sin.astype(du.dtype)
        out[..., 0::2], out[..., 1::2] = a * c + b * s, -a * s + b * c
        return out

    def rolled(du, cos, sin):
        u = np.roll(du, -1, axis=-1)  # pairs (u[2i+1], u[2i+2])
        c, s = cos.astype(du.dtype), sin.astype(du.dtype)
        out = np.empty_like(du)
        out[..., 0::2] = u[..., 0::2] * c + u[..., 1::2] * s
        out[..., 1::2] = -u[..., 0::2] * s + u[..., 1::2] * c
        return np.roll(out, 1, axis=-1)

    for fn in (shifted, rolled):
        assert "pairs are shifted by one" in _verdict("rope_backward", fn).message


def test_a_merge_that_divides_one_block_only_is_named():
    def merge(m1, sigma1, o1, m2, sigma2, o2):
        m, sigma, o = ex.SPECS["softmax_merge"].reference(m1, sigma1, o1, m2, sigma2, o2)
        with np.errstate(all="ignore"):
            w1 = (sigma1 * np.exp(m1 - m))[:, None]
        return m, sigma, o + w1 * o1 * (1 - 1 / sigma[:, None])  # block 1 not divided by sigma

    assert "the division by sigma is missing from the term sigma1" in _verdict(
        "softmax_merge", merge).message


# ---------------------------------------------------------------------------------- hints


def test_hints_come_in_three_steps_per_exercise():
    ex.forget_hints()
    texts = [ex.hint("rmsnorm_backward") for _ in range(4)]
    for i, step in enumerate(HINT_STEPS):
        assert texts[i].startswith(f"Hint {i + 1} of 3 ({step}) for rmsnorm_backward: ")
    assert texts[3] == texts[2] and "last hint" in texts[3]
    assert ex.hint("softmax_rowsum").startswith("Hint 1 of 3")  # its own count
    ex.forget_hints("rmsnorm_backward")
    assert ex.hint("rmsnorm_backward").startswith("Hint 1 of 3")
    assert ex.hint("softmax_rowsum").startswith("Hint 2 of 3")
    ex.forget_hints()


def test_the_verdict_gives_the_next_hint(capsys):
    ex.forget_hints()
    result = ex.check_softmax_rowsum(lambda dout, out: np.sum(dout * out, axis=-2))
    assert result.hint().startswith("Hint 1 of 3 (a question)")
    assert ex.hint("softmax_rowsum").startswith("Hint 2 of 3 (the rule)")  # one count
    third = result.hint()
    assert third.startswith("Hint 3 of 3 (the line)") and repr(third) == str(third)
    ex.forget_hints()


def test_a_spec_without_hints_gets_generic_ones():
    ex.forget_hints()
    assert not ex.SPECS["silu_grad"].hints
    steps = [ex.hint("silu_grad") for _ in range(3)]
    assert "dz" in steps[0] and "?" in steps[0]
    assert "fan-in" in steps[1]
    ex.forget_hints()


def test_every_exercise_has_three_hints():
    from xenith_edu.exercises.hints import steps  # the module under test, not the package

    for name, spec in ex.SPECS.items():
        s = steps(spec)
        assert len(s) == 3 and all(isinstance(t, str) and len(t) > 20 for t in s), name


def test_an_unknown_exercise_is_a_value_error():
    with pytest.raises(ValueError, match="exercise"):
        ex.hint("no_such_exercise")
