"""Grouped-query attention: the config, the shapes, exact gradients, and the expanded heads.

Query head j reads key/value head j // G, G = H // Hkv, as transformers' repeat_kv: the
computation must equal the one with every key/value head repeated G times, and the gradient of
a key/value head must be the sum over its G query heads.
"""

from __future__ import annotations

import numpy as np
import pytest

import xenith_edu as xe
from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.flash_attention import flash_attention_backward, flash_attention_forward
from xenith_edu.model import check_model
from xenith_edu.model.params import random_params
from xenith_edu.tools.gradcheck import check_gradient

# -- the config and the parameter shapes -----------------------------------------------------


def test_n_kv_head_defaults_to_n_head_and_sets_the_key_value_widths() -> None:
    cfg = xe.Config(vocab_size=7, n_embd=24, n_head=6, n_layer=3)
    assert cfg.n_kv_head == 6 and cfg.kv_dim == 24 and cfg.group == 1
    gqa = xe.Config(vocab_size=7, n_embd=24, n_head=6, n_layer=3, n_kv_head=2)
    assert gqa.kv_dim == 8 and gqa.group == 3
    shapes = xe.param_shapes(gqa)
    assert shapes["wk"] == shapes["wv"] == (3, 24, 8)  # (L, d, n_kv_head * hd)
    assert shapes["wq"] == shapes["wo"] == (3, 24, 24)
    params = xe.init_params(gqa, seed=0)
    assert params["wk"].shape == params["wv"].shape == (3, 24, 8)
    assert xe.Config(**gqa.to_dict()) == gqa  # a checkpoint's config round-trips


@pytest.mark.parametrize(("value", "error"), [
    (4, ValueError), (5, ValueError), (12, ValueError), (0, ValueError), (-2, ValueError),
    (2.0, TypeError), (True, TypeError), ("2", TypeError),
])
def test_a_bad_n_kv_head_is_refused_by_name(value: object, error: type) -> None:
    with pytest.raises(error, match="Config.n_kv_head"):
        xe.Config(vocab_size=7, n_embd=24, n_head=6, n_layer=1, n_kv_head=value)


def test_the_boundary_refuses_full_width_keys_for_a_grouped_config(rng) -> None:
    full = xe.Config(vocab_size=7, n_embd=16, n_head=4, n_layer=1, seq_len=4)
    gqa = xe.Config(**{**full.to_dict(), "n_kv_head": 2})
    with pytest.raises(ValueError, match=r"params\['wk'\] has shape \(1, 16, 16\).*\(1, 16, 8\)"):
        xe.forward(xe.init_params(full), gqa, np.array([[1, 2]]))


# -- the components: plain and flash attention with Hkv < H ----------------------------------


def _qkv(rng, B=2, H=6, Hkv=2, S=7, hd=4):
    q, dout = rng.standard_normal((2, B, H, S, hd))
    k, v = rng.standard_normal((2, B, Hkv, S, hd))
    return q, k, v, dout


def _attention(kind: str, block: int = 3):
    if kind == "flash":
        return (lambda q, k, v: flash_attention_forward(q, k, v, block)), flash_attention_backward
    return causal_attention_forward, causal_attention_backward


def _group_sum(g: np.ndarray, Hkv: int) -> np.ndarray:
    """(B, H, S, hd) -> (B, Hkv, S, hd): the sum over each key/value head's query heads."""
    B, H, S, hd = g.shape
    return g.reshape(B, Hkv, H // Hkv, S, hd).sum(axis=2)


@pytest.mark.parametrize("kind", ["plain", "flash"])
@pytest.mark.parametrize(("H", "Hkv", "S"), [(6, 2, 7), (4, 1, 9), (3, 3, 5), (4, 2, 1)])
def test_equals_the_expanded_heads(rng, kind: str, H: int, Hkv: int, S: int) -> None:
    """Grouped attention is attention with each key/value head repeated for its query heads."""
    fwd, bwd = _attention(kind)
    q, k, v, dout = _qkv(rng, H=H, Hkv=Hkv, S=S)
    G = H // Hkv
    ke, ve = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)  # head j holds head j // G
    out, cache = fwd(q, k, v)
    out_e, cache_e = causal_attention_forward(q, ke, ve)
    np.testing.assert_allclose(out, out_e, rtol=1e-13, atol=1e-13)
    dq, dk, dv = bwd(dout, cache)
    dq_e, dk_e, dv_e = causal_attention_backward(dout, cache_e)
    assert dk.shape == dv.shape == k.shape
    np.testing.assert_allclose(dq, dq_e, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dk, _group_sum(dk_e, Hkv), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dv, _group_sum(dv_e, Hkv), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kind", ["plain", "flash"])
def test_agrees_with_the_chapter_exercise_s_reference(rng, kind: str) -> None:
    """The attention chapter's grouped-query exercise builds its answer independently, by
    repeating the heads and folding their gradients: the components must give the same."""
    from xenith_edu.exercises.attention import gqa_backward64

    fwd, bwd = _attention(kind)
    q, k, v, dout = _qkv(rng, H=6, Hkv=3, S=8)
    want = gqa_backward64(dout, q, k, v)
    for name, got in zip(("dq", "dk", "dv"), bwd(dout, fwd(q, k, v)[1]), strict=True):
        np.testing.assert_allclose(got, want[name], rtol=1e-12, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("kind", ["plain", "flash"])
@pytest.mark.parametrize(("H", "Hkv"), [(6, 2), (4, 1), (2, 2)])
def test_gradients_against_finite_differences(rng, kind: str, H: int, Hkv: int) -> None:
    fwd, bwd = _attention(kind)
    q, k, v, dout = _qkv(rng, B=1, H=H, Hkv=Hkv, S=6, hd=4)
    inputs = {"q": q, "k": k, "v": v}
    grads = dict(zip("qkv", bwd(dout, fwd(q, k, v)[1]), strict=True))
    for name in "qkv":
        def f(z: np.ndarray, name: str = name) -> float:
            return float(np.sum(fwd(**{**inputs, name: z})[0] * dout))

        # the tolerance of the flash chapter's own check: query 0's true gradient is 0, and the
        # blockwise sums leave 1e-16 there, 1e-8 of the floor
        result = check_gradient(f, inputs[name], grads[name], name=name, tol=1e-7)
        assert result.passed, str(result)


def test_fewer_queries_than_keys_are_the_last_positions(rng) -> None:
    """Decoding: Sq new queries after Sk - Sq cached positions give the full attention's rows."""
    q, k, v, _ = _qkv(rng, H=6, Hkv=3, S=9)
    full, _ = causal_attention_forward(q, k, v)
    for Sq in (1, 4, 9):
        last, cache = causal_attention_forward(q[:, :, -Sq:], k, v)
        np.testing.assert_allclose(last, full[:, :, -Sq:], rtol=1e-13, atol=1e-13)
        assert cache.att.shape == (2, 6, Sq, 9)


@pytest.mark.parametrize(("Sq", "Sk"), [(1, 1), (1, 5), (3, 8), (8, 8), (9, 9), (2, 17)])
def test_the_kept_mask_of_the_last_queries_is_the_causal_mask_s_last_rows(Sq, Sk) -> None:
    from xenith_edu.attention import _kept_mask, causal_mask

    mask = _kept_mask(Sq, Sk, np.dtype(np.float64))
    np.testing.assert_array_equal(mask, causal_mask(Sk, np.float64)[Sk - Sq :])
    assert not mask.flags.writeable


@pytest.mark.parametrize("kind", ["plain", "flash"])
def test_float32_kept_and_inputs_unchanged(rng, kind: str) -> None:
    fwd, bwd = _attention(kind)
    q, k, v, dout = (a.astype(np.float32) for a in _qkv(rng))
    before = [a.copy() for a in (q, k, v, dout)]
    out, cache = fwd(q, k, v)
    grads = bwd(dout, cache)
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    for a, b in zip((q, k, v, dout), before, strict=True):
        np.testing.assert_array_equal(a, b)


# -- the model -------------------------------------------------------------------------------


def _model(rng, n_kv_head: int | None, attention: str = "plain", tie: bool = True, S: int = 6):
    cfg = xe.Config(vocab_size=11, n_embd=24, n_head=6, n_layer=2, ffn_hidden=20, seq_len=8,
                    tie_embeddings=tie, n_kv_head=n_kv_head, attention=attention, flash_block=4)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 11, (2, S)), rng.integers(0, 11, (2, S))
    return cfg, params, x, y


def _expand(w: np.ndarray, Hkv: int, G: int) -> np.ndarray:
    """(L, d, Hkv*hd) -> (L, d, Hkv*G*hd): each key/value head's columns repeated G times."""
    L, d, _ = w.shape
    return np.repeat(w.reshape(L, d, Hkv, -1), G, axis=2).reshape(L, d, -1)


@pytest.mark.parametrize(("attention", "tie", "recompute"), [
    ("plain", True, False), ("plain", False, True), ("flash", True, False), ("flash", False, True),
])
def test_the_model_equals_the_model_with_expanded_heads(rng, attention, tie, recompute) -> None:
    cfg, params, x, y = _model(rng, 2, attention, tie)
    G = cfg.group
    full = xe.Config(**{**cfg.to_dict(), "n_kv_head": cfg.n_head})
    expanded = {**params, "wk": _expand(params["wk"], 2, G), "wv": _expand(params["wv"], 2, G)}
    np.testing.assert_allclose(xe.forward(params, cfg, x)[0], xe.forward(expanded, full, x)[0],
                               rtol=1e-12, atol=1e-12)
    loss, grads = xe.loss_and_grads(params, cfg, x, y, recompute=recompute)
    loss_e, grads_e = xe.loss_and_grads(expanded, full, x, y, recompute=recompute)
    assert abs(loss - loss_e) < 1e-13
    L, d = cfg.n_layer, cfg.n_embd
    for name in ("wk", "wv"):  # the expanded columns of a key/value head add up to its own
        want = grads_e[name].reshape(L, d, 2, G, -1).sum(axis=3).reshape(L, d, -1)
        np.testing.assert_allclose(grads[name], want, rtol=1e-11, atol=1e-13, err_msg=name)
    for name in set(grads) - {"wk", "wv"}:
        np.testing.assert_allclose(grads[name], grads_e[name], rtol=1e-11, atol=1e-13,
                                   err_msg=name)


@pytest.mark.parametrize(("n_kv_head", "attention", "tie"), [
    (2, "plain", False), (1, "flash", True), (3, "flash", False), (None, "flash", True),
])
def test_model_gradients_against_finite_differences(rng, n_kv_head, attention, tie) -> None:
    cfg, params, x, y = _model(rng, n_kv_head, attention, tie)
    for result in check_model(params, cfg, x, y, n_coords=6, seed=3):
        assert result.passed, str(result)


@pytest.mark.parametrize("attention", ["plain", "flash"])
def test_recompute_gives_the_same_bits_with_grouped_heads(rng, attention: str) -> None:
    cfg, params, x, y = _model(rng, 2, attention)
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    loss_r, grads_r = xe.loss_and_grads(params, cfg, x, y, recompute=True)
    assert loss == loss_r
    for name in grads:
        np.testing.assert_array_equal(grads[name], grads_r[name])


def test_one_rope_table_shape_shared_by_every_layer(rng) -> None:
    """forward makes the (S, (d + dkv)/2) tables once; every layer's RoPE cache holds those."""
    cfg, params, x, _ = _model(rng, 2)
    _, cache = xe.forward(params, cfg, x)
    S = x.shape[1]
    assert cache.cos.shape == cache.sin.shape == (S, (cfg.n_embd + cfg.kv_dim) // 2)
    for layer in cache.layers:
        assert layer.attn.rope.cos is cache.cos and layer.attn.rope.sin is cache.sin
