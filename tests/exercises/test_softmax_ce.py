"""The exercise checks of the "Softmax cross-entropy" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.softmax_ce import softmax_cross_entropy

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


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


def ls(logits, targets, eps, *, on_scale=True, spread="V", grad_smooth=True, mean_grad=True,
       loss_mean=True, sign=1.0, shift=True, cast=True):
    """Label smoothing: (1 - eps) * the usual loss + eps * the mean over V of -log p."""
    N, V = logits.shape
    with np.errstate(all="ignore"):
        z = logits - logits.max(axis=-1, keepdims=True) if shift else logits
        lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (N, V) log softmax
    rows = np.arange(N)
    off = {"V": eps / V, "V-1": eps / (V - 1), "all": eps}[spread]
    on = (1 - eps if on_scale or spread != "V" else 1.0) + (off if spread != "V-1" else 0.0)
    q = np.full((N, V), off)
    q[rows, targets] = on
    nll = -np.sum(q * lp, axis=-1)
    loss = float(nll.mean() if loss_mean else nll.sum())
    d = np.exp(lp) - (q if grad_smooth else np.eye(V)[targets])
    d = sign * (d / N if mean_grad else d)
    return loss, d.astype(logits.dtype) if cast else d


def ls_mixed(logits, targets, eps):
    """The same loss written as a mix: (1 - eps) * cross-entropy + eps * uniform term."""
    loss, d = ce(logits, targets)
    lg = logits.astype(np.float64)
    lse = lg.max(-1) + np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1))  # (N,)
    uniform_term = float(np.mean(lse - lg.mean(-1)))
    N, V = logits.shape
    return (1 - eps) * loss + eps * uniform_term, (d - (eps / V - eps * np.eye(V)[targets]) / N
                                                   ).astype(logits.dtype)



# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "softmax_cross_entropy": (ce, softmax_cross_entropy),
    "label_smoothing": (ls, ls_mixed),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("softmax_cross_entropy", kw(ce, mean_grad=False), ["dlogits", "1/N of the mean is missing",
                                                         "(loss is right.)"], ["sign"]),
    ("softmax_cross_entropy", kw(ce, onehot=False), ["one-hot term is missing"]),
    ("softmax_cross_entropy", kw(ce, sign=-1.0), ["sign flipped"]),
    ("softmax_cross_entropy", kw(ce, axis=0), ["wrong axis"]),
    ("softmax_cross_entropy", kw(ce, shift=False), ["large logits", "NaN",
                                                     "Subtract each row's max"]),
    ("softmax_cross_entropy", kw(ce, loss_mean=False), ["loss is wrong", "summed"]),
    ("softmax_cross_entropy", kw(ce, log=np.log2), ["loss is wrong", "log base 2"]),
    ("softmax_cross_entropy", kw(ce, keepdims=False), ["keepdims"]),
    ("softmax_cross_entropy", lambda lg, t: ce(lg, t)[::-1], ["loss should be a number"]),
    ("softmax_cross_entropy", lambda lg, t: (ce(lg, t)[0], ce(lg, t)[1].astype(np.float64)),
     ["float32", "dlogits has dtype float64, expected float32"]),
    ("softmax_cross_entropy", lambda lg, t: ce(lg, t) + (0,), ["returned 3 values, expected 2"]),
    ("label_smoothing", lambda lg, t, e: ce(lg, t), ["the smoothing is ignored"]),
    ("label_smoothing", kw(ls, grad_smooth=False), ["the gradient ignores the smoothing",
                                                    "(loss is right.)"]),
    ("label_smoothing", kw(ls, on_scale=False), ["not scaled by (1 - smoothing)"]),
    ("label_smoothing", kw(ls, spread="V-1"), ["spread over the V - 1 other tokens"]),
    ("label_smoothing", kw(ls, spread="all"), ["the uniform part is smoothing, not smoothing / V"]),
    ("label_smoothing", kw(ls, mean_grad=False), ["1/N of the mean is missing"]),
    ("label_smoothing", kw(ls, loss_mean=False), ["summed over the positions"]),
    ("label_smoothing", kw(ls, sign=-1.0), ["sign flipped"]),
    ("label_smoothing", kw(ls, shift=False), ["large logits", "inf", "Subtract each row's max"]),
    ("label_smoothing", kw(ls, cast=False), ["float32", "dlogits has dtype float64"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
