"""The exercise checks of the "SwiGLU" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import math

import numpy as np

from xenith_edu.swiglu import sigmoid, swiglu_backward, swiglu_forward

from .helpers import catalogue_tests, kw, sig

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


def silu_grad(z, *, form="right"):
    s = sig(z)
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
    s = sig(h1)
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


C = math.sqrt(2 / math.pi)


def gelu_mlp(dout, x, w1, w2, *, chain=True, product=True, dtanh="right", c_out=True,
             erf=False, dw2_pre=False, path=True):
    h = x @ w1  # (N, f)
    u = C * (h + 0.044715 * h**3)
    t = np.tanh(u)
    a = 0.5 * h * (1 + t)  # (N, f)
    da = dout @ w2.T
    if erf:
        phi = 0.5 * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
        dg = phi + h * np.exp(-h * h / 2) / math.sqrt(2 * math.pi)
    else:
        du = (C if c_out else 1.0) * ((1 + 3 * 0.044715 * h * h) if chain else 1.0)
        dt = {"right": 1 - t * t, "lin": 1 - t}[dtanh]
        dg = 0.5 * (1 + t) + (0.5 * h * dt * du if product else 0.0)
    dh = da * dg
    dx = dh @ w1.T if path else np.zeros_like(x)
    return dx, x.T @ dh, (h if dw2_pre else a).T @ dout


def gelu_mlp_sech(dout, x, w1, w2):
    """A correct alternative: tanh' written as sech**2 = 1 / cosh**2, and gelu as h * sigmoid."""
    h = x @ w1
    u = C * (h + 0.044715 * h**3)
    s = 1 / (1 + np.exp(-2 * u))  # 0.5 (1 + tanh u) = sigmoid(2u)
    dg = s + h * (2 * s * (1 - s)) * C * (1 + 3 * 0.044715 * h * h)
    dh = (dout @ w2.T) * dg
    return dh @ w1.T, x.T @ dh, (h * s).T @ dout


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "swiglu_backward": (swiglu, lambda dout, x, w1, w3, w2: swiglu_backward(
        dout, swiglu_forward(x, w1, w3, w2)[1])),
    "gelu_mlp_backward": (gelu_mlp, gelu_mlp_sech),
    "silu_grad": (silu_grad, lambda z: sigmoid(z) * (1 + z * (1 - sigmoid(z)))),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("swiglu_backward", kw(swiglu, dsilu="sigmoid"), ["silu'(h1) taken as sigmoid(h1)"]),
    ("swiglu_backward", kw(swiglu, dsilu="dsigmoid"), ["sigmoid's derivative"]),
    ("swiglu_backward", kw(swiglu, dsilu="no_dsig"), ["misses sigmoid's own derivative"]),
    ("swiglu_backward", kw(swiglu, swap13=True), ["dw1 and dw3 are swapped"]),
    ("swiglu_backward", kw(swiglu, path3=False), ["dx misses the path through w3"]),
    ("swiglu_backward", kw(swiglu, path1=False), ["dx misses the path through w1"]),
    ("swiglu_backward", kw(swiglu, up_h1=True), ["multiplied by h1"]),
    ("swiglu_backward", kw(swiglu, dw2_transposed=True), [
        r"re:dw2 has shape \((\d+), (\d+)\), expected \(\2, \1\): transposed"]),
    ("swiglu_backward", lambda *a: tuple(o.astype(np.float32) for o in swiglu(*a)),
     ["dx has dtype float32, expected float64", "float64 was asked for"]),
    ("silu_grad", kw(silu_grad, form="sigmoid"), ["that is sigmoid(z)"]),
    ("silu_grad", kw(silu_grad, form="silu"), ["silu(z) itself"]),
    ("silu_grad", kw(silu_grad, form="dsigmoid"), ["derivative of sigmoid, not of silu"]),
    ("silu_grad", kw(silu_grad, form="no_dsig"), ["sigmoid's derivative is sigmoid * (1 - "]),
    ("silu_grad", kw(silu_grad, form="no_s_term"), ["misses the sigmoid(z) term"]),
    ("silu_grad", silu_grad_naive, ["large |z|", "NaN", "Overflow in exp"]),
    ("silu_grad", lambda z: (silu_grad(z),), ["returned a tuple of 1 value(s), expected a "
                                              "single dz"]),
    ("silu_grad", lambda z: silu_grad(z).tolist(), ["should be a NumPy array", "got a list"]),
    ("gelu_mlp_backward", kw(gelu_mlp, erf=True), ["exact (erf) GELU"]),
    ("gelu_mlp_backward", kw(gelu_mlp, chain=False), ["chain rule through the cubic"]),
    ("gelu_mlp_backward", kw(gelu_mlp, product=False), ["misses the product rule"]),
    ("gelu_mlp_backward", kw(gelu_mlp, dtanh="lin"), ["1 - tanh**2, not 1 - tanh"]),
    ("gelu_mlp_backward", kw(gelu_mlp, c_out=False), ["c = sqrt(2 / pi) is missing"]),
    ("gelu_mlp_backward", kw(gelu_mlp, dw2_pre=True), ["dw2 uses the pre-activation",
                                                        "(dx, dw1 are right.)"]),
    ("gelu_mlp_backward", kw(gelu_mlp, path=False), ["dx is all zeros"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
