"""LoRA: the component against central finite differences, and the model with adapters.

Invariants, each over generated cases (hypothesis: shapes, ranks, scales, leading axes; model
configs with grouped heads, biases, QK-norm, a head width of its own, untied embeddings, flash
attention, Gemma's GeGLU and norms, recompute, and every subset of the targets):
- lora_backward is the vector-Jacobian product of lora_forward (float64 finite differences);
- the adapted model computes what the merged model (W + scale A.T B.T) computes;
- the adapters' gradients are the frozen weight's own gradient G (n, m) carried through the
  factorisation: dA = scale B.T G.T, dB = scale G.T A.T (G from the merged model's backward);
- they match finite differences of the adapted model's loss;
- with adapters, no base parameter's gradient is made (only the adapters' keys come back), the
  base arrays are not changed, and recompute gives the same gradients bit for bit;
- with adapters, no cache keeps the input of a frozen product (the input a weight's gradient
  would need): none is computed, whichever feed-forward (SwiGLU, GeGLU) or attention kernel;
- the frozen blocks run as sums of parts (model/parts.py, one thread per BLAS thread): the
  attention over groups of key/value heads, the feed-forward over slices of its hidden width,
  and the head over shards of the vocabulary, give the loss and gradients of one pass, to
  float64 rounding, whatever the number of parts (one per BLAS thread, up to one per unit),
  their sizes (equal or not) and the model's pieces.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from xenith_edu.lora import lora_backward, lora_forward, lora_init
from xenith_edu.model import Config, ends, forward, loss_and_grads, parts, random_params
from xenith_edu.model.adapters import (
    TARGETS,
    Adapters,
    LoraSpec,
    adapter_shapes,
    init_adapters,
    merged,
    target_size,
)
from xenith_edu.model.parts import Parts, head_groups, hidden_slices
from xenith_edu.tools.gradcheck import check_gradient

SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), n=st.integers(1, 6),
       m=st.integers(1, 6), r=st.integers(1, 4), scale=st.floats(0.1, 8.0),
       seed=st.integers(0, 2**16))
def test_lora_backward_is_the_vjp_of_forward(lead, n, m, r, scale, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, n))
    A, B = rng.standard_normal((r, n)), rng.standard_normal((m, r))  # B nonzero: dA can't hide
    out, cache = lora_forward(x, A, B, scale)
    assert out.shape == (*lead, m)
    g = rng.standard_normal(out.shape)  # a random upstream gradient
    grads = lora_backward(g, cache)
    inputs = [x, A, B]
    for i, (u, du) in enumerate(zip(inputs, grads, strict=True)):
        def f(ui, i=i):
            args = list(inputs)
            args[i] = ui
            return float(np.sum(lora_forward(*args, scale)[0] * g))

        res = check_gradient(f, u, du, name=("x", "A", "B")[i], tol=1e-8)
        assert res.passed, str(res)


@given(n=st.integers(1, 300), m=st.integers(1, 9), r=st.integers(1, 8), seed=st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_lora_init_is_peft_default_b_zero_a_within_kaiming_bound(n, m, r, seed):
    A, B = lora_init(n, m, r, np.random.default_rng(seed))
    assert A.shape == (r, n) and B.shape == (m, r) and A.dtype == np.float32
    assert not B.any() and np.abs(A).max() <= 1 / np.sqrt(n)
    A2, _ = lora_init(n, m, r, np.random.default_rng(seed))
    assert np.array_equal(A, A2)  # the rng is the only source of randomness


@pytest.mark.parametrize("rank", [0, -1, 1.5, True, "2"])
def test_lora_init_refuses_bad_rank(rank):
    with pytest.raises(ValueError, match="rank"):
        lora_init(4, 4, rank, np.random.default_rng(0))


# -- the model with adapters --------------------------------------------------------------

@st.composite
def lora_models(draw, grouped: bool = False):
    """A small config with any mix of the open models' pieces, a spec on any targets, and
    float64 base weights and adapters (B nonzero) that make every term matter. `grouped`:
    several key/value heads, each read by one or more query heads (what head groups split)."""
    H = draw(st.sampled_from([4, 6] if grouped else [2, 4]))
    Hkv = draw(st.sampled_from([h for h in (1, 2, 3, H) if H % h == 0 and h > grouped]))
    hd = draw(st.sampled_from([2, 4, 6]))
    kw = dict(vocab_size=draw(st.integers(7, 12)), n_head=H, n_kv_head=Hkv, n_embd=H * 4,
              n_layer=draw(st.integers(1, 2)), seq_len=draw(st.integers(2, 6)),
              tie_embeddings=draw(st.booleans()), qkv_bias=draw(st.booleans()),
              qk_norm=draw(st.booleans()))
    if draw(st.booleans()):
        kw["head_width"] = hd
    if draw(st.booleans()):
        kw.update(attention="flash", flash_block=draw(st.integers(1, 3)))
    if draw(st.booleans()):  # Gemma 3's pieces: GeGLU, gains 1 + w, post-norms, scaled embedding
        kw.update(activation="gelu_tanh", norm_plus_one=True, post_norms=True,
                  scale_embeddings=True)
    if draw(st.booleans()):  # windows (Mistral), on some layers with their own RoPE base
        kw.update(sliding_window=draw(st.integers(1, 3)),  # (Gemma 3), and layers without RoPE
                  global_layers=draw(st.sampled_from([()] if kw["n_layer"] == 1
                                                     else [(), (0,)])),  # (SmolLM3)
                  nope_layers=draw(st.sampled_from([(), (0,)])))
        if kw["global_layers"] and draw(st.booleans()):
            kw["local_rope_theta"] = 10.0
    cfg = Config(**kw)
    targets = tuple(draw(st.sets(st.sampled_from(list(TARGETS)), min_size=1)))
    most = min(3, *(min(target_size(cfg, t)) for t in targets))  # a rank the model holds
    spec = LoraSpec(draw(st.integers(1, most)), draw(st.floats(0.5, 16.0)), targets)
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng, dtype=np.float64)
    ad = init_adapters(cfg, spec, rng, np.float64)
    for k, a in ad.weights.items():  # B / scale: the adapters' change of W, scale A.T B.T, is
        # then of the base's size whatever the scale (else the model saturates with a large
        # alpha / r, and finite differences truncate badly)
        a[...] = 0.4 * rng.standard_normal(a.shape) / (spec.scale if "lora_B" in k else 1.0)
    B = draw(st.integers(1, 2))
    # distinct tokens in a window: two equal ones give equal values, and then the attention's
    # output does not depend on q at all (an exact zero that finite differences see as noise)
    x = np.stack([rng.permutation(cfg.vocab_size)[: cfg.seq_len] for _ in range(B)])  # (B, S)
    y = rng.integers(0, cfg.vocab_size, (B, cfg.seq_len))
    return cfg, params, ad, x, y, rng


@SLOW
@given(case=lora_models())
def test_adapter_grads_are_the_frozen_weights_gradient_factored(case):
    cfg, params, ad, x, y, _ = case
    before = {k: p.copy() for k, p in params.items()}
    loss, grads = loss_and_grads(params, cfg, x, y, adapters=ad)
    assert list(grads) == list(adapter_shapes(cfg, ad.spec))  # no base gradient at all
    for k, p in params.items():
        assert np.array_equal(p, before[k]), f"{k} changed"
    full = merged(params, ad)
    loss_m, grads_m = loss_and_grads(full, cfg, x, y)
    assert loss == pytest.approx(loss_m, rel=1e-12)
    s = ad.spec.scale
    for t in ad.spec.targets:
        G = grads_m[TARGETS[t][0]]  # (L, n, m) the frozen weight's gradient, (in, out)
        A, B = ad.weights[f"lora_A.{t}"], ad.weights[f"lora_B.{t}"]
        GT = G.transpose(0, 2, 1)  # (L, m, n), torch's layout
        np.testing.assert_allclose(grads[f"lora_A.{t}"], s * B.transpose(0, 2, 1) @ GT,
                                   rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grads[f"lora_B.{t}"], s * GT @ A.transpose(0, 2, 1),
                                   rtol=1e-9, atol=1e-12)


@SLOW
@given(case=lora_models())
def test_adapter_grads_match_finite_differences(case):
    cfg, params, ad, x, y, rng = case
    _, grads = loss_and_grads(params, cfg, x, y, adapters=ad)
    for name, g in grads.items():
        def f(w, name=name):
            weights = {**ad.weights, name: w}
            return loss_and_grads(params, cfg, x, y, adapters=Adapters(ad.spec, weights))[0]

        # the step divided by the scale: B and A reach the output multiplied by it, so the same
        # step in the output's terms (else the differences' truncation error grows as scale**4).
        # The differences' rounding is then up to eps |loss| / h ~ 1e-16 * 10 / 6e-5 ~ 2e-11:
        # a gradient below floor 1e-5 is compared absolutely, within tol * floor = 1e-11
        h = 1e-3 / max(1.0, ad.spec.scale)
        res = check_gradient(f, ad.weights[name], g, name=name, n_coords=4, rng=rng, tol=1e-6,
                             h=h, floor=1e-5)
        assert res.passed, str(res)


@settings(max_examples=8, deadline=None)
@given(case=lora_models())
def test_recompute_gives_the_same_adapter_grads(case):
    cfg, params, ad, x, y, _ = case
    loss, g = loss_and_grads(params, cfg, x, y, adapters=ad)
    loss_r, g_r = loss_and_grads(params, cfg, x, y, recompute=True, adapters=ad)
    assert loss == loss_r
    for k in g:
        assert np.array_equal(g[k], g_r[k]), k


def test_fresh_adapters_leave_the_model_unchanged(rng):
    cfg = Config(vocab_size=9, n_embd=8, n_head=2, n_layer=2, seq_len=5)
    params = random_params(cfg, rng, dtype=np.float64)
    ad = init_adapters(cfg, LoraSpec(2, 8.0, ("q", "k", "v", "o")), rng, np.float64)
    x = rng.integers(0, 9, (2, 5))
    with threadpool_limits(1):  # one pass (no shards, no head groups: their sums round
        loss_ad, g = loss_and_grads(params, cfg, x, x, adapters=ad)  # otherwise; the test
        loss = loss_and_grads(params, cfg, x, x)[0]  # of the shards compares them)
    assert loss_ad == loss  # B = 0: the frozen model exactly
    assert all(not g[f"lora_A.{t}"].any() for t in ad.spec.targets)  # dA = s B.T G.T = 0
    assert any(g[f"lora_B.{t}"].any() for t in ad.spec.targets)  # dB moves first


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(rank=0), "rank"), (dict(rank=2, alpha=0.0), "alpha"),
    (dict(rank=2, alpha=float("nan")), "alpha"), (dict(rank=2, targets=("w",)), "unknown"),
    (dict(rank=2, targets=("up",)), "SwiGLU"), (dict(rank=2, targets=()), "once"),
    (dict(rank=2, targets=("q", "q")), "once"),
])
def test_spec_refuses_bad_settings_in_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoraSpec(**kwargs)


@given(rank=st.integers(1, 2**62), target=st.sampled_from(list(TARGETS)))
@settings(max_examples=30, deadline=None)
def test_a_rank_the_model_cannot_hold_is_refused_before_any_allocation(rank, target):
    """Above min(in, out) of the projection: refused by the one door to the adapters' sizes
    (a rank of 10**8 once asked the machine for 19 GB)."""
    cfg = Config(vocab_size=9, n_embd=8, n_head=2, n_kv_head=1, n_layer=2, seq_len=4)
    spec = LoraSpec(rank, 8.0, (target,))
    widths = {"q": 8, "k": 4, "v": 4, "o": 8}
    if rank <= widths[target]:
        assert init_adapters(cfg, spec, np.random.default_rng(0)).weights
        return
    with pytest.raises(ValueError, match="min\\(in, out\\)"):
        init_adapters(cfg, spec, np.random.default_rng(0))


def test_spec_has_one_canonical_target_order():
    assert LoraSpec(4, targets=("v", "o", "q")) == LoraSpec(4, targets=("q", "v", "o"))


@pytest.mark.parametrize("damage", ["missing", "shape", "dtype", "nan", "type"])
def test_model_refuses_damaged_adapters_naming_them(damage, rng):
    cfg = Config(vocab_size=9, n_embd=8, n_head=2, n_layer=1, seq_len=4)
    params = random_params(cfg, rng, dtype=np.float64)
    ad = init_adapters(cfg, LoraSpec(2), rng, np.float64)
    w = dict(ad.weights)
    if damage == "missing":
        del w["lora_B.v"]
    elif damage == "shape":
        w["lora_A.q"] = w["lora_A.q"][:, :1]
    elif damage == "dtype":
        w["lora_A.q"] = w["lora_A.q"].astype(np.float32)
    elif damage == "nan":
        w["lora_B.q"] = w["lora_B.q"].copy()
        w["lora_B.q"][0, 0, 0] = np.nan
    bad = (w, ) if damage == "type" else Adapters(ad.spec, w)
    x = rng.integers(0, 9, (1, 4))
    with pytest.raises((ValueError, TypeError), match="adapters"):
        loss_and_grads(params, cfg, x, x, adapters=bad)


FROZEN_INPUTS = {  # cache type -> the fields that only a frozen weight's gradient would read
    "LinearCache": ("x",), "SwiGLUCache": ("x", "ha", "w13"), "GeGLUCache": ("x", "ha"),
    "HeadCache": ("xf",),
}


def _named(obj, path):
    """Every named tuple inside a model cache, with its path (lists, dicts and tuples opened)."""
    if hasattr(obj, "_fields"):
        yield path, obj
        for f in obj._fields:
            yield from _named(getattr(obj, f), f"{path}.{f}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _named(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _named(v, f"{path}[{k!r}]")


@SLOW
@given(case=lora_models())
def test_frozen_products_keep_no_input_so_no_weight_gradient_is_made(case):
    cfg, params, ad, x, _, _ = case
    _, cache = forward(params, cfg, x, adapters=ad)
    seen = set()
    for path, c in _named(cache, "cache"):
        kind = type(c).__name__
        for field in FROZEN_INPUTS.get(kind, ()):
            seen.add(kind)
            assert getattr(c, field) is None, f"{path}.{field} is kept for a frozen weight"
    ffn = "GeGLUCache" if cfg.activation == "gelu_tanh" else "SwiGLUCache"
    assert {"LinearCache", "HeadCache", ffn} <= seen  # the walk reached every frozen product


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.one_of(lora_models(), lora_models(grouped=True)), threads=st.integers(2, 4),
       recompute=st.booleans())
def test_blocks_run_as_sums_of_parts_give_the_gradients_of_one_pass(case, threads, recompute):
    cfg, params, ad, x, y, _ = case
    with threadpool_limits(1):  # one BLAS thread: one pass, no parts
        loss, grads = loss_and_grads(params, cfg, x, y, adapters=ad)
        assert head_groups(cfg, x.size) is None and hidden_slices(cfg, x.size) is None
    with threadpool_limits(threads), pytest.MonkeyPatch.context() as mp:
        mp.setattr(parts, "MIN_WORK", 0)  # parts however small,
        mp.setattr(ends, "SPLIT", 0)  # and the head on vocabulary shards too
        groups, slices = head_groups(cfg, x.size), hidden_slices(cfg, x.size)
        assert (groups is None) == (min(threads, cfg.kv_heads) < 2)  # at most one per unit
        for split, n in ((groups, cfg.kv_heads), (slices, cfg.hidden)):
            assert split is None or [u for lo, hi in split for u in range(lo, hi)] == list(
                range(n))  # every unit in one part, in order
        _, cache = forward(params, cfg, x, adapters=ad)
        assert isinstance(cache.layers[0].ffn, Parts) and slices is not None
        assert isinstance(cache.layers[-1].attn, Parts) == (groups is not None)
        loss_s, grads_s = loss_and_grads(params, cfg, x, y, recompute, adapters=ad)  # the
        # parts made again in the backward, when recomputing
    assert loss_s == pytest.approx(loss, rel=1e-12)
    for k, g in grads.items():
        np.testing.assert_allclose(grads_s[k], g, rtol=1e-10, atol=1e-13, err_msg=k)
