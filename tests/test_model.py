"""The whole model: the contract's forward, exact gradients, dtype, purity and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

import xenith_edu as xe
from xenith_edu import model
from xenith_edu.model import check_model, ends
from xenith_edu.model.params import random_params
from xenith_edu.softmax_ce import softmax_cross_entropy
from xenith_edu.tools.gradcheck import check_gradient

CONFIGS = {
    "tied-4heads-2layers": dict(n_head=4, n_layer=2, tie_embeddings=True),
    "untied-1head-2layers": dict(n_head=1, n_layer=2, tie_embeddings=False),
    "tied-2heads-3layers": dict(n_head=2, n_layer=3, tie_embeddings=True),
    # grouped-query attention: two query heads per key/value head, and one key/value head for all
    "gqa-tied-4heads-2kv": dict(n_head=4, n_layer=2, tie_embeddings=True, n_kv_head=2),
    "gqa-untied-4heads-1kv": dict(n_head=4, n_layer=2, tie_embeddings=False, n_kv_head=1),
}


def make(rng, tie_embeddings=True, n_head=2, n_layer=2, V=13, d=16, f=24, seq_len=8,
         n_kv_head=None):
    """A small config and non-degenerate float64 params: larger weights, gains away from one."""
    cfg = xe.Config(vocab_size=V, n_embd=d, n_head=n_head, n_layer=n_layer, ffn_hidden=f,
                    seq_len=seq_len, tie_embeddings=tie_embeddings, n_kv_head=n_kv_head)
    return cfg, random_params(cfg, rng)


def reference_logits(params, cfg, x):
    """The contract's forward pass, written independently with loops over heads and pairs."""
    B, S = x.shape
    d, H = cfg.n_embd, cfg.n_head
    hd = d // H
    group = H // cfg.n_kv_head  # query head j reads key/value head j // group

    def rms(u, w):
        return u / np.sqrt(np.mean(u**2, -1, keepdims=True) + cfg.norm_eps) * w

    def rope(u):  # (B, S, hd)
        out = u.copy()
        for t in range(S):
            for i in range(hd // 2):
                a = t * cfg.rope_theta ** (-2 * i / hd)
                c, s = np.cos(a), np.sin(a)
                out[:, t, 2 * i] = u[:, t, 2 * i] * c - u[:, t, 2 * i + 1] * s
                out[:, t, 2 * i + 1] = u[:, t, 2 * i] * s + u[:, t, 2 * i + 1] * c
        return out

    h = params["wte"][x]
    for l in range(cfg.n_layer):
        xb = rms(h, params["rms_attn"][l])
        q, k, v = xb @ params["wq"][l], xb @ params["wk"][l], xb @ params["wv"][l]
        heads = []
        for j in range(H):
            sl = slice(j * hd, (j + 1) * hd)
            kv = slice(j // group * hd, (j // group + 1) * hd)
            qj, kj = rope(q[..., sl]), rope(k[..., kv])
            scores = qj @ kj.transpose(0, 2, 1) / np.sqrt(hd)
            scores[:, ~np.tril(np.ones((S, S), bool))] = -np.inf
            p = np.exp(scores - scores.max(-1, keepdims=True))
            heads.append((p / p.sum(-1, keepdims=True)) @ v[..., kv])
        h = h + np.concatenate(heads, -1) @ params["wo"][l]
        x2b = rms(h, params["rms_ffn"][l])
        g = x2b @ params["w1"][l]
        h = h + (g / (1 + np.exp(-g)) * (x2b @ params["w3"][l])) @ params["w2"][l]
    w_out = params["wte"] if cfg.tie_embeddings else params["lm_head"]
    return rms(h, params["rms_final"]) @ w_out.T


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_forward_matches_contract(rng, kind):
    cfg, params = make(rng, **CONFIGS[kind])
    x = rng.integers(0, cfg.vocab_size, (3, 7))
    logits, _ = xe.forward(params, cfg, x)
    np.testing.assert_allclose(logits, reference_logits(params, cfg, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("S", [1, 8])
def test_model_gradients(rng, kind, S):
    cfg, params = make(rng, **CONFIGS[kind])
    x = rng.integers(0, cfg.vocab_size, (2, S))
    y = rng.integers(0, cfg.vocab_size, (2, S))
    results = check_model(params, cfg, x, y, n_coords=10, seed=7, tol=1e-6)
    assert [r.name for r in results] == list(xe.param_shapes(cfg))
    for r in results:
        assert r.passed, str(r)


def test_model_gradients_repeated_tokens(rng):
    """Every coordinate of wte when the batch repeats two tokens: the scatter must add."""
    cfg, params = make(rng, tie_embeddings=False)
    x = np.array([[3, 3, 3, 5, 3, 5, 5, 3], [5, 3, 3, 3, 3, 5, 3, 3]])
    y = np.roll(x, -1, axis=1)
    _, grads = xe.loss_and_grads(params, cfg, x, y)

    def f(w):
        return softmax_cross_entropy(xe.forward({**params, "wte": w}, cfg, x)[0], y)[0]

    result = check_gradient(f, params["wte"], grads["wte"], name="wte", tol=1e-6)
    assert result.passed, str(result)
    unused = [v for v in range(cfg.vocab_size) if v not in (3, 5)]
    assert np.all(grads["wte"][unused] == 0)  # untied: only the two used rows move


def test_loss_and_grads_is_forward_then_backward(rng):
    cfg, params = make(rng)
    x, y = rng.integers(0, cfg.vocab_size, (2, 5)), rng.integers(0, cfg.vocab_size, (2, 5))
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    logits, cache = xe.forward(params, cfg, x)
    loss2, grads2 = xe.backward(params, cfg, cache, y)
    assert loss == loss2
    assert set(grads) == set(params)
    for k in params:
        np.testing.assert_array_equal(grads[k], grads2[k])
        assert grads[k].shape == params[k].shape


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_kept_and_inputs_untouched(rng, dtype):
    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, seq_len=8)
    params = xe.init_params(cfg, seed=3, dtype=dtype)
    assert all(p.dtype == dtype for p in params.values())
    before = {k: v.copy() for k, v in params.items()}
    x = rng.integers(0, 11, (2, 8))
    y = rng.integers(0, 11, (2, 8))
    x0, y0 = x.copy(), y.copy()
    logits, _ = xe.forward(params, cfg, x)
    assert logits.dtype == dtype and logits.shape == (2, 8, 11)
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    assert isinstance(loss, float) and np.isfinite(loss)
    assert all(g.dtype == dtype for g in grads.values())
    for k in params:
        np.testing.assert_array_equal(params[k], before[k])
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)


def test_float32_agrees_with_float64(rng):
    cfg, params = make(rng)
    x, y = rng.integers(0, cfg.vocab_size, (2, 8)), rng.integers(0, cfg.vocab_size, (2, 8))
    loss64, g64 = xe.loss_and_grads(params, cfg, x, y)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    loss32, g32 = xe.loss_and_grads(p32, cfg, x, y)
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    for k in params:
        err = np.abs(g32[k] - g64[k]).max() / np.abs(g64[k]).max()
        assert err < 1e-3, k


def test_init_params_is_seeded():
    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2)
    a, b = xe.init_params(cfg, seed=5), xe.init_params(cfg, seed=5)
    c = xe.init_params(cfg, seed=6)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wq"], c["wq"])
    assert np.all(a["rms_attn"] == 1.0) and a["wte"].std() == pytest.approx(0.02, rel=0.1)


def test_default_ffn_hidden_is_llama_rule():
    assert xe.Config(vocab_size=76, n_embd=128, n_head=4, n_layer=4).ffn_hidden == 352


@pytest.mark.parametrize("kwargs, field", [
    (dict(n_embd=130, n_head=4), "n_embd"),
    (dict(n_embd=12, n_head=4), "n_head"),  # head width 3 is odd
    (dict(n_layer=0), "n_layer"),
    (dict(vocab_size=-1), "vocab_size"),
    (dict(seq_len=0), "seq_len"),
    (dict(ffn_hidden=0), "ffn_hidden"),
    (dict(norm_eps=0.0), "norm_eps"),
])
def test_config_rejects_impossible_shapes(kwargs, field):
    base = dict(vocab_size=11, n_embd=16, n_head=2, n_layer=2)
    with pytest.raises(ValueError, match=field):
        xe.Config(**{**base, **kwargs})


def test_config_rejects_non_integers():
    with pytest.raises(TypeError, match="n_embd"):
        xe.Config(vocab_size=11, n_embd=16.0, n_head=2, n_layer=2)


@pytest.fixture
def small():
    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=1, seq_len=6)
    return cfg, xe.init_params(cfg, seed=0, dtype=np.float64)


@pytest.mark.parametrize("x, exc, match", [
    (np.array([[1, 2, 11]]), ValueError, r"outside \[0, 11\)"),
    (np.array([[1, -1]]), ValueError, r"outside \[0, 11\)"),
    (np.array([[1.0, 2.0]]), TypeError, "integer"),
    (np.zeros((1, 7), dtype=np.int64), ValueError, "longer than Config.seq_len"),
    (np.array([1, 2, 3]), ValueError, r"\(B, S\)"),
    ([[1, 2]], TypeError, "NumPy"),
])
def test_forward_rejects_bad_tokens(small, x, exc, match):
    cfg, params = small
    with pytest.raises(exc, match=match):
        xe.forward(params, cfg, x)


def test_loss_and_grads_rejects_mismatched_targets(small):
    cfg, params = small
    x = np.array([[1, 2, 3]])
    with pytest.raises(ValueError, match="y has shape"):
        xe.loss_and_grads(params, cfg, x, np.array([[1, 2]]))
    with pytest.raises(ValueError, match=r"y has token ids"):
        xe.loss_and_grads(params, cfg, x, np.array([[1, 2, 99]]))


def test_forward_rejects_bad_params(small):
    cfg, params = small
    x = np.array([[1, 2]])
    with pytest.raises(ValueError, match="missing keys.*'wq'"):
        xe.forward({k: v for k, v in params.items() if k != "wq"}, cfg, x)
    with pytest.raises(ValueError, match=r"params\['w1'\] has shape"):
        xe.forward({**params, "w1": params["w1"][:, :, :-1]}, cfg, x)
    with pytest.raises(ValueError, match="lm_head"):
        xe.forward({**params, "lm_head": params["wte"]}, cfg, x)  # tied config
    with pytest.raises(TypeError, match="dtype"):
        xe.forward({**params, "wq": params["wq"].astype(np.float32)}, cfg, x)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_recompute_gives_exactly_the_same_gradients(rng, kind):
    cfg, params = make(rng, **CONFIGS[kind])
    x, y = rng.integers(0, cfg.vocab_size, (2, 8)), rng.integers(0, cfg.vocab_size, (2, 8))
    loss, grads = xe.loss_and_grads(params, cfg, x, y)
    loss_r, grads_r = xe.loss_and_grads(params, cfg, x, y, recompute=True)
    assert loss_r == loss
    assert list(grads_r) == list(grads)
    for k in grads:
        np.testing.assert_array_equal(grads_r[k], grads[k], err_msg=k)
    _, cache = xe.forward(params, cfg, x, recompute=True)
    assert cache.layers == [] and len(cache.layer_inputs) == cfg.n_layer


def _walk(obj, path="cache"):
    """Every container and array inside a model cache, with its path (a piece the Config does
    not ask for, such as the biases' cache of the book's model, is None: not a container)."""
    if obj is None or isinstance(obj, (str, int)):
        return
    yield path, obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name, value in zip(obj._fields, obj, strict=True):
            yield from _walk(value, f"{path}.{name}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _walk(value, f"{path}[{i}]")


def _caches(obj, path="cache"):
    """Every container inside a model cache, with its path."""
    return ((p, c) for p, c in _walk(obj, path) if not isinstance(c, np.ndarray))


def test_caches_are_named_tuples(rng):
    """Every cache of the model, down to the components', names its fields: no dicts, no
    positional tuples (the shape tuple of SwiGLU's input is data, not a cache)."""
    cfg, params = make(rng)
    _, cache = xe.forward(params, cfg, rng.integers(0, cfg.vocab_size, (2, 5)))
    for path, c in _caches(cache):
        if path.endswith(".x_shape"):
            continue
        assert isinstance(c, list) or hasattr(c, "_fields"), f"{path} is a {type(c).__name__}"
    assert isinstance(cache.layers[0].attn.attention, xe.attention.AttentionCache)
    assert isinstance(cache.head.norm, xe.rmsnorm.RMSNormCache)


def test_blocks_compose_into_forward_and_backward(rng):
    """forward is embedding, layer_forward per layer and head_forward; backward their reverse."""
    cfg, params = make(rng, tie_embeddings=False)
    x, y = rng.integers(0, cfg.vocab_size, (2, 6)), rng.integers(0, cfg.vocab_size, (2, 6))
    cos, sin = model.qk_rope_tables(cfg, 6, np.float64)  # (S, (d + dkv)/2), the one shape
    h = params["wte"][x].reshape(12, -1)
    layers = []
    for l in range(cfg.n_layer):
        h, c = model.layer_forward(h, model.layer_params(params, l), cfg, cos, sin)
        layers.append(c)
    logits, head = model.head_forward(h, params, cfg)
    want, cache = xe.forward(params, cfg, x)
    np.testing.assert_array_equal(logits.reshape(want.shape), want)
    _, dlogits = softmax_cross_entropy(logits, y.reshape(-1))
    dh, grads = model.head_backward(dlogits, head)
    assert set(grads) == {"rms_final", "lm_head"}
    per_layer = [None] * cfg.n_layer
    for l in reversed(range(cfg.n_layer)):
        dh, per_layer[l] = model.layer_backward(dh, layers[l])
    assert set(per_layer[0]) == set(model.LAYER_PARAMS)
    grads.update({k: np.stack([g[k] for g in per_layer]) for k in model.LAYER_PARAMS})
    grads["wte"] = xe.embedding.embedding_backward(dh.reshape(2, 6, -1),
                                                   xe.embedding.EmbeddingCache(x, 13))
    _, want_grads = xe.backward(params, cfg, cache, y)
    for k, g in grads.items():
        np.testing.assert_allclose(g, want_grads[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_model_reexports_the_parameter_table():
    from xenith_edu.model import params
    assert xe.param_shapes is params.param_shapes and xe.init_params is params.init_params


def test_backward_rejects_a_foreign_cache(small):
    cfg, params = small
    x = np.array([[1, 2]])
    with pytest.raises(TypeError, match="cache"):
        xe.backward(params, cfg, {"x": x}, x)


def test_forward_rejects_half_precision(small):
    cfg, params = small
    with pytest.raises(TypeError, match="float32 or float64"):
        xe.forward({k: v.astype(np.float16) for k, v in params.items()}, cfg, np.array([[1]]))


def test_backward_leaves_the_cache_whole_unless_released(rng):
    """A cache can be given to backward twice; `release=True` (what loss_and_grads passes, since
    it owns its cache) drops each layer's part once it is done, and changes no number."""
    cfg, params = make(rng)
    x, y = rng.integers(0, cfg.vocab_size, (2, 5)), rng.integers(0, cfg.vocab_size, (2, 5))
    _, cache = xe.forward(params, cfg, x)
    loss, grads = xe.backward(params, cfg, cache, y)
    assert all(layer is not None for layer in cache.layers)
    loss2, grads2 = xe.backward(params, cfg, cache, y, release=True)
    assert cache.layers == [None] * cfg.n_layer
    assert loss == loss2
    for k in grads:
        np.testing.assert_array_equal(grads[k], grads2[k])
    _, spent = xe.forward(params, cfg, x, recompute=True)
    xe.backward(params, cfg, spent, y, release=True)
    assert spent.layer_inputs == [None] * cfg.n_layer


# -- what mutation testing asked for: dtypes, flash, padding, on_layer, loss_and_grads' choices --

def _arrays(obj, path="cache"):
    """Every array inside a model cache, with its path."""
    return ((p, a) for p, a in _walk(obj, path) if isinstance(a, np.ndarray))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("attention", ["plain", "flash"])
def test_float32_stays_float32_in_every_cache_and_gradient(rng, tie, attention):
    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=4, n_kv_head=2, n_layer=2, seq_len=8,
                    tie_embeddings=tie, attention=attention, flash_block=4)
    params = xe.init_params(cfg, seed=3, dtype=np.float32)
    x, y = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    logits, cache = xe.forward(params, cfg, x)
    floats = [(p, a) for p, a in _arrays(cache) if a.dtype.kind == "f"]
    assert len(floats) > 20 and logits.dtype == np.float32
    assert [p for p, a in floats if a.dtype != np.float32] == []
    dh, grads = model.attention_block_backward(
        rng.standard_normal((16, 16)).astype(np.float32), cache.layers[0].attn)
    assert dh.dtype == np.float32
    assert {k: g.dtype for k, g in grads.items()} == dict.fromkeys(grads, np.float32)
    _, grads = xe.backward(params, cfg, cache, y)
    assert {k: g.dtype for k, g in grads.items()} == dict.fromkeys(params, np.float32)


def test_flash_attention_runs_in_blocks_of_the_config_s_size(rng):
    for block in (2, 3):
        cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=1, seq_len=8,
                        attention="flash", flash_block=block)
        params = xe.init_params(cfg, seed=0, dtype=np.float64)
        _, cache = xe.forward(params, cfg, rng.integers(0, 11, (1, 8)))
        att = cache.layers[0].attn.attention
        assert isinstance(att, xe.flash_attention.FlashCache) and att.block_size == block
    plain = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=1, seq_len=8)
    _, cache = xe.forward(xe.init_params(plain, seed=0), plain, rng.integers(0, 11, (1, 8)))
    assert isinstance(cache.layers[0].attn.attention, xe.attention.AttentionCache)


@pytest.mark.parametrize("tie", [True, False])
def test_padding_targets_count_for_nothing_and_the_pad_row_learns_nothing_as_input(rng, tie):
    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=1, seq_len=6,
                    tie_embeddings=tie, pad_token_id=0)
    params = random_params(cfg, rng)
    x = np.array([[0, 3, 4, 0, 5, 6]])  # the pad token as an input, twice
    y = np.array([[3, 4, 0, 5, 0, 0]])  # and as a target, three times
    logits, cache = xe.forward(params, cfg, x)
    loss, grads = xe.backward(params, cfg, cache, y)
    keep = y[0] != 0
    want, _ = softmax_cross_entropy(logits[0, keep], y[0, keep])
    assert loss == pytest.approx(want, rel=1e-12)
    # the pad row as output row (tied: the same wte) gets the head's gradient only
    _, dlogits = softmax_cross_entropy(logits, y, 0)
    xf = cache.head.xf  # (N, d)
    out_row = (dlogits.reshape(6, -1)[:, 0] @ xf) if tie else np.zeros(16)
    np.testing.assert_allclose(grads["wte"][0], out_row, rtol=1e-10, atol=1e-14)
    assert np.abs(grads["wte"][3]).sum() > 0  # a row that is not the pad learns from both


def test_on_layer_hears_each_layer_s_gradients_from_the_top_down(rng):
    cfg, params = make(rng, n_layer=3)
    x, y = rng.integers(0, cfg.vocab_size, (2, 5)), rng.integers(0, cfg.vocab_size, (2, 5))
    heard = []
    _, cache = xe.forward(params, cfg, x)
    _, grads = xe.backward(params, cfg, cache, y, on_layer=lambda l, g: heard.append((l, g)))
    assert [l for l, _ in heard] == [2, 1, 0]
    for l, g in heard:
        assert set(g) == set(model.LAYER_PARAMS)
        for k in model.LAYER_PARAMS:
            np.testing.assert_array_equal(g[k], grads[k][l], err_msg=f"{k}[{l}]")


def test_the_model_s_errors_name_the_argument_exactly(small):
    cfg, params = small
    with pytest.raises(ValueError) as e:
        xe.forward(params, cfg, np.array([[1, 2, 11]]))
    assert str(e.value) == "x has token ids in [1, 11], outside [0, 11)"
    with pytest.raises(TypeError) as e:
        xe.backward(params, cfg, ("not", "a cache"), np.array([[1, 2]]))
    assert str(e.value) == "cache must be the ModelCache that forward returned, got tuple"


def test_loss_and_grads_does_not_recompute_by_default_and_gives_its_cache_up(rng, monkeypatch):
    from xenith_edu.model import transformer

    cfg, params = make(rng)
    x, y = rng.integers(0, cfg.vocab_size, (2, 5)), rng.integers(0, cfg.vocab_size, (2, 5))
    forwards, caches = [], []
    real_layer, real_backward = transformer.layer_forward, transformer.backward

    def layer_forward(*a, **kw):
        forwards.append(1)
        return real_layer(*a, **kw)

    def backward(params, cfg, cache, y, *a, **kw):
        caches.append(cache)
        return real_backward(params, cfg, cache, y, *a, **kw)

    monkeypatch.setattr(transformer, "layer_forward", layer_forward)
    monkeypatch.setattr(transformer, "backward", backward)
    transformer.loss_and_grads(params, cfg, x, y)
    assert len(forwards) == cfg.n_layer  # once per layer: nothing run again
    assert caches[0].layers == [None] * cfg.n_layer  # released as backward went
    transformer.loss_and_grads(params, cfg, x, y, recompute=True)
    assert len(forwards) == 3 * cfg.n_layer
    assert caches[1].layer_inputs == [None] * cfg.n_layer


def test_init_and_random_params_are_their_documented_draws():
    """init_params: N(0, 0.02²) weights and unit gains, drawn in the table's order from the
    seed (0 and float32 by default); random_params: N(0, 0.4²) and 1 + 0.3·N(0, 1), float64."""
    from xenith_edu.model.params import PARAM, init_params, param_shapes

    for tie in (True, False):
        cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_kv_head=1, n_layer=2,
                        tie_embeddings=tie)
        shapes = param_shapes(cfg)
        assert ("lm_head" in shapes) is not tie
        for params, seed, dtype in ((init_params(cfg), 0, np.float32),
                                    (init_params(cfg, 4, np.float64), 4, np.float64)):
            rng = np.random.default_rng(seed)
            assert list(params) == list(shapes)
            for k, shape in shapes.items():
                want = (np.ones(shape) if PARAM[k].kind == "gain"
                        else 0.02 * rng.standard_normal(shape)).astype(dtype)
                assert params[k].dtype == dtype and params[k].shape == shape
                np.testing.assert_array_equal(params[k], want, err_msg=k)
        params, rng = random_params(cfg, np.random.default_rng(2)), np.random.default_rng(2)
        for k, shape in shapes.items():
            want = (1.0 + 0.3 * rng.standard_normal(shape) if PARAM[k].kind == "gain"
                    else 0.4 * rng.standard_normal(shape))
            assert params[k].dtype == np.float64
            np.testing.assert_array_equal(params[k], want, err_msg=k)
        small = random_params(cfg, np.random.default_rng(2), 0.1, 0.0, np.float32)
        assert small["wq"].dtype == np.float32 and np.all(small["rms_ffn"] == 1.0)
        np.testing.assert_allclose(small["wte"], params["wte"] / 4, rtol=1e-6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(V=st.integers(2, 13), H=st.sampled_from([1, 2]), tied=st.booleans(),
       threads=st.integers(2, 4), B=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_the_head_on_vocabulary_shards_gives_the_gradients_of_one_pass(V, H, tied, threads, B,
                                                                       seed):
    """Above `ends.SPLIT` multiply-adds (a real vocabulary's), with several BLAS threads, the
    head runs as one product per shard of the vocabulary on threads: the logits are the
    shards' columns, dxf the sum of their parts, the output projection's gradient their rows.
    Here SPLIT is 0, so every size is split, empty shards included (V below the threads)."""
    cfg = model.Config(vocab_size=V, n_embd=4 * H, n_head=H, n_layer=1, seq_len=4,
                       tie_embeddings=tied)
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng, dtype=np.float64)
    x, y = rng.integers(0, V, (2, B, 4))
    with threadpool_limits(1):
        loss, grads = model.loss_and_grads(params, cfg, x, y)
    with threadpool_limits(threads), pytest.MonkeyPatch.context() as mp:
        mp.setattr(ends, "SPLIT", 0)
        assert ends.vocab_shards(B * 4, cfg.n_embd, V) is not None
        loss_s, grads_s = model.loss_and_grads(params, cfg, x, y)
    assert loss_s == pytest.approx(loss, rel=1e-12)
    for k, g in grads.items():
        np.testing.assert_allclose(grads_s[k], g, rtol=1e-10, atol=1e-13, err_msg=k)
