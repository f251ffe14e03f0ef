"""The exercise checks of the "RoPE" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.rope import rope_backward, rope_forward
from xenith_edu.tools.gradcheck import check_gradient

from .helpers import catalogue_tests, kw

# Shape legend: B batch, S positions, N positions, d width, H heads, hd head width, f hidden,
# V vocab.


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


def freq_grad(du, u, omega, *, start=0, with_t=True, unrotated=False, mixed=False, dot=False,
              mean=False, halves=False, flip=False, one_sign=False, keep_rows=False,
              per_position=False):
    """domega from scratch: u' = rope(u) with the angles t * omega, then the chain rule."""
    if halves:  # rotate-half pairs: (u[i], u[i + hd/2]), the same as interleaving them first
        h = u.shape[-1] // 2
        perm = np.stack([np.arange(h), np.arange(h) + h], -1).reshape(-1)
        du, u = du[..., perm], u[..., perm]
    S = u.shape[-2]
    t = np.arange(S) + start  # (S,) positions
    phi = t[:, None] * omega[None, :]  # (S, hd/2)
    c, s = np.cos(phi), np.sin(phi)
    up = u if unrotated else rope_bwd(u, c, s, way=1.0)  # (..., S, hd) u'
    g = rope_bwd(du, c, s) if mixed else du  # du, the backward's output, with u'
    a, b = up[..., 0::2], up[..., 1::2]  # (..., S, hd/2)
    g0, g1 = g[..., 0::2], g[..., 1::2]
    if dot:
        dphi = g0 * a + g1 * b
    else:
        dphi = (g1 * a + g0 * b) if one_sign else (g1 * a - g0 * b)
    dphi = -dphi if flip else dphi
    rows = dphi.reshape(-1, S, dphi.shape[-1])  # (n, S, hd/2)
    if keep_rows:
        return np.sum((t[:, None] if with_t else 1) * dphi, axis=-2)  # (..., hd/2)
    dphi = rows.mean(axis=0) if mean else rows.sum(axis=0)  # (S, hd/2)
    if per_position:
        return t[:, None] * dphi
    return np.sum((t[:, None] if with_t else 1) * dphi, axis=0)  # (hd/2,)


def freq_grad_from_du(du, u, omega):
    """Another right answer: du = rope_backward(du') pairs with u, through the package."""
    t = np.arange(u.shape[-2])[:, None]
    c, s = np.cos(t * omega), np.sin(t * omega)
    g = rope_backward(du, rope_forward(du, c, s)[1])  # (..., S, hd) du
    dphi = g[..., 1::2] * u[..., 0::2] - g[..., 0::2] * u[..., 1::2]  # (..., S, hd/2)
    rows = dphi.reshape(-1, *dphi.shape[-2:])  # (n, S, hd/2)
    return np.einsum("s,nsi->i", np.arange(u.shape[-2]), rows)


def test_the_reference_is_the_finite_difference_gradient():
    """domega of every case, against central differences of sum(rope(u) * du') in float64."""
    from xenith_edu.exercises.rope import ROPE_FREQ, rope_freq_grad

    for seed in (None, 1):
        rng = None if seed is None else np.random.default_rng(seed)
        for case in ROPE_FREQ.make_cases(rng):
            du, u, omega = case.args

            def f(w, du=du, u=u):
                phi = np.arange(u.shape[-2])[:, None] * w[None, :]  # (S, hd/2)
                return float(np.sum(rope_forward(u, np.cos(phi), np.sin(phi))[0] * du))

            # h = 1e-4: the angles reach t * omega ~ 20 radians, so f bends fast in omega
            res = check_gradient(f, omega.copy(), rope_freq_grad(du, u, omega), h=1e-4)
            assert res.passed, (case.label, str(res))


def half_bwd(du, cos, sin, *, way=-1.0, interleaved=False, swap=False):
    c, s = (sin, cos) if swap else (cos, sin)
    c, s = c.astype(du.dtype), way * s.astype(du.dtype)
    if interleaved:
        return rope_bwd(du, cos, sin)
    h = du.shape[-1] // 2
    a, b = du[..., :h], du[..., h:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def half_bwd_by_permutation(du, cos, sin):
    """A correct alternative: permute to interleaved order, use the book's backward, undo."""
    hd = du.shape[-1]
    perm = np.stack([np.arange(hd // 2), np.arange(hd // 2) + hd // 2], -1).reshape(-1)
    out = rope_bwd(du[..., perm], cos, sin)
    return out[..., np.argsort(perm)]


def permutation(n_heads, head_dim, *, inverse=False, global_=False, flipped=False,
                dtype=np.int64):
    H, hd = (1, n_heads * head_dim) if global_ else (n_heads, head_dim)
    h = hd // 2
    if inverse:
        one = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    else:
        first, second = (np.arange(h) + h, np.arange(h)) if flipped else (np.arange(h),
                                                                          np.arange(h) + h)
        one = np.stack([first, second], axis=-1).reshape(-1)
    return np.concatenate([one + hd * j for j in range(H)]).astype(dtype)


def permutation_by_search(n_heads, head_dim):
    """Another right answer: find where each interleaved column's partner sits, by testing."""
    out = []
    for j in range(n_heads):
        for col in range(head_dim):
            pair, second = divmod(col, 2)
            out.append(j * head_dim + pair + second * head_dim // 2)
    return np.array(out, dtype=np.int32)


# exercise -> (the right answer from scratch, the package's reference in the learner's signature)
RIGHT = {
    "rope_backward": (rope_bwd, lambda du, c, s: rope_backward(du, rope_forward(du, c, s)[1])),
    "rope_freq_grad": (freq_grad, freq_grad_from_du),
    "rope_half_backward": (half_bwd, half_bwd_by_permutation),
    "rope_permutation": (permutation, permutation_by_search),
}

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("rope_backward", kw(rope_bwd, way=1.0), ["RoPE rotated the wrong way"]),
    ("rope_backward", lambda du, c, s: rope_forward(du, c, s)[0], ["RoPE rotated the wrong way"]),
    ("rope_backward", lambda du, c, s: du.copy(), ["du came back unrotated"]),
    ("rope_backward", kw(rope_bwd, swap=True), ["cos and sin are swapped"]),
    ("rope_backward", kw(rope_bwd, halves=True), ["rotate-half convention"]),
    ("rope_backward", kw(rope_bwd, cast=False), ["float32", "du_in has dtype float64, expected "
                                                  "float32", "cos.astype(du.dtype)"]),
    ("rope_freq_grad", kw(freq_grad, with_t=False), ["the factor t is missing"]),
    ("rope_freq_grad", kw(freq_grad, start=1), ["positions start at 1"]),
    ("rope_freq_grad", kw(freq_grad, unrotated=True), ["not with u"]),
    ("rope_freq_grad", kw(freq_grad, mixed=True), ["it pairs du = rope_backward(du')"]),
    ("rope_freq_grad", kw(freq_grad, dot=True), ["a scale of each pair, not of its angle"]),
    ("rope_freq_grad", kw(freq_grad, mean=True), ["a mean divides by their number"]),
    ("rope_freq_grad", kw(freq_grad, halves=True), ["rotate-half convention"]),
    ("rope_freq_grad", kw(freq_grad, flip=True), ["the sign of the quarter turn"]),
    ("rope_freq_grad", kw(freq_grad, one_sign=True),
     ["the term -t * du'[2i] * u'[2i+1] has its sign flipped"]),
    ("rope_freq_grad", kw(freq_grad, keep_rows=True),
     ["domega has shape", "sum over the positions and over every leading axis"]),
    ("rope_freq_grad", kw(freq_grad, per_position=True),
     [r"re:domega has shape \(\d+, \d+\), expected \(\d+,\)", "One number per pair"]),
    ("rope_freq_grad", lambda du, u, w: freq_grad(du, u, w).astype(np.float32),
     ["domega has dtype float32, expected float64"]),
    ("rope_half_backward", kw(half_bwd, way=1.0), ["rotated the wrong way"]),
    ("rope_half_backward", lambda du, c, s: du.copy(), ["du came back unrotated"]),
    ("rope_half_backward", kw(half_bwd, interleaved=True), ["the interleaved convention"]),
    ("rope_half_backward", kw(half_bwd, swap=True), ["cos and sin are swapped"]),
    ("rope_permutation", kw(permutation, inverse=True), ["the inverse permutation"]),
    ("rope_permutation", kw(permutation, global_=True), ["inside each head"]),
    ("rope_permutation", kw(permutation, flipped=True), ["each pair is in the wrong order"]),
    ("rope_permutation", kw(permutation, dtype=np.float64), ["perm has dtype float64"]),
    ("rope_permutation", lambda H, hd: permutation(1, hd), ["One index per column of wq"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)
