"""A second catalogue of wrong answers, written before the diagnosis from the reference's
mutants was wired into the checks, from the kinds of mistake the issue named (eps outside the
root, swapped weights, a wrong scale, an off-by-one at a schedule's boundary) and others.

Each entry is (exercise, wrong implementation, a pattern the diagnosis must match[, a pattern it
must not match]). Written from scratch, not from the references; frozen once measured.
"""

from __future__ import annotations

import math

import numpy as np

# Shape legend: N positions, d width, f hidden, V vocab, B batch, H heads, S positions,
# hd head width.


def _sig(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _kw(fn, **switches):
    def learner(*args):
        return fn(*args, **switches)
    return learner


# ---------------------------------------------------------------------------- RMSNorm backward


def _rms(dy, x, w, eps, *, eps_out=False, swap_wx=False, dw_t=False, half=False,
         no_keepdims_mean=False):
    d = x.shape[-1]
    ms = np.mean(x * x, axis=-1, keepdims=True)  # (N, 1)
    rstd = 1.0 / (np.sqrt(ms) + eps) if eps_out else 1.0 / np.sqrt(ms + eps)
    xhat = x * rstd
    g = dy * (x if swap_wx else w)
    proj = np.sum(g * xhat, axis=-1, keepdims=True) / (2 * d if half else d)
    dx = rstd * (g - xhat * proj)
    dw = np.sum(dy * xhat, axis=0)
    return dx.astype(x.dtype), dw.astype(x.dtype)


RMS = [
    ("rmsnorm_backward", _kw(_rms, eps_out=True), r"eps"),
    ("rmsnorm_backward", _kw(_rms, half=True), r"\b2\b|half|constant|factor"),
]


# ---------------------------------------------------------------------- softmax cross-entropy


def _ce(logits, targets, *, scale=1.0, loss_log2=False, onehot_scale=1.0, sum_axis=-1):
    N = logits.shape[0]
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=sum_axis, keepdims=True)
    rows = np.arange(N)
    loss = float(-np.mean(np.log(p[rows, targets])))
    d = p.copy()
    d[rows, targets] -= onehot_scale
    return loss, (scale * d / N).astype(logits.dtype)


CE = [
    ("softmax_cross_entropy", _kw(_ce, scale=2.0), r"\b2\b|constant|factor"),
    ("softmax_cross_entropy", _kw(_ce, onehot_scale=2.0), r"onehot|one-hot|constant|\b2\b"),
    ("softmax_cross_entropy", _kw(_ce, sum_axis=0), r"axis"),
]


# ---------------------------------------------------------------------------- SwiGLU backward


def _swi(dout, x, w1, w3, w2, *, swap13=False, no_fanin=False, dw2_scale=1.0):
    a1, a3 = (w3, w1) if swap13 else (w1, w3)
    h1, h3 = x @ a1, x @ a3  # (N, f)
    s = _sig(h1)
    act = h1 * s * h3
    dw2 = act.T @ dout * dw2_scale
    dact = dout @ w2.T
    dh1 = dact * h3 * s * (1 + h1 * (1 - s))
    dh3 = dact * h1 * s
    dx = dh3 @ w3.T if no_fanin else dh1 @ w1.T + dh3 @ w3.T
    return tuple(o.astype(x.dtype) for o in (dx, x.T @ dh1, x.T @ dh3, dw2))


SWI = [
    ("swiglu_backward", _kw(_swi, swap13=True), r"swap|w1.*w3|w3.*w1|each other"),
    ("swiglu_backward", _kw(_swi, no_fanin=True), r"term|fan-in|twice|missing|adds"),
    ("swiglu_backward", _kw(_swi, dw2_scale=0.5), r"dw2.*(2|half|constant|factor)"),
]


# ------------------------------------------------------------------------- attention backward


def _att(dout, q, k, v, *, scale_hd=False, swap_qk=False, no_rowsum_keep=False, dv_no_t=False):
    S, hd = q.shape[-2], q.shape[-1]
    sc = 1.0 / (hd if scale_hd else math.sqrt(hd))
    T = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    z = q @ T(k) / math.sqrt(hd)
    z = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, z)
    P = np.exp(z - z.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    dv = (P if dv_no_t else T(P)) @ dout
    dP = dout @ T(v)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))
    dq, dk = dS @ k * sc, T(dS) @ q * sc
    if swap_qk:
        dq, dk = dk, dq
    return tuple(o.astype(q.dtype) for o in (dq, dk, dv))


ATT = [
    ("attention_backward", _kw(_att, scale_hd=True), r"sqrt|scale|factor"),
    ("attention_backward", _kw(_att, dv_no_t=True), r"transpos"),
]


# ---------------------------------------------------------------------------- RoPE backward


def _rope(du, cos, sin, *, sign=1.0, swap_cs=False):
    c, s = (sin, cos) if swap_cs else (cos, sin)
    c, s = c.astype(du.dtype), s.astype(du.dtype)
    a, b = du[..., 0::2], du[..., 1::2]
    out = np.empty_like(du)
    out[..., 0::2], out[..., 1::2] = a * c + sign * b * s, -sign * a * s + b * c
    return out


ROPE = [
    ("rope_backward", _kw(_rope, sign=-1.0), r"sign|angle|inverse|transpose"),
    ("rope_backward", _kw(_rope, swap_cs=True), r"swap|cos.*sin|sin.*cos|each other"),
]


# --------------------------------------------------------------------------- embedding backward


def _emb(x, dh, V, *, assign=False, ones=False):
    d = dh.shape[-1]
    dw = np.ones((V, d), dtype=dh.dtype) if ones else np.zeros((V, d), dtype=dh.dtype)
    flat, rows = x.reshape(-1), dh.reshape(-1, d)
    if assign:
        dw[flat] += rows
    else:
        np.add.at(dw, flat, rows)
    return dw


EMB = [
    ("embedding_backward", _kw(_emb, assign=True), r"add|repeat|scatter"),
    ("embedding_backward", _kw(_emb, ones=True), r"zero|start"),
]


# ------------------------------------------------------------------------------ LR schedule


def _lr(step, max_lr, min_lr, warmup, decay, *, warm_le=False, plus_one=True, decay_gt=False,
        cos_full=False):
    if (step <= warmup) if warm_le else (step < warmup):
        return max_lr * ((step + 1) if plus_one else step) / warmup
    if (step > decay) if decay_gt else (step >= decay):
        return min_lr
    progress = (step - warmup) / (decay - warmup)
    coeff = 0.5 * (1.0 + math.cos((2 if cos_full else 1) * math.pi * progress))
    return min_lr + coeff * (max_lr - min_lr)


LR = [
    ("lr_schedule", _kw(_lr, warm_le=True), r"boundary|off by one|step=|step \d"),
    ("lr_schedule", _kw(_lr, plus_one=False), r"boundary|off by one|step \+ 1|constant"),
    ("lr_schedule", _kw(_lr, cos_full=True), r"constant|\b2\b|pi|cos"),
]


# ------------------------------------------------------------------------------ AdamW update


def _adamw(p, g, m, v, t, lr, b1, b2, eps, wd, *, eps_in=False, no_bias2=False, swap_b=False):
    if swap_b:
        b1, b2 = b2, b1
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mh = m / (1 - b1 ** t)
    vh = v if no_bias2 else v / (1 - b2 ** t)
    step = mh / np.sqrt(vh + eps) if eps_in else mh / (np.sqrt(vh) + eps)
    return (p - lr * step).astype(p.dtype), m.astype(p.dtype), v.astype(p.dtype)


ADAMW = [
    ("adamw_update", _kw(_adamw, eps_in=True), r"eps"),
    ("adamw_update", _kw(_adamw, no_bias2=True), r"bias|correct|factor|missing|1 - beta2"),
    ("adamw_update", _kw(_adamw, swap_b=True), r"beta|swap|each other"),
]


UNSEEN = RMS + CE + SWI + ATT + ROPE + EMB + LR + ADAMW
