"""The pieces the open models add, each a component with its backward derived: QK-norm, biases
on q, k and v, Llama 3's RoPE frequency scaling, sliding-window causal attention, a head width
of its own, layers without RoPE; and the whole model with any mix of them, against central
finite differences in float64 on non-degenerate inputs. The cases are generated (hypothesis):
shapes, windows, heads and every combination of the new Config fields.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xenith_edu as xe
from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.bias import bias_backward, bias_forward
from xenith_edu.model import forward, loss_and_grads, random_params
from xenith_edu.model.generate import _feed, _prepare, empty_kv_cache
from xenith_edu.qk_norm import qk_norm_backward, qk_norm_forward
from xenith_edu.rope import rope_backward, rope_forward, rope_tables
from xenith_edu.rope_scaling import Llama3Scaling, llama3_inv_freq
from xenith_edu.softmax_ce import softmax_cross_entropy
from xenith_edu.tools.gradcheck import check_gradient, numerical_gradient, rel_error

SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def vjp_check(forward_fn, inputs: list[np.ndarray], backward_fn, rng, tol=1e-7):
    """Every input's gradient from `backward_fn` against finite differences of sum(out * g)."""
    out, cache = forward_fn(*inputs)
    g = rng.standard_normal(out.shape)  # a random upstream gradient: no term can hide
    grads = backward_fn(g.copy(), cache)
    for i, (x, dx) in enumerate(zip(inputs, grads, strict=True)):
        def f(xi, i=i):
            args = list(inputs)
            args[i] = xi
            return float(np.sum(forward_fn(*args)[0] * g))

        res = check_gradient(f, x, dx, name=f"input {i}", tol=tol)
        assert res.passed, str(res)


@SLOW
@given(heads=st.integers(1, 4), hd=st.sampled_from([4, 6, 8]), n=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_qk_norm_backward_is_rmsnorms_per_head(heads, hd, n, seed):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((n, heads * hd))
    w = 1 + 0.3 * rng.standard_normal(hd)
    vjp_check(lambda u, w: qk_norm_forward(u, w, 1e-6), [u, w], qk_norm_backward, rng)


def test_qk_norm_normalizes_each_head_on_its_own(rng):
    u = rng.standard_normal((3, 4 * 6)) * np.repeat([1.0, 10.0, 0.1, 3.0], 6)  # heads apart
    y, _ = qk_norm_forward(u, np.ones(6), 0.0)
    rms = np.sqrt((y.reshape(3, 4, 6) ** 2).mean(-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-12)


@SLOW
@given(m=st.integers(1, 6), n=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_bias_backward_sums_the_rows(m, n, seed):
    rng = np.random.default_rng(seed)
    vjp_check(lambda x, b: bias_forward(x, b), [rng.standard_normal((n, 2, m)),
                                                rng.standard_normal(m)], bias_backward, rng)


@st.composite
def llama3(draw) -> Llama3Scaling:
    low = draw(st.floats(0.5, 4.0))
    return Llama3Scaling(draw(st.floats(1.0, 64.0)), low, low + draw(st.floats(0.5, 8.0)),
                         draw(st.integers(2, 8192)))


@SLOW
@given(s=llama3(), hd=st.sampled_from([2, 8, 64, 128]), theta=st.floats(10.0, 1e6))
def test_llama3_scaling_only_slows_rotations_and_keeps_the_fast_ones(s, hd, theta):
    """Every frequency is divided by something in [1, factor]; those whose wavelength is below
    original/high are kept, those above original/low divided by exactly factor."""
    f = theta ** (-np.arange(0, hd, 2) / hd)
    g = llama3_inv_freq(f, s)
    ratio = f / g
    assert np.all(ratio >= 1 - 1e-12) and np.all(ratio <= s.factor * (1 + 1e-12))
    wavelen = 2 * np.pi / f
    np.testing.assert_array_equal(g[wavelen < s.original_context / s.high_freq_factor],
                                  f[wavelen < s.original_context / s.high_freq_factor])
    slow = wavelen > s.original_context / s.low_freq_factor
    np.testing.assert_allclose(g[slow], f[slow] / s.factor, rtol=1e-15)
    one = llama3_inv_freq(f, s._replace(factor=1.0))
    np.testing.assert_allclose(one, f, rtol=1e-15)  # factor 1: the plain RoPE


@SLOW
@given(s=llama3(), S=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_rope_backward_with_scaled_tables_is_the_rotation_back(s, S, seed):
    """Only the tables change: the same backward, checked on the scaled tables."""
    rng = np.random.default_rng(seed)
    cos, sin = rope_tables(S, 8, 500.0, s)
    vjp_check(lambda u: rope_forward(u, cos, sin), [rng.standard_normal((2, S, 8))],
              lambda g, c: (rope_backward(g, c),), rng)


@st.composite
def attention_inputs(draw):
    hkv = draw(st.integers(1, 3))
    H, S = hkv * draw(st.integers(1, 3)), draw(st.integers(1, 7))
    hd = draw(st.sampled_from([2, 4]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    q = rng.standard_normal((1, H, S, hd))
    k, v = (rng.standard_normal((1, hkv, S, hd)) for _ in range(2))
    return q, k, v, draw(st.integers(1, S + 2)), rng


@SLOW
@given(inputs=attention_inputs())
def test_sliding_window_attention_backward_against_finite_differences(inputs):
    q, k, v, window, rng = inputs
    vjp_check(lambda q, k, v: causal_attention_forward(q, k, v, window), [q, k, v],
              causal_attention_backward, rng)


@SLOW
@given(inputs=attention_inputs())
def test_a_window_sees_exactly_its_positions(inputs):
    """Moving a key outside a query's window changes nothing; a window of S or more is the
    full causal attention bit for bit; a window of 1 returns each position's own value."""
    q, k, v, window, _ = inputs
    S = q.shape[2]
    out, _ = causal_attention_forward(q, k, v, window)
    if window >= S:
        np.testing.assert_array_equal(out, causal_attention_forward(q, k, v)[0])
    if S > window:  # the first key is outside the last query's window
        k2, v2 = k.copy(), v.copy()
        k2[:, :, 0] += 5.0
        v2[:, :, 0] -= 3.0
        out2, _ = causal_attention_forward(q, k2, v2, window)
        np.testing.assert_array_equal(out2[:, :, window:], out[:, :, window:])
    one, _ = causal_attention_forward(q, k, v, 1)
    G = q.shape[1] // k.shape[1]
    np.testing.assert_allclose(one, np.repeat(v, G, axis=1), rtol=0, atol=1e-15)


@st.composite
def open_configs(draw) -> xe.Config:
    """A tiny model with any mix of the new fields."""
    hkv = draw(st.integers(1, 2))
    H = hkv * draw(st.integers(1, 2))
    hd = draw(st.sampled_from([None, 4, 6]))  # widths of 8 and more: at 4, central
    # differences with h = 1e-3 are off by 1e-4 (their h**4 term), not the backward
    n_embd = H * 8 if hd is None else draw(st.sampled_from([8, 12]))
    scaling = dict(rope_scaling="llama3", rope_factor=draw(st.floats(1.0, 32.0)),
                   rope_original_context=draw(st.integers(2, 64))) if draw(st.booleans()) else {}
    return xe.Config(
        vocab_size=11, n_embd=n_embd, n_head=H, n_kv_head=hkv, n_layer=2, ffn_hidden=10,
        seq_len=6, tie_embeddings=draw(st.booleans()), head_width=hd,
        qkv_bias=draw(st.booleans()), qk_norm=draw(st.booleans()),
        rope_theta=draw(st.sampled_from([10.0, 100.0])),  # fast rotations: a key bias moves
        # every score of a row alike, which softmax ignores, but for RoPE's turning it; with
        # theta 1e4 its gradient is near 0 (3e-6) and central differences' rounding shows
        **scaling,
        sliding_window=draw(st.none() | st.integers(1, 7)),
        nope_layers=draw(st.sampled_from([(), (1,), (0, 1)])))


def zero_by_structure(cfg: xe.Config) -> dict[str, set[int]]:
    """The layers whose gradient of a parameter is zero by the model's structure, not by the
    inputs, where central differences read only rounding: a window of 1 attends to the query's
    own position alone, so its scores (wq, wk, their biases and norms) change nothing; a key
    bias without RoPE or QK-norm after it adds q . bk to every score of a row alike, which
    softmax ignores."""
    zero: dict[str, set[int]] = {}
    for l in range(cfg.n_layer):
        names = []
        if xe.model.config.window_of(cfg, l) == 1:
            names += ["wq", "wk", "bq", "bk", "q_norm", "k_norm"]
        if l in cfg.nope_layers and not cfg.qk_norm:
            names.append("bk")
        for name in names:
            zero.setdefault(name, set()).add(l)
    return zero


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=open_configs(), seed=st.integers(0, 2**16))
def test_every_gradient_of_any_mix_against_finite_differences(cfg, seed):
    """Every parameter's gradient, for any mix of the new fields, against central differences
    at sampled coordinates; where the structure makes a layer's gradient zero (see
    `zero_by_structure`) the backward's must be zero to rounding, and that layer is not
    sampled (its differences are rounding alone)."""
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
    _, grads = loss_and_grads(params, cfg, x, y)
    zero = zero_by_structure(cfg)
    for name, g in grads.items():
        layers = sorted(zero.get(name, ()))
        assert np.abs(g[layers]).max(initial=0.0) <= 1e-12, (cfg, name, layers)
        live = [i for i in np.ndindex(g.shape) if i[0] not in layers or name not in zero]
        if not live:
            continue
        pick = [live[k] for k in rng.choice(len(live), min(4, len(live)), replace=False)]

        def f(p, name=name):  # the loss alone: a forward pass
            logits = forward({**params, name: p}, cfg, x)[0]
            return softmax_cross_entropy(logits, y, cfg.pad_token_id)[0]

        # h = 1e-4: per-head norms of 4 numbers curve fast, and at h = 1e-3 the differences'
        # h**4 term reaches 3e-5 (it fell 120-fold from h = 1e-3 to 3e-4, as h**4 does)
        numeric = numerical_gradient(f, params[name], pick, h=1e-4)
        err = max(float(rel_error(g[i], numeric[i])) for i in pick)
        assert err <= 1e-6, (cfg, name, err)


@settings(max_examples=20, deadline=None)
@given(cfg=open_configs(), seed=st.integers(0, 2**16))
def test_defaults_of_the_new_fields_are_the_books_model_bit_for_bit(cfg, seed):
    """Zero biases and a window of the whole context are the model without them: the same
    logits, bit for bit."""
    rng = np.random.default_rng(seed)
    base = replace(cfg, qkv_bias=False, sliding_window=None)
    params = random_params(base, rng)
    x = rng.integers(0, 11, (2, 6))
    want, _ = forward(params, base, x)
    full = replace(base, sliding_window=6, qkv_bias=True)
    zeros = {**params, **{k: np.zeros(s) for k, s in xe.param_shapes(full).items()
                          if k in ("bq", "bk", "bv")}}
    np.testing.assert_array_equal(forward(zeros, full, x)[0], want)


@settings(max_examples=15, deadline=None)
@given(cfg=open_configs(), seed=st.integers(0, 2**16))
def test_decoding_with_the_kv_cache_is_the_forward_pass(cfg, seed):
    """Token by token through the KV path (windowed or not): each position's logits are the
    full forward pass's."""
    decoding_is_the_forward(cfg, seed)


def decoding_is_the_forward(cfg: xe.Config, seed: int) -> None:
    """Six tokens fed one at a time through the KV cache give, at each position, the logits
    the forward pass gives at once."""
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    ids = rng.integers(0, 11, 6)
    full, _ = forward(params, cfg, ids[None, :])
    w, kv = _prepare(params, cfg), empty_kv_cache(cfg, np.float64)
    for t in range(6):
        np.testing.assert_allclose(_feed(params, cfg, w, kv, ids[t : t + 1], t), full[0, t],
                                   rtol=1e-10, atol=1e-12)


def test_config_refuses_what_it_cannot_be():
    base = dict(vocab_size=11, n_embd=8, n_head=2, n_layer=1)
    for bad, word in (({"head_width": 3}, "head_width"), ({"rope_scaling": "yarn"}, "rope_scaling"),
                      ({"sliding_window": 0}, "sliding_window"),
                      ({"global_layers": (0,)}, "sliding_window"),
                      ({"sliding_window": 2, "global_layers": (1,)}, "global_layers"),
                      ({"rope_low_freq_factor": 4.0, "rope_high_freq_factor": 1.0},
                       "rope_low_freq_factor"), ({"qk_norm": 1}, "qk_norm"),
                      ({"n_embd": 9, "n_head": 2}, "n_head")):
        with pytest.raises((ValueError, TypeError), match=word):
            xe.Config(**{**base, **bad})


def test_loss_and_grads_keys_follow_the_config(rng):
    cfg = xe.Config(vocab_size=11, n_embd=8, n_head=2, n_layer=1, qkv_bias=True, qk_norm=True,
                    head_width=6)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 11, (1, 4)), rng.integers(0, 11, (1, 4))
    _, grads = loss_and_grads(params, cfg, x, y)
    assert list(grads) == list(xe.param_shapes(cfg))
    assert grads["wq"].shape == (1, 8, 12) and grads["q_norm"].shape == (1, 6)
