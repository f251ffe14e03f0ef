"""The exercise checks of the "RoPE" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; the right answers pass.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.rope import rope_backward, rope_forward, rope_tables

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
    "rope_tables": (tables, rope_tables),
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
    ("rope_tables", kw(tables, swap=True), ["cos and sin are swapped"]),
    ("rope_tables", kw(tables, exp_sign=1.0), ["theta ** (-2i/hd)"]),
    ("rope_tables", kw(tables, two=1.0), ["-i/hd where -2i/hd is needed"]),
    ("rope_tables", kw(tables, start=1), ["positions start at 1"]),
    ("rope_tables", kw(tables, transposed=True), [
        r"re:cos has shape \((\d+), (\d+)\), expected \(\2, \1\): transposed"]),
    ("rope_tables", kw(tables, full=True),
     [r"re:cos has shape \((\d+), \d+\), expected \(\1, \d+\)", "one column per pair"]),
    ("rope_tables", kw(tables, dtype=np.float32), ["cos has dtype float32, expected float64"]),
    ("rope_tables", lambda *a: tables(*a)[0], ["expected a tuple of 2 values (cos, sin)"]),
    ("rope_tables", lambda S, hd, theta: tables(S, hd, 10000.0),
     ["theta is fixed at 10000 instead of read from the argument theta"]),
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
