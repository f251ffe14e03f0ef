"""A held-out catalogue of plausible wrong answers, written before the fitting diagnosis.

Each entry is (exercise, wrong implementation, a pattern the diagnosis must match[, a pattern
it must not match]). The catalogue is frozen: the diagnosis is measured on it, not tuned to it.
"""

from __future__ import annotations

import math

import numpy as np

# Shape legend: N positions, d width, f hidden, V vocab, B batch, H heads, S positions,
# hd head width, R rows.


def _sig(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


# ---------------------------------------------------------------------------- RMSNorm backward


def _rms(dy, x, w, eps, *, proj_w=True, sign=1.0, scale=1.0, proj_div=1.0, dw_mean=False,
         eps_out=False, proj_x=False, first_rstd=True, dw_w=False):
    ms = np.mean(x * x, axis=-1, keepdims=True)
    rstd = 1.0 / (np.sqrt(ms) + eps) if eps_out else 1.0 / np.sqrt(ms + eps)
    xhat = x * rstd
    g = dy * w
    gp = g if proj_w else dy
    proj = np.mean(gp * xhat, axis=-1, keepdims=True) / proj_div
    first = rstd * g if first_rstd else g
    dx = sign * scale * (first - rstd * (x if proj_x else xhat) * proj)
    dw = (np.mean if dw_mean else np.sum)(dy * xhat * (w if dw_w else 1.0), axis=0)
    return dx.astype(x.dtype), dw.astype(x.dtype)


def _kw(fn, **switches):
    def learner(*args):
        return fn(*args, **switches)
    return learner


RMS = [
    ("rmsnorm_backward", _kw(_rms, proj_w=False), r"gain|\bw\b"),
    ("rmsnorm_backward", _kw(_rms, first_rstd=False), r"rstd"),
    ("rmsnorm_backward", _kw(_rms, sign=-1.0), r"sign"),
    ("rmsnorm_backward", _kw(_rms, scale=2.0), r"\b2\b"),
    ("rmsnorm_backward", lambda dy, x, w, eps: _rms(dy, x, w, eps, proj_div=x.shape[-1]),
     r"mean.*\bd\b|\bd = \d+"),
    ("rmsnorm_backward", _kw(_rms, dw_mean=True), r"dw.*(N = \d+|mean|average)"),
    ("rmsnorm_backward", _kw(_rms, eps_out=True), r"eps"),
    ("rmsnorm_backward", _kw(_rms, proj_x=True), r"xhat|\bx\b"),
    ("rmsnorm_backward", _kw(_rms, dw_w=True), r"dw.*\bw\b"),
]


# ---------------------------------------------------------------------- softmax cross-entropy


def _ce(logits, targets, *, d_by_v=False, loss_nn=False, no_max=False, sign_no_n=False,
        loss_all=False, d_scale=1.0):
    N, V = logits.shape
    z = logits if no_max else logits - logits.max(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        e = np.exp(z)
        p = e / e.sum(axis=-1, keepdims=True)
        lp = np.log(p)
    rows = np.arange(N)
    loss = -np.mean(lp) if loss_all else -np.sum(lp[rows, targets]) / (N * N if loss_nn else N)
    d = p.copy()
    d[rows, targets] -= 1
    d = -d if sign_no_n else d / (V if d_by_v else N)
    return float(loss), (d_scale * d).astype(logits.dtype)


CE = [
    ("softmax_cross_entropy", _kw(_ce, d_by_v=True), r"\bV\b"),
    ("softmax_cross_entropy", _kw(_ce, loss_nn=True), r"loss.*N = \d+"),
    ("softmax_cross_entropy", _kw(_ce, no_max=True), r"max|[Oo]verflow"),
    ("softmax_cross_entropy", _kw(_ce, sign_no_n=True), r"sign.*N = |N = .*sign"),
    ("softmax_cross_entropy", _kw(_ce, loss_all=True), r"target"),
    ("softmax_cross_entropy", _kw(_ce, d_scale=0.5), r"\b2\b|half"),
]


# ---------------------------------------------------------------------------- SwiGLU backward


def _swi(dout, x, w1, w3, w2, *, dw2_t=False, overwrite=False, dw1_sign=False, dw2_mean=False,
         silu_s=False, dw1_two=False, dw3_scale=1.0):
    h1, h3 = x @ w1, x @ w3  # (N, f)
    s = _sig(h1)
    a = h1 * s * h3  # (N, f)
    dw2 = dout.T @ a if dw2_t else a.T @ dout
    if dw2_mean:
        dw2 = dw2 / x.shape[0]
    dha = dout @ w2.T
    dsilu = s * (1 + h1 * s) if silu_s else s * (1 + h1 * (1 - s))
    dh1 = dha * h3 * dsilu
    dh3 = dha * h1 * s
    dx = dh1 @ w1.T
    dx = dh3 @ w3.T if overwrite else dx + dh3 @ w3.T
    dw1 = x.T @ dh1 * (-1.0 if dw1_sign else 2.0 if dw1_two else 1.0)
    dw3 = x.T @ dh3 * dw3_scale
    return tuple(o.astype(x.dtype) for o in (dx, dw1, dw3, dw2))


SWI = [
    ("swiglu_backward", _kw(_swi, dw2_t=True), r"transpos"),
    ("swiglu_backward", _kw(_swi, overwrite=True), r"w1|overwr|\+="),
    ("swiglu_backward", _kw(_swi, dw1_sign=True), r"dw1.*sign"),
    ("swiglu_backward", _kw(_swi, dw2_mean=True), r"dw2.*N = \d+"),
    ("swiglu_backward", _kw(_swi, silu_s=True), r"silu|sigmoid"),
    ("swiglu_backward", _kw(_swi, dw1_two=True), r"dw1.*\b2\b"),
    ("swiglu_backward", _kw(_swi, dw3_scale=-1.0), r"dw3.*sign"),
]


# ------------------------------------------------------------------------- attention backward


def _att(dout, q, k, v, *, dv_unmasked=False, dq_noscale=False, dq_t=False, rowsum_sign=1.0,
         rowsum_axis=-1, dk_noscale=False, dv_scale=False):
    S, hd = q.shape[-2], q.shape[-1]
    sc = 1.0 / math.sqrt(hd)
    scores = q @ np.swapaxes(k, -1, -2) * sc  # (B, H, S, S)
    mask = np.triu(np.ones((S, S), dtype=bool), k=1)

    def soft(z):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    P = soft(np.where(mask, -np.inf, scores))
    Pv = soft(scores) if dv_unmasked else P
    dv = np.swapaxes(Pv, -1, -2) @ dout * (sc if dv_scale else 1.0)
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - rowsum_sign * np.sum(P * dP, axis=rowsum_axis, keepdims=True))
    dq = (np.swapaxes(dS, -1, -2) if dq_t else dS) @ k * (1.0 if dq_noscale else sc)
    dk = np.swapaxes(dS, -1, -2) @ q * (1.0 if dk_noscale else sc)
    return tuple(o.astype(q.dtype) for o in (dq, dk, dv))


ATT = [
    ("attention_backward", _kw(_att, dv_unmasked=True), r"mask"),
    ("attention_backward", _kw(_att, dq_noscale=True), r"dq.*(sqrt|scale)"),
    ("attention_backward", _kw(_att, dq_t=True), r"dq.*transpos|transpos.*dq"),
    ("attention_backward", _kw(_att, rowsum_sign=-1.0), r"sign"),
    ("attention_backward", _kw(_att, rowsum_axis=-2), r"axis"),
    ("attention_backward", _kw(_att, dk_noscale=True), r"dk.*(sqrt|scale)"),
    ("attention_backward", _kw(_att, dv_scale=True), r"dv.*(sqrt|scale)"),
]


# ----------------------------------------------------------------------------- softmax merge


def _merge(m1, l1, o1, m2, l2, o2, *, how="right"):
    with np.errstate(all="ignore"):
        m = m1 + m2 if how == "sum_m" else np.maximum(m1, m2)
        e1, e2 = np.exp(m1 - m), np.exp(m2 - m)
        w1, w2 = l1 * e1, l2 * e2
        l = w1 + w2
        if how == "precedence":  # only the second product is divided
            o = w1[:, None] * o1 + w2[:, None] * o2 / l[:, None]
        elif how == "by_l1":
            o = (w1[:, None] * o1 + w2[:, None] * o2) / l1[:, None]
        elif how == "exp_only_no_div":
            o = e1[:, None] * o1 + e2[:, None] * o2
        elif how == "o_unscaled":
            o = (l1[:, None] * o1 + l2[:, None] * o2) / (l1 + l2)[:, None]
        elif how == "div_plain_l":
            o = (w1[:, None] * o1 + w2[:, None] * o2) / (l1 + l2)[:, None]
        else:
            o = (w1[:, None] * o1 + w2[:, None] * o2) / l[:, None]
        return m, l, o


MERGE = [
    ("softmax_merge", _kw(_merge, how="precedence"), r"divid"),
    ("softmax_merge", _kw(_merge, how="by_l1"), r"divid|\bl\b"),
    ("softmax_merge", _kw(_merge, how="sum_m"), r"max"),
    ("softmax_merge", _kw(_merge, how="exp_only_no_div"), r"weight|divid"),
    ("softmax_merge", _kw(_merge, how="o_unscaled"), r"rescal"),
    ("softmax_merge", _kw(_merge, how="div_plain_l"), r"divid|rescal"),
]


# --------------------------------------------------------------------------------- row sums D


ROWSUM = [
    ("softmax_rowsum", lambda dout, out: np.sum(dout * out, axis=-2), r"axis"),
    ("softmax_rowsum", lambda dout, out: np.sum(dout * out), r"axis|reduced"),
    ("softmax_rowsum", lambda dout, out: np.sum(dout * out, axis=-1, keepdims=True),
     r"keepdims", r"sum over the positions missing"),
    ("softmax_rowsum", lambda dout, out: 2 * np.sum(dout * out, axis=-1), r"\b2\b"),
    ("softmax_rowsum", lambda dout, out: -np.sum(dout * out, axis=-1), r"sign"),
]


# ------------------------------------------------------------------------------- KV budget


def _budget(b, L, B, H, hd, i, *, kv=2, batch=True, heads=True, item=True, rounding=None):
    per = kv * L * (B if batch else 1) * (H if heads else 1) * hd * (i if item else 1)
    return int(rounding(b / per)) if rounding else b // per


BUDGET = [
    ("kv_cache_budget", _kw(_budget, kv=1), r"values", r"bytes per number"),
    ("kv_cache_budget", _kw(_budget, item=False), r"bytes per number|itemsize",
     r"values are missing"),
    ("kv_cache_budget", _kw(_budget, batch=False), r"batch"),
    ("kv_cache_budget", _kw(_budget, heads=False), r"heads"),
    ("kv_cache_budget", _kw(_budget, rounding=round), r"round"),
    ("kv_cache_budget", _kw(_budget, kv=4), r"values|twice|\b2\b"),
]


# ------------------------------------------------------------------------------ RoPE backward


def _rope(du, cos, sin, *, how="right"):
    c, s = cos.astype(du.dtype), sin.astype(du.dtype)
    if how == "roll":
        c, s = np.roll(c, 1, axis=0), np.roll(s, 1, axis=0)
    a, b = du[..., 0::2], du[..., 1::2]
    if how == "shifted":  # pairs taken one element later: (u[2i+1], u[2i]) as (first, second)
        a, b = b, a
    out = np.empty_like(du)
    if how == "no_sin":
        out[..., 0::2], out[..., 1::2] = a * c, b * c
    elif how == "cos_only":
        out[..., 0::2], out[..., 1::2] = a * c + b * c, -a * c + b * c
    else:
        out[..., 0::2], out[..., 1::2] = a * c + b * s, -a * s + b * c
    return out


ROPE = [
    ("rope_backward", _kw(_rope, how="shifted"), r"pair"),
    ("rope_backward", _kw(_rope, how="no_sin"), r"sin"),
    ("rope_backward", _kw(_rope, how="cos_only"), r"sin|cos"),
    ("rope_backward", _kw(_rope, how="roll"), r"position"),
]


# ---------------------------------------------------------------------------------- silu grad


SILU = [
    ("silu_grad", lambda z: (_sig(z) * (1 - z * (1 - _sig(z)))).astype(z.dtype), r"sign"),
    ("silu_grad", lambda z: (_sig(z) * (1 + z * _sig(z))).astype(z.dtype), r"sigmoid"),
    ("silu_grad", lambda z: (2 * _sig(z) * (1 + z * (1 - _sig(z)))).astype(z.dtype), r"\b2\b"),
]


HELDOUT = RMS + CE + SWI + ATT + MERGE + ROWSUM + BUDGET + ROPE + SILU
