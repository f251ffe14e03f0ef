"""A second held-out catalogue of learner mistakes, written before the diagnosis derives its
candidate mistakes from the reference, and kept apart from the author of that change.

Each entry (`Wrong`) is one wrong answer, written as a learner writes it: the exercise, a short
name of the mistake, the learner's function, a pattern that a RIGHT diagnosis matches (the words
of the chapter for the mistake), optionally a pattern that a misleading diagnosis would match,
and flags:

- "rare": the answer is wrong only on inputs a check may not draw (large logits, a table longer
  than the sequence, a size that does not divide, a dtype, ...): every entry that at most one
  case of the notebook's draw shows is flagged so. The measurement reports the false passes of
  these apart from the others.
- "hole": today's check passes it (measured when the catalogue was written). The tests assert
  that every entry without this flag is rejected.

The catalogue is frozen: the diagnosis is measured on it, never tuned to it. None of its entries
is one of `heldout.py`'s. tests/exercises/measure_heldout_second.py prints the measurement.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

# Shape legend: N positions, d width, f hidden width, V vocab, B batch, H heads, G kv heads,
# S positions, hd head width, K shards, m outputs of a linear layer, L layers.


class Wrong(NamedTuple):
    """One held-out wrong answer, and what a diagnosis of it must (and must not) say."""

    exercise: str  # the Spec's id
    mistake: str  # a short name, unique within the exercise
    fn: object  # the learner's function, with the exercise's signature
    want: str  # a regex that the diagnosis of a right verdict matches
    absent: str | None = None  # a regex that a misleading diagnosis would match
    flags: frozenset = frozenset()  # "rare", "hole"

    @property
    def id(self) -> str:
        return f"{self.exercise}/{self.mistake}"


def _w(exercise: str, mistake: str, fn: object, want: str, absent: str | None = None,
       *flags: str) -> Wrong:
    return Wrong(exercise, mistake, fn, want, absent, frozenset(flags))


def _softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def _causal(z):
    S = z.shape[-1]
    return np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, z)


# ------------------------------------------------------------------------ the rules: broadcast


def _bc_axes_swapped(dY, X):
    return (dY * X).sum(axis=1), (dY * X).sum(axis=0, keepdims=True)


def _bc_no_keepdims(dY, X):
    return (dY * X).sum(axis=0), (dY * X).sum(axis=1)


def _bc_da_without_x(dY, X):
    return dY.sum(axis=0), (dY * X).sum(axis=1, keepdims=True)


def _bc_da_mean(dY, X):
    return (dY * X).mean(axis=0), (dY * X).sum(axis=1, keepdims=True)


def _bc_product_of_sums(dY, X):
    return (dY * X).sum(axis=0), dY.sum(axis=1, keepdims=True) * X.sum(axis=1, keepdims=True)


def _bc_first_row(dY, X):
    return dY[0] * X[0], (dY * X).sum(axis=1, keepdims=True)


BROADCAST = [
    _w("broadcast_backward", "axes-swapped", _bc_axes_swapped, r"axis"),
    _w("broadcast_backward", "dc-keepdims", _bc_no_keepdims, r"keepdims|\(N, 1\)"),
    _w("broadcast_backward", "da-without-X", _bc_da_without_x, r"\bX\b|dY \* X"),
    _w("broadcast_backward", "da-mean", _bc_da_mean, r"mean|average|N = \d+"),
    _w("broadcast_backward", "dc-product-of-sums", _bc_product_of_sums,
       r"product|dY \* X|elementwise"),
    _w("broadcast_backward", "da-first-row", _bc_first_row,
       r"first row|only one row|sum over the (N )?rows|all rows|every row", r"mean|average"),
]


# ----------------------------------------------------------------------- the rules: the block


def _block_fwd(x, w, W, target, eps):
    var = (x**2).mean(axis=1, keepdims=True) + eps  # (N, 1)
    r = var**-0.5
    xhat = x * r
    u = xhat * w
    return var, r, xhat, u, u @ W - target


def _blk_de_one_over_n(x, w, W, target, eps):
    N, d = x.shape
    var, r, xhat, u, diff = _block_fwd(x, w, W, target, eps)
    de = np.full_like(diff, 1 / N)  # loss = e.sum() / (2 N)
    ddiff = de * 2 * diff
    dout = ddiff
    dW, du = u.T @ dout, dout @ W.T
    dw, dxhat = (du * xhat).sum(axis=0), du * w
    dr = (dxhat * x).sum(axis=1, keepdims=True)
    dvar = dr * -0.5 * var**-1.5
    dms = dvar
    dsq = np.broadcast_to(dms / d, x.shape).copy()
    return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dxhat * r + dsq * 2 * x


def _blk_dx_one_path(x, w, W, target, eps):
    N, d = x.shape
    var, r, xhat, u, diff = _block_fwd(x, w, W, target, eps)
    de = np.full_like(diff, 1 / (2 * N))
    ddiff = de * 2 * diff
    dout = ddiff
    dW, du = u.T @ dout, dout @ W.T
    dw, dxhat = (du * xhat).sum(axis=0), du * w
    dr = (dxhat * x).sum(axis=1, keepdims=True)
    dvar = dr * -0.5 * var**-1.5
    dms = dvar
    dsq = np.broadcast_to(dms / d, x.shape).copy()
    dx = dxhat * r
    return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dx


def _blk_dvar_power(x, w, W, target, eps):
    N, d = x.shape
    var, r, xhat, u, diff = _block_fwd(x, w, W, target, eps)
    de = np.full_like(diff, 1 / (2 * N))
    ddiff = de * 2 * diff
    dout = ddiff
    dW, du = u.T @ dout, dout @ W.T
    dw, dxhat = (du * xhat).sum(axis=0), du * w
    dr = (dxhat * x).sum(axis=1, keepdims=True)
    dvar = dr * -0.5 * var**-0.5
    dms = dvar
    dsq = np.broadcast_to(dms / d, x.shape).copy()
    return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dxhat * r + dsq * 2 * x


def _blk_dsq_no_mean(x, w, W, target, eps):
    N, d = x.shape
    var, r, xhat, u, diff = _block_fwd(x, w, W, target, eps)
    de = np.full_like(diff, 1 / (2 * N))
    ddiff = de * 2 * diff
    dout = ddiff
    dW, du = u.T @ dout, dout @ W.T
    dw, dxhat = (du * xhat).sum(axis=0), du * w
    dr = (dxhat * x).sum(axis=1, keepdims=True)
    dvar = dr * -0.5 * var**-1.5
    dms = dvar
    dsq = np.broadcast_to(dms, x.shape).copy()
    return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dxhat * r + dsq * 2 * x


def _blk_dW_transposed(x, w, W, target, eps):
    N, d = x.shape
    var, r, xhat, u, diff = _block_fwd(x, w, W, target, eps)
    de = np.full_like(diff, 1 / (2 * N))
    ddiff = de * 2 * diff
    dout = ddiff
    dW, du = dout.T @ u, dout @ W.T
    dw, dxhat = (du * xhat).sum(axis=0), du * w
    dr = (dxhat * x).sum(axis=1, keepdims=True)
    dvar = dr * -0.5 * var**-1.5
    dms = dvar
    dsq = np.broadcast_to(dms / d, x.shape).copy()
    return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dxhat * r + dsq * 2 * x


BLOCK = [
    _w("rules_block", "de-one-over-N", _blk_de_one_over_n,
       r"\bde\b.*(2|half)|1 ?/ ?\(2 ?\*? ?N\)|2N"),
    _w("rules_block", "dx-one-path", _blk_dx_one_path, r"dx.*(twice|both|path|dsq)|used twice"),
    _w("rules_block", "dvar-power", _blk_dvar_power, r"dvar|-1\.5|power|exponent"),
    _w("rules_block", "dsq-no-mean", _blk_dsq_no_mean, r"dsq.*(\bd\b|mean)|1 ?/ ?d|d = \d+"),
    _w("rules_block", "dW-transposed", _blk_dW_transposed, r"transpos"),
]


# --------------------------------------------------------------------- softmax cross-entropy


def _ce_axis0(logits, targets):
    N = len(targets)
    p = np.exp(logits - logits.max(axis=0))
    p = p / p.sum(axis=0)
    loss = -np.log(p[np.arange(N), targets]).mean()
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return loss, d / N


def _ce_column_index(logits, targets):
    N = len(targets)
    p = _softmax(logits)
    loss = -np.log(p[np.arange(N), targets]).mean()
    d = p.copy()
    d[:, targets] -= 1
    return loss, d / N


def _ce_float32(logits, targets):
    N = len(targets)
    p = _softmax(logits.astype(np.float32))
    loss = -np.log(p[np.arange(N), targets]).mean()
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return float(loss), (d / N).astype(logits.dtype)


def _ce_log_clip(logits, targets):
    N = len(targets)
    p = _softmax(logits)
    loss = -np.log(p[np.arange(N), targets] + 1e-12).mean()
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return loss, d / N


def _ce_global_max(logits, targets):
    N = len(targets)
    e = np.exp(logits - logits.max())
    p = e / e.sum(axis=-1, keepdims=True)
    loss = -np.log(p[np.arange(N), targets]).mean()
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return loss, d / N


def _ce_loss_by_v(logits, targets):
    N, V = logits.shape
    p = _softmax(logits)
    loss = -np.log(p[np.arange(N), targets]).sum() / V
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return loss, d / N


def _ce_no_mean_in_grad(logits, targets):
    N = len(targets)
    p = _softmax(logits)
    loss = -np.log(p[np.arange(N), targets]).mean()
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return loss, d


def _ce_mixed_shift(logits, targets):
    N = len(targets)
    z = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    loss = -(logits[np.arange(N), targets] - lse).mean()
    d = np.exp(z - lse[:, None])
    d[np.arange(N), targets] -= 1
    return loss, d / N


CE = [
    _w("softmax_cross_entropy", "softmax-axis-0", _ce_axis0, r"axis"),
    _w("softmax_cross_entropy", "column-index", _ce_column_index,
       r"each row's target|one-?hot|\[:, targets\]|column|rows, targets", r"sign"),
    _w("softmax_cross_entropy", "float32", _ce_float32, r"float32|precision"),
    _w("softmax_cross_entropy", "log-clip", _ce_log_clip,
       r"log.*(0|underflow)|log.?softmax|log-sum-exp|1e-12", None, "rare"),
    _w("softmax_cross_entropy", "global-max", _ce_global_max,
       r"each row's max|per row|row max", None,
       "rare"),
    _w("softmax_cross_entropy", "loss-by-V", _ce_loss_by_v, r"\bV\b"),
    _w("softmax_cross_entropy", "dlogits-no-mean", _ce_no_mean_in_grad, r"N = \d+|1 ?/ ?N|mean"),
    _w("softmax_cross_entropy", "loss-mixed-shift", _ce_mixed_shift,
       r"max|shift|log-sum-exp|logsumexp", r"dlogits"),
]


# ----------------------------------------------------------------------------- label smoothing


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _ls_v_minus_one(logits, targets, smoothing):
    N, V = logits.shape
    q = np.full((N, V), smoothing / (V - 1))
    q[np.arange(N), targets] = 1 - smoothing
    lp = _log_softmax(logits)
    return float(-(q * lp).sum() / N), (np.exp(lp) - q) / N


def _ls_target_forgets_share(logits, targets, smoothing):
    N, V = logits.shape
    q = np.full((N, V), smoothing / V)
    q[np.arange(N), targets] = 1 - smoothing
    lp = _log_softmax(logits)
    return float(-(q * lp).sum() / N), (np.exp(lp) - q) / N


def _ls_grad_onehot(logits, targets, smoothing):
    N, V = logits.shape
    onehot = np.eye(V)[targets]
    q = (1 - smoothing) * onehot + smoothing / V
    lp = _log_softmax(logits)
    return float(-(q * lp).sum() / N), ((np.exp(lp) - onehot) / N).astype(logits.dtype)


def _ls_off_not_divided(logits, targets, smoothing):
    N, V = logits.shape
    onehot = np.eye(V)[targets]
    q = (1 - smoothing) * onehot + smoothing
    lp = _log_softmax(logits)
    return float(-(q * lp).sum() / N), ((np.exp(lp) - q) / N).astype(logits.dtype)


def _ls_no_shift(logits, targets, smoothing):
    N, V = logits.shape
    onehot = np.eye(V)[targets]
    q = (1 - smoothing) * onehot + smoothing / V
    lp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return float(-(q * lp).sum() / N), ((np.exp(lp) - q) / N).astype(logits.dtype)


def _ls_sign(logits, targets, smoothing):
    N, V = logits.shape
    onehot = np.eye(V)[targets]
    q = (1 + smoothing) * onehot - smoothing / V
    lp = _log_softmax(logits)
    return float(-(q * lp).sum() / N), ((np.exp(lp) - q) / N).astype(logits.dtype)


SMOOTH = [
    _w("label_smoothing", "over-V-minus-1", _ls_v_minus_one, r"V ?- ?1|other tokens"),
    _w("label_smoothing", "target-forgets-share", _ls_target_forgets_share,
       r"at the target|1 - smoothing \+ smoothing ?/ ?V"),
    _w("label_smoothing", "grad-onehot", _ls_grad_onehot, r"dlogits.*(smooth|\bq\b)|one-?hot"),
    _w("label_smoothing", "share-not-divided", _ls_off_not_divided,
       r"smoothing ?/ ?V|not smoothing|sum to 1"),
    _w("label_smoothing", "no-max-shift", _ls_no_shift, r"max|[Oo]verflow", None, "rare"),
    _w("label_smoothing", "smoothing-sign", _ls_sign, r"sign|1 \+ smoothing|- smoothing ?/ ?V"),
]


# ------------------------------------------------------------------------------------ SwiGLU


def _swi_dx_gate_only(dout, x, w1, w3, w2):
    h1, h3 = x @ w1, x @ w3
    s = _sigmoid(h1)
    dha = dout @ w2.T
    dh1 = dha * h3 * s * (1 + h1 * (1 - s))
    dh3 = dha * h1 * s
    return dh1 @ w1.T, x.T @ dh1, x.T @ dh3, (h1 * s * h3).T @ dout


def _swi_dh3_no_gate(dout, x, w1, w3, w2):
    h1, h3 = x @ w1, x @ w3
    s = _sigmoid(h1)
    dha = dout @ w2.T
    dh1 = dha * h3 * s * (1 + h1 * (1 - s))
    dh3 = dha * h1
    return dh1 @ w1.T + dh3 @ w3.T, x.T @ dh1, x.T @ dh3, (h1 * s * h3).T @ dout


def _swi_dh1_no_up(dout, x, w1, w3, w2):
    h1, h3 = x @ w1, x @ w3
    s = _sigmoid(h1)
    dha = dout @ w2.T
    dh1 = dha * s * (1 + h1 * (1 - s))
    dh3 = dha * h1 * s
    return dh1 @ w1.T + dh3 @ w3.T, x.T @ dh1, x.T @ dh3, (h1 * s * h3).T @ dout


def _swi_sigmoid_grad(dout, x, w1, w3, w2):
    h1, h3 = x @ w1, x @ w3
    s = _sigmoid(h1)
    dha = dout @ w2.T
    dh1 = dha * h3 * s * (1 - s)
    dh3 = dha * h1 * s
    return dh1 @ w1.T + dh3 @ w3.T, x.T @ dh1, x.T @ dh3, (h1 * s * h3).T @ dout


def _swi_dw2_no_up(dout, x, w1, w3, w2):
    h1, h3 = x @ w1, x @ w3
    s = _sigmoid(h1)
    dha = dout @ w2.T
    dh1 = dha * h3 * s * (1 + h1 * (1 - s))
    dh3 = dha * h1 * s
    return dh1 @ w1.T + dh3 @ w3.T, x.T @ dh1, x.T @ dh3, (h1 * s).T @ dout


def _swi_no_transpose(dout, x, w1, w3, w2):
    h1, h3 = x @ w1, x @ w3
    s = _sigmoid(h1)
    dha = dout @ w2.T
    dh1 = dha * h3 * s * (1 + h1 * (1 - s))
    dh3 = dha * h1 * s
    return dh1 @ w1 + dh3 @ w3, x.T @ dh1, x.T @ dh3, (h1 * s * h3).T @ dout


SWIGLU = [
    _w("swiglu_backward", "dx-gate-path-only", _swi_dx_gate_only, r"w3|dx.*(path|both|sum)"),
    _w("swiglu_backward", "dh3-h1-not-silu", _swi_dh3_no_gate, r"silu\(h1\)|dh3.*(silu|gate)"),
    _w("swiglu_backward", "dh1-without-h3", _swi_dh1_no_up, r"\bh3\b"),
    _w("swiglu_backward", "sigmoid-derivative", _swi_sigmoid_grad,
       r"sigmoid'|derivative of (the )?sigmoid|sigmoid \* \(1 - sigmoid\)|silu'"),
    _w("swiglu_backward", "dw2-without-h3", _swi_dw2_no_up, r"\bh3\b", r"transpos"),
    _w("swiglu_backward", "dx-no-transpose", _swi_no_transpose, r"transpos|\.T\b|shape"),
]


def _silu_exp_ratio(z):
    s = np.exp(z) / (1 + np.exp(z))
    return s * (1 + z * (1 - s))


def _silu_sigmoid_derivative(z):
    s = _sigmoid(z)
    return s * (1 - s)


def _silu_dropped_factor(z):
    s = _sigmoid(z)
    return s + z * (1 - s)


def _silu_float32(z):
    s = _sigmoid(z.astype(np.float32))
    return (s * (1 + z * (1 - s))).astype(z.dtype)


def _silu_tanh_without_half(z):
    s = 0.5 * (1 + np.tanh(z))
    return s * (1 + z * (1 - s))


SILU = [
    _w("silu_grad", "exp-ratio-overflow", _silu_exp_ratio, r"[Oo]verflow|exp|NaN", None, "rare"),
    _w("silu_grad", "sigmoid-derivative", _silu_sigmoid_derivative,
       r"derivative of (the )?sigmoid|sigmoid'|sigmoid \* \(1 - sigmoid\)"),
    _w("silu_grad", "dropped-factor-s", _silu_dropped_factor,
       r"missing|term", r"derivative of (the )?sigmoid"),
    _w("silu_grad", "float32", _silu_float32, r"float32|precision"),
    _w("silu_grad", "tanh-without-half", _silu_tanh_without_half, r"z ?/ ?2|half|tanh"),
]


# ---------------------------------------------------------------------------------- GELU MLP


C_GELU = math.sqrt(2 / math.pi)


def _gelu_first_term_only(dout, x, w1, w2):
    h = x @ w1  # (N, f)
    t = np.tanh(C_GELU * (h + 0.044715 * h**3))
    dh = (dout @ w2.T) * 0.5 * (1 + t)
    return dh @ w1.T, x.T @ dh, (0.5 * h * (1 + t)).T @ dout


def _gelu_inner_no_three(dout, x, w1, w2):
    h = x @ w1
    t = np.tanh(C_GELU * (h + 0.044715 * h**3))
    dgelu = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * C_GELU * (1 + 0.044715 * h * h)
    dh = (dout @ w2.T) * dgelu
    return dh @ w1.T, x.T @ dh, (0.5 * h * (1 + t)).T @ dout


def _gelu_dw2_preactivation(dout, x, w1, w2):
    h = x @ w1
    t = np.tanh(C_GELU * (h + 0.044715 * h**3))
    dgelu = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * C_GELU * (1 + 3 * 0.044715 * h * h)
    dh = (dout @ w2.T) * dgelu
    return dh @ w1.T, x.T @ dh, h.T @ dout


def _gelu_erf_derivative(dout, x, w1, w2):
    h = x @ w1
    erf = np.vectorize(math.erf)
    dgelu = 0.5 * (1 + erf(h / math.sqrt(2))) + h * np.exp(-h * h / 2) / math.sqrt(2 * math.pi)
    dh = ((dout @ w2.T) * dgelu).astype(x.dtype)
    t = np.tanh(C_GELU * (h + 0.044715 * h**3))
    return dh @ w1.T, x.T @ dh, (0.5 * h * (1 + t)).T @ dout


def _gelu_dx_no_transpose(dout, x, w1, w2):
    h = x @ w1
    t = np.tanh(C_GELU * (h + 0.044715 * h**3))
    dgelu = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * C_GELU * (1 + 3 * 0.044715 * h * h)
    dh = (dout @ w2.T) * dgelu
    return dh @ w1, x.T @ dh, (0.5 * h * (1 + t)).T @ dout


GELU = [
    _w("gelu_mlp_backward", "first-term-only", _gelu_first_term_only,
       r"product rule|z \* tanh'|second term|term.*missing|only 0\.5 \(1 \+ tanh"),
    _w("gelu_mlp_backward", "inner-no-3", _gelu_inner_no_three, r"0\.044715|cubic|\b3\b"),
    _w("gelu_mlp_backward", "dw2-pre-activation", _gelu_dw2_preactivation,
       r"dw2.*(gelu|activation)|gelu\(h\)"),
    _w("gelu_mlp_backward", "erf-derivative", _gelu_erf_derivative, r"erf|exact|approximation"),
    _w("gelu_mlp_backward", "dx-no-transpose", _gelu_dx_no_transpose, r"transpos|shape"),
]


# ----------------------------------------------------------------------------------- RMSNorm


def _rms_no_keepdims(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    xhat = x * rstd
    g = dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1)), np.sum(dy * xhat, axis=0)


def _rms_dw_axis1(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat, g = x * rstd, dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), np.sum(dy * xhat, 1)


def _rms_dw_with_x(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat, g = x * rstd, dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), np.sum(dy * x, 0)


def _rms_dw_first_row(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat, g = x * rstd, dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), dy[0] * xhat[0]


def _rms_no_eps(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
    xhat, g = x * rstd, dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), np.sum(dy * xhat, 0)


def _rms_sum_not_mean(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat, g = x * rstd, dy * w
    return rstd * (g - xhat * np.sum(g * xhat, axis=-1, keepdims=True)), np.sum(dy * xhat, 0)


def _rms_float32(dy, x, w, eps):
    x32, dy32, w32 = x.astype(np.float32), dy.astype(np.float32), w.astype(np.float32)
    rstd = 1 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    xhat, g = x32 * rstd, dy32 * w32
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx.astype(x.dtype), np.sum(dy32 * xhat, 0).astype(x.dtype)


RMS = [
    _w("rmsnorm_backward", "rstd-keepdims", _rms_no_keepdims, r"keepdims|broadcast|\(N, 1\)"),
    _w("rmsnorm_backward", "dw-axis-1", _rms_dw_axis1, r"axis|dw.*(shape|positions)"),
    _w("rmsnorm_backward", "dw-with-x", _rms_dw_with_x, r"xhat|normali[sz]ed|rstd"),
    _w("rmsnorm_backward", "dw-first-row", _rms_dw_first_row,
       r"first (row|position)|only one (row|position)|every position|all positions|all rows",
       r"mean|average"),
    _w("rmsnorm_backward", "no-eps", _rms_no_eps, r"eps"),
    _w("rmsnorm_backward", "projection-sum", _rms_sum_not_mean, r"mean|d = \d+"),
    _w("rmsnorm_backward", "float32", _rms_float32, r"float32|precision"),
]


def _ln_no_mean_term(dy, x, w, b, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat, g = xc * rstd, dy * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), dy.sum(axis=0)


def _ln_unbiased(dy, x, w, b, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(np.var(x, axis=-1, ddof=1, keepdims=True) + eps)
    xhat, g = xc * rstd, dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), dy.sum(axis=0)


def _ln_db_axis1(dy, x, w, b, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat, g = xc * rstd, dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), dy.sum(axis=1)


def _ln_db_mean(dy, x, w, b, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat, g = xc * rstd, dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), dy.mean(axis=0)


def _ln_dw_with_x(dy, x, w, b, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat, g = xc * rstd, dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * x, axis=0), dy.sum(axis=0)


def _ln_var_uncentred(dy, x, w, b, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat, g = xc * rstd, dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), dy.sum(axis=0)


LAYERNORM = [
    _w("layernorm_backward", "no-mean-term", _ln_no_mean_term,
       r"mean\(g|mean of|cent(er|re)|\bmu\b"),
    _w("layernorm_backward", "unbiased-variance", _ln_unbiased, r"d ?- ?1|ddof|unbiased|biased"),
    _w("layernorm_backward", "db-axis-1", _ln_db_axis1, r"axis|\bdb\b"),
    _w("layernorm_backward", "db-mean", _ln_db_mean, r"db.*(mean|average|N = )"),
    _w("layernorm_backward", "dw-with-x", _ln_dw_with_x, r"xhat|normali[sz]ed"),
    _w("layernorm_backward", "variance-uncentred", _ln_var_uncentred,
       r"variance|x - mean|uncent|centred|centered"),
]


def _rms_dx(dy, x, w, eps):
    rstd = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat, g = x * rstd, dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), xhat


def _scale_no_gain(dy, x, w, eps):
    return np.sum(x * _rms_dx(dy, x, np.ones_like(w), eps)[0], axis=-1)


def _scale_axis0(dy, x, w, eps):
    return np.sum(x * _rms_dx(dy, x, w, eps)[0], axis=0)


def _scale_no_eps(dy, x, w, eps):
    return np.sum(x * _rms_dx(dy, x, w, 0.0)[0], axis=-1)


def _scale_xhat(dy, x, w, eps):
    dx, xhat = _rms_dx(dy, x, w, eps)
    return np.sum(xhat * dx, axis=-1)


def _scale_keepdims(dy, x, w, eps):
    return np.sum(x * _rms_dx(dy, x, w, eps)[0], axis=-1, keepdims=True)


SCALE = [
    _w("rmsnorm_scale_grad", "no-gain", _scale_no_gain, r"\bw\b|gain"),
    _w("rmsnorm_scale_grad", "axis-0", _scale_axis0, r"axis"),
    _w("rmsnorm_scale_grad", "no-eps", _scale_no_eps, r"eps|zero"),
    _w("rmsnorm_scale_grad", "xhat-for-x", _scale_xhat, r"xhat|rstd"),
    _w("rmsnorm_scale_grad", "keepdims", _scale_keepdims, r"keepdims|shape"),
]


# --------------------------------------------------------------------------------- attention


def _att_masks_diagonal(dout, q, k, v):
    S, hd = q.shape[-2:]
    z = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)
    z = np.where(np.triu(np.ones((S, S), dtype=bool), k=0), -np.inf, z)
    P = _softmax(z)
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout


def _att_no_max_shift(dout, q, k, v):
    hd = q.shape[-1]
    e = np.exp(_causal(q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)))
    P = e / e.sum(axis=-1, keepdims=True)
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout


def _att_dot_T(dout, q, k, v):
    hd = q.shape[-1]
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)))
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, P.T @ dout


def _att_times_sqrt(dout, q, k, v):
    hd = q.shape[-1]
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) * math.sqrt(hd)))
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) * math.sqrt(hd)
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout


def _att_rowsum_of_dP(dout, q, k, v):
    hd = q.shape[-1]
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)))
    dP = dout @ np.swapaxes(v, -1, -2)
    dS = P * (dP - np.sum(dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout


def _att_head0_copied(dout, q, k, v):
    hd = q.shape[-1]
    q0, k0, v0, do0 = q[:, :1], k[:, :1], v[:, :1], dout[:, :1]  # (B, 1, S, hd)
    P = _softmax(_causal(q0 @ np.swapaxes(k0, -1, -2) / math.sqrt(hd)))
    dP = do0 @ np.swapaxes(v0, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    grads = dS @ k0, np.swapaxes(dS, -1, -2) @ q0, np.swapaxes(P, -1, -2) @ do0
    return tuple(np.broadcast_to(g, q.shape).copy() for g in grads)


def _att_first_sequence_copied(dout, q, k, v):
    hd = q.shape[-1]
    q0, k0, v0, do0 = q[:1], k[:1], v[:1], dout[:1]  # (1, H, S, hd): the first sequence
    P = _softmax(_causal(q0 @ np.swapaxes(k0, -1, -2) / math.sqrt(hd)))
    dP = do0 @ np.swapaxes(v0, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    grads = dS @ k0, np.swapaxes(dS, -1, -2) @ q0, np.swapaxes(P, -1, -2) @ do0
    return tuple(np.broadcast_to(g, q.shape).copy() for g in grads)


ATTENTION = [
    _w("attention_backward", "mask-diagonal", _att_masks_diagonal, r"diagonal|mask"),
    _w("attention_backward", "no-max-shift", _att_no_max_shift, r"max|[Oo]verflow", None,
       "rare"),
    _w("attention_backward", "dot-T-on-4d", _att_dot_T, r"\.T\b|swapaxes|transpos|axes"),
    _w("attention_backward", "times-sqrt", _att_times_sqrt, r"sqrt|scale"),
    _w("attention_backward", "rowsum-of-dP", _att_rowsum_of_dP, r"P \* dP|row.?sum|Jacobian"),
    _w("attention_backward", "head-0-copied", _att_head0_copied, r"head", r"mask|leak"),
    _w("attention_backward", "first-sequence-copied", _att_first_sequence_copied,
       r"sequence|batch", r"mask|leak", "rare", "hole"),
]


def _bug_axis_no_keepdims(dout, q, k, v):
    hd = q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) * scale))
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dscores = P * (dP - np.sum(P * dP, axis=-1))  # the fix, but keepdims went missing
    return dscores @ k * scale, np.swapaxes(dscores, -1, -2) @ q * scale, dv


def _bug_wrong_line(dout, q, k, v):
    hd = q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) * scale))
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dscores = P * (dP - np.sum(P * dP, axis=-2, keepdims=True))
    return dscores @ k * scale, dscores @ q * scale, dv  # "fixed" dk instead


def _bug_sign(dout, q, k, v):
    hd = q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) * scale))
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    dscores = P * (dP + np.sum(P * dP, axis=-1, keepdims=True))
    return dscores @ k * scale, np.swapaxes(dscores, -1, -2) @ q * scale, dv


ATTENTION_BUG = [
    _w("attention_find_the_bug", "fix-drops-keepdims", _bug_axis_no_keepdims,
       r"keepdims|axis|row"),
    _w("attention_find_the_bug", "fixed-the-wrong-line", _bug_wrong_line,
       r"not fixed|still|axis|row sum"),
    _w("attention_find_the_bug", "fix-flips-sign", _bug_sign, r"sign"),
]


def _gqa_probs(q, ke):
    return _softmax(_causal(q @ np.swapaxes(ke, -1, -2) / math.sqrt(q.shape[-1])))


def _gqa_tile(dout, q, k, v):
    B, H, S, hd = q.shape
    G = k.shape[1]
    ke, ve = np.tile(k, (1, H // G, 1, 1)), np.tile(v, (1, H // G, 1, 1))
    P = _gqa_probs(q, ke)
    dP = dout @ np.swapaxes(ve, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    dke, dve = np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout
    return (dS @ ke, dke.reshape(B, H // G, G, S, hd).sum(axis=1),
            dve.reshape(B, H // G, G, S, hd).sum(axis=1))


def _gqa_mean(dout, q, k, v):
    B, H, S, hd = q.shape
    G = k.shape[1]
    ke, ve = np.repeat(k, H // G, axis=1), np.repeat(v, H // G, axis=1)
    P = _gqa_probs(q, ke)
    dP = dout @ np.swapaxes(ve, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    dke, dve = np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout
    return (dS @ ke, dke.reshape(B, G, H // G, S, hd).mean(axis=2),
            dve.reshape(B, G, H // G, S, hd).mean(axis=2))


def _gqa_first_of_group(dout, q, k, v):
    B, H, S, hd = q.shape
    G = k.shape[1]
    ke, ve = np.repeat(k, H // G, axis=1), np.repeat(v, H // G, axis=1)
    P = _gqa_probs(q, ke)
    dP = dout @ np.swapaxes(ve, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    dke, dve = np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout
    return dS @ ke, dke[:, :: H // G], dve[:, :: H // G]


def _gqa_no_scale(dout, q, k, v):
    B, H, S, hd = q.shape
    G = k.shape[1]
    ke, ve = np.repeat(k, H // G, axis=1), np.repeat(v, H // G, axis=1)
    P = _softmax(_causal(q @ np.swapaxes(ke, -1, -2)))
    dP = dout @ np.swapaxes(ve, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))
    dke, dve = np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout
    return (dS @ ke, dke.reshape(B, G, H // G, S, hd).sum(axis=2),
            dve.reshape(B, G, H // G, S, hd).sum(axis=2))


def _gqa_no_mask(dout, q, k, v):
    B, H, S, hd = q.shape
    G = k.shape[1]
    ke, ve = np.repeat(k, H // G, axis=1), np.repeat(v, H // G, axis=1)
    P = _softmax(q @ np.swapaxes(ke, -1, -2) / math.sqrt(hd))
    dP = dout @ np.swapaxes(ve, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    dke, dve = np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout
    return (dS @ ke, dke.reshape(B, G, H // G, S, hd).sum(axis=2),
            dve.reshape(B, G, H // G, S, hd).sum(axis=2))


def _gqa_first_sequence_copied(dout, q, k, v):
    B, H, S, hd = q.shape
    G = k.shape[1]
    q0, k0, v0, do0 = q[:1], k[:1], v[:1], dout[:1]  # the first sequence only
    ke, ve = np.repeat(k0, H // G, axis=1), np.repeat(v0, H // G, axis=1)
    P = _gqa_probs(q0, ke)
    dP = do0 @ np.swapaxes(ve, -1, -2)
    dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True)) / math.sqrt(hd)
    dke, dve = np.swapaxes(dS, -1, -2) @ q0, np.swapaxes(P, -1, -2) @ do0
    dk = dke.reshape(1, G, H // G, S, hd).sum(axis=2)
    dv = dve.reshape(1, G, H // G, S, hd).sum(axis=2)
    return tuple(np.broadcast_to(g, a.shape).copy() for g, a in ((dS @ ke, q), (dk, k), (dv, v)))


GQA = [
    _w("gqa_backward", "tile-not-repeat", _gqa_tile, r"repeat|tile|group|consecutive"),
    _w("gqa_backward", "group-mean", _gqa_mean, r"averag|mean", r"only one"),
    _w("gqa_backward", "first-of-group", _gqa_first_of_group,
       r"only one|one query head|first", r"average|mean"),
    _w("gqa_backward", "no-scale", _gqa_no_scale, r"sqrt|scale"),
    _w("gqa_backward", "no-causal-mask", _gqa_no_mask, r"mask|causal"),
    _w("gqa_backward", "first-sequence-copied", _gqa_first_sequence_copied, r"sequence|batch",
       r"mask|leak", "rare"),
]


CACHE = [
    _w("attention_cache_bytes", "triangle-without-diagonal",
       lambda B, H, S, hd, itemsize: B * H * (3 * S * hd + S * (S - 1) // 2) * itemsize,
       r"diagonal|S \(S \+ 1\)|S \+ 1"),
    _w("attention_cache_bytes", "k-and-v-only",
       lambda B, H, S, hd, itemsize: B * H * (2 * S * hd + S * (S + 1) // 2) * itemsize,
       r"\bq\b|3 S hd|three"),
    _w("attention_cache_bytes", "bits",
       lambda B, H, S, hd, itemsize: 8 * B * H * (3 * S * hd + S * (S + 1) // 2) * itemsize,
       r"bits|\b8\b"),
    _w("attention_cache_bytes", "no-batch",
       lambda B, H, S, hd, itemsize: H * (3 * S * hd + S * (S + 1) // 2) * itemsize,
       r"batch|\bB\b"),
    _w("attention_cache_bytes", "numbers-not-bytes",
       lambda B, H, S, hd, itemsize: B * H * (3 * S * hd + S * (S + 1) // 2),
       r"itemsize|bytes"),
]


# -------------------------------------------------------------------------------------- RoPE


def _rope_forward_again(du, cos, sin):
    out = np.empty_like(du)
    a, b = du[..., 0::2], du[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def _rope_halves(du, cos, sin):
    h = du.shape[-1] // 2
    a, b = du[..., :h], du[..., h:]
    return np.concatenate([a * cos + b * sin, -a * sin + b * cos], axis=-1).astype(du.dtype)


def _rope_second_sign(du, cos, sin):
    out = np.empty_like(du)
    a, b = du[..., 0::2], du[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * cos + b * sin, a * sin + b * cos
    return out


def _rope_positions_reversed(du, cos, sin):
    c, s = cos[::-1], sin[::-1]
    out = np.empty_like(du)
    a, b = du[..., 0::2], du[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * c + b * s, -a * s + b * c
    return out


def _rope_float32_tables(du, cos, sin):
    c, s = cos.astype(np.float32), sin.astype(np.float32)
    out = np.empty_like(du)
    a, b = du[..., 0::2], du[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * c + b * s, -a * s + b * c
    return out


ROPE = [
    _w("rope_backward", "forward-again", _rope_forward_again,
       r"wrong way|-angle|direction|transpose"),
    _w("rope_backward", "rotate-half-pairs", _rope_halves, r"rotate-half|u\[i \+ hd/2\]|halves"),
    _w("rope_backward", "second-sign", _rope_second_sign, r"sign"),
    _w("rope_backward", "positions-reversed", _rope_positions_reversed, r"position", r"sign"),
    _w("rope_backward", "float32-tables", _rope_float32_tables, r"float32|precision"),
]


def _half_interleaved(du, cos, sin):
    out = np.empty_like(du)
    a, b = du[..., 0::2], du[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a * cos + b * sin, -a * sin + b * cos
    return out


def _half_forward_again(du, cos, sin):
    h = du.shape[-1] // 2
    a, b = du[..., :h], du[..., h:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(du.dtype)


def _half_concat_swapped(du, cos, sin):
    h = du.shape[-1] // 2
    a, b = du[..., :h], du[..., h:]
    return np.concatenate([-a * sin + b * cos, a * cos + b * sin], axis=-1).astype(du.dtype)


HALF = [
    _w("rope_half_backward", "interleaved-pairs", _half_interleaved, r"interleav|neighbou?r|2i"),
    _w("rope_half_backward", "forward-again", _half_forward_again,
       r"wrong way|-angle|direction|sign"),
    _w("rope_half_backward", "halves-swapped", _half_concat_swapped, r"order|swap|concatenat"),
]


def _freq_dphi(du_out, v0, v1):
    return du_out[..., 1::2] * v0 - du_out[..., 0::2] * v1  # (..., S, hd/2)


def _freq_rotated(u, omega, t):
    ang = t[:, None] * omega[None, :]  # (S, hd/2)
    a, b = u[..., 0::2], u[..., 1::2]
    return a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)


def _freq_no_t(du_out, u, omega):
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(S, dtype=np.float64)
    dphi = _freq_dphi(du_out, *_freq_rotated(u, omega, t))
    return dphi.reshape(-1, S, h).sum(axis=(0, 1))


def _freq_from_one(du_out, u, omega):
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(1, S + 1, dtype=np.float64)
    dphi = _freq_dphi(du_out, *_freq_rotated(u, omega, t))
    return (t[:, None] * dphi.reshape(-1, S, h).sum(axis=0)).sum(axis=0)


def _freq_unrotated(du_out, u, omega):
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(S, dtype=np.float64)
    dphi = _freq_dphi(du_out, u[..., 0::2], u[..., 1::2])
    return (t[:, None] * dphi.reshape(-1, S, h).sum(axis=0)).sum(axis=0)


def _freq_sign(du_out, u, omega):
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(S, dtype=np.float64)
    v0, v1 = _freq_rotated(u, omega, t)
    dphi = du_out[..., 0::2] * v1 - du_out[..., 1::2] * v0
    return (t[:, None] * dphi.reshape(-1, S, h).sum(axis=0)).sum(axis=0)


def _freq_first_row(du_out, u, omega):
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(S, dtype=np.float64)
    dphi = _freq_dphi(du_out, *_freq_rotated(u, omega, t))
    return (t[:, None] * dphi.reshape(-1, S, h)[0]).sum(axis=0)


FREQ = [
    _w("rope_freq_grad", "no-factor-t", _freq_no_t, r"factor t|\bt\b"),
    _w("rope_freq_grad", "positions-from-1", _freq_from_one,
       r"position|start|t ?\+ ?1|off by one|0-based"),
    _w("rope_freq_grad", "unrotated-u", _freq_unrotated, r"u'|rope\(u\)|rotated pair|rotated u"),
    _w("rope_freq_grad", "quarter-turn-sign", _freq_sign, r"sign"),
    _w("rope_freq_grad", "first-leading-row", _freq_first_row,
       r"batch|leading|every row|rows of", r"factor t"),
]


def _perm_one_head(hd):
    h = hd // 2
    return np.stack([np.arange(h), np.arange(h) + h], axis=-1).reshape(-1)  # (hd,)


def _perm_tiled(n_heads, head_dim):
    return np.tile(_perm_one_head(head_dim), n_heads)


def _perm_pairs_swapped(n_heads, head_dim):
    h = head_dim // 2
    one = np.stack([np.arange(h) + h, np.arange(h)], axis=-1).reshape(-1)
    return (one[None, :] + head_dim * np.arange(n_heads)[:, None]).reshape(-1)


def _perm_offset_by_h(n_heads, head_dim):
    one = _perm_one_head(head_dim)
    return (one[None, :] + (head_dim // 2) * np.arange(n_heads)[:, None]).reshape(-1)


def _perm_float(n_heads, head_dim):
    one = _perm_one_head(head_dim).astype(float)
    return (one[None, :] + head_dim * np.arange(n_heads)[:, None]).reshape(-1)


PERM = [
    _w("rope_permutation", "one-head-tiled", _perm_tiled, r"head|offset"),
    _w("rope_permutation", "pair-order", _perm_pairs_swapped, r"swap|pair|2i"),
    _w("rope_permutation", "head-offset-half", _perm_offset_by_h, r"head|offset"),
    _w("rope_permutation", "float-indices", _perm_float, r"int|dtype"),
]


# --------------------------------------------------------------------------------- embedding


def _scatter(x, dh, V):
    dwte = np.zeros((V, dh.shape[-1]), dtype=dh.dtype)  # (V, d)
    np.add.at(dwte, x.reshape(-1), dh.reshape(-1, dh.shape[-1]))
    return dwte


def _emb_assign(x, dh, vocab_size):
    dwte = np.zeros((vocab_size, dh.shape[-1]), dtype=dh.dtype)
    dwte[x.reshape(-1)] = dh.reshape(-1, dh.shape[-1])
    return dwte


def _emb_rows_seen(x, dh, vocab_size):
    dwte = np.zeros((x.max() + 1, dh.shape[-1]), dtype=dh.dtype)
    np.add.at(dwte, x.reshape(-1), dh.reshape(-1, dh.shape[-1]))
    return dwte


def _emb_mean_per_token(x, dh, vocab_size):
    dwte = _scatter(x, dh, vocab_size)
    counts = np.bincount(x.reshape(-1), minlength=vocab_size)
    return (dwte / np.maximum(counts, 1)[:, None]).astype(dh.dtype)


def _emb_first_sequence(x, dh, vocab_size):
    dwte = np.zeros((vocab_size, dh.shape[-1]), dtype=dh.dtype)
    np.add.at(dwte, x[0], dh[0])
    return dwte


def _emb_float64(x, dh, vocab_size):
    dwte = np.zeros((vocab_size, dh.shape[-1]))
    np.add.at(dwte, x.reshape(-1), dh.reshape(-1, dh.shape[-1]))
    return dwte


def _emb_ones(x, dh, vocab_size):
    dwte = np.ones((vocab_size, dh.shape[-1]), dtype=dh.dtype)
    np.add.at(dwte, x.reshape(-1), dh.reshape(-1, dh.shape[-1]))
    return dwte


EMBEDDING = [
    _w("embedding_backward", "assign-not-add", _emb_assign, r"repeat|add\.at|assign|\+=|add"),
    _w("embedding_backward", "rows-seen-only", _emb_rows_seen, r"vocab_size|shape|rows", None,
       "rare"),
    _w("embedding_backward", "mean-per-token", _emb_mean_per_token, r"count|mean|average|repeat"),
    _w("embedding_backward", "first-sequence", _emb_first_sequence, r"sequence|batch|first",
       r"overwrite"),
    _w("embedding_backward", "float64-table", _emb_float64, r"dtype|float32", None, "rare"),
    _w("embedding_backward", "ones-not-zeros", _emb_ones, r"ones|zeros|initiali|unused"),
]


TIED = [
    _w("tied_wte_grad", "no-head-term",
       lambda x, dh, dlogits, xf, vocab_size: _scatter(x, dh, vocab_size),
       r"head|dlogits|tied|both"),
    _w("tied_wte_grad", "head-transposed",
       lambda x, dh, dlogits, xf, vocab_size: _scatter(x, dh, vocab_size) + xf.T @ dlogits,
       r"transpos|dlogits\.T"),
    _w("tied_wte_grad", "assign-not-add",
       lambda x, dh, dlogits, xf, vocab_size: _emb_assign(x, dh, vocab_size) + dlogits.T @ xf,
       r"repeat|add\.at|assign|\+=|add"),
    _w("tied_wte_grad", "head-term-mean",
       lambda x, dh, dlogits, xf, vocab_size: _scatter(x, dh, vocab_size)
       + dlogits.T @ xf / len(xf), r"N = \d+|mean|averag", r"repeat|scatter"),
    _w("tied_wte_grad", "head-term-only",
       lambda x, dh, dlogits, xf, vocab_size: dlogits.T @ xf,
       r"embedding|scatter|gather|input|both"),
]


def _pos_table_of_s(x, dh, vocab_size, block_size):
    return _scatter(x, dh, vocab_size), dh.sum(axis=0)  # (S, d)


def _pos_axis1(x, dh, vocab_size, block_size):
    return _scatter(x, dh, vocab_size), dh.sum(axis=1)


def _pos_right_aligned(x, dh, vocab_size, block_size):
    dwpe = np.zeros((block_size, dh.shape[-1]), dtype=dh.dtype)
    dwpe[block_size - x.shape[1]:] = dh.sum(axis=0)
    return _scatter(x, dh, vocab_size), dwpe


def _pos_assign(x, dh, vocab_size, block_size):
    dwpe = np.zeros((block_size, dh.shape[-1]), dtype=dh.dtype)
    dwpe[: x.shape[1]] = dh.sum(axis=0)
    return _emb_assign(x, dh, vocab_size), dwpe


def _pos_first_sequence(x, dh, vocab_size, block_size):
    dwpe = np.zeros((block_size, dh.shape[-1]), dtype=dh.dtype)
    dwpe[: x.shape[1]] = dh[0]
    return _scatter(x, dh, vocab_size), dwpe


POSITION = [
    _w("position_embedding_backward", "table-of-S-rows", _pos_table_of_s,
       r"block_size|rows|shape", None, "rare"),
    _w("position_embedding_backward", "sum-axis-1", _pos_axis1, r"axis|batch"),
    _w("position_embedding_backward", "right-aligned", _pos_right_aligned,
       r"position|rows past|first S|:S", r"batch", "rare"),
    _w("position_embedding_backward", "assign-not-add", _pos_assign,
       r"repeat|add\.at|assign|\+=|add"),
    _w("position_embedding_backward", "first-sequence", _pos_first_sequence,
       r"first sequence|batch|sequences"),
]


# ------------------------------------------------------------------------ the whole backward


def _lin_dW_mean(dY, X, W):
    return dY @ W.T, X.T @ dY / len(X)


def _lin_dW_no_transpose(dY, X, W):
    return dY @ W.T, X @ dY


def _lin_dW_outer_of_sums(dY, X, W):
    return dY @ W.T, np.outer(X.sum(axis=0), dY.sum(axis=0))


def _lin_float32(dY, X, W):
    return dY @ W.T, (X.T.astype(np.float32) @ dY.astype(np.float32)).astype(X.dtype)


def _lin_dX_sign(dY, X, W):
    return -dY @ W.T, X.T @ dY


LINEAR = [
    _w("linear_backward", "dW-mean", _lin_dW_mean, r"N = \d+|mean"),
    _w("linear_backward", "dW-no-transpose", _lin_dW_no_transpose, r"transpos|X\.T"),
    _w("linear_backward", "dW-outer-of-sums", _lin_dW_outer_of_sums,
       r"product|X\.T @ dY|positions", r"transpos"),
    _w("linear_backward", "dW-float32", _lin_float32, r"float32|precision"),
    _w("linear_backward", "dX-sign", _lin_dX_sign, r"sign"),
]


def _res_no_gain(dout, h, w, W, alpha, eps):
    rstd = 1 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    xhat = h * rstd
    dW = (xhat * w).T @ (alpha * dout)
    dxn = alpha * dout @ W.T
    g = dxn  # forgot: xn = xhat * w, so g = dxn * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dout + dx, np.sum(dxn * xhat, axis=0), dW


def _res_dw_without_alpha(dout, h, w, W, alpha, eps):
    rstd = 1 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    xhat = h * rstd
    dW = (xhat * w).T @ (alpha * dout)
    dxn = alpha * dout @ W.T
    g = dxn * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dout + dx, np.sum((dout @ W.T) * xhat, axis=0), dW


def _res_dW_xhat(dout, h, w, W, alpha, eps):
    rstd = 1 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    xhat = h * rstd
    dW = xhat.T @ (alpha * dout)
    dxn = alpha * dout @ W.T
    g = dxn * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dout + dx, np.sum(dxn * xhat, axis=0), dW


def _res_eps_outside(dout, h, w, W, alpha, eps):
    rstd = 1 / (np.sqrt(np.mean(h * h, axis=-1, keepdims=True)) + eps)
    xhat = h * rstd
    dW = (xhat * w).T @ (alpha * dout)
    dxn = alpha * dout @ W.T
    g = dxn * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dout + dx, np.sum(dxn * xhat, axis=0), dW


def _res_dW_transposed(dout, h, w, W, alpha, eps):
    rstd = 1 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    xhat = h * rstd
    dW = (alpha * dout).T @ (xhat * w)  # (d, d): square, so no shape error
    dxn = alpha * dout @ W.T
    g = dxn * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dout + dx, np.sum(dxn * xhat, axis=0), dW


RESIDUAL = [
    _w("residual_scale_backward", "rms-no-gain", _res_no_gain, r"\bw\b|gain"),
    _w("residual_scale_backward", "dw-without-alpha", _res_dw_without_alpha, r"dw.*alpha|alpha"),
    _w("residual_scale_backward", "dW-with-xhat", _res_dW_xhat, r"dW.*\bw\b|xn|xhat"),
    _w("residual_scale_backward", "eps-outside-sqrt", _res_eps_outside, r"eps", r"alpha"),
    _w("residual_scale_backward", "dW-transposed", _res_dW_transposed, r"transpos"),
]


def _stack_layer(dh, x, w, W, eps):
    """One layer's (dx through the branch, dw, dW), right."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    dxn = dh @ W.T
    g = dxn * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dxn * xhat, axis=0), (xhat * w).T @ dh


def _stack_inputs(h, w, W, eps):
    hs = [h]
    for l in range(w.shape[0]):
        x = hs[-1]
        xhat = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        hs.append(x + (xhat * w[l]) @ W[l])
    return hs


def _stack_adds_dout(dout, h, w, W, eps):
    hs = _stack_inputs(h, w, W, eps)
    dw, dW, dh = np.zeros_like(w), np.zeros_like(W), dout
    for l in reversed(range(w.shape[0])):
        dx, dw[l], dW[l] = _stack_layer(dh, hs[l], w[l], W[l], eps)
        dh = dout + dx  # the fix adds the top gradient, not this layer's
    return dh, dw, dW


def _stack_forward_order(dout, h, w, W, eps):
    hs = _stack_inputs(h, w, W, eps)
    dw, dW, dh = np.zeros_like(w), np.zeros_like(W), dout
    for l in range(w.shape[0]):
        dx, dw[l], dW[l] = _stack_layer(dh, hs[l], w[l], W[l], eps)
        dh = dh + dx
    return dh, dw, dW


def _stack_residual_twice(dout, h, w, W, eps):
    hs = _stack_inputs(h, w, W, eps)
    dw, dW, dh = np.zeros_like(w), np.zeros_like(W), dout
    for l in reversed(range(w.shape[0])):
        dx, dw[l], dW[l] = _stack_layer(dh, hs[l], w[l], W[l], eps)
        dh = 2 * dh + dx
    return dh, dw, dW


STACK_BUG = [
    _w("backward_find_the_bug", "adds-dout", _stack_adds_dout, r"dout|residual|top gradient"),
    _w("backward_find_the_bug", "forward-order", _stack_forward_order,
       r"order|revers|last layer first"),
    _w("backward_find_the_bug", "residual-twice", _stack_residual_twice,
       r"twice|\b2\b|residual"),
]


def _cross_minus(a, c, B, H, itemsize):
    b = B * H * itemsize
    return (a + math.sqrt(abs(a * a - 4 * b * c))) / (2 * b)


def _cross_itemsize_twice(a, c, B, H, itemsize):
    b = B * H * itemsize * itemsize
    return (a + math.sqrt(a * a + 4 * b * c)) / (2 * b)


def _cross_linear(a, c, B, H, itemsize):
    return (c + a) / (B * H * itemsize)


def _cross_ceil(a, c, B, H, itemsize):
    b = B * H * itemsize
    return float(math.ceil((a + math.sqrt(a * a + 4 * b * c)) / (2 * b)))


def _cross_no_a(a, c, B, H, itemsize):
    return math.sqrt(c / (B * H * itemsize))


CROSSOVER = [
    _w("attention_crossover", "discriminant-sign", _cross_minus, r"sign|discriminant|4 b c"),
    _w("attention_crossover", "itemsize-twice", _cross_itemsize_twice, r"itemsize"),
    _w("attention_crossover", "linear-not-quadratic", _cross_linear, r"quadratic|S\*\*2|square"),
    _w("attention_crossover", "rounded-up", _cross_ceil, r"round|ceil|integer"),
    _w("attention_crossover", "no-a-term", _cross_no_a, r"\ba\b|a S|linear term"),
]




# ---------------------------------------------------------------------------------- capstone
# The learner's my_layer_backward runs the forward the chapter gives (`layer_steps`) and goes
# back through its 36 steps, in four stages; each wrong answer below reuses the learner's
# right stages and writes the stage that holds its mistake out again, with the mistake in it.


def _cap_ffn(t, w1, w3, w2, g2, dy, eps):
    """Steps 36 to 25: df ... dh1."""
    d = dy.shape[1]
    df = dy
    dgg, dw2 = df @ w2.T, t["gg"].T @ df
    dsu, dgt = dgg * t["gt"], dgg * t["su"]
    dsg = dsu * t["u"]
    du = dsu * t["sg"] + dsg * t["sg"] * (1 - t["sg"])
    dw1, dw3 = t["x2"].T @ du, t["x2"].T @ dgt
    dx2 = du @ w1.T + dgt @ w3.T
    dg2, dhn2 = (dx2 * t["hn2"]).sum(axis=0), dx2 * g2
    dr2 = (dhn2 * t["h1"]).sum(axis=1, keepdims=True)
    dms2 = dr2 * -0.5 * (t["ms2"] + eps) ** -1.5
    dsq2 = np.ones_like(t["sq2"]) * dms2 / d
    dh1 = dy + dhn2 * t["r2"] + dsq2 * 2 * t["h1"]
    return [df, dgg, dw2, dsu, dgt, dsg, du, dw1, dw3, dx2, dg2, dhn2, dr2, dms2, dsq2, dh1]


def _cap_attention(t, dh1, wo):
    """Steps 24 to 21: do, da, dwo, dp, dv, dden."""
    do = dh1
    da, dwo = do @ wo.T, t["a"].T @ do
    dp, dv = da @ t["v"].T, t["p"].T @ da
    dden = (-dp * t["e"] / t["den"] ** 2).sum(axis=1, keepdims=True)
    return [do, da, dwo, dp, dv, dden]


def _cap_scores(t, dp, dden):
    """Steps 21 to 10: de ... dk0."""
    from xenith_edu.exercises.capstone import pairswap  # given with the forward

    S, d = t["q"].shape
    de = dp / t["den"] + dden
    dzs = de * t["e"]
    dm = -dzs.sum(axis=1, keepdims=True)
    dzm = dzs.copy()
    dzm[np.arange(S), t["zm"].argmax(axis=1)] += dm[:, 0]
    dz = np.where(np.tril(np.ones((S, S), dtype=bool)), dzm, 0).astype(dzm.dtype)
    ds = dz / math.sqrt(d)
    C, Sn = np.repeat(t["cos"], 2, axis=1), np.repeat(t["sin"], 2, axis=1)  # (S, d)
    dq, dk = ds @ t["k"], ds.T @ t["q"]
    dq0s, dk0s = dq * Sn, dk * Sn
    return [de, dzs, dm, dzm, dz, ds, dq, dk, dq0s, dq * C - pairswap(dq0s), dk0s,
            dk * C - pairswap(dk0s)]


def _cap_bottom(t, g, tokens, wte, g1, wq, wk, wv, eps):
    """Steps 9 to 1: dwq ... dwte."""
    h = t["h"]
    d = h.shape[1]
    dwq, dwk, dwv = t["x1"].T @ g["dq0"], t["x1"].T @ g["dk0"], t["x1"].T @ g["dv"]
    dx1 = g["dq0"] @ wq.T + g["dk0"] @ wk.T + g["dv"] @ wv.T
    dg1, dhn1 = (dx1 * t["hn1"]).sum(axis=0), dx1 * g1
    dr1 = (dhn1 * h).sum(axis=1, keepdims=True)
    dms1 = dr1 * -0.5 * (t["ms1"] + eps) ** -1.5
    dsq1 = np.ones_like(h) * dms1 / d
    dh = g["dh1"] + dhn1 * t["r1"] + dsq1 * 2 * h
    dwte = np.zeros_like(wte)
    np.add.at(dwte, tokens, dh)
    return [dwq, dwk, dwv, dx1, dg1, dhn1, dr1, dms1, dsq1, dh, dwte]


_CAP_NAMES = ("df dgg dw2 dsu dgt dsg du dw1 dw3 dx2 dg2 dhn2 dr2 dms2 dsq2 dh1 do da dwo dp dv "
              "dden de dzs dm dzm dz ds dq dk dq0s dq0 dk0s dk0 dwq dwk dwv dx1 dg1 dhn1 dr1 "
              "dms1 dsq1 dh dwte").split()


def _cap_layer(args, ffn=_cap_ffn, attention=_cap_attention, scores=_cap_scores,
               bottom=_cap_bottom):
    """The learner's my_layer_backward, from its four stages."""
    from xenith_edu.exercises.capstone import layer_steps  # the forward the chapter gives

    tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps = args
    t = layer_steps(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, eps)
    t = {**t, "cos": cos, "sin": sin}
    g = dict(zip(_CAP_NAMES[:16], ffn(t, w1, w3, w2, g2, dy, eps), strict=True))
    g.update(zip(_CAP_NAMES[16:22], attention(t, g["dh1"], wo), strict=True))
    g.update(zip(_CAP_NAMES[22:34], scores(t, g["dp"], g["dden"]), strict=True))
    g.update(zip(_CAP_NAMES[34:], bottom(t, g, tokens, wte, g1, wq, wk, wv, eps), strict=True))
    return tuple(g[name] for name in _CAP_NAMES)


def _cap_ffn_dr2_keepdims(t, w1, w3, w2, g2, dy, eps):
    d = dy.shape[1]
    first = _cap_ffn(t, w1, w3, w2, g2, dy, eps)[:12]  # df ... dhn2, right
    dhn2 = first[-1]
    dr2 = (dhn2 * t["h1"]).sum(axis=1)  # (S,): keepdims forgotten
    dms2 = dr2 * -0.5 * (t["ms2"] + eps) ** -1.5
    dsq2 = np.ones_like(t["sq2"]) * dms2 / d
    dh1 = dy + dhn2 * t["r2"] + dsq2 * 2 * t["h1"]
    return first + [dr2, dms2, dsq2, dh1]


def _cap_attention_dv_untransposed(t, dh1, wo):
    do = dh1
    da, dwo = do @ wo.T, t["a"].T @ do
    dp, dv = da @ t["v"].T, t["p"] @ da
    dden = (-dp * t["e"] / t["den"] ** 2).sum(axis=1, keepdims=True)
    return [do, da, dwo, dp, dv, dden]


def _cap_attention_dden_sign(t, dh1, wo):
    do = dh1
    da, dwo = do @ wo.T, t["a"].T @ do
    dp, dv = da @ t["v"].T, t["p"].T @ da
    dden = (dp * t["e"] / t["den"] ** 2).sum(axis=1, keepdims=True)
    return [do, da, dwo, dp, dv, dden]


def _cap_scores_times_sqrt(t, dp, dden):
    right = _cap_scores(t, dp, dden)
    d = t["q"].shape[1]
    ds = right[4] * math.sqrt(d)  # s * (1 / sqrt(d)) read as s / (1 / sqrt(d))
    return right[:5] + _cap_scores_from_ds(t, ds)


def _cap_scores_from_ds(t, ds):
    from xenith_edu.exercises.capstone import pairswap

    C, Sn = np.repeat(t["cos"], 2, axis=1), np.repeat(t["sin"], 2, axis=1)
    dq, dk = ds @ t["k"], ds.T @ t["q"]
    dq0s, dk0s = dq * Sn, dk * Sn
    return [ds, dq, dk, dq0s, dq * C - pairswap(dq0s), dk0s, dk * C - pairswap(dk0s)]


def _cap_bottom_dg1_axis(t, g, tokens, wte, g1, wq, wk, wv, eps):
    right = _cap_bottom(t, g, tokens, wte, g1, wq, wk, wv, eps)
    dx1 = right[3]
    return right[:4] + [(dx1 * t["hn1"]).sum(axis=1)] + right[5:]


def _cap_bottom_dms1_power(t, g, tokens, wte, g1, wq, wk, wv, eps):
    h = t["h"]
    d = h.shape[1]
    right = _cap_bottom(t, g, tokens, wte, g1, wq, wk, wv, eps)
    dhn1, dr1 = right[5], right[6]
    dms1 = dr1 * -0.5 * (t["ms1"] + eps) ** -0.5
    dsq1 = np.ones_like(h) * dms1 / d
    dh = g["dh1"] + dhn1 * t["r1"] + dsq1 * 2 * h
    dwte = np.zeros_like(wte)
    np.add.at(dwte, tokens, dh)
    return right[:7] + [dms1, dsq1, dh, dwte]


def _capstone(**stages):
    def my_layer_backward(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps):
        args = (tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps)
        return _cap_layer(args, **stages)
    return my_layer_backward


CAPSTONE = [
    _w("capstone_layer", "dr2-keepdims", _capstone(ffn=_cap_ffn_dr2_keepdims),
       r"keepdims|dr2|\(S, 1\)"),
    _w("capstone_layer", "dv-untransposed", _capstone(attention=_cap_attention_dv_untransposed),
       r"\bdv\b.*(transpos|p\.T)"),
    _w("capstone_layer", "dden-sign", _capstone(attention=_cap_attention_dden_sign),
       r"dden.*(sign|minus|-dp)"),
    _w("capstone_layer", "ds-times-sqrt-d", _capstone(scores=_cap_scores_times_sqrt),
       r"\bds\b.*(scale|sqrt)"),
    _w("capstone_layer", "dg1-axis-1", _capstone(bottom=_cap_bottom_dg1_axis),
       r"dg1.*(axis|rows|shape)"),
    _w("capstone_layer", "dms1-power", _capstone(bottom=_cap_bottom_dms1_power),
       r"dms1.*(-1\.5|power|derivative)"),
]


# ---------------------------------------------------------------------------------- training


def _aw_v_uncorrected(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1**t)
    p = p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v) + eps)
    return p, m, v


def _aw_decay_after(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p * (1 - lr * weight_decay), m, v


def _aw_betas_swapped(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta2 * m + (1 - beta2) * g
    v = beta1 * v + (1 - beta1) * g * g
    m_hat, v_hat = m / (1 - beta2**t), v / (1 - beta1**t)
    return p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _aw_t_minus_one(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** (t - 1)), v / (1 - beta2 ** (t - 1))
    return p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _aw_no_sqrt(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return p * (1 - lr * weight_decay) - lr * m_hat / (v_hat + eps), m, v


def _aw_old_moments(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m_new / (1 - beta1**t), v_new / (1 - beta2**t)
    return p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


ADAMW = [
    _w("adamw_update", "v-uncorrected", _aw_v_uncorrected, r"v_hat|v is not|second moment"),
    _w("adamw_update", "decay-after-step", _aw_decay_after,
       r"order|before|after the step|decayed p", r"missing"),
    _w("adamw_update", "betas-swapped", _aw_betas_swapped, r"beta1|beta2|swap"),
    _w("adamw_update", "t-minus-1", _aw_t_minus_one, r"t ?- ?1|1-based|0-based"),
    _w("adamw_update", "no-sqrt", _aw_no_sqrt, r"sqrt"),
    _w("adamw_update", "old-moments-returned", _aw_old_moments,
       r"old|updated|new m|moments? (are|is) not", r"bias correction"),
]


def _lr_warmup_inclusive(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step <= warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def _lr_full_cosine(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (1 + math.cos(2 * math.pi * progress)) * (max_lr - min_lr)


def _lr_progress_over_decay(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / decay_steps
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def _lr_warmup_plus_one(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def _lr_min_max_swapped(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return max_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (min_lr - max_lr)


LR = [
    _w("lr_schedule", "warmup-inclusive", _lr_warmup_inclusive,
       r"boundary|<=|off by one|step == warmup|at step warmup"),
    _w("lr_schedule", "full-cosine", _lr_full_cosine,
       r"half (a )?cos|2 ?\*? ?pi|full (cosine|period)"),
    _w("lr_schedule", "progress-over-decay-steps", _lr_progress_over_decay,
       r"progress|decay_steps - warmup_steps"),
    _w("lr_schedule", "warmup-over-w-plus-1", _lr_warmup_plus_one,
       r"warmup_steps \+ 1|divid|off by one", r"cosine|decay"),
    _w("lr_schedule", "min-max-swapped", _lr_min_max_swapped, r"min_lr|max_lr|swap|direction"),
]


def _l2_decoupled(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _l2_half(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    g = g + 0.5 * weight_decay * p  # the loss has (weight_decay / 2) * p**2
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _l2_v_raw(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    gl = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * gl
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _l2_sign(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    g = g - weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


ADAM_L2 = [
    _w("adam_l2_update", "decoupled", _l2_decoupled, r"AdamW|decoupl|through the gradient|L2"),
    _w("adam_l2_update", "half-decay", _l2_half, r"weight_decay|\b2\b|half|0\.5"),
    _w("adam_l2_update", "v-without-l2", _l2_v_raw, r"\bv\b|second moment"),
    _w("adam_l2_update", "l2-sign", _l2_sign, r"sign"),
]


# ------------------------------------------------------------------------------------ memory


def _rowsum_float32(dout, out):
    return np.sum((dout * out).astype(np.float32), axis=-1).astype(out.dtype)


def _merge_exp_inverted(m1, sigma1, o1, m2, sigma2, o2):
    m = np.maximum(m1, m2)
    w1, w2 = sigma1 * np.exp(m - m1), sigma2 * np.exp(m - m2)
    return m, w1 + w2, (w1[:, None] * o1 + w2[:, None] * o2) / (w1 + w2)[:, None]


def _merge_sigma_not_rescaled(m1, sigma1, o1, m2, sigma2, o2):
    m = np.maximum(m1, m2)
    w1, w2 = sigma1 * np.exp(m1 - m), sigma2 * np.exp(m2 - m)
    return m, sigma1 + sigma2, (w1[:, None] * o1 + w2[:, None] * o2) / (w1 + w2)[:, None]


def _merge_no_weights(m1, sigma1, o1, m2, sigma2, o2):
    m = np.maximum(m1, m2)
    w1, w2 = sigma1 * np.exp(m1 - m), sigma2 * np.exp(m2 - m)
    return m, w1 + w2, (o1 + o2) / 2


MEMORY = [
    _w("softmax_rowsum", "float32", _rowsum_float32, r"float32|precision"),
    _w("softmax_rowsum", "product-of-sums", lambda dout, out: dout.sum(-1) * out.sum(-1),
       r"product|dout \* out|elementwise"),
    _w("softmax_rowsum", "matrix-row-sum",
       lambda dout, out: np.sum(dout @ np.swapaxes(out, -1, -2), axis=-1),
       r"diagonal|same position|only its own"),
    _w("softmax_merge", "exp-inverted", _merge_exp_inverted, r"exp\(m. - m\)|rescal|sign|max"),
    _w("softmax_merge", "sigma-not-rescaled", _merge_sigma_not_rescaled,
       r"sigma.*(rescal|exp)|exp\(m"),
    _w("softmax_merge", "plain-average", _merge_no_weights, r"weight|sigma|exp\(m"),
    _w("kv_cache_budget", "no-layers",
       lambda budget, n_layer, batch, n_head, head_dim, itemsize:
       budget // (2 * batch * n_head * head_dim * itemsize), r"layer|\bL\b"),
    _w("kv_cache_budget", "rounded-up",
       lambda budget, n_layer, batch, n_head, head_dim, itemsize:
       -(-budget // (2 * n_layer * batch * n_head * head_dim * itemsize)),
       r"round|ceil|floor|fits"),
]


# ---------------------------------------------------------------------------------- parallel


def _gg_broadcast(shard_grads, shard_sizes):
    w = shard_sizes / shard_sizes.sum()
    return (shard_grads * w[:, None]).sum(axis=0).astype(shard_grads.dtype)


def _gg_integer_weights(shard_grads, shard_sizes):
    w = shard_sizes // shard_sizes.sum()
    return np.tensordot(w, shard_grads, axes=1).astype(shard_grads.dtype)


def _gg_ones_start(shard_grads, shard_sizes):
    total = np.ones_like(shard_grads[0])
    for g, n in zip(shard_grads, shard_sizes, strict=True):
        total += n * g
    return (total / shard_sizes.sum()).astype(shard_grads.dtype)


PARALLEL = [
    _w("global_gradient", "plain-mean", lambda shard_grads, shard_sizes: shard_grads.mean(0),
       r"weight|size|n_r|mean"),
    _w("global_gradient", "weighted-sum-not-divided",
       lambda shard_grads, shard_sizes: np.tensordot(shard_sizes.astype(shard_grads.dtype),
                                                     shard_grads, axes=1),
       r"N = \d+|divid|sum of"),
    _w("global_gradient", "divided-by-K",
       lambda shard_grads, shard_sizes: np.tensordot(shard_sizes.astype(shard_grads.dtype),
                                                     shard_grads, axes=1) / len(shard_sizes),
       r"\bK\b|N = \d+|sum\(n\)"),
    _w("global_gradient", "weights-broadcast", _gg_broadcast, r"broadcast|axis|weight",
       None, "rare"),
    _w("global_gradient", "integer-division", _gg_integer_weights, r"integer|division|zero"),
    _w("global_gradient", "starts-from-ones", _gg_ones_start, r"ones|zeros|initiali|start"),
    _w("ring_allreduce_bytes", "one-phase", lambda n_params, itemsize, K:
       (K - 1) * (n_params // K) * itemsize, r"all-gather|reduce-scatter|\b2\b|twice"),
    _w("ring_allreduce_bytes", "K-steps", lambda n_params, itemsize, K:
       2 * K * (n_params // K) * itemsize, r"K ?- ?1"),
    _w("ring_allreduce_bytes", "whole-buffer", lambda n_params, itemsize, K:
       2 * (K - 1) * n_params * itemsize, r"chunk|/ ?K|n_params / K"),
    _w("ring_allreduce_bytes", "chunk-rounded-up", lambda n_params, itemsize, K:
       2 * (K - 1) * -(-n_params // K) * itemsize, r"round|ceil|floor|divis", None, "rare",
       "hole"),
]


# ------------------------------------------------------------------------ PyTorch and LLaMA


def _bias_parts(dout, q, k, v, bias):
    hd = q.shape[-1]
    P = _softmax(_causal(q @ np.swapaxes(k, -1, -2) / math.sqrt(hd) + bias))  # (B, H, S, S)
    dP = dout @ np.swapaxes(v, -1, -2)
    dZ = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))
    dS = dZ / math.sqrt(hd)
    return P, dZ, (dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout)


def _bias_not_summed(dout, q, k, v, bias):
    P, dZ, (dq, dk, dv) = _bias_parts(dout, q, k, v, bias)
    return dq, dk, dv, dZ


def _bias_mean(dout, q, k, v, bias):
    P, dZ, (dq, dk, dv) = _bias_parts(dout, q, k, v, bias)
    return dq, dk, dv, dZ.mean(axis=0)


def _bias_scaled(dout, q, k, v, bias):
    P, dZ, (dq, dk, dv) = _bias_parts(dout, q, k, v, bias)
    return dq, dk, dv, dZ.sum(axis=0) / math.sqrt(q.shape[-1])


def _bias_left_out(dout, q, k, v, bias):
    P, dZ, grads = _bias_parts(dout, q, k, v, np.zeros_like(bias))
    return (*grads, dZ.sum(axis=0))


def _bias_no_shift(dout, q, k, v, bias):
    hd = q.shape[-1]
    e = np.exp(_causal(q @ np.swapaxes(k, -1, -2) / math.sqrt(hd) + bias))
    P = e / e.sum(axis=-1, keepdims=True)
    dP = dout @ np.swapaxes(v, -1, -2)
    dZ = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))
    dS = dZ / math.sqrt(hd)
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ dout, dZ.sum(axis=0)


def _bias_first_sequence(dout, q, k, v, bias):
    P, dZ, grads = _bias_parts(dout[:1], q[:1], k[:1], v[:1], bias)
    return (*(np.broadcast_to(g, q.shape).copy() for g in grads), dZ.sum(axis=0))


TORCH = [
    _w("attention_bias_backward", "dbias-not-summed", _bias_not_summed, r"batch|sum|axis=0"),
    _w("attention_bias_backward", "dbias-mean", _bias_mean, r"mean|B = \d+|batch"),
    _w("attention_bias_backward", "dbias-scaled", _bias_scaled, r"sqrt|scale"),
    _w("attention_bias_backward", "bias-left-out", _bias_left_out, r"bias"),
    _w("attention_bias_backward", "no-max-shift", _bias_no_shift, r"max|[Oo]verflow", None,
       "rare"),
    _w("attention_bias_backward", "first-sequence-copied", _bias_first_sequence,
       r"sequence|batch"),
]


def _pair_rows(n_heads, hd):
    """Our row c*hd + 2i + r reads the checkpoint's row c*hd + r*hd/2 + i."""
    j = np.arange(hd)
    return (np.arange(n_heads)[:, None] * hd + ((j % 2) * (hd // 2) + j // 2)[None, :]).ravel()


def _inverse_rows(n_heads, hd):
    tau = np.concatenate((np.arange(0, hd, 2), np.arange(1, hd, 2)))
    return (np.arange(n_heads)[:, None] * hd + tau[None, :]).ravel()


HF = [
    _w("wq_from_rotate_half", "not-transposed",
       lambda weight, n_head: weight[_pair_rows(n_head, weight.shape[0] // n_head)],
       r"transpos|\(in, out\)"),
    _w("wq_from_rotate_half", "columns-permuted",
       lambda weight, n_head: weight[:, _pair_rows(n_head, weight.shape[0] // n_head)].T,
       r"rows|columns|\bout\b"),
    _w("wq_from_rotate_half", "inverse-map",
       lambda weight, n_head: weight[_inverse_rows(n_head, weight.shape[0] // n_head)].T,
       r"inverse"),
    _w("wq_from_rotate_half", "one-head",
       lambda weight, n_head: weight[_pair_rows(1, weight.shape[0])].T, r"head"),
    _w("wk_from_hf", "query-heads",
       lambda weight, n_head, n_kv_head: weight[_pair_rows(n_head, weight.shape[0] // n_head)].T,
       r"n_kv_head|key/value heads|\bhd\b"),
    _w("wk_from_hf", "not-transposed",
       lambda weight, n_head, n_kv_head: weight[_pair_rows(n_kv_head, weight.shape[1] // n_head)],
       r"transpos"),
    _w("wk_from_hf", "one-head",
       lambda weight, n_head, n_kv_head: weight[_pair_rows(1, weight.shape[0])].T, r"head"),
    _w("wk_from_hf", "no-permutation", lambda weight, n_head, n_kv_head: weight.T,
       r"permut|rotate-half|pair"),
]


def _pad_no_mask(logits, targets, ignore_index):
    N = len(targets)
    p = _softmax(logits)
    loss = -np.log(p[np.arange(N), targets]).mean()  # every position counts
    d = p.copy()
    d[np.arange(N), targets] -= 1
    return float(loss), d / N


def _pad_mask_zero(logits, targets, ignore_index):
    N = len(targets)
    keep = targets > 0  # padding is token 0
    M = int(keep.sum())
    p = _softmax(logits)
    safe = np.where(keep, targets, 0)
    loss = -np.log(p[np.arange(N), safe])[keep].sum() / M
    d = p.copy()
    d[np.arange(N), safe] -= 1
    return float(loss), d * keep[:, None] / M


def _pad_index_first(logits, targets, ignore_index):
    N = len(targets)
    keep = targets != ignore_index
    M = int(keep.sum())
    lp = np.log(_softmax(logits))[np.arange(N), targets]  # ignored rows too
    d = _softmax(logits)
    d[np.arange(N), targets] -= 1
    return float(-lp[keep].sum() / M), d * keep[:, None] / M


def _pad_count_ignored(logits, targets, ignore_index):
    N = len(targets)
    keep = targets != ignore_index
    M = max(int((~keep).sum()), 1)
    p = _softmax(logits)
    safe = np.where(keep, targets, 0)
    loss = -np.log(p[np.arange(N), safe])[keep].sum() / M
    d = p.copy()
    d[np.arange(N), safe] -= 1
    return float(loss), d * keep[:, None] / M


LLAMA = [
    _w("padded_cross_entropy", "no-mask", _pad_no_mask, r"ignore|padd|count"),
    _w("padded_cross_entropy", "padding-is-token-0", _pad_mask_zero, r"ignore_index|padd"),
    _w("padded_cross_entropy", "index-before-mask", _pad_index_first,
       r"-100|ignore_index|index", None, "rare"),
    _w("padded_cross_entropy", "M-counts-ignored", _pad_count_ignored, r"M = \d+|count",
       r"sign"),
]


# LoRA's backward, written by someone who did not write its check: dy (N, m), x (N, n),
# A (r, n), B (m, r), scale = alpha / r
def _lora_alpha_for_scale(dy, x, A, B, scale):
    alpha = scale * A.shape[0]  # "the scale is alpha": r times too large everywhere
    u, du = x @ A.T, alpha * dy @ B
    return du @ A, du.T @ x, alpha * dy.T @ u


def _lora_u_scaled(dy, x, A, B, scale):
    u = scale * (x @ A.T)  # the scale kept in the middle, then applied again in dB
    du = scale * dy @ B
    return du @ A, du.T @ x, scale * dy.T @ u


def _lora_db_mean(dy, x, A, B, scale):
    u, du = x @ A.T, scale * dy @ B
    return du @ A, du.T @ x, scale * dy.T @ u / len(x)  # dB averaged over positions


def _lora_dx_sign(dy, x, A, B, scale):
    u, du = x @ A.T, scale * dy @ B
    return -(du @ A), du.T @ x, scale * dy.T @ u  # "the branch is subtracted"


def _lora_float32(dy, x, A, B, scale):
    f = np.float32  # computed in float32 whatever the inputs
    u, du = x.astype(f) @ A.T.astype(f), f(scale) * dy.astype(f) @ B.astype(f)
    out = (du @ A.astype(f), du.T @ x.astype(f), f(scale) * dy.T.astype(f) @ u)
    return tuple(o.astype(x.dtype) for o in out)


def _lora_last_position(dy, x, A, B, scale):
    u, du = x @ A.T, scale * dy @ B
    return du @ A, du[-1:].T @ x[-1:], scale * dy[-1:].T @ u[-1:]  # one position's share


LORA = [
    _w("lora_backward", "alpha-for-scale", _lora_alpha_for_scale, r"scale|alpha|r = \d"),
    _w("lora_backward", "u-scaled-too", _lora_u_scaled, r"scale"),
    _w("lora_backward", "dB-averaged", _lora_db_mean, r"sum|average|position|N = \d"),
    _w("lora_backward", "dx-sign", _lora_dx_sign, r"sign|minus|negat|-1"),
    _w("lora_backward", "float32-inside", _lora_float32, r"float32|dtype|precision|round"),
    _w("lora_backward", "last-position-only", _lora_last_position,
       r"sum|position|N = \d|every"),
]


HELDOUT_SECOND: list[Wrong] = (
    BROADCAST + BLOCK + CE + SMOOTH + SWIGLU + SILU + GELU + RMS + LAYERNORM + SCALE + ATTENTION
    + ATTENTION_BUG + GQA + CACHE + ROPE + HALF + FREQ + PERM + EMBEDDING + TIED + POSITION
    + LINEAR + RESIDUAL + STACK_BUG + CROSSOVER + CAPSTONE + ADAMW + LR + ADAM_L2 + MEMORY
    + PARALLEL + TORCH + HF + LLAMA + LORA)
