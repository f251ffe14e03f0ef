"""The exercise check of the "Your backward inside PyTorch" chapter, mutation-tested.

Each mistake of the catalogue is rejected with its diagnosis; several right answers, written
in different ways, pass. The check itself is NumPy only: nothing here imports torch.
"""

from __future__ import annotations

import numpy as np

from xenith_edu.exercises.torch import half_rows, wq_from_rotate_half

from .helpers import catalogue_tests, kw

# Shape legend: d width, H heads (n_head), hd = d // H head width. A checkpoint's `weight` is
# nn.Linear's (out, in) = (d, d) with rotate-half output order; ours is (in, out), interleaved.


def convert(weight, n_head, *, transpose=True, order="inverse", axis="out", heads=None,
            cast=None):
    """From scratch, with one switch per mistake of the catalogue."""
    d = weight.shape[0]
    H = n_head if heads is None else heads
    hd = d // H
    i = np.arange(hd // 2)
    ours = {  # our coordinate -> the rotate-half coordinate it is read from, within a head
        "inverse": np.stack([i, i + hd // 2], axis=1).reshape(-1),  # 2i -> i, 2i+1 -> i + hd/2
        "tau": np.concatenate([2 * i, 2 * i + 1]),  # the chapter's tau, the wrong way
        "none": np.arange(hd),
        "swapped": np.stack([i + hd // 2, i], axis=1).reshape(-1),
    }[order]
    rows = (np.arange(H)[:, None] * hd + ours[None, :]).reshape(-1)  # (d,)
    moved = weight[rows, :] if axis == "out" else weight[:, rows]
    out = moved.T if transpose else moved
    return out.astype(cast) if cast is not None else out


def by_reshape(weight, n_head):
    """The inverse of the Hugging Face conversion script's permute, then the transpose."""
    d = weight.shape[0]
    hd = d // n_head
    return weight.reshape(n_head, 2, hd // 2, d).transpose(0, 2, 1, 3).reshape(d, d).T


def by_loops(weight, n_head):
    d = weight.shape[0]
    hd = d // n_head
    out = np.empty_like(weight)
    for c in range(n_head):
        for i in range(hd // 2):
            for r in range(2):
                out[:, c * hd + 2 * i + r] = weight[c * hd + r * hd // 2 + i, :]
    return out


def by_argsort(weight, n_head):
    d = weight.shape[0]
    hd = d // n_head
    tau = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    tau_d = (np.arange(n_head)[:, None] * hd + tau).reshape(-1)  # half j <- ours tau_d[j]
    return weight.T[:, np.argsort(tau_d)]


def by_matrix_product(weight, n_head):
    """A permutation matrix: a product with ones and zeros moves entries exactly."""
    d = weight.shape[0]
    hd = d // n_head
    c, m = np.divmod(np.arange(d), hd)  # head and coordinate of each of our columns
    rows = c * hd + (m % 2) * (hd // 2) + m // 2  # (d,) the checkpoint's row for each
    P = np.eye(d, dtype=weight.dtype)[rows]  # (d, d) row j of P @ weight is weight[rows[j]]
    return (P @ weight).T


def two_columns_swapped(weight, n_head):
    out = by_reshape(weight, n_head).copy()
    out[:, [0, 1]] = out[:, [1, 0]]
    return out


def shuffled_within_columns(weight, n_head):
    out = by_reshape(weight, n_head).copy()
    return out[::-1, :]  # every column's entries in reverse: not whole rows of the checkpoint


def in_place(weight, n_head):
    weight[:] = by_reshape(weight, n_head).T
    return weight.T


RIGHT = {
    "wq_from_rotate_half": (convert, by_reshape, by_loops, by_argsort, by_matrix_product,
                            wq_from_rotate_half),
}

ORDER = "the permutation goes the wrong way"
LAYOUT = "in nn.Linear's (out, in) layout"

# (exercise, mutant, words the verdict must contain[, words it must not contain])
MUTANTS = [
    ("wq_from_rotate_half", kw(convert, transpose=False), [LAYOUT], [ORDER]),
    ("wq_from_rotate_half", kw(convert, order="none"), ["still in rotate-half order"], [LAYOUT]),
    ("wq_from_rotate_half", kw(convert, order="tau"), [ORDER, "its inverse"], [LAYOUT]),
    ("wq_from_rotate_half", kw(convert, heads=1), ["treats the d columns as one head"]),
    ("wq_from_rotate_half", kw(convert, order="swapped"),
     ["two members of each pair are exchanged"]),
    ("wq_from_rotate_half", kw(convert, axis="in"), ["applied to the input axis"], [ORDER]),
    ("wq_from_rotate_half", kw(convert, order="tau", axis="in"),
     [ORDER, "applied to the input axis"]),
    ("wq_from_rotate_half", kw(convert, transpose=False, order="tau"), [LAYOUT, ORDER]),
    ("wq_from_rotate_half", kw(convert, transpose=False, order="none"),
     [LAYOUT, "still in rotate-half order"]),
    ("wq_from_rotate_half", lambda w, H: w.copy(), [LAYOUT, "still in rotate-half order"]),
    ("wq_from_rotate_half", kw(convert, heads=2), ["the one for n_head = 2"]),
    ("wq_from_rotate_half", kw(convert, heads=4), ["the one for n_head = 4"]),
    ("wq_from_rotate_half", two_columns_swapped, ["re:your column \\d+ \\(head 0, coordinate "
                                                  "\\d\\) is the checkpoint's row \\d+; it "
                                                  "should be row \\d+"]),
    ("wq_from_rotate_half", shuffled_within_columns, ["not one whole row of the checkpoint"]),
    ("wq_from_rotate_half", lambda w, H: 2.0 * by_reshape(w, H), ["only moves entries"]),
    ("wq_from_rotate_half", lambda w, H: -by_reshape(w, H), ["sign flipped"]),
    ("wq_from_rotate_half", lambda w, H: -w[half_rows(w.shape[0], H)].T,
     ["sign flipped"], [ORDER]),
    ("wq_from_rotate_half", kw(convert, cast=np.float64),
     ["wq has dtype float64, expected float32", "do not cast"]),
    ("wq_from_rotate_half", in_place, ["changed its input `weight` in place"]),
    ("wq_from_rotate_half", lambda w, H: by_reshape(w, H).reshape(H, -1, w.shape[0]),
     ["wq has shape", "(d, d)"]),
]

(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_the_cases_tell_the_mistakes_apart() -> None:
    """The first case of every draw has several heads and hd >= 6, where tau and its inverse
    differ; the cases vary n_head, hd and the dtype."""
    from xenith_edu.exercises import SPECS

    spec = SPECS["wq_from_rotate_half"]
    for seed in [None, 0, 1, 2, 3, 4]:
        cases = spec.make_cases(None if seed is None else np.random.default_rng(seed))
        weight, H = cases[0].args
        assert H >= 2 and weight.shape[0] // H >= 6
        assert {c.args[0].dtype for c in cases} == {np.dtype(np.float64), np.dtype(np.float32)}
        assert len({c.args[1] for c in cases}) >= 3
        assert len({c.args[0].shape[0] // c.args[1] for c in cases}) >= 3



def test_every_diagnosis_holds_on_many_draws() -> None:
    """The grader draws its cases at random: each mutant keeps its diagnosis on 20 draws."""
    from .helpers import assert_rejected

    for seed in range(20):
        for name, fn, words, *absent in MUTANTS:
            assert_rejected(name, fn, words, absent[0] if absent else [],
                            np.random.default_rng(100 + seed))
