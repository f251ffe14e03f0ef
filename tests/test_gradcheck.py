"""Tests of tools.gradcheck, the ruler every chapter and test trusts, against known values.

Each test computes what the checker must return by hand: a gradient wrong at one late
coordinate, tiny magnitudes, both orders of the finite difference, the default tolerance.
"""

import numpy as np
import pytest

import xenith_edu as xe
from xenith_edu.model import check_model
from xenith_edu.model.params import param_shapes
from xenith_edu.tools.gradcheck import (
    FLOOR,
    GradCheck,
    H,
    check_gradient,
    numerical_gradient,
    rel_error,
    sample_indices,
)


def half_square(x):
    """f(x) = sum(x**2) / 2, whose gradient is x: finite differences of a quadratic are exact."""
    return 0.5 * float(np.sum(x * x))


def fifth_power(x):
    return float(np.sum(x**5))


# ---- rel_error: |a - b| / max(|a|, |b|, floor) ----

def test_rel_error_known_values():
    assert rel_error(1.0, 1.1) == pytest.approx(0.1 / 1.1, rel=1e-12)
    assert rel_error(-2.0, 2.0) == pytest.approx(2.0, rel=1e-12)  # |a - b| / max(|a|, |b|)
    np.testing.assert_allclose(rel_error(np.array([3.0, -1.0]), np.array([1.0, -4.0])),
                               [2 / 3, 3 / 4], rtol=1e-12)
    assert rel_error(5.0, 5.0) == 0.0


def test_rel_error_is_relative_at_tiny_magnitudes():
    # above the floor the error is relative: the same 10% at 1e-6 as at 1
    assert rel_error(1e-6, 1.1e-6) == pytest.approx(0.1 / 1.1, rel=1e-9)
    # below the floor it is absolute, divided by the floor
    assert rel_error(1e-12, 3e-12) == pytest.approx(2e-12 / FLOOR, rel=1e-9)
    assert rel_error(0.0, 0.0) == 0.0  # no 0 / 0
    assert FLOOR == 1e-8


def test_rel_error_floor_argument():
    assert rel_error(0.0, 1e-10, floor=1e-12) == pytest.approx(1.0)
    assert rel_error(0.0, 1e-10, floor=1e-6) == pytest.approx(1e-4)


def test_rel_error_computes_in_float64():
    a = np.float32(1.0) + np.float32(1e-7)  # float32 keeps it: 1.00000012
    assert rel_error(a, np.float32(1.0)).dtype == np.float64
    assert rel_error(a, 1.0) == pytest.approx(float(a) - 1.0, rel=1e-6)


# ---- numerical_gradient: order 2 and 4, against the exact differences of a fifth power ----
# For f(x) = x**5: D(h) = (f(x+h) - f(x-h)) / 2h = 5x**4 + 10 x**2 h**2 + h**4, and the
# fourth-order rule (4 D(h) - D(2h)) / 3 = 5x**4 - 4 h**4.

def test_order_2_is_the_central_difference():
    x = np.array([1.0, 2.0, -0.5])
    h = 0.1
    got = numerical_gradient(fifth_power, x, h=h, order=2)
    np.testing.assert_allclose(got, 5 * x**4 + 10 * x**2 * h**2 + h**4, rtol=1e-10)


def test_order_4_cancels_the_h2_term():
    x = np.array([1.0, 2.0, -0.5])
    h = 0.1
    got = numerical_gradient(fifth_power, x, h=h, order=4)
    np.testing.assert_allclose(got, 5 * x**4 - 4 * h**4, rtol=1e-10)


def test_default_order_is_4_and_default_step_is_H():
    x = np.array([1.0, 2.0, -0.5])
    assert H == 1e-3
    np.testing.assert_array_equal(numerical_gradient(fifth_power, x),
                                  numerical_gradient(fifth_power, x, h=H, order=4))
    # and order 4 is the more accurate: at h = 1e-3 its error is about 4e-12
    err4 = np.abs(numerical_gradient(fifth_power, x) - 5 * x**4)
    err2 = np.abs(numerical_gradient(fifth_power, x, order=2) - 5 * x**4)
    assert err4.max() < 1e-9 < 1e-6 < err2.min()


def test_all_indices_by_default_and_only_those_asked_otherwise():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    np.testing.assert_allclose(numerical_gradient(half_square, x), x, rtol=1e-9, atol=1e-12)
    some = [(0, 1), (2, 3)]
    got = numerical_gradient(half_square, x, indices=some)
    want = np.zeros_like(x)
    for i in some:
        want[i] = x[i]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.count_nonzero(got) == 2


def test_numerical_gradient_leaves_x_unchanged():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(6)
    before = x.copy()
    seen = []

    def f(z):
        seen.append(z is x)
        return fifth_power(z)

    numerical_gradient(f, x)
    np.testing.assert_array_equal(x, before)
    assert not any(seen)  # f is evaluated on a private copy


def test_each_coordinate_is_restored_before_the_next():
    # f(x) = x0 * x1 * x2: the derivative in x1 is x0 * x2, correct only if x0 was put back
    x = np.array([2.0, 3.0, 5.0])
    got = numerical_gradient(lambda z: float(np.prod(z)), x, order=2)
    np.testing.assert_allclose(got, [15.0, 10.0, 6.0], rtol=1e-9)


def test_numerical_gradient_rejects_bad_input():
    msg = r"^numerical_gradient needs a float64 array x: float32 is too coarse$"
    with pytest.raises(TypeError, match=msg):
        numerical_gradient(half_square, np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match=msg):
        numerical_gradient(half_square, [1.0, 2.0])
    for order in (1, 3):
        with pytest.raises(ValueError, match=f"order must be 2 or 4, got {order}"):
            numerical_gradient(half_square, np.ones(3), order=order)


# ---- sample_indices ----

def test_sample_indices_all_when_n_is_none_or_covers_the_shape():
    everything = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert sample_indices((2, 3), None, None) == everything
    assert sample_indices((2, 3), 6, None) == everything  # n == size: no rng needed
    assert sample_indices((2, 3), 100, None) == everything


def test_sample_indices_are_distinct_sorted_python_ints():
    got = sample_indices((10, 10), 60, np.random.default_rng(3))
    assert len(got) == 60 and len(set(got)) == 60  # no coordinate twice
    assert got == sorted(got)
    assert all(type(j) is int and 0 <= j < 10 for i in got for j in i)
    assert len(sample_indices((5,), 4, np.random.default_rng(0))) == 4


def test_sample_indices_needs_rng_to_sample():
    with pytest.raises(ValueError, match=r"^sample_indices needs rng to sample n < size indices$"):
        sample_indices((2, 3), 5, None)


# ---- check_gradient ----

def test_gradient_wrong_at_one_late_coordinate_only():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 5)) + 3.0  # values near 3, none near 0
    g = x.copy()
    g[3, 4] *= 1.01  # the last coordinate: 1% off, every other one exact
    r = check_gradient(half_square, x, g, name="w")
    assert not r.passed
    assert r.worst_index == (3, 4)
    assert r.analytic == g[3, 4] and r.numeric == pytest.approx(x[3, 4], rel=1e-9)
    assert r.max_rel_error == pytest.approx(0.01 / 1.01, rel=1e-6)
    assert r.n_checked == 20 and r.name == "w"


def test_correct_gradient_passes_with_the_worst_coordinate_reported():
    x = np.array([1.0, -2.0, 3.0])
    r = check_gradient(half_square, x, x.copy())
    assert r.passed and r.max_rel_error < 1e-9 and r.name == "x"
    assert r.n_checked == 3


def test_default_tolerance_is_1e_7():
    x = np.array([1.5, -2.0, 0.7, 3.0])
    exact = x.copy()  # the numeric gradient of a quadratic is exact to rounding
    assert check_gradient(half_square, x, exact).tol == 1e-7
    assert check_gradient(half_square, x, exact * (1 + 0.9e-7)).passed
    assert not check_gradient(half_square, x, exact * (1 + 1.1e-7)).passed
    assert check_gradient(half_square, x, exact * (1 + 1.1e-7), tol=2e-7).passed


def test_tiny_gradients_are_compared_relatively():
    # f = 1e-6 * sum(x**2) / 2: a gradient of magnitude 1e-6, still above the floor
    x = np.array([1.0, 2.0, 3.0])
    f = lambda z: 1e-6 * half_square(z)  # noqa: E731
    assert check_gradient(f, x, 1e-6 * x).passed
    r = check_gradient(f, x, 1e-6 * x * 1.001)
    assert not r.passed  # off by 0.1%: an absolute error of 3e-9 must not pass
    assert r.max_rel_error == pytest.approx(0.001 / 1.001, rel=1e-4)


def test_floor_makes_a_tiny_error_on_a_zero_gradient_pass_or_fail():
    x = np.array([0.5, 0.25])
    f = lambda z: 0.0 * half_square(z)  # noqa: E731  the exact gradient is 0
    off = np.array([0.5e-15, 0.0])
    assert check_gradient(f, x, off).passed  # 0.5e-15 / 1e-8 = 0.5e-7: within tol
    r = check_gradient(f, x, off, floor=1e-12)
    assert not r.passed and r.max_rel_error == pytest.approx(0.5e-3)
    assert not check_gradient(f, x, 4 * off).passed  # 2e-15 / 1e-8 = 2e-7: not within tol


def test_order_and_step_reach_the_finite_difference():
    x = np.array([1.0, 2.0])
    exact = 5 * x**4
    assert not check_gradient(fifth_power, x, exact, h=0.01, order=2).passed
    assert check_gradient(fifth_power, x, exact, h=0.01, order=4, tol=1e-6).passed
    r = check_gradient(fifth_power, x, exact, h=0.1, order=2, tol=1.0)
    assert r.worst_index == (0,)  # relative error 0.1001 / 5.1001 beats 0.4001 / 80.4001
    assert r.numeric == pytest.approx(5 + 0.1 + 1e-4, rel=1e-10) and r.analytic == 5.0


def test_sampled_coordinates():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 7))
    r = check_gradient(half_square, x, x.copy(), n_coords=10, rng=np.random.default_rng(0))
    assert r.n_checked == 10 and r.passed
    assert r.worst_index in sample_indices(x.shape, 10, np.random.default_rng(0))
    g = x.copy()
    g[sample_indices(x.shape, 10, np.random.default_rng(0))[-1]] += 1.0
    bad = check_gradient(half_square, x, g, n_coords=10, rng=np.random.default_rng(0))
    assert not bad.passed
    assert bad.worst_index == sample_indices(x.shape, 10, np.random.default_rng(0))[-1]


def test_shape_mismatch_names_the_argument():
    with pytest.raises(ValueError, match=r"analytic gradient of wq has shape \(2,\), x has \(3,\)"):
        check_gradient(half_square, np.ones(3), np.ones(2), name="wq")


# ---- GradCheck ----

def test_gradcheck_passed_is_inclusive():
    ok = GradCheck("b", 1e-7, (0,), 1.0, 1.0, 1, 1e-7)
    assert ok.passed is True
    assert GradCheck("b", 1.0000001e-7, (0,), 1.0, 1.0, 1, 1e-7).passed is False


def test_gradcheck_str():
    r = GradCheck("wq", 3.2e-9, (1, 2), 0.5, -0.25, 12, 1e-7)
    assert str(r) == ("wq: max rel error 3.2e-09 over 12 coordinates (tol 1e-07) ok; worst at "
                      "(1, 2): analytic 5.000000e-01, numeric -2.500000e-01")
    r = GradCheck("w1", 0.5, (0,), 2.0, 1.0, 3, 1e-6)
    assert str(r) == ("w1: max rel error 5.0e-01 over 3 coordinates (tol 1e-06) FAILED; worst "
                      "at (0,): analytic 2.000000e+00, numeric 1.000000e+00")


# ---- check_model ----

CFG = xe.Config(vocab_size=11, n_embd=8, n_head=2, n_layer=1, ffn_hidden=12, seq_len=5)


def _model_case(seed=0):
    rng = np.random.default_rng(seed)
    params = xe.init_params(CFG, seed, np.float64)
    params = {k: p + 0.1 * rng.standard_normal(p.shape) for k, p in params.items()}
    x = rng.integers(0, CFG.vocab_size, (2, CFG.seq_len))
    y = rng.integers(0, CFG.vocab_size, (2, CFG.seq_len))
    return params, x, y


def test_check_model_checks_every_parameter_in_order():
    params, x, y = _model_case()
    results = check_model(params, CFG, x, y)
    assert [r.name for r in results] == list(param_shapes(CFG))
    assert all(r.passed for r in results), "\n".join(map(str, results))
    for r in results:
        assert r.tol == 1e-6
        assert r.n_checked == min(8, params[r.name].size)
    again = check_model(params, CFG, x, y, seed=0)
    assert [(r.worst_index, r.max_rel_error) for r in again] == \
        [(r.worst_index, r.max_rel_error) for r in results]
    other = check_model(params, CFG, x, y, n_coords=3, seed=1, tol=1e-5)
    assert all(r.n_checked == min(3, params[r.name].size) and r.tol == 1e-5 for r in other)
    assert [r.worst_index for r in other] != [r.worst_index for r in results]
    # the step reaches every check: h = 0.2 is far too coarse, and shows it
    coarse = check_model(params, CFG, x, y, h=0.2)
    assert [r.max_rel_error for r in coarse] != [r.max_rel_error for r in results]
    assert max(r.max_rel_error for r in coarse) > 1e-6


def test_check_model_catches_a_wrong_backward(monkeypatch):
    import xenith_edu.model.check as model  # the module whose loss_and_grads check_model calls

    params, x, y = _model_case(1)
    real = model.loss_and_grads

    def wrong(*args, **kwargs):
        loss, grads = real(*args, **kwargs)
        return loss, {**grads, "wq": grads["wq"] * 1.001}

    monkeypatch.setattr(model, "loss_and_grads", wrong)
    results = {r.name: r for r in check_model(params, CFG, x, y)}
    assert not results["wq"].passed
    assert all(r.passed for k, r in results.items() if k != "wq")


def test_check_model_needs_float64():
    params, x, y = _model_case()
    params["wq"] = params["wq"].astype(np.float32)
    with pytest.raises(TypeError, match=r"^check_model needs float64 params: cast them with "
                                         r"\.astype\(np\.float64\)$"):
        check_model(params, CFG, x, y)


# ---- the parameters the checks run on ----

def test_init_params_known_values():
    from xenith_edu.model.params import PARAM, init_params

    default = init_params(CFG)
    rng = np.random.default_rng(0)  # the default seed
    for name, shape in param_shapes(CFG).items():
        p = default[name]
        assert p.shape == shape and p.dtype == np.float32  # the default dtype
        if PARAM[name].kind == "gain":
            np.testing.assert_array_equal(p, 1.0)
        else:
            np.testing.assert_array_equal(p, (0.02 * rng.standard_normal(shape)).astype(np.float32))
    other = init_params(CFG, seed=1, dtype=np.float64)
    assert other["wq"].dtype == np.float64 and not np.allclose(other["wq"], default["wq"])


def test_random_params_known_values():
    from xenith_edu.model.params import PARAM, random_params

    got = random_params(CFG, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    for name, shape in param_shapes(CFG).items():
        assert got[name].dtype == np.float64  # the default dtype
        if PARAM[name].kind == "gain":  # 1 + 0.3 N(0, 1)
            want = 1.0 + 0.3 * rng.standard_normal(shape)
        else:  # 0.4 N(0, 1)
            want = 0.4 * rng.standard_normal(shape)
        np.testing.assert_array_equal(got[name], want)
    small = random_params(CFG, np.random.default_rng(3), scale=0.1, gain_spread=0.0,
                          dtype=np.float32)
    assert all(p.dtype == np.float32 for p in small.values())
    np.testing.assert_array_equal(small["rms_final"], 1.0)
    np.testing.assert_allclose(small["wq"], got["wq"] * 0.25, rtol=1e-6)
