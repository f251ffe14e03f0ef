"""The exercise checks of the "The whole backward pass" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import math

import numpy as np

from xenith_edu.exercises.backward import buggy_stack_backward
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


def linear(dY, X, W, *, dx_no_t=False, dw_t=False, mean=False):
    dX = dY @ (W if dx_no_t else W.T)
    dW = dY.T @ X if dw_t else X.T @ dY
    if mean:
        dW = dW / X.shape[0]
    return dX, dW


def residual(dout, h, w, W, alpha, eps, *, skip="one", branch="alpha", dW_alpha=True,
             dW_h=False):
    r = 1 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    xhat = h * r
    xn = xhat * w
    a = {"alpha": alpha, "none": 1.0, "twice": alpha * alpha}[branch]
    db = a * dout  # out = h + alpha * xn @ W
    dW = (h if dW_h else xn).T @ (db if dW_alpha else dout)
    dxn = db @ W.T
    g = dxn * w
    dx = r * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    s = {"one": 1.0, "none": 0.0, "alpha": alpha, "two": 2.0}[skip]
    return s * dout + dx, np.sum(dxn * xhat, axis=0), dW


def residual_by_package(dout, h, w, W, alpha, eps):
    """The same with the package's RMSNorm pair: one source for the norm's gradient."""
    xn, cache = rmsnorm_forward(h, w, eps)
    dx, dw = rmsnorm_backward(alpha * dout @ W.T, cache)
    return dout + dx, dw, xn.T @ (alpha * dout)


def stack(dout, h, w, W, eps, *, layer=residual):
    """The fixed stack: the residual path carries dh into every layer below."""
    hs = [h]
    for i in range(w.shape[0]):
        r = 1 / np.sqrt(np.mean(hs[-1] ** 2, axis=-1, keepdims=True) + eps)
        hs.append(hs[-1] + (hs[-1] * r * w[i]) @ W[i])
    dw, dW, dh = np.zeros_like(w), np.zeros_like(W), dout
    for i in reversed(range(w.shape[0])):
        dh, dw[i], dW[i] = layer(dh, hs[i], w[i], W[i], 1.0, eps)
    return dh, dw, dW


def cross(a, c, B, H, i, *, fixed=True, root=1.0, b_parts="BHi", two=2.0, four=4.0):
    b = {"BHi": B * H * i, "BH": B * H, "Hi": H * i, "Bi": B * i}[b_parts]
    cc = c if fixed else 0.0
    return (a + root * math.sqrt(a * a + four * b * cc)) / (two * b)


def cross_by_bisection(a, c, B, H, i):
    """A numerical solution: bisect b S**2 - a S - c on [0, hi] until the bracket is tiny."""
    b = B * H * i
    lo, hi = 0.0, 1.0
    while b * hi * hi - a * hi - c < 0:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if b * mid * mid - a * mid - c < 0 else (lo, mid)
    return (lo + hi) / 2


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "linear_backward": (linear, lambda dY, X, W: (dY @ W.T, X.T @ dY)),
    "residual_scale_backward": (residual, residual_by_package),
    "attention_crossover": (cross, cross_by_bisection),
    "backward_find_the_bug": (stack, kw(stack, layer=residual_by_package)),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("linear_backward", kw(linear, dx_no_t=True), ["raised ValueError", "transpose"]),
    ("linear_backward", kw(linear, dw_t=True),
     [r"re:dW has shape \((\d+), (\d+)\), expected \(\2, \1\): transposed"]),
    ("linear_backward", kw(linear, mean=True),
     [r"re:dW is (\d+) times too small: off by a factor of N = \1", "(dX is right.)"]),
    ("linear_backward", lambda dY, X, W: (dY @ W.T, X.T @ dY)[::-1],
     [r"re:dX has shape \(\d+, \d+\), expected \(\d+, \d+\); that is the shape of dW",
      "in the order (dX, dW)"]),
    ("residual_scale_backward", kw(residual, skip="none"), ["the residual path is missing",
                                                            "(dw, dW are right.)"]),
    ("residual_scale_backward", kw(residual, skip="alpha"), ["alpha scales the skip path"]),
    ("residual_scale_backward", kw(residual, branch="none"), ["alpha is missing from the "
                                                               "branch"]),
    ("residual_scale_backward", kw(residual, branch="twice"), ["alpha is applied twice"]),
    ("residual_scale_backward", kw(residual, dW_alpha=False), ["dW misses alpha"]),
    ("residual_scale_backward", kw(residual, dW_h=True), ["dW uses h"]),
    ("backward_find_the_bug", buggy_stack_backward, ["still what the given code computes",
                                                     "re:Wrong in layers? 0"]),
    ("backward_find_the_bug", kw(stack, layer=kw(residual, skip="two")), ["dh is wrong"]),
    ("backward_find_the_bug", kw(stack, layer=kw(residual, dW_h=True)),
     ["dW is wrong", "(dh, dw are right.)", "Wrong in layer"]),
    ("attention_crossover", kw(cross, fixed=False), ["the fixed part c is left out"]),
    ("attention_crossover", kw(cross, root=-1.0), ["the other root"]),
    ("attention_crossover", kw(cross, b_parts="BH"), ["b misses the itemsize"],
     ["batch", "heads"]),
    ("attention_crossover", kw(cross, b_parts="Hi"), ["b misses the batch"]),
    ("attention_crossover", kw(cross, b_parts="Bi"), ["b misses the heads"]),
    ("attention_crossover", kw(cross, two=1.0), ["divides by b, not 2 b"]),
    ("attention_crossover", kw(cross, four=1.0), ["the discriminant"]),
    ("attention_crossover", lambda *a: round(cross(*a)), ["S is wrong"], ["constant factor"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
