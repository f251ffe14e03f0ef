"""Blockwise attention against the plain one: values, gradients, dtype, the cache, the memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.flash_attention import (
    FlashCache,
    flash_attention_backward,
    flash_attention_forward,
)
from xenith_edu.tools.gradcheck import check_gradient
from xenith_edu.tools.workspace import workspace


def _qkv(rng: np.random.Generator, B: int, H: int, S: int, hd: int, dtype=np.float64) -> tuple:
    return tuple(rng.standard_normal((B, H, S, hd)).astype(dtype) for _ in range(4))


def _max_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(1, max |b|): relative for large values, absolute for tiny ones."""
    return float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max())))


CASES = [(S, bs) for S in (1, 2, 3, 7, 16, 31, 64, 65, 100) for bs in (1, 4, 16, 64, 128)]


@pytest.mark.parametrize(("S", "block"), CASES)
def test_matches_plain_attention(S: int, block: int) -> None:
    rng = np.random.default_rng(S * 1000 + block)
    q, k, v, dout = _qkv(rng, 2, 3, S, 6)
    out_ref, cache_ref = causal_attention_forward(q, k, v)
    grads_ref = causal_attention_backward(dout, cache_ref)
    out, cache = flash_attention_forward(q, k, v, block_size=block)
    grads = flash_attention_backward(dout, cache)
    assert out.shape == out_ref.shape
    assert _max_err(out, out_ref) < 1e-12
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        assert g.shape == g_ref.shape, name
        assert _max_err(g, g_ref) < 1e-12, name


def test_log_sum_exp_is_the_rows_normaliser() -> None:
    rng = np.random.default_rng(0)
    q, k, v, _ = _qkv(rng, 1, 2, 9, 4)
    _, cache = flash_attention_forward(q, k, v, block_size=4)
    scores = q @ np.swapaxes(k, -1, -2) / 2.0 + np.triu(np.full((9, 9), -np.inf), 1)
    lse = np.log(np.exp(scores).sum(axis=-1))  # (B, H, S), no max needed at these sizes
    np.testing.assert_allclose(cache.lse, lse, rtol=1e-13, atol=1e-13)


def test_rescaling_when_the_max_grows_across_blocks() -> None:
    # Scores that grow along the keys: every new key block raises the running max, by a lot,
    # so a forgotten or inverted rescaling of the running sum and output shows at once.
    rng = np.random.default_rng(1)
    B, H, S, hd = 1, 2, 24, 4
    q = np.abs(rng.standard_normal((B, H, S, hd))) + 1.0
    k = np.linspace(0.0, 40.0, S)[None, None, :, None] * np.ones((B, H, S, hd))
    v, dout = rng.standard_normal((2, B, H, S, hd))
    out_ref, cache_ref = causal_attention_forward(q, k, v)
    out, cache = flash_attention_forward(q, k, v, block_size=5)
    assert _max_err(out, out_ref) < 1e-12
    for g, g_ref in zip(flash_attention_backward(dout, cache),
                        causal_attention_backward(dout, cache_ref), strict=True):
        assert _max_err(g, g_ref) < 1e-12


@pytest.mark.parametrize("block", [1, 3, 8])
def test_gradients_against_finite_differences(block: int) -> None:
    rng = np.random.default_rng(7 + block)
    q, k, v, G = _qkv(rng, 2, 2, 7, 4)
    _, cache = flash_attention_forward(q, k, v, block_size=block)
    dq, dk, dv = flash_attention_backward(G, cache)
    inputs = {"q": q, "k": k, "v": v}
    for name, analytic in (("q", dq), ("k", dk), ("v", dv)):
        def f(z: np.ndarray, name: str = name) -> float:
            args = {**inputs, name: z}
            return float(np.sum(flash_attention_forward(**args, block_size=block)[0] * G))

        result = check_gradient(f, inputs[name], analytic, name=name, tol=1e-7)
        assert result.passed, str(result)


def test_keeps_dtype_and_leaves_inputs_unchanged() -> None:
    rng = np.random.default_rng(2)
    q, k, v, dout = _qkv(rng, 2, 2, 10, 4, np.float32)
    before = [a.copy() for a in (q, k, v, dout)]
    out, cache = flash_attention_forward(q, k, v, block_size=4)
    out_copy = out.copy()
    dq, dk, dv = flash_attention_backward(dout, cache)
    assert out.dtype == np.float32 and cache.lse.dtype == np.float32
    assert dq.dtype == dk.dtype == dv.dtype == np.float32
    for a, b in zip((q, k, v, dout), before, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out, out_copy)  # the backward reads out, never writes it
    out_ref, cache_ref = causal_attention_forward(q, k, v)
    assert np.abs(out - out_ref).max() < 1e-5
    for g, g_ref in zip((dq, dk, dv), causal_attention_backward(dout, cache_ref), strict=True):
        assert np.abs(g - g_ref).max() < 1e-4 * max(1.0, float(np.abs(g_ref).max()))


def test_cache_holds_no_square_array() -> None:
    rng = np.random.default_rng(3)
    B, H, S, hd = 2, 3, 40, 4
    q, k, v, _ = _qkv(rng, B, H, S, hd)
    _, cache = flash_attention_forward(q, k, v, block_size=8)
    assert isinstance(cache, FlashCache)
    arrays = [a for a in cache if isinstance(a, np.ndarray)]
    assert arrays, "the cache holds arrays"
    for a in arrays:
        assert list(a.shape).count(S) == 1, a.shape  # S appears once: no (S, S) anywhere
        assert a.size <= B * H * S * hd
    assert cache.lse.shape == (B, H, S)
    total = sum(a.nbytes for a in arrays)
    assert total == 4 * q.nbytes + cache.lse.nbytes  # q, k, v, out and lse: nothing else


@pytest.mark.parametrize(("bad", "error"), [
    (0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("8", TypeError),
])
def test_a_bad_block_size_is_refused_where_the_model_is_configured(bad, error) -> None:
    """The component trusts its block size; the boundary, Config.flash_block, checks it."""
    import xenith_edu as xe

    with pytest.raises(error, match="Config.flash_block"):
        xe.Config(vocab_size=5, n_embd=8, n_head=2, n_layer=1, attention="flash",
                  flash_block=bad)


def _traced_peak(fn) -> int:
    """Peak traced bytes of fn(), with the package's workspace of reusable arrays off: otherwise
    a call reuses what an earlier one allocated, and the peak measures the order of the calls."""
    ws = workspace()
    ws.clear()
    limit, ws.limit_bytes = ws.limit_bytes, 0
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        ws.limit_bytes = limit


def test_peak_memory_at_1024_is_under_a_quarter_of_plain() -> None:
    rng = np.random.default_rng(4)
    q, k, v, dout = _qkv(rng, 1, 2, 1024, 16)

    def plain() -> None:
        _, cache = causal_attention_forward(q, k, v)
        causal_attention_backward(dout, cache)

    def flash() -> None:
        _, cache = flash_attention_forward(q, k, v)
        flash_attention_backward(dout, cache)

    p_plain, p_flash = _traced_peak(plain), _traced_peak(flash)
    assert p_plain > 2 * 1024 * 1024 * 2 * 8  # at least the weights and their gradient
    assert p_flash <= p_plain / 4, (p_flash, p_plain)


# -- in the model: Config.attention = "flash", and recomputation -----------------------------

def _model_case(attention: str = "plain", S: int = 24, block: int = 8, seed: int = 0):
    import xenith_edu as xe
    from xenith_edu.model.params import random_params

    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=S,
                    attention=attention, flash_block=block)
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 11, (2, S)), rng.integers(0, 11, (2, S))
    return xe, cfg, params, x, y


@pytest.mark.parametrize(("S", "block"), [(1, 8), (24, 8), (23, 5), (24, 64)])
def test_flash_model_matches_the_plain_model(S: int, block: int) -> None:
    xe, cfg, params, x, y = _model_case("flash", S, block)
    plain = xe.Config(**{**cfg.to_dict(), "attention": "plain"})
    loss_f, grads_f = xe.loss_and_grads(params, cfg, x, y)
    loss_p, grads_p = xe.loss_and_grads(params, plain, x, y)
    assert abs(loss_f - loss_p) < 1e-12
    for name in grads_p:
        assert _max_err(grads_f[name], grads_p[name]) < 1e-12, name


def test_flash_model_passes_the_whole_model_gradient_check() -> None:
    from xenith_edu.model import check_model

    xe, cfg, params, x, y = _model_case("flash", 9, 4)
    for result in check_model(params, cfg, x, y, n_coords=6, seed=1):
        assert result.passed, str(result)


@pytest.mark.parametrize("attention", ["plain", "flash"])
def test_recompute_gives_bitwise_equal_gradients_and_a_lower_peak(attention: str) -> None:
    xe, cfg, params, x, y = _model_case(attention, 64, 16)
    x, y = np.tile(x, (4, 1)), np.tile(y, (4, 1))  # a batch of 8: activations dominate
    results = {}
    for recompute in (True, False):  # the smaller first: no help from warm memory
        out: list = []
        peak = _traced_peak(lambda r=recompute, o=out: o.append(
            xe.loss_and_grads(params, cfg, x, y, recompute=r)))
        results[recompute] = (*out[0], peak)
    (loss, grads, peak), (loss_r, grads_r, peak_r) = results[False], results[True]
    assert loss == loss_r
    for name in grads:
        np.testing.assert_array_equal(grads[name], grads_r[name])
    assert peak_r < peak, (peak_r, peak)


@pytest.mark.parametrize(("field", "value", "error"), [
    ("attention", "fast", ValueError), ("attention", None, ValueError),
    ("flash_block", 0, ValueError), ("flash_block", 2.0, TypeError),
])
def test_config_names_a_bad_attention_setting(field: str, value: object, error: type) -> None:
    import xenith_edu as xe

    with pytest.raises(error, match=f"Config.{field}"):
        xe.Config(vocab_size=5, n_embd=8, n_head=2, n_layer=1, **{field: value})
