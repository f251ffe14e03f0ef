"""Tests of training.optim: learning-rate schedule, AdamW (pure and in place), clipping."""

import math

import numpy as np
import pytest

from xenith_edu import Config
from xenith_edu.model.params import PARAMS, random_params
from xenith_edu.training.optim import (
    adamw_step_,
    adamw_update,
    clip_by_global_norm,
    decays,
    lr_at,
    zeros_like_params,
)

# ---------------------------------------------------------------- learning-rate schedule


def test_lr_warmup_is_linear_and_reaches_max_lr():
    assert lr_at(0, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-5)
    assert lr_at(49, 1e-3, 1e-4, 100, 2000) == pytest.approx(5e-4)
    assert lr_at(99, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3)
    assert lr_at(100, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3)


def test_lr_cosine_decay_midpoint_end_and_after():
    mid = 100 + (2000 - 100) // 2
    assert lr_at(mid, 1e-3, 1e-4, 100, 2000) == pytest.approx(5.5e-4)  # (max + min) / 2
    assert lr_at(2000, 1e-3, 1e-4, 100, 2000) == 1e-4
    assert lr_at(5000, 1e-3, 1e-4, 100, 2000) == 1e-4
    # a quarter of the way: min + (max - min) * (1 + cos(pi/4)) / 2
    q = 100 + 1900 // 4
    want = 1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * (q - 100) / 1900))
    assert lr_at(q, 1e-3, 1e-4, 100, 2000) == pytest.approx(want, rel=1e-12)


def test_lr_decreases_after_warmup_and_handles_no_warmup():
    lrs = [lr_at(s, 1e-3, 1e-4, 100, 2000) for s in range(100, 2001)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lr_at(0, 1e-3, 1e-4, 0, 10) == pytest.approx(1e-3)


def test_lr_rejects_negative_step():
    with pytest.raises(ValueError, match="step"):
        lr_at(-1, 1e-3, 1e-4, 10, 100)


# ---------------------------------------------------------------- AdamW


def _adamw_scalar(p, g_seq, lr, b1, b2, eps, wd):
    """AdamW written per element with Python floats, the textbook way (Loshchilov & Hutter)."""
    m = v = 0.0
    for t, g in enumerate(g_seq, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        p = p - lr * (m_hat / (math.sqrt(v_hat) + eps) + wd * p)
    return p


def test_adamw_matches_scalar_reference_over_several_steps():
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(6)
    gs = rng.standard_normal((5, 6))
    p, m, v = p0.copy(), np.zeros(6), np.zeros(6)
    for t in range(1, 6):
        p, m, v = adamw_update(p, gs[t - 1], m, v, t, 1e-2, 0.9, 0.99, 1e-8, 0.1)
    want = [_adamw_scalar(p0[i], gs[:, i], 1e-2, 0.9, 0.99, 1e-8, 0.1) for i in range(6)]
    np.testing.assert_allclose(p, want, rtol=1e-12, atol=0)


def test_adamw_first_step_moves_each_weight_by_lr_times_sign():
    # t = 1, zero moments: m_hat = g and v_hat = g**2, so the step is lr * g / (|g| + eps)
    g = np.array([3.0, -0.5, 1e-3])
    p, _, _ = adamw_update(np.zeros(3), g, np.zeros(3), np.zeros(3), 1, 0.1, 0.9, 0.99, 1e-12, 0.0)
    np.testing.assert_allclose(p, -0.1 * np.sign(g), rtol=1e-8)


def test_adamw_weight_decay_is_decoupled():
    # with zero gradient and zero moments only the decay acts: p * (1 - lr * wd) exactly
    p0 = np.array([1.0, -2.0, 4.0])
    z = np.zeros(3)
    p, m, v = adamw_update(p0, z, z, z, 3, 0.01, 0.9, 0.99, 1e-8, 0.5)
    np.testing.assert_array_equal(p, p0 * (1 - 0.01 * 0.5))
    np.testing.assert_array_equal(m, z)
    np.testing.assert_array_equal(v, z)


def test_adamw_does_not_modify_inputs_and_keeps_dtype():
    rng = np.random.default_rng(1)
    p, g, m, v = (rng.standard_normal(4).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    copies = [a.copy() for a in (p, g, m, v)]
    out = adamw_update(p, g, m, v, 2, 1e-3, 0.9, 0.99, 1e-8, 0.1)
    for a, c in zip((p, g, m, v), copies, strict=True):
        np.testing.assert_array_equal(a, c)
    assert all(o.dtype == np.float32 for o in out)
    assert all(o is not a for o, a in zip(out, (p, m, v), strict=True))


def test_adamw_rejects_t_zero():
    z = np.zeros(2)
    with pytest.raises(ValueError, match="1-based"):
        adamw_update(z, z, z, z, 0, 1e-3, 0.9, 0.99, 1e-8, 0.1)


TINY = Config(vocab_size=11, n_embd=8, n_head=2, n_layer=2, ffn_hidden=12, seq_len=4,
              tie_embeddings=False)


def _params(rng, dtype=np.float32):
    """Every parameter of the table (lm_head included), random, gains away from one."""
    return random_params(TINY, rng, dtype=dtype)


def test_in_place_step_is_bit_identical_to_adamw_update():
    rng = np.random.default_rng(2)
    params = _params(rng)
    ref = {k: p.copy() for k, p in params.items()}
    m, v = zeros_like_params(params), zeros_like_params(params)
    rm, rv = zeros_like_params(params), zeros_like_params(params)
    for t in range(1, 8):
        grads = _params(rng)
        adamw_step_(params, grads, m, v, t, 3e-3, 0.9, 0.99, 1e-8, 0.1)
        for k in ref:
            wd = 0.1 if decays(k) else 0.0
            ref[k], rm[k], rv[k] = adamw_update(ref[k], grads[k], rm[k], rv[k], t, 3e-3, 0.9,
                                                0.99, 1e-8, wd)
    for k in params:
        assert params[k].dtype == np.float32
        np.testing.assert_array_equal(params[k], ref[k])
        np.testing.assert_array_equal(m[k], rm[k])
        np.testing.assert_array_equal(v[k], rv[k])


def test_weight_decay_applies_to_matrices_only():
    assert decays("wte") and decays("wq") and decays("w2") and decays("lm_head")
    assert not decays("rms_attn") and not decays("rms_ffn") and not decays("rms_final")
    assert all(decays(p.name) == (p.kind != "gain") for p in PARAMS)
    params = _params(np.random.default_rng(3), np.float64)
    before = {k: p.copy() for k, p in params.items()}
    zero = zeros_like_params(params)
    adamw_step_(params, zero, zeros_like_params(params), zeros_like_params(params), 1, 0.1,
                0.9, 0.99, 1e-8, 0.5)
    np.testing.assert_array_equal(params["rms_attn"], before["rms_attn"])
    np.testing.assert_array_equal(params["rms_final"], before["rms_final"])
    np.testing.assert_allclose(params["wq"], before["wq"] * 0.95, rtol=1e-15)
    np.testing.assert_allclose(params["wte"], before["wte"] * 0.95, rtol=1e-15)


# ---------------------------------------------------------------- clipping


def test_clip_scales_all_gradients_together_to_max_norm():
    rng = np.random.default_rng(4)
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5) * 10}
    copies = {k: g.copy() for k, g in grads.items()}
    norm_want = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
    clipped, norm = clip_by_global_norm(grads, 1.0)
    assert norm == pytest.approx(norm_want, rel=1e-12)
    new_norm = math.sqrt(sum(float((g**2).sum()) for g in clipped.values()))
    assert new_norm == pytest.approx(1.0, rel=1e-5)
    for k in grads:  # same direction, inputs untouched
        np.testing.assert_allclose(clipped[k] * norm_want, grads[k] * new_norm, rtol=1e-9)
        np.testing.assert_array_equal(grads[k], copies[k])


def test_clip_leaves_small_gradients_alone():
    grads = {"a": np.array([0.3, -0.4])}
    clipped, norm = clip_by_global_norm(grads, 1.0)
    assert norm == pytest.approx(0.5)
    np.testing.assert_array_equal(clipped["a"], grads["a"])


def test_clip_reports_non_finite_norm_and_rejects_bad_max_norm():
    _, norm = clip_by_global_norm({"a": np.array([np.nan, 1.0])}, 1.0)
    assert math.isnan(norm)
    with pytest.raises(ValueError, match="max_norm"):
        clip_by_global_norm({"a": np.ones(2)}, 0.0)
