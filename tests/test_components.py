"""Each backward component against central finite differences in float64 (bound 1e-7).

Vector-valued functions are checked through the scalar sum(out * G) with a random G,
whose gradient is exactly what backward computes from dout = G.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from xenith_edu.attention import (
    _kept_mask,
    causal_attention_backward,
    causal_attention_forward,
    causal_mask,
)
from xenith_edu.embedding import embedding_backward, embedding_forward
from xenith_edu.linear import linear_backward, linear_forward
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward
from xenith_edu.rope import rope_backward, rope_forward, rope_tables
from xenith_edu.softmax_ce import per_token_loss, softmax_cross_entropy
from xenith_edu.swiglu import swiglu_backward, swiglu_forward
from xenith_edu.tools.gradcheck import check_gradient

TOL = 1e-7


def assert_passes(result):
    assert result.passed, str(result)


# -- the linear layer ------------------------------------------------------------------------

@pytest.mark.parametrize("lead", [(5,), (2, 3), (1,)])
def test_linear_gradients(rng, lead):
    x, w = rng.standard_normal((*lead, 4)), rng.standard_normal((4, 3))
    G = rng.standard_normal((*lead, 3))
    y, cache = linear_forward(x, w)
    np.testing.assert_allclose(y, x @ w, rtol=1e-12)
    dx, dw = linear_backward(G, cache)
    assert_passes(check_gradient(lambda z: float(np.sum(linear_forward(z, w)[0] * G)), x, dx,
                                 name="x", tol=TOL))
    assert_passes(check_gradient(lambda z: float(np.sum(linear_forward(x, z)[0] * G)), w, dw,
                                 name="w", tol=TOL))


# -- softmax cross-entropy ---------------------------------------------------------------

@pytest.mark.parametrize("offset", [0.0, 500.0])  # ordinary logits, and large ones (exp overflows)
@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 11), (1, 4)])
def test_softmax_ce_gradient(rng, shape, offset):
    logits = offset + 2.0 * rng.standard_normal(shape)
    targets = rng.integers(0, shape[-1], shape[:-1])
    loss, dlogits = softmax_cross_entropy(logits, targets)
    assert dlogits.shape == logits.shape
    assert_passes(check_gradient(lambda z: softmax_cross_entropy(z, targets)[0], logits,
                                 dlogits, name="logits", tol=TOL))


def test_softmax_ce_matches_definition(rng):
    logits = rng.standard_normal((6, 9))
    targets = rng.integers(0, 9, 6)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = -np.log(p[np.arange(6), targets])
    np.testing.assert_allclose(per_token_loss(logits, targets), expected, rtol=1e-12)
    loss, dlogits = softmax_cross_entropy(logits, targets)
    assert loss == pytest.approx(expected.mean(), rel=1e-12)
    np.testing.assert_allclose(dlogits.sum(-1), 0.0, atol=1e-15)  # rows sum to zero


def test_softmax_ce_huge_logits_stay_finite():
    logits = np.array([[1000.0, -1000.0, 0.0]], dtype=np.float32)
    loss, dlogits = softmax_cross_entropy(logits, np.array([1]))
    assert np.isfinite(loss) and loss == pytest.approx(-np.log(1e-30), rel=1e-6)  # the clamp
    assert np.all(np.isfinite(dlogits))


# -- SwiGLU --------------------------------------------------------------------------------

@pytest.mark.parametrize("lead", [(6,), (2, 3), (1, 1)])
def test_swiglu_gradients(rng, lead):
    d, f = 5, 7
    x = rng.standard_normal((*lead, d))
    w1, w3, w2 = (rng.standard_normal(s) for s in [(d, f), (d, f), (f, d)])
    G = rng.standard_normal((*lead, d))
    out, cache = swiglu_forward(x, w1, w3, w2)
    dx, dw1, dw3, dw2 = swiglu_backward(G, cache)

    def f_of(i):
        def f_(z):
            args = [x, w1, w3, w2]
            args[i] = z
            return float(np.sum(swiglu_forward(*args)[0] * G))
        return f_

    for i, (arr, grad, name) in enumerate(
        [(x, dx, "x"), (w1, dw1, "w1"), (w3, dw3, "w3"), (w2, dw2, "w2")]
    ):
        assert grad.shape == arr.shape
        assert_passes(check_gradient(f_of(i), arr, grad, name=name, tol=TOL))


def test_swiglu_matches_definition(rng):
    x, w1, w3, w2 = (rng.standard_normal(s) for s in [(4, 3), (3, 6), (3, 6), (6, 3)])
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    expected = (silu(x @ w1) * (x @ w3)) @ w2
    np.testing.assert_allclose(swiglu_forward(x, w1, w3, w2)[0], expected, rtol=1e-12)


def _swiglu_readable(x, w1, w3, w2, dout):
    """The SwiGLU chapter's readable form, forward and backward, in the inputs' dtype."""
    h1, h3 = x @ w1, x @ w3
    sig = 1 / (1 + np.exp(-h1))
    a = h1 * sig * h3
    da = dout @ w2.T
    dh3 = da * h1 * sig
    dh1 = da * h3 * sig * (1 + h1 * (1 - sig))
    return a @ w2, dh1 @ w1.T + dh3 @ w3.T, x.T @ dh1, x.T @ dh3, a.T @ dout


@pytest.mark.parametrize("scale", [1.0, 6.0])  # 6: h1 reaches +-60, far into both tails
def test_swiglu_float32_is_the_readable_form_to_float32_rounding(rng, scale):
    """The fast form in float32 against the chapter's readable form in float64 on the same
    float32 numbers: every output within a few float32 roundings of its largest entry."""
    N, d, f = 64, 16, 40
    x = (scale * rng.standard_normal((N, d))).astype(np.float32)
    w1, w3, w2 = (rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0])
                  for s in [(d, f), (d, f), (f, d)])
    dout = rng.standard_normal((N, d)).astype(np.float32)
    out, cache = swiglu_forward(x, w1, w3, w2)
    fast = (out, *swiglu_backward(dout, cache))
    exact = _swiglu_readable(*(a.astype(np.float64) for a in (x, w1, w3, w2, dout)))
    for name, got, want in zip(("out", "dx", "dw1", "dw3", "dw2"), fast, exact, strict=True):
        assert got.dtype == np.float32
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 2e-6, f"{name}: {err:.1e} of its largest entry"


# -- RMSNorm -------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [1e-5, 1e-1])
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 6), (1, 4)])
def test_rmsnorm_gradients(rng, shape, eps):
    x = rng.standard_normal(shape)
    w = 1.0 + 0.3 * rng.standard_normal(shape[-1])
    G = rng.standard_normal(shape)
    y, cache = rmsnorm_forward(x, w, eps)
    dx, dw = rmsnorm_backward(G, cache)
    assert_passes(check_gradient(lambda z: float(np.sum(rmsnorm_forward(z, w, eps)[0] * G)),
                                 x, dx, name="x", tol=TOL))
    assert_passes(check_gradient(lambda z: float(np.sum(rmsnorm_forward(x, z, eps)[0] * G)),
                                 w, dw, name="w", tol=TOL))


def test_rmsnorm_matches_definition(rng):
    x, w = rng.standard_normal((3, 7)), rng.standard_normal(7)
    expected = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(rmsnorm_forward(x, w, 1e-5)[0], expected, rtol=1e-12)


# -- causal attention ------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 1, 1, 2), (1, 2, 6, 8)])
def test_attention_gradients(rng, shape):
    q, k, v = (rng.standard_normal(shape) for _ in range(3))
    G = rng.standard_normal(shape)
    out, cache = causal_attention_forward(q, k, v)
    dq, dk, dv = causal_attention_backward(G, cache)
    for i, (arr, grad, name) in enumerate([(q, dq, "q"), (k, dk, "k"), (v, dv, "v")]):
        def f_(z, i=i):
            args = [q, k, v]
            args[i] = z
            return float(np.sum(causal_attention_forward(*args)[0] * G))
        assert_passes(check_gradient(f_, arr, grad, name=name, tol=TOL))


def test_attention_matches_definition_and_is_causal(rng):
    B, H, S, hd = 2, 2, 5, 4
    q, k, v = (rng.standard_normal((B, H, S, hd)) for _ in range(3))
    out, _ = causal_attention_forward(q, k, v)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((S, S), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, p @ v, rtol=1e-12)
    # a change at the last position moves no earlier output
    k2, v2 = k.copy(), v.copy()
    k2[..., -1, :] += 1.0
    v2[..., -1, :] += 1.0
    out2, _ = causal_attention_forward(q, k2, v2)
    np.testing.assert_array_equal(out2[..., :-1, :], out[..., :-1, :])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kept_mask_is_the_causal_mask_and_cannot_be_changed(dtype):
    """The forward adds a mask made once and kept: the same values as `causal_mask`, and
    read-only, so no caller can change the mask of every later call."""
    mask = _kept_mask(7, 7, np.dtype(dtype))
    np.testing.assert_array_equal(mask, causal_mask(7, dtype))
    assert mask.dtype == dtype and _kept_mask(7, 7, np.dtype(dtype)) is mask
    with pytest.raises(ValueError):
        mask[0, 1] = 0.0
    tracemalloc.start()  # and it keeps 2S - 1 numbers, not S * S: 64 KiB here, not 128 MiB
    big = _kept_mask(4096, 4096, np.dtype(dtype))
    kept = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert kept < 2**20
    assert big[4095, 4095] == 0.0 and big[4094, 4095] == -np.inf and big[4095, 0] == 0.0


# -- RoPE ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 1, 1, 2), (4, 6)])
def test_rope_gradient(rng, shape):
    S, hd = shape[-2], shape[-1]
    cos, sin = rope_tables(S + 2, hd, 10000.0)  # tables longer than S are cropped
    u, G = rng.standard_normal(shape), rng.standard_normal(shape)
    out, cache = rope_forward(u, cos, sin)
    du = rope_backward(G, cache)
    assert_passes(check_gradient(lambda z: float(np.sum(rope_forward(z, cos, sin)[0] * G)),
                                 u, du, name="u", tol=TOL))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_backward_into_out_equals_a_new_array(rng, dtype):
    """`out=` (the model writes dq and dk straight into its fused gradient) changes where the
    result goes, not what it is: into a strided view, bit for bit the same as a new array."""
    B, H, S, hd = 2, 3, 5, 8
    cos, sin = rope_tables(S, hd)
    dout = rng.standard_normal((B, H, S, hd)).astype(dtype)
    _, cache = rope_forward(dout, cos.astype(dtype), sin.astype(dtype))
    expected = rope_backward(dout, cache)
    buf = np.full((B, S, 3 * H * hd), np.nan, dtype)  # heads of q | k | v, as the model has them
    view = buf.reshape(B, S, 3 * H, hd).transpose(0, 2, 1, 3)[:, H : 2 * H]  # (B, H, S, hd)
    result = rope_backward(dout, cache, out=view)
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(view, expected)
    assert np.isnan(buf.reshape(B, S, 3, H * hd)[:, :, [0, 2]]).all()  # nothing else written


def test_rope_matches_contract_and_inverts(rng):
    S, hd, theta = 6, 8, 100.0
    cos, sin = rope_tables(S, hd, theta)
    assert cos.shape == sin.shape == (S, hd // 2)
    u = rng.standard_normal((S, hd))
    out, cache = rope_forward(u, cos, sin)
    for t in range(S):
        for i in range(hd // 2):
            a = t * theta ** (-2 * i / hd)
            x0, x1 = u[t, 2 * i], u[t, 2 * i + 1]
            assert out[t, 2 * i] == pytest.approx(x0 * np.cos(a) - x1 * np.sin(a), abs=1e-12)
            assert out[t, 2 * i + 1] == pytest.approx(x0 * np.sin(a) + x1 * np.cos(a), abs=1e-12)
    np.testing.assert_allclose(rope_backward(out, cache), u, atol=1e-12)  # R^T R = I


def test_rope_relative_position(rng):
    """q.k after RoPE depends only on the offset between the two positions."""
    hd = 8
    cos, sin = rope_tables(20, hd, 10000.0)
    q, k = rng.standard_normal(hd), rng.standard_normal(hd)
    qs, ks = np.tile(q, (20, 1)), np.tile(k, (20, 1))
    rq, rk = rope_forward(qs, cos, sin)[0], rope_forward(ks, cos, sin)[0]
    assert rq[7] @ rk[4] == pytest.approx(rq[15] @ rk[12], rel=1e-10)


# -- embedding -------------------------------------------------------------------------------

@pytest.mark.parametrize("x", [
    np.array([[3, 1, 3, 3], [0, 1, 4, 3]]),  # repeated tokens
    np.array([[2]]),                        # S = 1
])
def test_embedding_gradient(rng, x):
    V, d = 6, 3
    wte = rng.standard_normal((V, d))
    G = rng.standard_normal((*x.shape, d))
    h, cache = embedding_forward(wte, x)
    np.testing.assert_array_equal(h, wte[x])
    dwte = embedding_backward(G, cache)
    assert dwte.shape == wte.shape
    assert_passes(check_gradient(lambda w: float(np.sum(embedding_forward(w, x)[0] * G)),
                                 wte, dwte, name="wte", tol=TOL))


def test_embedding_repeated_tokens_accumulate(rng):
    x = np.array([[5, 5, 5]])
    dh = rng.standard_normal((1, 3, 4))
    _, cache = embedding_forward(rng.standard_normal((7, 4)), x)
    dwte = embedding_backward(dh, cache)
    np.testing.assert_allclose(dwte[5], dh[0].sum(0), rtol=1e-12)
    assert np.count_nonzero(np.abs(dwte).sum(1)) == 1


# -- a checker that can fail ----------------------------------------------------------------

def test_checker_rejects_wrong_gradients(rng):
    """The check must fail on the classic mistakes, or the tests above prove nothing."""
    x, w = rng.standard_normal((4, 6)), 1 + 0.3 * rng.standard_normal(6)
    G = rng.standard_normal((4, 6))
    _, (xhat, rstd, _) = rmsnorm_forward(x, w, 1e-5)
    f = lambda z: float(np.sum(rmsnorm_forward(z, w, 1e-5)[0] * G))  # noqa: E731
    good = rstd * (G * w - xhat * np.mean(G * w * xhat, -1, keepdims=True))
    no_mean_term = rstd * (G * w)
    assert check_gradient(f, x, good, tol=TOL).passed
    assert not check_gradient(f, x, -good, tol=TOL).passed  # sign flipped
    assert not check_gradient(f, x, no_mean_term, tol=TOL).passed  # projection missing
    assert not check_gradient(f, x, good * (1 + 1e-5), tol=TOL).passed  # off by 1e-5


# -- dtype and purity ------------------------------------------------------------------------

def _calls(rng, dtype):
    """Each component function with inputs of `dtype`, as (name, fn, args)."""
    r = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    x, w = r(3, 4, 8), (1 + 0.1 * rng.standard_normal(8)).astype(dtype)
    q, k, v = r(2, 2, 5, 4), r(2, 2, 5, 4), r(2, 2, 5, 4)
    cos, sin = rope_tables(5, 4, 10000.0)
    tok = rng.integers(0, 6, (3, 4))
    _, rc = rmsnorm_forward(x, w, 1e-5)
    _, sc = swiglu_forward(x, r(8, 6), r(8, 6), r(6, 8))
    _, ac = causal_attention_forward(q, k, v)
    _, pc = rope_forward(q, cos, sin)
    _, ec = embedding_forward(r(6, 8), tok)
    return [
        ("softmax_cross_entropy", softmax_cross_entropy, (r(5, 6), tok.ravel()[:5])),
        ("per_token_loss", per_token_loss, (r(5, 6), tok.ravel()[:5])),
        ("rmsnorm_forward", rmsnorm_forward, (x, w, 1e-5)),
        ("rmsnorm_backward", rmsnorm_backward, (r(3, 4, 8), rc)),
        ("swiglu_forward", swiglu_forward, (x, r(8, 6), r(8, 6), r(6, 8))),
        ("swiglu_backward", swiglu_backward, (r(3, 4, 8), sc)),
        ("causal_attention_forward", causal_attention_forward, (q, k, v)),
        ("causal_attention_backward", causal_attention_backward, (r(2, 2, 5, 4), ac)),
        ("rope_forward", rope_forward, (q, cos, sin)),
        ("rope_backward", rope_backward, (q, pc)),
        ("embedding_forward", embedding_forward, (r(6, 8), tok)),
        ("embedding_backward", embedding_backward, (x, ec)),
        ("linear_forward", linear_forward, (x, r(8, 5))),
        ("linear_backward", linear_backward, (r(3, 4, 5), linear_forward(x, r(8, 5))[1])),
    ]


def _arrays(obj):
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _arrays(o)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_components_keep_dtype_and_inputs(rng, dtype):
    for name, fn, args in _calls(rng, dtype):
        before = [a.copy() for a in _arrays(args)]
        out = fn(*args)
        for a, b in zip(_arrays(args), before, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} changed an input in place")
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            if isinstance(o, np.ndarray) and o.dtype.kind == "f":
                assert o.dtype == dtype, f"{name} returned {o.dtype} for {np.dtype(dtype)} input"


# -- caches name what they keep ----------------------------------------------------------

def test_component_caches_are_named_tuples(rng):
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    q = rng.standard_normal((1, 2, 3, 4))
    cos, sin = rope_tables(3, 4)
    w1, w3, w2 = (rng.standard_normal(s) for s in [(4, 5), (4, 5), (5, 4)])
    caches = {
        "rmsnorm": (rmsnorm_forward(x, w, 1e-5)[1], ("xhat", "rstd", "w")),
        "swiglu": (swiglu_forward(x, w1, w3, w2)[1],
                   ("x", "x_shape", "w13", "w2", "h3", "sig2", "gate", "ha", "w1w3")),
        "attention": (causal_attention_forward(q, q, q)[1], ("q", "k", "v", "att", "scale")),
        "rope": (rope_forward(q, cos, sin)[1], ("cos", "sin")),
        "embedding": (embedding_forward(x, np.array([[0, 2]]))[1], ("x", "vocab_size")),
        "linear": (linear_forward(x, x.T)[1], ("x", "w")),
    }
    for name, (cache, fields) in caches.items():
        assert cache._fields == fields, name


def test_silu_and_its_gradient(rng):
    from xenith_edu.swiglu import sigmoid, silu, silu_grad
    z = np.concatenate([4.0 * rng.standard_normal(50), [-800.0, 0.0, 800.0]])
    # the tanh form loses relative precision far left, where sigmoid is below 1e-15 anyway
    want = 1 / (1 + np.exp(-np.clip(z, -700, 700)))
    np.testing.assert_allclose(sigmoid(z), want, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(silu(z), z * sigmoid(z), rtol=1e-15)
    h = 1e-6
    numeric = (silu(z + h) - silu(z - h)) / (2 * h)
    np.testing.assert_allclose(silu_grad(z), numeric, rtol=1e-7, atol=1e-9)
    assert silu_grad(np.array([0.0]))[0] == 0.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_backward_equals_the_chapters_scatter_add(rng, dtype):
    """The package sorts and sums runs; the chapter's form is np.add.at. Same sums."""
    V, d = 9, 5
    x = rng.integers(0, V - 2, (3, 17))  # repeats, and two unused rows
    dh = rng.standard_normal((3, 17, d)).astype(dtype)
    want = np.zeros((V, d), dtype)
    np.add.at(want, x.reshape(-1), dh.reshape(-1, d))
    _, cache = embedding_forward(np.zeros((V, d), dtype), x)
    got = embedding_backward(dh, cache)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-6)
    assert np.all(got[V - 2:] == 0)
