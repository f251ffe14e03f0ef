"""Sliding-window attention in every path: plain, flash (forward and backward) and the KV cache,
and models whose layers mix windowed and full attention (`Config.global_layers`, `window_of`).

The invariants, each over generated cases: the flash path is the plain path to float64
rounding for any sizes, block and window, and visits exactly the blocks that hold a seen key;
its gradients are central differences'; a model's layer l attends as `window_of(cfg, l)` says,
in the forward, the backward (by finite differences) and decoding; decoding through a cache of
at most `window` positions per windowed layer gives the full forward's logits, however the
tokens are split into feeds; no cache array of a windowed layer ever holds more positions.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xenith_edu as xe
from xenith_edu import flash_attention as fa
from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.model import generate as gen
from xenith_edu.model.check import check_model
from xenith_edu.model.config import window_of
from xenith_edu.model.ends import head_forward
from xenith_edu.model.generate import _feed, _prepare, cache_positions, empty_kv_cache, generate
from xenith_edu.model.params import random_params
from xenith_edu.model.positions import layer_tables, qk_rope_tables
from xenith_edu.model.transformer import forward, layer_forward, layer_params
from xenith_edu.tools.gradcheck import check_gradient

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def attention_inputs(draw):
    """q (B, H, S, hd), k, v (B, Hkv, S, hd), dout; a block size and a window (or None)."""
    hkv = draw(st.integers(1, 3))
    B, H, S = draw(st.integers(1, 2)), hkv * draw(st.integers(1, 3)), draw(st.integers(1, 40))
    hd = draw(st.sampled_from([2, 4, 6]))
    block, window = draw(st.integers(1, 20)), draw(st.none() | st.integers(1, 45))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.3, 1.0, 4.0]))  # 4: peaked rows, large running-max jumps
    q = rng.standard_normal((B, H, S, hd)) * scale
    k, v = rng.standard_normal((2, B, hkv, S, hd)) * scale
    return q, k, v, rng.standard_normal((B, H, S, hd)), block, window


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max())))


@FAST
@given(attention_inputs())
def test_flash_with_a_window_is_the_plain_path_to_rounding(case):
    q, k, v, dout, block, window = case
    out_ref, cache_ref = causal_attention_forward(q, k, v, window)
    out, cache = fa.flash_attention_forward(q, k, v, block, window)
    assert _rel(out, out_ref) < 1e-12
    for g, g_ref in zip(fa.flash_attention_backward(dout, cache),
                        causal_attention_backward(dout, cache_ref), strict=True):
        assert g.shape == g_ref.shape and _rel(g, g_ref) < 1e-12


@FAST
@given(attention_inputs())
def test_flash_visits_exactly_the_blocks_that_hold_a_seen_key(case):
    """Forward and backward each compute the scores of a block (queries I, keys J) once if some
    query of I sees some key of J (0 <= t - j < window), and never otherwise."""
    q, k, v, dout, block, window = case
    S = q.shape[2]
    seen: list[tuple[int, int]] = []
    real = fa._scores

    def scores(qs, kb, i0, j0, w):
        seen.append((i0, j0))
        return real(qs, kb, i0, j0, w)

    fa._scores = scores
    try:
        _, cache = fa.flash_attention_forward(q, k, v, block, window)
        forward_blocks, seen[:] = sorted(seen), []
        fa.flash_attention_backward(dout, cache)
        backward_blocks = sorted(seen)
    finally:
        fa._scores = real
    w = S + 1 if window is None else window
    want = sorted((i0, j0) for i0 in range(0, S, block) for j0 in range(0, S, block)
                  if any(0 <= t - j < w for t in range(i0, min(i0 + block, S))
                         for j in range(j0, min(j0 + block, S))))
    assert forward_blocks == want
    assert backward_blocks == want


@pytest.mark.parametrize(("S", "block", "window"), [(9, 2, 3), (12, 5, 1), (11, 4, 7),
                                                    (10, 3, 10)])
def test_flash_windowed_gradients_against_finite_differences(S, block, window):
    rng = np.random.default_rng(S * block + window)
    q, G = rng.standard_normal((2, 1, 4, S, 4))
    k, v = rng.standard_normal((2, 1, 2, S, 4))  # grouped: two query heads per key/value head
    _, cache = fa.flash_attention_forward(q, k, v, block, window)
    inputs = {"q": q, "k": k, "v": v}
    for name, analytic in zip(inputs, fa.flash_attention_backward(G, cache), strict=True):
        def f(z: np.ndarray, name: str = name) -> float:
            out, _ = fa.flash_attention_forward(**{**inputs, name: z}, block_size=block,
                                                window=window)
            return float(np.sum(out * G))

        result = check_gradient(f, inputs[name], analytic, name=name, tol=1e-7)
        assert result.passed, str(result)


# -- models that mix windowed and full layers -----------------------------------------------

@st.composite
def windowed_configs(draw, attention=None):
    n_layer = draw(st.integers(1, 3))
    hkv = draw(st.integers(1, 2))
    window = draw(st.integers(1, 9))
    layers = draw(st.lists(st.integers(0, n_layer - 1), unique=True, max_size=n_layer - 1).map(
        lambda ls: tuple(sorted(ls))))  # the global layers: never all of them
    return xe.Config(vocab_size=13, n_embd=8 * hkv, n_head=2 * hkv, n_kv_head=hkv,
                     n_layer=n_layer, ffn_hidden=12, seq_len=draw(st.integers(4, 12)),
                     sliding_window=window, global_layers=layers,
                     attention=attention or draw(st.sampled_from(["plain", "flash"])),
                     flash_block=draw(st.integers(1, 5)),
                     nope_layers=draw(st.sampled_from([(), (0,)])))


def test_window_of_is_the_configs_window_on_the_layers_it_names():
    base = dict(vocab_size=5, n_embd=8, n_head=2, n_layer=4)
    assert [window_of(xe.Config(**base), l) for l in range(4)] == [None] * 4
    assert [window_of(xe.Config(**base, sliding_window=3), l) for l in range(4)] == [3] * 4
    mixed = xe.Config(**base, sliding_window=3, global_layers=(0, 2))
    assert [window_of(mixed, l) for l in range(4)] == [None, 3, None, 3]
    assert xe.Config(**{**base, "sliding_window": 3, "global_layers": [0, 2]}).global_layers \
        == (0, 2)  # read back from JSON
    for bad in ((2, 1), (0, 0), (4,), (-1,), (True,), (1.0,), "1", (0, 1, 2, 3)):
        with pytest.raises(ValueError, match="global_layers"):
            xe.Config(**base, sliding_window=3, global_layers=bad)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=windowed_configs(), seed=st.integers(0, 2**16))
def test_each_layer_attends_as_window_of_says(cfg, seed):
    """The model is its layers run one by one, each under a config whose every layer has that
    layer's window: the per-layer rule and nothing else decides a layer's mask."""
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x = rng.integers(0, 13, (2, cfg.seq_len))
    want, _ = forward(params, cfg, x)
    cos, sin = qk_rope_tables(cfg, cfg.seq_len, np.float64)
    h = params["wte"][x].reshape(-1, cfg.n_embd)
    for l in range(cfg.n_layer):
        alone = replace(cfg, global_layers=(), sliding_window=window_of(cfg, l),
                        attention="plain")
        cl, sl = layer_tables(cfg, l, cos, sin)
        h, _ = layer_forward(h, layer_params(params, l), alone, cl, sl)
    got, _ = head_forward(h, params, cfg)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)


def test_one_model_has_one_form_a_window_on_no_layer_is_no_window():
    """Every layer global is the model without a window: said in one form only (Config
    refuses the other), so that two configs never name one model."""
    cfg = xe.Config(vocab_size=13, n_embd=8, n_head=2, n_layer=3, seq_len=10, sliding_window=3)
    with pytest.raises(ValueError, match="sliding_window None"):
        replace(cfg, global_layers=(0, 1, 2))


def test_a_layer_without_its_index_refuses_a_mixed_config():
    cfg = xe.Config(vocab_size=13, n_embd=8, n_head=2, n_layer=2, seq_len=6, sliding_window=2,
                    global_layers=(0,))
    params = random_params(cfg, np.random.default_rng(0))
    cos, sin = qk_rope_tables(cfg, 6, np.float64)
    with pytest.raises(ValueError, match="layer"):
        layer_forward(np.zeros((6, 8)), layer_params(params, 0), cfg, cos, sin)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cfg=windowed_configs(), seed=st.integers(0, 2**16))
def test_mixed_window_gradients_against_finite_differences(cfg, seed):
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 13, (2, cfg.seq_len)), rng.integers(0, 13, (2, cfg.seq_len))
    for res in check_model(params, cfg, x, y, n_coords=3, seed=seed, h=1e-4):
        assert res.passed, (cfg, str(res))


# -- the KV cache bounded by the window -----------------------------------------------------

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=windowed_configs(attention="plain"), seed=st.integers(0, 2**16), data=st.data())
def test_decoding_in_any_feeds_through_bounded_caches_is_the_forward_pass(cfg, seed, data):
    """The tokens split at random into feeds (a long prompt, single tokens, chunks longer than
    the window): each feed's last logits are the full forward's at that position."""
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    ids = rng.integers(0, 13, cfg.seq_len)
    full, _ = forward(params, cfg, ids[None, :])
    w, kv = _prepare(params, cfg), empty_kv_cache(cfg, np.float64)
    for l in range(cfg.n_layer):
        window = window_of(cfg, l)
        assert kv.k[l].shape[2] == (cfg.seq_len if window is None else
                                    min(window, cfg.seq_len))
    pos = 0
    while pos < cfg.seq_len:
        T = data.draw(st.integers(1, cfg.seq_len - pos))
        got = _feed(params, cfg, w, kv, ids[pos : pos + T], pos)
        pos += T
        np.testing.assert_allclose(got, full[0, pos - 1], rtol=1e-10, atol=1e-12)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=windowed_configs(attention="plain"), seed=st.integers(0, 2**16),
       prompt=st.integers(1, 14), new=st.integers(1, 30))
def test_generate_with_the_bounded_cache_draws_what_recomputing_draws(cfg, seed, prompt, new):
    """Greedy, past seq_len (the context crops and the cache restarts): the same tokens."""
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng, scale=1.0)
    ids = rng.integers(0, 13, prompt)
    a = generate(params, cfg, ids, new, np.random.default_rng(0), top_k=1)
    b = generate(params, cfg, ids, new, np.random.default_rng(0), top_k=1, kv_cache=False)
    np.testing.assert_array_equal(a, b)


def test_no_cache_array_of_a_windowed_layer_outgrows_its_window(monkeypatch):
    """Every array a layer's past holds, at every feed of a long generation, has at most
    `window` positions (the full layers' seq_len); the bytes are counted as kept."""
    cfg = xe.Config(vocab_size=13, n_embd=16, n_head=4, n_kv_head=2, n_layer=4, seq_len=40,
                    sliding_window=5, global_layers=(1,))
    params = random_params(cfg, np.random.default_rng(0))
    held: list[tuple[int, int, int]] = []
    real = gen.layer_forward

    def spy(h, p, cfg_, cos, sin, past=None, layer=None):
        held.append((layer, past.k.shape[2], past.v.shape[2]))
        return real(h, p, cfg_, cos, sin, past, layer)

    monkeypatch.setattr(gen, "layer_forward", spy)
    generate(params, cfg, np.arange(12) % 13, 60, np.random.default_rng(1))
    assert {(l, k, v) for l, k, v in held} == {(0, 5, 5), (1, 40, 40), (2, 5, 5), (3, 5, 5)}
    assert [cache_positions(cfg, l) for l in range(4)] == [5, 40, 5, 5]
    assert gen.kv_cache_bytes(cfg, 4) == 2 * 2 * (5 + 40 + 5 + 5) * 4 * 4


def test_to_hf_writes_a_window_on_some_layers_as_a_family_that_has_one():
    """A window on some layers only is written as a family whose config names its layers one
    by one (layer_types: SmolLM3's for a LLaMA, Qwen's with their own pieces), never as
    Mistral, whose window is on every layer; a window on every layer is Mistral's. Whether
    transformers then windows the same layers is tests/test_families.py's round trip."""
    from xenith_edu.model.hf import config_to_hf

    base = dict(vocab_size=13, n_embd=8, n_head=2, n_layer=3, sliding_window=4)
    for layers in ((1,), (0, 2)):
        hf = config_to_hf(xe.Config(**base, global_layers=layers))
        assert hf["model_type"] == "smollm3" and hf["use_sliding_window"] is True
        assert [t == "full_attention" for t in hf["layer_types"]] == [l in layers
                                                                      for l in range(3)]
        hf = config_to_hf(xe.Config(**base, global_layers=layers, qkv_bias=True))
        assert hf["model_type"] == "qwen2" and hf["sliding_window"] == 4
    assert config_to_hf(xe.Config(**base))["model_type"] == "mistral"
    assert config_to_hf(xe.Config(**base))["sliding_window"] == 4
