"""The exercise checks of the "RMSNorm" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


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


def ln(dy, x, w, b, eps, *, center=True, mean_g=True, proj=True, ddof=0, eps_on=True,
       use_w=True, dw_x=False, db_w=False):
    d = x.shape[-1]
    xc = x - x.mean(axis=-1, keepdims=True) if center else x
    var = (xc * xc).sum(axis=-1, keepdims=True) / (d - ddof)
    rstd = 1.0 / np.sqrt(var + (eps if eps_on else 0.0))
    xhat = xc * rstd
    g = dy * w if use_w else dy
    dx = g.copy()
    if mean_g and center:
        dx -= g.mean(axis=-1, keepdims=True)
    if proj:
        dx -= xhat * (g * xhat).sum(axis=-1, keepdims=True) / (d - ddof)
    return rstd * dx, (dy * (x if dw_x else xhat)).sum(axis=0), (dy * w if db_w else dy).sum(0)


def ln_jacobian(dy, x, w, b, eps):
    """A correct alternative: the (d, d) Jacobian of each row, formed and applied."""
    d = x.shape[-1]
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xhat = xc * rstd
    eye = np.eye(d, dtype=x.dtype)
    J = rstd[..., None] * (eye - 1 / d - xhat[:, :, None] * xhat[:, None, :] / d)  # (N, d, d)
    dx = np.einsum("nij,ni->nj", J, dy * w)
    return dx, (dy * xhat).sum(0), dy.sum(0)


def scale_grad(dy, x, w, eps, *, form="right"):
    r = 1 / np.sqrt(np.mean(x * x, axis=-1) + eps)  # (N,)
    gx = np.sum(dy * w * x, axis=-1)
    return {"right": eps * r**3 * gx, "zero": np.zeros_like(r), "sign": -eps * r**3 * gx,
            "r2": eps * r**2 * gx, "no_w": eps * r**3 * np.sum(dy * x, axis=-1),
            "no_mean": r * gx}[form].astype(x.dtype)


def scale_grad_by_backward(dy, x, w, eps):
    """The slow way: the whole backward, then the dot product of each row."""
    return np.sum(x * rms(dy, x, w, eps)[0], axis=-1)


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "rmsnorm_backward": (rms, lambda dy, x, w, eps: rmsnorm_backward(
        dy, rmsnorm_forward(x, w, eps)[1])),
    "layernorm_backward": (ln, ln_jacobian),
    "rmsnorm_scale_grad": (scale_grad, scale_grad_by_backward),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("rmsnorm_backward", kw(rms, mean_term="missing"),
     ["dx is wrong", "(dw is right.)", "the mean term of RMSNorm's Jacobian is missing"]),
    ("rmsnorm_backward", kw(rms, mean_term="plus"), ["mean term of RMSNorm's Jacobian has the "
                                                      "wrong sign"]),
    ("rmsnorm_backward", kw(rms, mean_term="sum"), [r"re:uses a sum over the d = \d+ features"]),
    ("rmsnorm_backward", kw(rms, eps_on=False), ["eps is missing"]),
    ("rmsnorm_backward", kw(rms, use_w=False), ["dx ignores the gain w"]),
    ("rmsnorm_backward", kw(rms, dw_x=True), ["dw is wrong", "(dx is right.)", "dw uses x"]),
    ("rmsnorm_backward", kw(rms, keepdims=False), ["keepdims=True"]),
    ("rmsnorm_backward", kw(rms, axis=0), ["mean of x**2 is taken over the wrong axis"]),
    ("rmsnorm_backward", kw(rms, dw_axis=1),  # a shape error, or wrong values when N == d
     [r"re:dw has shape \(\d+,\), expected \(\d+,\)|dw sums over the features",
      r"re:sum dy \* xhat over (the positions|them) \(axis=0\)"]),
    ("rmsnorm_backward", rms_inplace, ["changed its input `x` in place"]),
    ("rmsnorm_backward", lambda *a: tuple(o.astype(np.float32) for o in rms(*a)),
     ["dx has dtype float32, expected float64"]),
    ("rmsnorm_backward", lambda dy, x, w, eps: (rms(dy, x, w, eps)[0],
                                                rms(dy, x, w, eps)[1][None, :]),
     [r"re:dw has shape \(1, (\d+)\), expected \(\1,\)"]),
    ("rmsnorm_backward", lambda dy, x, w, eps: rms(dy, x, w, 1e-5),
     ["eps is fixed at 1e-05 instead of read from the argument eps"]),
    ("layernorm_backward", kw(ln, center=False), ["that is RMSNorm's backward"]),
    ("layernorm_backward", kw(ln, mean_g=False), ["the mean term -mean(g) of dx is missing",
                                                  "(dw, db are right.)"]),
    ("layernorm_backward", kw(ln, proj=False), ["xhat * mean(g * xhat) term of dx is missing"]),
    ("layernorm_backward", kw(ln, ddof=1), ["divides by d - 1"]),
    ("layernorm_backward", kw(ln, eps_on=False), ["eps is missing"]),
    ("layernorm_backward", kw(ln, use_w=False), ["dx ignores the gain w"]),
    ("layernorm_backward", kw(ln, dw_x=True), ["dw uses x"]),
    ("layernorm_backward", kw(ln, db_w=True), ["db is the bias's gradient"]),
    ("layernorm_backward", lambda *a: ln(*a)[:2], ["returned 2 values, expected 3"]),
    ("rmsnorm_scale_grad", kw(scale_grad, form="zero"), ["answer for eps = 0"]),
    ("rmsnorm_scale_grad", kw(scale_grad, form="sign"), ["the sign"]),
    ("rmsnorm_scale_grad", kw(scale_grad, form="r2"), ["one factor of rstd is missing"]),
    ("rmsnorm_scale_grad", kw(scale_grad, form="no_w"), ["the gain w is missing"]),
    ("rmsnorm_scale_grad", kw(scale_grad, form="no_mean"), ["the mean term of the backward"]),
    ("rmsnorm_scale_grad", lambda dy, x, w, eps: np.sum(x * rms(dy, x, w, eps)[0], axis=0),
     ["re:One number per position|one number per position"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
