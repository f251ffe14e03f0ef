"""The exercise checks of the "A real LLaMA" chapter, mutation-tested: the padded cross-entropy
and QK-norm's backward, two derivations; QK-norm's reference is the package's function.
"""

from __future__ import annotations

import numpy as np

import xenith_edu.exercises as ex
from xenith_edu.qk_norm import qk_norm_backward
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward

from .helpers import catalogue_tests, kw

# Shape legend: N positions, V vocab, M counted positions; H heads, hd head width, w (hd,).


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


RIGHT = {
    "padded_cross_entropy": (padded, padded_by_loops),
    "qk_norm_backward": (qk_norm, qk_norm_by_loops, qk_norm_through_rmsnorm),
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
