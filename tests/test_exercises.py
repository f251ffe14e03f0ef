"""The exercise checks, mutation-tested: every common mistake is rejected with its diagnosis.

Each exercise has a from-scratch implementation with switches that introduce one mistake at a
time; the right one and the package's reference must pass, every mutant must fail as described.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import xenith_edu.exercises as ex
from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.embedding import embedding_backward
from xenith_edu.optim import adamw_update, lr_at
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward
from xenith_edu.rope import rope_backward, rope_forward, rope_tables
from xenith_edu.softmax_ce import softmax_cross_entropy
from xenith_edu.swiglu import sigmoid, swiglu_backward, swiglu_forward

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


def _sig(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---------------------------------------------------------------- chapter 1: softmax CE
def ce(logits, targets, *, mean_grad=True, onehot=True, sign=1.0, axis=-1, shift=True,
       loss_mean=True, log=np.log, keepdims=True):
    with np.errstate(all="ignore"):
        z = logits - logits.max(axis=axis, keepdims=True) if shift else logits  # (N, V)
        e = np.exp(z)
        p = e / (e.sum(axis=axis, keepdims=True) if keepdims else e.sum(axis=axis))
    N = logits.shape[0]
    rows = np.arange(N)
    nll = -log(p[rows, targets])
    loss = float(nll.mean() if loss_mean else nll.sum())
    d = p.copy()
    if onehot:
        d[rows, targets] -= 1
    if mean_grad:
        d /= N
    return loss, sign * d


def uniform(V):
    return math.log(V)


# ---------------------------------------------------------------- chapter 2: SwiGLU
def silu_grad(z, *, form="right"):
    s = _sig(z)
    return {"right": s * (1 + z * (1 - s)), "sigmoid": s, "silu": z * s,
            "dsigmoid": s * (1 - s), "no_dsig": s + z * s,
            "no_s_term": z * s * (1 - s)}[form]


def silu_grad_naive(z):
    e = np.exp(z)
    s = e / (1 + e)  # overflows for large z
    return s * (1 + z * (1 - s))


def swiglu(dout, x, w1, w3, w2, *, dsilu="right", swap13=False, path1=True, path3=True,
           up_h1=False, dw2_transposed=False):
    h1, h3 = x @ w1, x @ w3  # (N, f)
    s = _sig(h1)
    gate = h1 * s
    ha = gate * h3
    dw2 = dout.T @ ha if dw2_transposed else ha.T @ dout  # (f, d)
    dha = dout @ w2.T  # (N, f)
    dh3 = dha * (h1 if up_h1 else gate)
    dh1 = dha * h3 * silu_grad(h1, form=dsilu)
    dw1, dw3 = x.T @ dh1, x.T @ dh3
    if swap13:
        dw1, dw3 = dw3, dw1
    dx = np.zeros_like(x)
    if path1:
        dx += dh1 @ w1.T
    if path3:
        dx += dh3 @ w3.T
    return dx, dw1, dw3, dw2


# ---------------------------------------------------------------- chapter 3: RMSNorm
def rms(dy, x, w, eps, *, mean_term="right", eps_on=True, use_w=True, dw_x=False,
        keepdims=True, axis=-1, dw_axis=0):
    e = eps if eps_on else 0.0
    ms = np.mean(x * x, axis=axis, keepdims=keepdims)
    rstd = 1.0 / np.sqrt(ms + e)
    xhat = x * rstd
    g = dy * w if use_w else dy
    proj = (np.mean(g * xhat, axis=-1, keepdims=True) if mean_term != "sum"
            else np.sum(g * xhat, axis=-1, keepdims=True))
    if mean_term == "missing":
        dx = rstd * g
    elif mean_term == "plus":
        dx = rstd * (g + xhat * proj)
    else:
        dx = rstd * (g - xhat * proj)
    dw = np.sum(dy * (x if dw_x else xhat), axis=dw_axis)
    return dx, dw


def rms_inplace(dy, x, w, eps):
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    x *= rstd  # x now holds xhat: right values, but the caller's x is gone
    g = dy * w
    return rstd * (g - x * np.mean(g * x, axis=-1, keepdims=True)), np.sum(dy * x, axis=0)


# ---------------------------------------------------------------- chapter 4: attention
def attn(dout, q, k, v, *, masked=True, scale="right", rowsum=True, swap_qk=False,
         dv_no_t=False, dk_no_t=False, shift=True, mask_future=True, keepdims=True):
    S, hd = q.shape[-2], q.shape[-1]
    c = {"right": 1 / math.sqrt(hd), "missing": 1.0, "twice": 1 / hd}[scale]
    with np.errstate(all="ignore"):
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)  # (B, H, S, S)
        if masked:
            upper = np.triu(np.ones((S, S), dtype=bool), k=1)
            s = np.where(upper if mask_future else upper.T, -np.inf, s)
        if shift:
            s = s - s.max(axis=-1, keepdims=True)
        P = np.exp(s)
        P = P / (P.sum(axis=-1, keepdims=True) if keepdims else P.sum(axis=-1))
    dP = dout @ np.swapaxes(v, -1, -2)
    if rowsum:
        dP = dP - np.sum(P * dP, axis=-1, keepdims=True)
    dS = P * dP * c
    dq = dS @ k
    dk = (dS if dk_no_t else np.swapaxes(dS, -1, -2)) @ q
    dv = (P if dv_no_t else np.swapaxes(P, -1, -2)) @ dout
    if swap_qk:
        dq, dk = dk, dq
    return dq, dk, dv


def memory(B, H, S, itemsize):
    return B * H * S * S * itemsize


# ---------------------------------------------------------------- chapter 5: RoPE
def rope_bwd(du, cos, sin, *, way=-1.0, halves=False, swap=False, cast=True):
    c, s = (sin, cos) if swap else (cos, sin)
    if cast:
        c, s = c.astype(du.dtype), s.astype(du.dtype)
    s = way * s
    if halves:
        h = du.shape[-1] // 2
        a, b = du[..., :h], du[..., h:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    a, b = du[..., 0::2], du[..., 1::2]  # (..., S, hd/2) the pairs
    return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(du.shape)


def tables(seq_len, head_dim, theta, *, exp_sign=-1.0, two=2.0, start=0, swap=False,
           transposed=False, full=False, dtype=np.float64):
    i = np.arange(head_dim // 2) if not full else np.arange(head_dim) / 2
    t = np.arange(seq_len) + start
    ang = t[:, None] * theta ** (exp_sign * two * i / head_dim)  # (S, hd/2)
    c, s = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    if swap:
        c, s = s, c
    if transposed:
        c, s = c.T, s.T
    return c, s


# ---------------------------------------------------------------- chapter 6: embedding
def emb(x, dh, V, *, mode="add", dtype=None):
    d = dh.shape[-1]
    dwte = np.zeros((V, d), dtype=dh.dtype if dtype is None else dtype)
    flat, rows = x.reshape(-1), dh.reshape(-1, d)
    if mode == "add":
        np.add.at(dwte, flat, rows)
    elif mode == "assign":
        dwte[flat] = rows
    elif mode == "buffered":
        dwte[flat] += rows
    elif mode == "mean":
        np.add.at(dwte, flat, rows)
        counts = np.bincount(flat, minlength=V)
        dwte /= np.maximum(counts, 1)[:, None]
    elif mode == "loop":
        for n, v in enumerate(flat):
            dwte[v] += rows[n]
    return dwte


def emb_flatten_inplace(x, dh, V):
    x.shape = (-1,)  # reshapes the caller's array, not a view of it
    return emb(x, dh, V)


def tied(x, dh, dlogits, xf, V, *, mode="add", proj=1.0, scatter=True, transposed=False):
    p = xf.T @ dlogits if transposed else dlogits.T @ xf
    out = proj * p
    if scatter:
        out = out + emb(x, dh, V, mode=mode)
    return out


# ---------------------------------------------------------------- chapter 7: linear
def linear(dY, X, W, *, dx_no_t=False, dw_t=False, mean=False):
    dX = dY @ (W if dx_no_t else W.T)
    dW = dY.T @ X if dw_t else X.T @ dY
    if mean:
        dW = dW / X.shape[0]
    return dX, dW


# ---------------------------------------------------------------- chapter 8: optimizer
def adamw(p, g, m, v, t, lr, b1, b2, eps, wd, *, bias=True, t_shift=0, l2=False, decay=True,
          decay_lr=True, sign=-1.0, eps_in=False, square=True, lr64=False):
    if lr64:
        lr = np.float64(lr)  # a NumPy float64 scalar promotes float32 arrays to float64
    if l2:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * (g * g if square else g)
    tb = t + t_shift
    mh = m / (1 - b1**tb) if bias else m
    vh = v / (1 - b2**tb) if bias else v
    den = np.sqrt(vh + eps) if eps_in else np.sqrt(vh) + eps
    if decay and not l2:
        p = p * (1 - (lr if decay_lr else 1.0) * wd)
    return p + sign * lr * mh / den, m, v


def adamw_inplace(p, g, m, v, t, lr, b1, b2, eps, wd):
    p2, m2, v2 = adamw(p, g, m, v, t, lr, b1, b2, eps, wd)
    p[...] = p2  # updates the caller's parameter in place
    return p, m2, v2


def lr_sched(step, max_lr, min_lr, warmup, decay, *, off_by_one=False, linear=False,
             to_zero=False, from_zero=False):
    if step < warmup:
        return max_lr * (step if off_by_one else step + 1) / warmup
    if step >= decay:
        return min_lr
    progress = (step / decay) if from_zero else (step - warmup) / (decay - warmup)
    if linear:
        return max_lr - progress * (max_lr - min_lr)
    coeff = 0.5 * (1 + math.cos(math.pi * progress))
    return coeff * max_lr if to_zero else min_lr + coeff * (max_lr - min_lr)


# ---------------------------------------------------------------- the catalogue
# check -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "softmax_cross_entropy": (ce, softmax_cross_entropy),
    "uniform_loss": (uniform, lambda V: -math.log(1.0 / V)),
    "swiglu_backward": (swiglu, lambda dout, x, w1, w3, w2: swiglu_backward(
        dout, swiglu_forward(x, w1, w3, w2)[1])),
    "silu_grad": (silu_grad, lambda z: sigmoid(z) * (1 + z * (1 - sigmoid(z)))),
    "rmsnorm_backward": (rms, lambda dy, x, w, eps: rmsnorm_backward(
        dy, rmsnorm_forward(x, w, eps)[1])),
    "rmsnorm_dot": (lambda d: 0, lambda d: 0.0),
    "attention_backward": (attn, lambda dout, q, k, v: causal_attention_backward(
        dout, causal_attention_forward(q, k, v)[1])),
    "attention_memory": (memory, memory),
    "rope_backward": (rope_bwd, rope_backward),
    "rope_tables": (tables, rope_tables),
    "embedding_backward": (lambda x, dh, V: emb(x, dh, V, mode="loop"), embedding_backward),
    "tied_wte_grad": (tied, lambda x, dh, dl, xf, V: embedding_backward(x, dh, V) + dl.T @ xf),
    "linear_backward": (linear, lambda dY, X, W: (dY @ W.T, X.T @ dY)),
    "adamw_update": (adamw, adamw_update),
    "lr_schedule": (lr_sched, lr_at),
}


def _kw(fn, **kw):
    def learner(*args):
        return fn(*args, **kw)
    learner.__name__ = f"my_{fn.__name__}"
    return learner


# (check, mutant, words the verdict must contain)
MUTANTS = [
    # chapter 1
    ("softmax_cross_entropy", _kw(ce, mean_grad=False), ["dlogits", "1/N of the mean is missing",
                                                         "(loss is right.)"], ["sign"]),
    ("softmax_cross_entropy", _kw(ce, onehot=False), ["one-hot term is missing"]),
    ("softmax_cross_entropy", _kw(ce, sign=-1.0), ["sign flipped"]),
    ("softmax_cross_entropy", _kw(ce, axis=0), ["wrong axis"]),
    ("softmax_cross_entropy", _kw(ce, shift=False), ["large logits", "NaN",
                                                     "Subtract each row's max"]),
    ("softmax_cross_entropy", _kw(ce, loss_mean=False), ["loss is wrong", "summed"]),
    ("softmax_cross_entropy", _kw(ce, log=np.log2), ["loss is wrong", "log base 2"]),
    ("softmax_cross_entropy", _kw(ce, keepdims=False), ["raised ValueError", "keepdims"]),
    ("softmax_cross_entropy", lambda lg, t: ce(lg, t)[::-1], ["loss should be a number"]),
    ("softmax_cross_entropy", lambda lg, t: (ce(lg, t)[0], ce(lg, t)[1].astype(np.float64)),
     ["float32", "dlogits has dtype float64, expected float32"]),
    ("softmax_cross_entropy", lambda lg, t: ce(lg, t) + (0,), ["returned 3 values, expected 2"]),
    ("uniform_loss", lambda V: math.log(1 / V), ["sign flipped"]),
    ("uniform_loss", lambda V: 1 / V, ["probability 1/V"]),
    ("uniform_loss", lambda V: math.log2(V), ["log base 2"]),
    ("uniform_loss", lambda V: V, ["that is V itself"]),
    ("uniform_loss", lambda V: np.array([math.log(V)]), ["should be a number"]),
    # chapter 2
    ("swiglu_backward", _kw(swiglu, dsilu="sigmoid"), ["silu'(h1) taken as sigmoid(h1)"]),
    ("swiglu_backward", _kw(swiglu, dsilu="dsigmoid"), ["sigmoid's derivative"]),
    ("swiglu_backward", _kw(swiglu, dsilu="no_dsig"), ["misses sigmoid's own derivative"]),
    ("swiglu_backward", _kw(swiglu, swap13=True), ["dw1 and dw3 are swapped"]),
    ("swiglu_backward", _kw(swiglu, path3=False), ["dx misses the path through w3"]),
    ("swiglu_backward", _kw(swiglu, path1=False), ["dx misses the path through w1"]),
    ("swiglu_backward", _kw(swiglu, up_h1=True), ["multiplied by h1"]),
    ("swiglu_backward", _kw(swiglu, dw2_transposed=True), ["dw2 has shape (4, 10), expected "
                                                           "(10, 4): transposed"]),
    ("swiglu_backward", lambda *a: tuple(o.astype(np.float32) for o in swiglu(*a)),
     ["dx has dtype float32, expected float64", "float64 was asked for"]),
    ("silu_grad", _kw(silu_grad, form="sigmoid"), ["that is sigmoid(z)"]),
    ("silu_grad", _kw(silu_grad, form="silu"), ["silu(z) itself"]),
    ("silu_grad", _kw(silu_grad, form="dsigmoid"), ["derivative of sigmoid, not of silu"]),
    ("silu_grad", _kw(silu_grad, form="no_dsig"), ["sigmoid's derivative is sigmoid * (1 - "]),
    ("silu_grad", _kw(silu_grad, form="no_s_term"), ["misses the sigmoid(z) term"]),
    ("silu_grad", silu_grad_naive, ["large |z|", "NaN", "Overflow in exp"]),
    ("silu_grad", lambda z: (silu_grad(z),), ["returned a tuple of 1 value(s), expected a "
                                              "single dz"]),
    ("silu_grad", lambda z: silu_grad(z).tolist(), ["should be a NumPy array", "got a list"]),
    # chapter 3
    ("rmsnorm_backward", _kw(rms, mean_term="missing"),
     ["dx is wrong", "(dw is right.)", "the mean term of RMSNorm's Jacobian is missing"]),
    ("rmsnorm_backward", _kw(rms, mean_term="plus"), ["mean term of RMSNorm's Jacobian has the "
                                                      "wrong sign"]),
    ("rmsnorm_backward", _kw(rms, mean_term="sum"), ["uses a sum over the d = 8 features"]),
    ("rmsnorm_backward", _kw(rms, eps_on=False), ["eps is missing"]),
    ("rmsnorm_backward", _kw(rms, use_w=False), ["dx ignores the gain w"]),
    ("rmsnorm_backward", _kw(rms, dw_x=True), ["dw is wrong", "(dx is right.)", "dw uses x"]),
    ("rmsnorm_backward", _kw(rms, keepdims=False), ["raised ValueError", "keepdims=True"]),
    ("rmsnorm_backward", _kw(rms, axis=0), ["mean of x**2 is taken over the wrong axis"]),
    ("rmsnorm_backward", _kw(rms, dw_axis=1), ["dw has shape (6,), expected (8,)",
                                               "sum dy * xhat over the positions (axis=0)"]),
    ("rmsnorm_backward", rms_inplace, ["changed its input `x` in place"]),
    ("rmsnorm_backward", lambda *a: tuple(o.astype(np.float32) for o in rms(*a)),
     ["dx has dtype float32, expected float64"]),
    ("rmsnorm_backward", lambda dy, x, w, eps: (rms(dy, x, w, eps)[0],
                                                rms(dy, x, w, eps)[1][None, :]),
     ["dw has shape (1, 8), expected (8,)"]),
    ("rmsnorm_dot", lambda d: d, ["expected 0, got", "squared length of xhat"]),
    ("rmsnorm_dot", lambda d: 1.0, ["value is wrong: expected 0, got 1"]),
    # chapter 4
    ("attention_backward", _kw(attn, masked=False), ["gradient leaks through the causal mask"]),
    ("attention_backward", _kw(attn, mask_future=False), ["gradient leaks through the causal "
                                                          "mask"]),
    ("attention_backward", _kw(attn, scale="missing"), ["1/sqrt(hd) scale of the scores is "
                                                        "missing", "(dv is right.)"], ["leaks"]),
    ("attention_backward", _kw(attn, scale="twice"), ["1/sqrt(hd) scale is applied twice"]),
    ("attention_backward", _kw(attn, rowsum=False), ["row-sum term is missing"]),
    ("attention_backward", _kw(attn, swap_qk=True), ["dq and dk are swapped"]),
    ("attention_backward", _kw(attn, dv_no_t=True), ["dv needs the transposed weights"],
     ["leaks"]),
    ("attention_backward", _kw(attn, dk_no_t=True), ["dk needs the transposed score gradient"]),
    ("attention_backward", _kw(attn, shift=False), ["large scores", "NaN", "Subtract each row's "
                                                                         "max"]),
    ("attention_backward", _kw(attn, keepdims=False), ["raised ValueError", "keepdims=True"]),
    ("attention_memory", lambda B, H, S, i: B * H * S * S, ["counts elements, not bytes"]),
    ("attention_memory", lambda B, H, S, i: np.array(B * H * S * S), ["counts elements"]),
    ("attention_memory", lambda B, H, S, i: B * H * S * i, ["one factor of S is missing"]),
    ("attention_memory", lambda B, H, S, i: B * S * S * i, ["heads are missing"]),
    ("attention_memory", lambda B, H, S, i: 8 * B * H * S * S * i, ["bits, not bytes"]),
    ("attention_memory", lambda B, H, S, i: B * H * S * S * i / 1, ["should be an int",
                                                                     "// rather than /"]),
    # chapter 5
    ("rope_backward", _kw(rope_bwd, way=1.0), ["RoPE rotated the wrong way"]),
    ("rope_backward", lambda du, c, s: rope_forward(du, c, s), ["RoPE rotated the wrong way"]),
    ("rope_backward", lambda du, c, s: du.copy(), ["du came back unrotated"]),
    ("rope_backward", _kw(rope_bwd, swap=True), ["cos and sin are swapped"]),
    ("rope_backward", _kw(rope_bwd, halves=True), ["rotate-half convention"]),
    ("rope_backward", _kw(rope_bwd, cast=False), ["float32", "du_in has dtype float64, expected "
                                                  "float32", "cos.astype(du.dtype)"]),
    ("rope_tables", _kw(tables, swap=True), ["cos and sin are swapped"]),
    ("rope_tables", _kw(tables, exp_sign=1.0), ["theta ** (-2i/hd)"]),
    ("rope_tables", _kw(tables, two=1.0), ["-i/hd where -2i/hd is needed"]),
    ("rope_tables", _kw(tables, start=1), ["positions start at 1"]),
    ("rope_tables", _kw(tables, transposed=True), ["cos has shape (2, 8), expected (8, 2): "
                                                   "transposed"]),
    ("rope_tables", _kw(tables, full=True), ["cos has shape (8, 4), expected (8, 2)",
                                             "one column per pair"]),
    ("rope_tables", _kw(tables, dtype=np.float32), ["cos has dtype float32, expected float64"]),
    ("rope_tables", lambda *a: tables(*a)[0], ["expected a tuple of 2 values (cos, sin)"]),
    # chapter 6
    ("embedding_backward", _kw(emb, mode="assign"), ["repeated tokens overwrite instead of "
                                                     "accumulate", "np.add.at"]),
    ("embedding_backward", _kw(emb, mode="buffered"), ["repeated tokens overwrite instead of "
                                                       "accumulate"]),
    ("embedding_backward", _kw(emb, mode="mean"), ["averaged instead of summed"]),
    ("embedding_backward", _kw(emb, dtype=np.float64), ["float32", "dwte has dtype float64, "
                                                        "expected float32", "dtype=dh.dtype"]),
    ("embedding_backward", lambda x, dh, V: dh.reshape(-1, dh.shape[-1]).copy(),
     ["dwte has shape (10, 3), expected (7, 3)", "One row per vocabulary entry"]),
    ("embedding_backward", lambda x, dh, V: emb(x, dh, V).T.copy(), ["transposed"]),
    ("embedding_backward", emb_flatten_inplace, ["changed its input `x` in place"]),
    ("tied_wte_grad", _kw(tied, scatter=False), ["only the output-projection term"]),
    ("tied_wte_grad", _kw(tied, proj=0.0), ["only the embedding scatter-add"]),
    ("tied_wte_grad", _kw(tied, proj=-1.0), ["output-projection term has its sign flipped"]),
    ("tied_wte_grad", _kw(tied, mode="assign"), ["repeated tokens overwrite instead of "
                                                 "accumulate"]),
    ("tied_wte_grad", _kw(tied, transposed=True), ["raised ValueError", "transpose"]),
    ("tied_wte_grad", _kw(tied, transposed=True, scatter=False),
     ["dwte has shape (3, 7), expected (7, 3): transposed"]),
    # chapter 7
    ("linear_backward", _kw(linear, dx_no_t=True), ["raised ValueError", "transpose"]),
    ("linear_backward", _kw(linear, dw_t=True), ["dW has shape (4, 3), expected (3, 4): "
                                                 "transposed"]),
    ("linear_backward", _kw(linear, mean=True), ["dW is 5 times too small: off by a factor of "
                                                 "N = 5", "(dX is right.)"]),
    ("linear_backward", lambda dY, X, W: (dY @ W.T, X.T @ dY)[::-1],
     ["dX has shape (3, 4), expected (5, 3); that is the shape of dW",
      "in the order (dX, dW)"]),
    # chapter 8
    ("adamw_update", _kw(adamw, bias=False), ["bias correction is missing"]),
    ("adamw_update", _kw(adamw, t_shift=1), ["bias correction uses t + 1"]),
    ("adamw_update", _kw(adamw, l2=True), ["weight decay goes through the gradient (L2"]),
    ("adamw_update", _kw(adamw, decay=False), ["weight decay is missing"]),
    ("adamw_update", _kw(adamw, decay_lr=False), ["weight decay is not scaled by lr"]),
    ("adamw_update", _kw(adamw, sign=1.0), ["the step goes uphill"]),
    ("adamw_update", _kw(adamw, eps_in=True), ["eps is inside the square root"]),
    ("adamw_update", _kw(adamw, square=False), ["p contains NaN", "v must average g**2"]),
    ("adamw_update", _kw(adamw, lr64=True), ["float32", "p has dtype float64, expected float32"]),
    ("adamw_update", adamw_inplace, ["changed its input `p` in place"]),
    ("lr_schedule", _kw(lr_sched, off_by_one=True), ["step=0 (warmup)", "warmup is off by one"]),
    ("lr_schedule", _kw(lr_sched, linear=True), ["(cosine decay)", "the decay is linear"]),
    ("lr_schedule", _kw(lr_sched, to_zero=True), ["the cosine decays to 0"]),
    ("lr_schedule", _kw(lr_sched, from_zero=True), ["progress counts from step 0"]),
    ("lr_schedule", lambda step, *a: 0.0 if step >= a[3] else lr_sched(step, *a),
     ["(after the decay)", "stays at min_lr"]),
]


def run(name: str, fn) -> ex.CheckResult:
    return getattr(ex, f"check_{name}")(fn)


def test_the_table_of_exercises_is_complete():
    assert set(ex.CHECKS) == set(RIGHT)
    assert {ch for ch, _ in ex.CHECKS.values()} == set(range(1, 9))
    for name, (_, check) in ex.CHECKS.items():
        assert check is getattr(ex, f"check_{name}")


@pytest.mark.parametrize("name", sorted(RIGHT))
@pytest.mark.parametrize("which", ["from scratch", "package"])
def test_right_answers_pass(name, which, capsys):
    fn = RIGHT[name][0 if which == "from scratch" else 1]
    result = run(name, fn)
    assert result.status == "passed" and result.passed, result.message
    assert result.exercise == name
    assert result.message.startswith(f"[passed] {name}: all ")
    assert capsys.readouterr().out.strip() == result.message


@pytest.mark.parametrize("name,fn,words,absent",
                         [(m[0], m[1], m[2], m[3] if len(m) > 3 else []) for m in MUTANTS],
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTANTS)])
def test_mutant_is_rejected_with_its_diagnosis(name, fn, words, absent):
    result = run(name, fn)
    assert result.status == "failed" and not result.passed
    assert result.message.startswith(f"[failed] {name}"), result.message
    for word in words:
        assert word in result.message, f"{word!r} not in:\n{result.message}"
    for word in absent:  # a wrong diagnosis would send the learner the wrong way
        assert word not in result.message, f"{word!r} in:\n{result.message}"


# Mistakes any exercise can make, applied to each right answer in turn.
def _outputs(fn, transform):
    def learner(*args):
        out = fn(*args)
        if isinstance(out, tuple):
            return tuple(transform(o) for o in out)
        return transform(out)
    return learner


def _has_array_output(name: str) -> bool:
    return name not in {"uniform_loss", "rmsnorm_dot", "attention_memory", "lr_schedule"}


def _raise(exc):
    def learner(*args):
        raise exc
    return learner


GENERIC = {
    "raises": (lambda f: _raise(ZeroDivisionError("division by zero")),
               ["raised ZeroDivisionError: division by zero", "line "]),
    "exits": (lambda f: _raise(SystemExit(1)), ["raised SystemExit"]),
    "returns None": (lambda f: (lambda *a: None), ["returned None", "`return` missing"]),
    "not callable": (lambda f: 42, ["expected a function, got 42 (int)"]),
}
GENERIC_ARRAYS = {
    "NaN": (lambda f: _outputs(f, lambda o: np.full_like(o, np.nan)
                               if isinstance(o, np.ndarray) else o), ["contains NaN"]),
    "sign flipped": (lambda f: _outputs(f, lambda o: -o), ["sign"]),
    "extra axis": (lambda f: _outputs(f, lambda o: o[None] if isinstance(o, np.ndarray) else o),
                   ["has shape (1, ", "an extra axis"]),
    "float32 instead of float64": (lambda f: _outputs(
        f, lambda o: o.astype(np.float32) if isinstance(o, np.ndarray) else o),
        ["dtype float32, expected float64"]),
}


@pytest.mark.parametrize("name", sorted(RIGHT))
@pytest.mark.parametrize("mistake", sorted(GENERIC) + sorted(GENERIC_ARRAYS))
def test_common_mistakes_of_every_exercise(name, mistake):
    if mistake in GENERIC_ARRAYS and not _has_array_output(name):
        pytest.skip("the answer is a number")
    make, words = {**GENERIC, **GENERIC_ARRAYS}[mistake]
    if name == "rope_tables" and mistake == "sign flipped":
        words = ["sin"]  # -cos and -sin: each table is flipped, cos first
    result = run(name, make(RIGHT[name][0]))
    assert result.status == "failed", result.message
    for word in words:
        assert word in result.message, f"{word!r} not in:\n{result.message}"


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_not_attempted_yet(name):
    result = run(name, _raise(NotImplementedError()))
    assert result.status == "not attempted" and not result.passed
    assert "[not attempted yet]" in result.message
    assert "the notebook goes on with" in result.message


@pytest.mark.parametrize("name", [n for n in sorted(RIGHT)
                                  if _has_array_output(n) and n != "rope_tables"])
def test_changing_any_input_in_place_is_caught(name):
    right = RIGHT[name][0]

    def learner(*args):
        out = right(*args)
        for a in args:  # the first float array argument gets scribbled on afterwards
            if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                a *= 2
                break
        return out

    result = run(name, learner)
    assert result.status == "failed"
    assert "in place" in result.message


def test_a_scalar_that_broadcasts_is_not_accepted():
    # dw of shape () or (1,) would broadcast against (d,) in a loose comparison
    result = ex.check_rmsnorm_backward(lambda dy, x, w, eps: (rms(dy, x, w, eps)[0],
                                                              np.float64(0.0)))
    assert "dw should be a NumPy array of shape (8,)" in result.message


def test_verdict_names_the_case_and_is_deterministic():
    a = ex.check_rmsnorm_backward(_kw(rms, mean_term="missing"))
    b = ex.check_rmsnorm_backward(_kw(rms, mean_term="missing"))
    assert a == b
    assert "case 1 of 6 (float64, N=6, d=8)" in a.message
    assert "worst at index (" in a.message and "relative error" in a.message


def test_float32_only_mistake_is_found_on_its_case():
    def learner(dy, x, w, eps):
        dx, dw = rms(dy, x, w, eps)
        return (dx, dw) if x.dtype == np.float64 else (dx * 1.01, dw)

    result = ex.check_rmsnorm_backward(learner)
    assert "case 2 of 6 (float32, N=5, d=16)" in result.message
    assert "dx is wrong" in result.message


def test_checks_leave_numpy_state_alone():
    before = np.geterr()
    ex.check_softmax_cross_entropy(_kw(ce, shift=False))
    assert np.geterr() == before


def test_grade_log_gets_one_json_line_per_check(tmp_path, monkeypatch):
    log = tmp_path / "grades.jsonl"
    monkeypatch.setenv(ex.GRADE_LOG_ENV, str(log))
    ex.check_linear_backward(linear)
    ex.check_uniform_loss(_raise(NotImplementedError()))
    ex.check_rope_backward(_kw(rope_bwd, way=1.0))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["exercise"], e["status"]) for e in lines] == [
        ("linear_backward", "passed"), ("uniform_loss", "not attempted"),
        ("rope_backward", "failed")]
    assert "RoPE rotated the wrong way" in lines[2]["message"]


def test_no_grade_log_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(ex.GRADE_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    ex.check_linear_backward(linear)
    assert list(tmp_path.iterdir()) == []


def test_the_teachers_page_shows_a_real_verdict(capsys):
    page = Path(__file__).resolve().parent.parent / "book" / "teaching.md"
    if not page.exists():
        pytest.skip("no teachers' page")
    text = page.read_text()
    code = re.search(r"```python\n(def my_rmsnorm_backward.*?)```", text, re.S).group(1)
    shown = re.search(r"```text\n(\[failed\] rmsnorm_backward.*?)\n```", text, re.S).group(1)
    namespace = {"np": np}
    exec(code, namespace)
    result = ex.check_rmsnorm_backward(namespace["my_rmsnorm_backward"])
    assert result.message == shown
