"""Input checks at the boundaries, and the values of the components just inside them.

The components trust their inputs; `forward`, `loss_and_grads`, `Config`, `TrainConfig` and
`load_checkpoint` check them and name the argument or field that is wrong. The components'
values are tested where a plausible slip would pass the gradient checks: rows of logits with
very different offsets, an infinite gradient norm, a schedule without a decay phase.
"""

import math
import re

import numpy as np
import pytest

import xenith_edu as xe
from xenith_edu.rope import rope_tables
from xenith_edu.softmax_ce import per_token_loss, softmax_cross_entropy
from xenith_edu.swiglu import sigmoid, silu, silu_grad
from xenith_edu.training.optim import clip_by_global_norm, global_norm, lr_at

CFG = xe.Config(vocab_size=9, n_embd=8, n_head=2, n_layer=1, ffn_hidden=12, seq_len=6)


def _case(B=2, S=6, seed=0):
    rng = np.random.default_rng(seed)
    params = xe.init_params(CFG, seed, np.float64)
    x = rng.integers(0, CFG.vocab_size, (B, S))
    y = rng.integers(0, CFG.vocab_size, (B, S))
    return params, x, y


def raises(kind, *names):
    """pytest.raises(kind) whose message names every one of `names`."""
    return pytest.raises(kind, match="(?s)" + "".join(f"(?=.*{re.escape(n)})" for n in names))


# ---- targets and inputs: loss_and_grads and forward name the argument ----

def test_negative_targets_are_refused_naming_y():
    params, x, y = _case()
    y[1, 3] = -1
    with raises(ValueError, "y", "-1", f"[0, {CFG.vocab_size})"):
        xe.loss_and_grads(params, CFG, x, y)


def test_targets_beyond_the_vocabulary_are_refused_naming_y():
    params, x, y = _case()
    y[0, 0] = CFG.vocab_size
    with raises(ValueError, "y", str(CFG.vocab_size)):
        xe.loss_and_grads(params, CFG, x, y)


def test_float_targets_are_refused_naming_y():
    params, x, y = _case()
    with raises(TypeError, "y", "float64"):
        xe.loss_and_grads(params, CFG, x, y.astype(np.float64))
    with raises(TypeError, "y"):
        xe.loss_and_grads(params, CFG, x, y.tolist())


def test_mismatched_targets_are_refused_naming_y():
    params, x, y = _case()
    with raises(ValueError, "y", "(2, 5)", "(2, 6)"):
        xe.loss_and_grads(params, CFG, x, y[:, :5])
    with raises(ValueError, "y"):
        xe.loss_and_grads(params, CFG, x, y[:1])


def test_backward_checks_the_targets_too():
    params, x, y = _case()
    _, cache = xe.forward(params, CFG, x)
    with raises(ValueError, "y"):
        xe.backward(params, CFG, cache, -y - 1)
    with raises(ValueError, "y"):
        xe.backward(params, CFG, cache, y[:, :3])


def test_bad_inputs_are_refused_naming_x():
    params, x, _ = _case()
    bad = x.copy()
    bad[0, 0] = -3
    with raises(ValueError, "x", "-3"):
        xe.forward(params, CFG, bad)
    with raises(TypeError, "x"):
        xe.forward(params, CFG, x.astype(np.float32))
    with raises(ValueError, "x", "seq_len"):
        xe.forward(params, CFG, np.zeros((1, CFG.seq_len + 1), dtype=np.int64))
    with raises(ValueError, "x"):
        xe.forward(params, CFG, np.zeros((0, 3), dtype=np.int64))


def test_valid_targets_at_the_edges_are_accepted():
    params, x, y = _case()
    y[0, 0], y[1, 5] = 0, CFG.vocab_size - 1
    loss, grads = xe.loss_and_grads(params, CFG, x, y.astype(np.int32))
    assert np.isfinite(loss) and set(grads) == set(xe.param_shapes(CFG))
    loss64, _ = xe.loss_and_grads(params, CFG, x, y)
    assert loss == pytest.approx(loss64, rel=1e-12)


# ---- Config: head width, key/value heads, RoPE base, flash block ----

def test_odd_head_width_is_refused_by_config():
    with raises(ValueError, "n_head", "even"):
        xe.Config(vocab_size=9, n_embd=6, n_head=2, n_layer=1)  # head width 3
    assert xe.Config(vocab_size=9, n_embd=6, n_head=3, n_layer=1).head_dim == 2


@pytest.mark.parametrize("theta", [0.0, -10000.0, float("nan")])
def test_rope_theta_must_be_positive(theta):
    with raises(ValueError, "rope_theta"):
        xe.Config(vocab_size=9, n_embd=8, n_head=2, n_layer=1, rope_theta=theta)


def test_a_config_rope_theta_reaches_the_model():
    params, x, _ = _case()
    other = xe.Config(**{**CFG.to_dict(), "rope_theta": 100.0})
    a, _ = xe.forward(params, CFG, x)
    b, _ = xe.forward(params, other, x)
    assert not np.allclose(a, b)


@pytest.mark.parametrize(("n_kv_head", "kind"), [(3, ValueError), (0, ValueError),
                                               (1.0, TypeError)])
def test_key_value_heads_are_checked_by_config(n_kv_head, kind):
    with raises(kind, "Config.n_kv_head"):
        xe.Config(vocab_size=9, n_embd=8, n_head=2, n_layer=1, n_kv_head=n_kv_head)


def test_flash_attention_s_block_is_checked_by_config_not_by_the_component():
    with raises(ValueError, "Config.flash_block"):
        xe.Config(vocab_size=9, n_embd=8, n_head=2, n_layer=1, attention="flash", flash_block=0)


def test_generation_refuses_keys_of_the_wrong_width_for_grouped_heads():
    from xenith_edu.model.generate import generate

    gqa = xe.Config(**{**CFG.to_dict(), "n_kv_head": 1})
    params = xe.init_params(CFG, 0, np.float64)  # wk, wv for two key/value heads, not one
    with raises(ValueError, "params['wk']", "(1, 8, 4)"):
        generate(params, gqa, np.array([1, 2]), 3, np.random.default_rng(0))


# ---- RoPE tables: exactly S rows of hd/2 angles, the values of the formula ----

def test_rope_tables_known_values():
    cos, sin = rope_tables(5, 6, theta=100.0)
    assert cos.shape == sin.shape == (5, 3) and cos.dtype == np.float64
    inv_freq = 100.0 ** (-np.arange(0, 6, 2) / 6)  # 1, 100**(-1/3), 100**(-2/3)
    angle = np.arange(5)[:, None] * inv_freq[None, :]
    np.testing.assert_allclose(cos, np.cos(angle), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(sin, np.sin(angle), rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(cos[0], 1.0)  # position 0 is not rotated
    d_cos, d_sin = rope_tables(3, 4)  # the default base, 10000
    np.testing.assert_allclose(d_sin[2], np.sin(2 * np.array([1.0, 0.01])), rtol=1e-14)


def test_rope_tables_cover_every_position_of_the_model():
    """forward builds the tables for all S positions: the last position is rotated by its
    own angle, so a sequence's logits at a position do not depend on what follows."""
    params, x, _ = _case(B=1)
    full, _ = xe.forward(params, CFG, x)
    for S in range(1, CFG.seq_len + 1):
        part, _ = xe.forward(params, CFG, x[:, :S])
        np.testing.assert_allclose(part, full[:, :S], rtol=1e-12, atol=1e-12)


# ---- softmax cross-entropy: the max is taken per row ----

def _reference_loss(logits, y):
    """-log softmax per row, in exact-enough float64 via log-sum-exp of each row."""
    out = []
    for row, t in zip(logits.reshape(-1, logits.shape[-1]), y.ravel(), strict=True):
        m = row.max()
        out.append(m + math.log(sum(math.exp(v - m) for v in row)) - row[t])
    return np.array(out).reshape(y.shape)


def test_softmax_ce_rows_with_very_different_offsets():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 7))
    offsets = np.array([[0.0], [800.0], [-800.0], [1e4]])  # a global max would underflow rows
    logits = base + offsets
    y = np.array([1, 4, 0, 6])
    want = _reference_loss(base, y)  # softmax is invariant under a shift of each row
    np.testing.assert_allclose(per_token_loss(logits, y), want, rtol=1e-9)
    loss, d = softmax_cross_entropy(logits, y)
    assert loss == pytest.approx(want.mean(), rel=1e-9)
    p = np.exp(base - base.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(4), y] -= 1
    np.testing.assert_allclose(d, p / 4, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(d.sum(axis=1), 0.0, atol=1e-15)  # each row of dlogits sums to 0


def test_softmax_ce_known_values():
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    y = np.array([0, 2])
    np.testing.assert_allclose(per_token_loss(logits, y), [math.log(2), -math.log(0.7)],
                               rtol=1e-12)
    loss, d = softmax_cross_entropy(logits, y)
    assert loss == pytest.approx((math.log(2) - math.log(0.7)) / 2, rel=1e-12)
    np.testing.assert_allclose(d, [[-0.25, 0.125, 0.125], [0.05, 0.1, -0.15]], rtol=1e-12)
    assert d.dtype == logits.dtype and d.shape == logits.shape


def test_softmax_ce_leading_axes_and_float32():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 3, 5)).astype(np.float32)
    y = rng.integers(0, 5, (2, 3))
    loss, d = softmax_cross_entropy(logits, y)
    assert d.dtype == np.float32 and d.shape == (2, 3, 5)
    assert loss == pytest.approx(_reference_loss(logits.astype(np.float64), y).mean(), rel=1e-5)
    np.testing.assert_allclose(d.sum(axis=-1), 0.0, atol=1e-7)
    before = logits.copy()
    softmax_cross_entropy(logits, y)
    np.testing.assert_array_equal(logits, before)  # the logits are not overwritten


def test_softmax_ce_probability_that_underflows_costs_a_finite_loss():
    logits = np.array([[0.0, -1e4]])
    got = per_token_loss(logits, np.array([1]))
    assert np.isfinite(got).all() and got[0] == pytest.approx(-math.log(1e-30))
    loss, d = softmax_cross_entropy(logits, np.array([1]))
    assert loss == pytest.approx(-math.log(1e-30))
    np.testing.assert_allclose(d, [[1.0, -1.0]])


# ---- SwiGLU's activation ----

def test_silu_and_its_gradient_known_values():
    z = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    s = 1.0 / (1.0 + np.exp(-z))
    np.testing.assert_allclose(sigmoid(z), s, rtol=1e-14)
    np.testing.assert_allclose(silu(z), z * s, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(silu_grad(z), s + z * s * (1 - s), rtol=1e-13)
    zero = np.zeros(1)
    assert silu(zero)[0] == 0.0 and silu_grad(zero)[0] == 0.5 and sigmoid(zero)[0] == 0.5


def test_silu_grad_is_the_derivative_of_silu():
    z = np.linspace(-6, 6, 25)
    h = 1e-5
    numeric = (silu(z + h) - silu(z - h)) / (2 * h)
    np.testing.assert_allclose(silu_grad(z), numeric, rtol=1e-8, atol=1e-10)


def test_sigmoid_saturates_without_a_warning():
    import warnings

    z = np.array([-1000.0, -40.0, 40.0, 1000.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning would reach a learner's notebook
        s = sigmoid(z)
        assert s[0] == 0.0 and s[-1] == 1.0
        np.testing.assert_allclose(s[1:3], [np.exp(-40.0), 1.0], rtol=1e-12)
        np.testing.assert_allclose(silu(z), [0.0, -40.0 * np.exp(-40.0), 40.0, 1000.0],
                                   rtol=1e-12, atol=1e-300)
    assert sigmoid(np.array([3.0], dtype=np.float32)).dtype == np.float32


# ---- the schedule and the clip ----

def test_warmup_equal_to_decay_has_no_cosine_phase():
    # warmup ends where the decay ends: the last warmup step reaches max_lr, then min_lr
    assert lr_at(4, 1e-3, 1e-4, 5, 5) == pytest.approx(1e-3)
    assert lr_at(5, 1e-3, 1e-4, 5, 5) == 1e-4
    assert lr_at(6, 1e-3, 1e-4, 5, 5) == 1e-4
    tc = xe.TrainConfig(warmup_steps=5, decay_steps=5, steps=10)
    assert [lr_at(s, tc.lr, tc.min_lr, 5, 5) for s in range(7)] == pytest.approx(
        [2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 1e-4, 1e-4])


def test_schedule_known_values():
    assert lr_at(0, 1.0, 0.0, 0, 10) == 1.0  # no warmup: the cosine starts at max_lr
    assert lr_at(5, 1.0, 0.0, 0, 10) == pytest.approx(0.5)
    assert lr_at(5, 1.0, 0.2, 0, 10) == pytest.approx(0.6)
    assert lr_at(10, 1.0, 0.2, 0, 10) == 0.2
    assert lr_at(0, 1.0, 0.0, 4, 10) == pytest.approx(0.25)  # the first update already moves
    assert lr_at(7, 1.0, 0.0, 4, 10) == pytest.approx(0.5)  # halfway through 4 -> 10


def test_an_infinite_gradient_norm_is_returned_unclipped():
    for bad in (np.inf, -np.inf, np.nan):
        grads = {"a": np.array([1.0, bad]), "b": np.ones(3)}
        clipped, norm = clip_by_global_norm(grads, 1.0)
        assert not math.isfinite(norm)
        assert clipped["a"] is grads["a"] and clipped["b"] is grads["b"]  # for the caller to stop


def test_clip_scales_a_large_finite_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    assert global_norm(grads) == 5.0
    clipped, norm = clip_by_global_norm(grads, 1.0)
    assert norm == 5.0
    np.testing.assert_allclose(clipped["a"], [3.0 / (5.0 + 1e-6), 0.0], rtol=1e-15)
    np.testing.assert_allclose(clipped["b"], [[4.0 / (5.0 + 1e-6)]], rtol=1e-15)
    np.testing.assert_array_equal(grads["a"], [3.0, 0.0])  # the inputs are not modified
    same, norm = clip_by_global_norm(grads, 5.0)  # exactly at the bound: unchanged
    assert same["a"] is grads["a"] and norm == 5.0


# ---- the training settings ----

@pytest.mark.parametrize("field, value", [
    ("warmup_steps", -1), ("decay_steps", -1), ("steps", 0), ("batch_size", 0), ("lr", 0.0),
    ("min_lr", 1.0), ("grad_clip", 0.0), ("beta1", 1.0), ("eps", 0.0), ("n_head", 3),
])
def test_train_config_names_the_bad_field(field, value):
    with raises(ValueError, field):
        xe.TrainConfig().with_settings(**{field: value})


# ---- one-line errors, as the command line prints them ----

def test_one_line_folds_any_message():
    from xenith_edu.tools.util import one_line

    assert one_line("a\n  b\tc ") == "a b c"
    assert one_line(ValueError("bad\nvalue")) == "bad value"
    assert one_line(KeyError()) == "KeyError"  # an empty message: the exception's type
    assert one_line("") == ""


def test_schedule_arguments_are_checked_one_by_one():
    msg = r"^warmup_steps and decay_steps must be >= 0, got {}, {}$"
    for warmup, decay in ((-1, 10), (5, -1), (-2, -3)):
        with pytest.raises(ValueError, match=msg.format(warmup, decay)):
            lr_at(0, 1.0, 0.1, warmup, decay)
    with pytest.raises(ValueError, match=r"^step must be >= 0, got -1$"):
        lr_at(-1, 1.0, 0.1, 0, 10)
    assert lr_at(0, 1.0, 0.1, 0, 0) == 0.1  # no warmup and no decay: min_lr from the start
    assert lr_at(3, 1.0, 0.1, 5, 0) == pytest.approx(0.8)  # warmup longer than decay


def test_adamw_refuses_a_zero_step_count():
    from xenith_edu.training.optim import adamw_step_, adamw_update

    p = {"wq": np.ones(3)}
    g, m, v = {"wq": np.ones(3)}, {"wq": np.zeros(3)}, {"wq": np.zeros(3)}
    msg = r"^t is the 1-based update count, got 0$"
    with pytest.raises(ValueError, match=msg):
        adamw_step_(p, g, m, v, 0, 1e-3, 0.9, 0.99, 1e-8, 0.1)
    with pytest.raises(ValueError, match=msg):
        adamw_update(p["wq"], g["wq"], m["wq"], v["wq"], 0, 1e-3, 0.9, 0.99, 1e-8, 0.1)
    np.testing.assert_array_equal(p["wq"], 1.0)  # nothing was changed


def test_per_token_loss_with_leading_axes():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((2, 3, 5))  # (B, S, V): the vocabulary is the last axis
    y = rng.integers(0, 5, (2, 3))
    got = per_token_loss(logits, y)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, _reference_loss(logits, y), rtol=1e-12)


def test_rope_rotates_any_strided_view_like_its_copy():
    from xenith_edu.rope import rope_backward, rope_forward

    rng = np.random.default_rng(5)
    S, hd = 5, 6
    cos, sin = rope_tables(S, hd)
    # (B, S, hd) whose last axis is not contiguous: the pairs are not side by side in memory
    u = np.transpose(rng.standard_normal((2, hd, S)), (0, 2, 1))
    assert u.strides[1] == u.itemsize and u.strides[-1] != u.itemsize
    out, cache = rope_forward(u, cos, sin)
    want, _ = rope_forward(np.ascontiguousarray(u), cos, sin)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(rope_backward(u, cache),
                                  rope_backward(np.ascontiguousarray(u), cache))
    # the rotation itself, pair by pair: (a, b) -> (a cos - b sin, a sin + b cos)
    a, b = u[..., 0::2], u[..., 1::2]
    np.testing.assert_allclose(out[..., 0::2], a * cos - b * sin, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(out[..., 1::2], a * sin + b * cos, rtol=1e-13, atol=1e-15)


def test_float32_stays_float32_in_swiglu_and_its_cache():
    """A float32 model keeps float32 caches: float64 intermediates would double their memory."""
    from xenith_edu.swiglu import swiglu_backward, swiglu_forward

    rng = np.random.default_rng(6)
    x, w1, w3 = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (4, 5), (4, 5)))
    w2 = rng.standard_normal((5, 4)).astype(np.float32)
    out, cache = swiglu_forward(x, w1, w3, w2)
    assert out.dtype == np.float32 and out.shape == x.shape
    for name, a in cache._asdict().items():
        if isinstance(a, np.ndarray):
            assert a.dtype == np.float32, name
    grads = swiglu_backward(np.ones_like(out), cache)
    assert [g.dtype for g in grads] == [np.float32] * 4
    assert [g.shape for g in grads] == [x.shape, w1.shape, w3.shape, w2.shape]
    h1, h3 = x @ w1, x @ w3
    np.testing.assert_allclose(out, (silu(h1) * h3) @ w2, rtol=1e-5, atol=1e-6)


def test_sigmoid_writes_into_the_buffer_it_is_given():
    z = np.array([-2.0, 0.0, 3.0])
    buf = np.empty(3)
    got = sigmoid(z, out=buf)
    assert got is buf
    np.testing.assert_allclose(buf, 1.0 / (1.0 + np.exp(-z)), rtol=1e-15)
    np.testing.assert_array_equal(z, [-2.0, 0.0, 3.0])  # the input is not overwritten
    fresh = sigmoid(z)
    assert fresh is not z and np.array_equal(fresh, buf)


def test_float32_swiglu_asks_the_workspace_for_float32_only(monkeypatch):
    """Float64 temporaries would change a float32 run's rounding and double its memory."""
    import xenith_edu.swiglu as swiglu

    asked, real = [], swiglu.empty

    def empty(shape, dtype):
        asked.append(np.dtype(dtype))
        return real(shape, dtype)

    monkeypatch.setattr(swiglu, "empty", empty)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w1, w3 = (rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2))
    w2 = rng.standard_normal((5, 4)).astype(np.float32)
    out, cache = swiglu.swiglu_forward(x, w1, w3, w2)
    swiglu.swiglu_backward(np.ones_like(out), cache)
    assert asked and set(asked) == {np.dtype(np.float32)}


def test_rmsnorm_keeps_float32():
    from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward

    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(4)).astype(np.float32)
    y, cache = rmsnorm_forward(x, w, 1e-5)
    assert y.dtype == np.float32
    assert all(a.dtype == np.float32 for a in cache if isinstance(a, np.ndarray))
    dx, dw = rmsnorm_backward(np.ones_like(y), cache)
    assert dx.dtype == dw.dtype == np.float32
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(axis=-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_causal_mask_values_and_dtype():
    from xenith_edu.attention import causal_mask

    m = causal_mask(3)
    assert m.dtype == np.float32  # the default
    np.testing.assert_array_equal(m, [[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, 0, 0]])
    assert causal_mask(2, np.float64).dtype == np.float64


def _attention_reference(q, k, v):
    """softmax(q k^T / sqrt(hd) + mask) v, each row shifted by its own max, in float64."""
    S, hd = q.shape[-2], q.shape[-1]
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((S, S), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


def test_attention_rows_with_very_different_scores():
    """Each query row is shifted by its own max: a global max, or adding the max instead of
    subtracting it, underflows the small rows or overflows the large ones."""
    from xenith_edu.attention import causal_attention_forward

    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 2, 4, 6)) for _ in range(3))
    q[..., 1, :] *= 300.0  # scores of order 1000 in row 1, of order 1 elsewhere
    k[..., :2, :] = q[..., 1:2, :] / 300.0
    with np.errstate(all="ignore"):
        out, _ = causal_attention_forward(q, k, v)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _attention_reference(q, k, v), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale, where", [(60.0, "above"), (-60.0, "below")])
def test_float32_attention_far_outside_exp_range_shifts_each_row(scale, where):
    """Scores whose exp overflows float32 (above about 88), or whose row underflows (every
    score below about -87): the rows are shifted by their max and the output is right."""
    from xenith_edu.attention import causal_attention_forward

    rng = np.random.default_rng(11)
    u = rng.standard_normal(4)
    u /= np.linalg.norm(u)  # every query and key along one direction, a little apart
    r = np.sqrt(4 * abs(scale))  # q . k / sqrt(4) is about r * r / 2 = 2 |scale|
    q = (np.sign(scale) * r * u + 0.1 * rng.standard_normal((1, 2, 5, 4))).astype(np.float32)
    k = (r * u + 0.1 * rng.standard_normal((1, 2, 5, 4))).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)  # scores about +-2 |scale|
    ref = _attention_reference(q, k, v)
    scores = (q @ np.swapaxes(k, -1, -2) / 2.0).astype(np.float64)
    assert (scores.min() > 88) if where == "above" else (scores.max() < -88)
    with np.errstate(over="raise", divide="raise", invalid="raise"):  # none of those
        out, _ = causal_attention_forward(q, k, v)
    # scores near 100 carry a float32 rounding 100 times that of scores near 1, and exp turns
    # it into a relative error of the weights: about 1e-5 here
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_attention_exp_range_test_reads_the_query_own_position():
    """Unshifted exp is safe when no score is above the bound and each query's own position (a
    lower bound of its row's max) is above the other: with Sq < Sk (decoding) that entry is
    (i, Sk - Sq + i), not (i, i)."""
    from xenith_edu.attention import _exp_bounds, _exp_is_safe

    hi, lo = _exp_bounds(np.dtype(np.float32), 8)
    scores = np.zeros((1, 1, 3, 8), np.float32)
    assert _exp_is_safe(scores, 3, 8)
    scores[0, 0, 1, 6] = lo - 1.0  # query 1 sits at position 8 - 3 + 1 = 6
    assert not _exp_is_safe(scores, 3, 8)
    scores[0, 0, 1, 6], scores[0, 0, 1, 1] = 0.0, lo - 1.0  # (1, 1) is not its own position
    assert _exp_is_safe(scores, 3, 8)
    scores[0, 0, 2, 0] = hi + 0.01  # any score above the bound, masked or not
    assert not _exp_is_safe(scores, 3, 8)
    scores[0, 0, 2, 0] = np.nan
    assert not _exp_is_safe(scores, 3, 8)
    scores[0, 0, 2, 0] = hi - 1e-4  # just inside the bound (float32 rounds the bound itself)
    assert _exp_is_safe(scores, 3, 8)
    scores[0, 0, 2, 7] = lo + 1e-4  # and the lower one
    assert _exp_is_safe(scores, 3, 8)
    hi64, lo64 = _exp_bounds(np.dtype(np.float64), 8)
    exact = np.zeros((1, 1, 3, 8))  # float64 holds the bounds exactly: both are in range
    exact[0, 0, 0, 0], exact[0, 0, 2, 7] = hi64, lo64
    assert _exp_is_safe(exact, 3, 8)


@pytest.mark.parametrize("dtype, Sk, hi, lo", [
    (np.float32, 64, 83.56396, -69.70102),  # ln(max) - ln(64) - 1, ln(tiny) + 24 ln 2 + 1
    (np.float32, 1024, 80.79137, -69.70102),
    (np.float64, 64, 704.62383, -670.65962),  # 53 bits of mantissa
])
def test_attention_exp_range_bounds(dtype, Sk, hi, lo):
    """Below hi, a row sum of Sk exps stays finite (by a factor e); above lo, a row's largest
    exp is 2**(mantissa bits) above the smallest normal number (by a factor e)."""
    from xenith_edu.attention import _exp_bounds

    got_hi, got_lo = _exp_bounds(np.dtype(dtype), Sk)
    assert got_hi == pytest.approx(hi, abs=1e-5) and got_lo == pytest.approx(lo, abs=1e-5)
    info = np.finfo(dtype)
    assert np.exp(got_hi) * Sk * np.e == pytest.approx(float(info.max), rel=1e-9)
    assert np.exp(got_lo) / np.e / 2.0 ** (info.nmant + 1) == pytest.approx(
        float(info.smallest_normal), rel=1e-9)


def test_attention_keeps_float32():
    from xenith_edu.attention import causal_attention_backward, causal_attention_forward

    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(3))
    out, cache = causal_attention_forward(q, k, v)
    assert out.dtype == np.float32
    assert all(a.dtype == np.float32 for a in cache if isinstance(a, np.ndarray))
    grads = causal_attention_backward(np.ones_like(out), cache)
    assert [g.dtype for g in grads] == [np.float32] * 3
    np.testing.assert_allclose(out, _attention_reference(q, k, v), rtol=1e-5, atol=1e-6)


def test_sigmoid_and_silu_take_scalars_as_a_learner_would_call_them():
    from xenith_edu.swiglu import sigmoid, silu

    for z in (np.float64(0.5), np.array(0.5), 0.5):
        assert sigmoid(z) == pytest.approx(1 / (1 + np.exp(-0.5)), rel=1e-15)
        assert silu(z) == pytest.approx(0.5 / (1 + np.exp(-0.5)), rel=1e-15)
    assert sigmoid(np.float32(2.0)).dtype == np.float32


def test_sigmoid_of_a_large_negative_scalar_is_zero_without_a_warning():
    import warnings

    from xenith_edu.swiglu import sigmoid

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sigmoid(np.float64(-1000.0)) == 0.0



# ---- the parameters: the boundary names the key and what it got ----

def test_params_that_are_not_a_dict_are_named_with_their_type():
    _, x, _ = _case()
    with pytest.raises(TypeError, match=r"^params must be a dict of arrays, got list$"):
        xe.forward([1, 2], CFG, x)


def test_a_parameter_that_is_not_an_array_is_named_with_its_type():
    params, x, _ = _case()
    for key in ("wte", "wq"):  # wte also gives the dtype every other must share
        bad = {**params, key: params[key].tolist()}
        with pytest.raises(TypeError, match=rf"^params\['{key}'\] must be a NumPy array, "
                                            r"got list$"):
            xe.forward(bad, CFG, x)


def test_mixed_dtypes_say_which_dtypes_are_allowed():
    params, x, _ = _case()
    bad = {**params, "wq": params["wq"].astype(np.float32)}
    with pytest.raises(TypeError, match=r"^params\['wq'\] has dtype float32; all must share "
                                        r"one dtype, float32 or float64$"):
        xe.forward(bad, CFG, x)


# ---------------------------------------------------------------- Config's own messages


def _config(**changes) -> xe.Config:
    return xe.Config(**{"vocab_size": 9, "n_embd": 8, "n_head": 2, "n_layer": 1, **changes})


@pytest.mark.parametrize("changes, error, message", [
    ({"n_embd": "8"}, TypeError, "Config.n_embd must be an int, got str"),
    ({"n_embd": 8.0}, TypeError, "Config.n_embd must be an int, got float"),
    ({"n_head": 4, "n_kv_head": 3}, ValueError,
     "Config.n_kv_head (3) must divide Config.n_head (4): each key/value head serves the same "
     "number of query heads"),
    ({"n_embd": 6}, ValueError,
     "Config.n_head: head width n_embd // n_head = 3 must be even for RoPE's pairs"),
    ({"tie_embeddings": "yes"}, TypeError, "Config.tie_embeddings must be a bool"),
    ({"pad_token_id": 9}, ValueError,
     "Config.pad_token_id must be None or a token id in [0, 9), got 9"),
    ({"pad_token_id": -1}, ValueError,
     "Config.pad_token_id must be None or a token id in [0, 9), got -1"),
    ({"pad_token_id": True}, ValueError,
     "Config.pad_token_id must be None or a token id in [0, 9), got True"),
    ({"pad_token_id": "1"}, ValueError,
     "Config.pad_token_id must be None or a token id in [0, 9), got '1'"),
])
def test_config_refuses_with_its_exact_message(changes, error, message):
    with pytest.raises(error) as caught:
        _config(**changes)
    assert str(caught.value) == message


def test_config_accepts_the_edges_of_its_ranges():
    assert _config(rope_theta=0.5).rope_theta == 0.5  # any positive base
    assert _config(pad_token_id=8).pad_token_id == 8  # the last token id
    assert _config(pad_token_id=np.int64(0)).pad_token_id == 0


def test_config_derives_its_defaults_after_checking_what_they_come_from():
    cfg = _config(n_embd=256)
    assert cfg.ffn_hidden == 704 and cfg.n_kv_head == 2  # LLaMA's rule; one kv head per head
    with pytest.raises(TypeError, match=r"^Config\.n_head must be an int, got NoneType$"):
        _config(n_head=None)
