"""The exercise checks of the "A real LLaMA" chapter, mutation-tested: the padded cross-entropy,
QK-norm's backward and LoRA's backward, three derivations; QK-norm's and LoRA's references are
the package's functions. LoRA's check is also attacked with generated wrong answers: every
change of its reference that changes the outputs, and every product of per-output slips
(a factor of the scale, of r or N, a sign, a zero), is rejected on the notebook's cases and on
the grader's hidden draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xenith_edu.exercises as ex
from xenith_edu.exercises import engine, mutate
from xenith_edu.lora import lora_backward, lora_forward
from xenith_edu.qk_norm import qk_norm_backward
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward

from .helpers import catalogue_tests, kw

# Shape legend: N positions, V vocab, M counted positions; H heads, hd head width, w (hd,);
# LoRA: x (N, n), dy (N, m), A (r, n), B (m, r).


def padded(logits, targets, ignore_index, *, over="M", mask_grad=True, mask_loss=True,
           sign=1.0):
    """From scratch, with one switch per mistake of the catalogue."""
    N, V = logits.shape
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)  # (N, V)
    keep = targets != ignore_index  # (N,)
    safe = np.where(keep, targets, 0)
    M = int(keep.sum())
    nll = -np.log(p[np.arange(N), safe])
    loss = nll[keep].sum() / M if mask_loss else nll.mean()
    d = p.copy()
    d[np.arange(N)[keep], safe[keep]] -= 1
    if mask_grad:
        d[~keep] = 0
    d /= M if over == "M" else N
    return float(loss), (sign * d).astype(logits.dtype)


def padded_by_loops(logits, targets, ignore_index):
    N, V = logits.shape
    rows = [n for n in range(N) if targets[n] != ignore_index]
    d = np.zeros((N, V))
    loss = 0.0
    for n in rows:
        z = logits[n].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        loss -= np.log(p[targets[n]])
        p[targets[n]] -= 1
        d[n] = p / len(rows)
    return loss / len(rows), d.astype(logits.dtype)


def qk_norm(dy, u, w, eps, *, per_head=True, strided=False, mean_term=1.0, eps_in=True,
            gain_in_dx=True, dw_from="xhat", dw_heads="sum", dw_positions="sum", center=False,
            stat_axis=-1):
    """From scratch, with one switch per mistake of the catalogue."""
    N, width = u.shape
    hd = w.shape[0]
    H = width // hd
    if strided:
        cut = lambda a: a.reshape(N, hd, H).swapaxes(1, 2)  # noqa: E731
        back = lambda a: a.swapaxes(1, 2).reshape(N, width)  # noqa: E731
    elif per_head:
        cut = lambda a: a.reshape(N, H, hd)  # noqa: E731
        back = lambda a: a.reshape(N, width)  # noqa: E731
    else:  # the whole row as one head, the gain repeated
        cut = lambda a: a.reshape(N, 1, width)  # noqa: E731
        back = lambda a: a.reshape(N, width)  # noqa: E731
    h = cut(u.astype(np.float64))
    if center:  # LayerNorm per head
        h = h - h.mean(axis=-1, keepdims=True)
    gain = w if (per_head or strided) else np.tile(w, H)
    rstd = 1.0 / np.sqrt(np.mean(h * h, axis=stat_axis, keepdims=True)
                         + (eps if eps_in else 0.0))
    xhat = h * rstd
    d = cut(dy.astype(np.float64))
    g = d * gain if gain_in_dx else d
    du = rstd * (g - mean_term * xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    if center:
        du = du - rstd * np.mean(g, axis=-1, keepdims=True)
    src = {"xhat": xhat, "u": h}[dw_from]
    per = np.sum(d * src, axis=0).reshape(-1, hd) if not (per_head or strided) \
        else np.sum(d * src, axis=0)  # (H, hd)
    dw = {"sum": per.sum(axis=0), "first": per[0], "mean": per.mean(axis=0)}[dw_heads]
    if dw_positions == "mean":
        dw = dw / N
    return back(du).astype(u.dtype), dw.astype(u.dtype)


def qk_norm_by_loops(dy, u, w, eps):
    """Position by position, head by head, RMSNorm's backward written out."""
    N, width = u.shape
    hd = w.shape[0]
    du, dw = np.zeros((N, width)), np.zeros(hd)
    for n in range(N):
        for c in range(0, width, hd):
            x, d = u[n, c:c + hd].astype(np.float64), dy[n, c:c + hd].astype(np.float64)
            r = 1.0 / np.sqrt(x @ x / hd + eps)
            xh = x * r
            g = d * w
            du[n, c:c + hd] = r * (g - xh * (g @ xh) / hd)
            dw += d * xh
    return du.astype(u.dtype), dw.astype(u.dtype)


def qk_norm_through_rmsnorm(dy, u, w, eps):
    """The package's RMSNorm backward on the (N*H, hd) rows: the derivation's first line."""
    N, width = u.shape
    hd = w.shape[0]
    _, cache = rmsnorm_forward(u.reshape(-1, hd), w, eps)
    du, dw = rmsnorm_backward(dy.reshape(-1, hd), cache)
    return du.reshape(N, width), dw


def lora(dy, x, A, B, scale, *, scale_in=("dB", "du"), extra=(), over_N=False, r_again=False,
         dB_from="u", dx_out=True):
    """From scratch, with one switch per mistake of the catalogue: `scale_in` names where the
    scale multiplies (dB, du: right; dA, dx: once more), `extra` where it multiplies again."""
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    s = scale / A.shape[0] if r_again else scale
    at = lambda where: (s if where in scale_in else 1.0) * (s if where in extra else 1.0)  # noqa: E731
    u = x64 @ A.T  # (N, r)
    du = at("du") * dy64 @ B  # (N, r)
    dx = at("dx") * du @ A if dx_out else np.zeros_like(x64)
    dA = at("dA") * du.T @ x64
    dB = at("dB") * dy64.T @ {"u": u, "x": x64}[dB_from]
    if over_N:
        dA, dB = dA / x.shape[0], dB / x.shape[0]
    return dx.astype(x.dtype), dA.astype(x.dtype), dB.astype(x.dtype)


def lora_by_loops(dy, x, A, B, scale):
    """Position by position: each one's outer products added into dA and dB."""
    dx, dA, dB = np.zeros(x.shape), np.zeros(A.shape), np.zeros(B.shape)
    for n in range(x.shape[0]):
        xn, dyn = x[n].astype(np.float64), dy[n].astype(np.float64)
        un = A @ xn  # (r,)
        dun = scale * (B.T @ dyn)  # (r,)
        dB += scale * np.outer(dyn, un)
        dA += np.outer(dun, xn)
        dx[n] = A.T @ dun
    return dx.astype(x.dtype), dA.astype(x.dtype), dB.astype(x.dtype)


def lora_through_W(dy, x, A, B, scale):
    """Through the gradient G = x.T @ dy (n, m) the frozen W would get: dA = scale * B.T @ G.T,
    dB = scale * G.T @ A.T (the README's second form), and dx = dy @ (scale * A.T @ B.T).T."""
    G = x.astype(np.float64).T @ dy.astype(np.float64)  # (n, m)
    delta = scale * A.T @ B.T  # (n, m): the change of W the branch adds
    return ((dy @ delta.T).astype(x.dtype), (scale * B.T @ G.T).astype(x.dtype),
            (scale * G.T @ A.T).astype(x.dtype))


RIGHT = {
    "padded_cross_entropy": (padded, padded_by_loops),
    "qk_norm_backward": (qk_norm, qk_norm_by_loops, qk_norm_through_rmsnorm),
    "lora_backward": (lora, lora_by_loops, lora_through_W),
}

MUTANTS = [
    ("padded_cross_entropy", kw(padded, over="N"), ["divided by N", "not by M"]),
    ("padded_cross_entropy", kw(padded, mask_loss=False), ["counted in the loss"]),
    ("padded_cross_entropy", kw(padded, mask_grad=False), ["ignored rows of dlogits"]),
    ("padded_cross_entropy", kw(padded, sign=-1.0), ["sign flipped"]),
    ("qk_norm_backward", kw(qk_norm, per_head=False), ["whole row", "normalised as one"]),
    ("qk_norm_backward", kw(qk_norm, strided=True), ["heads are cut the wrong way"]),
    ("qk_norm_backward", kw(qk_norm, center=True), ["as LayerNorm does"]),
    ("qk_norm_backward", kw(qk_norm, stat_axis=0), ["runs over the positions"]),
    ("qk_norm_backward", lambda dy, u, w, eps: (qk_norm(dy, u, w, eps)[0].reshape(
        u.shape[0], -1, w.shape[0]), qk_norm(dy, u, w, eps)[1]), ["reshape the (N, H, hd)"]),
    ("qk_norm_backward", kw(qk_norm, mean_term=0.0), ["mean term", "missing"]),
    ("qk_norm_backward", kw(qk_norm, mean_term=-1.0), ["wrong sign"]),
    ("qk_norm_backward", kw(qk_norm, eps_in=False), ["eps is missing"]),
    ("qk_norm_backward", kw(qk_norm, gain_in_dx=False), ["ignores the gain"]),
    ("qk_norm_backward", kw(qk_norm, dw_from="u"), ["dw uses u"]),
    ("qk_norm_backward", kw(qk_norm, dw_heads="first"), ["first head", "used-twice"]),
    ("qk_norm_backward", kw(qk_norm, dw_heads="mean"), ["averages over the H"]),
    ("qk_norm_backward", kw(qk_norm, dw_positions="mean"), ["averages over the N"]),
    ("qk_norm_backward", lambda dy, u, w, eps: (qk_norm(dy, u, w, eps)[0],
                                                np.sum(dy * u, axis=0)),
     ["(hd,)", "shared by every head"]),
    ("lora_backward", kw(lora, scale_in=("du",)), ["dB forgets the scale"]),
    ("lora_backward", kw(lora, scale_in=("dB",)), ["du forgets the scale"]),
    ("lora_backward", kw(lora, scale_in=()), ["forgotten everywhere"]),
    ("lora_backward", kw(lora, scale_in=("dB", "dx")), ["dA forgets the scale (dx has it)"]),
    ("lora_backward", kw(lora, scale_in=("dB", "dA")), ["dx forgets the scale (dA has it)"]),
    ("lora_backward", kw(lora, extra=("dA",)), ["applied twice in dA"]),
    ("lora_backward", kw(lora, extra=("dx",)), ["applied twice in dx"]),
    ("lora_backward", kw(lora, extra=("dA", "dx")), ["applied twice, in du and again"]),
    ("lora_backward", kw(lora, r_again=True), ["divided by r"]),
    ("lora_backward", kw(lora, over_N=True), ["averaged over the N", "used-twice"]),
    ("lora_backward", kw(lora, dx_out=False), ["dx is missing"]),
    ("lora_backward", kw(lora, dB_from="x"), ["dB has shape", "not x"]),
    ("lora_backward", lambda dy, x, A, B, s: tuple(o.T.copy() for o in lora(dy, x, A, B, s)),
     ["transposed?"]),
    ("lora_backward", lambda dy, x, A, B, s: lora(dy, x, A, B, s)[::-1],
     ["are the outputs in the order (dx, dA, dB)"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_qk_norm_reference_is_the_package_function(monkeypatch):
    """One source of truth: the exercise's reference returns what the package's
    qk_norm_backward returns, whatever that is (nothing is copied into the exercise)."""
    import xenith_edu.exercises.llama as module

    spec = ex.SPECS["qk_norm_backward"]
    args = spec.make_cases()[0].args
    assert all(np.array_equal(a, b) for a, b in zip(spec.reference(*args),
                                                    qk_norm_backward(*_package_cache(*args)),
                                                    strict=True))
    marker = (np.zeros(1), np.ones(1))
    monkeypatch.setattr(module, "qk_norm_backward", lambda dy, cache: marker)
    assert spec.reference(*args) is marker


def _package_cache(dy, u, w, eps):
    from xenith_edu.qk_norm import qk_norm_forward

    return dy, qk_norm_forward(u, w, eps)[1]


# -- LoRA's check against generated wrong answers ---------------------------------------------

LORA = ex.SPECS["lora_backward"]
HIDDEN = [None, 21, 22]  # the notebook's cases, then the grader's hidden draws


def test_lora_reference_is_the_package_function(monkeypatch):
    """One source of truth: the exercise's reference is the package's lora_backward on the
    cache of its lora_forward, whatever they return (nothing is copied into the exercise)."""
    import xenith_edu.exercises.llama as module

    dy, x, A, B, s = LORA.make_cases()[0].args
    assert all(np.array_equal(a, b) for a, b in zip(
        LORA.reference(dy, x, A, B, s), lora_backward(dy, lora_forward(x, A, B, s)[1]),
        strict=True))
    marker = (np.zeros(1), np.ones(1), np.zeros(2))
    monkeypatch.setattr(module, "lora_backward", lambda dout, cache: marker)
    assert LORA.reference(dy, x, A, B, s) is marker


def _differs(m: mutate.Mutant) -> bool:
    """Whether the mutant's outputs differ from the reference's on a fresh draw of the cases
    (beyond float64 rounding): a change that does not is no mistake."""
    for case in LORA.make_cases(np.random.default_rng(99)):
        args = tuple(engine._as64(a) for a in case.args)
        got, exp = mutate.outputs(LORA, m, args), LORA.reference(*args)
        if got is None or any(not engine.close(got[n], e, 1e-13)
                              for n, e in zip(LORA.out_names, exp, strict=True)):
            return True
    return False


def _as_learner(m: mutate.Mutant):
    def learner(*args):
        dtype = args[0].dtype
        out = mutate.outputs(LORA, m, tuple(engine._as64(a) for a in args))
        if out is None:
            raise ValueError("this change fails here")
        return tuple(np.asarray(o).astype(dtype) for o in out.values())
    return learner


@pytest.mark.parametrize("seed", HIDDEN)
def test_every_change_of_lora_s_reference_that_matters_is_rejected(seed, monkeypatch):
    """Program transformations of the reference (a sign, a dropped factor, a transpose, a
    swapped name...): each that changes the outputs fails the check, on every draw."""
    monkeypatch.setattr(engine, "from_mutants", lambda *a, **k: [])  # verdicts, not names
    found = [m for m in mutate.mutants(LORA) if _differs(m)]
    assert len(found) >= 20, len(found)
    passed = [m.describe() for m in found
              if ex.check(LORA, _as_learner(m), None if seed is None
                          else np.random.default_rng(seed)).passed]
    assert passed == []


SLIPS = ("scale", "1/scale", "r", "1/r", "N", "1/N", "-1", "0", "1")


def _factor(slip: str, args: tuple) -> float:
    _, x, A, _, s = args
    value = {"scale": s, "r": A.shape[0], "N": x.shape[0], "-1": -1.0, "0": 0.0, "1": 1.0}
    return 1.0 / value[slip[2:]] if slip.startswith("1/") else value[slip]


@settings(max_examples=40, deadline=None)
@given(slips=st.tuples(*[st.sampled_from(SLIPS)] * 3).filter(lambda t: t != ("1",) * 3),
       seed=st.sampled_from(HIDDEN))
def test_any_product_of_per_output_slips_is_rejected(slips, seed):
    """A wrong answer made of the right ones, each output off by its own factor (the scale or
    its inverse, r, N, a sign, zero): rejected whatever the mix, on the notebook's cases and on
    hidden draws, since no case has a scale, r or N of 1 in every output's way."""
    def learner(dy, x, A, B, s):
        right = lora(dy, x, A, B, s)
        return tuple((o * _factor(k, (dy, x, A, B, s))).astype(o.dtype)
                     for o, k in zip(right, slips, strict=True))

    rng = None if seed is None else np.random.default_rng(seed)
    assert not ex.check(LORA, learner, rng).passed
