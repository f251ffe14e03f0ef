"""Exercises of the "Your backward inside PyTorch" chapter: a rotate-half checkpoint's W_q in ours.

NumPy only (this module never imports torch); the check names the usual conversion mistakes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..model.hf.layout import pair_rows
from .engine import check
from .kit import amax, int_sampler, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: d width, H heads, hd = d // H head width (even). A checkpoint's weight is
# nn.Linear's (out, in) = (d, d); ours is (in, out), the output coordinates of head c being the
# columns c*hd .. (c+1)*hd - 1.


def interleaved_rows(d: int, n_head: int) -> np.ndarray:
    """For our output coordinate c*hd + 2i + r, the checkpoint's output c*hd + r*hd/2 + i.

    Our pair i of a head is (2i, 2i+1); rotate-half's pair i is (i, i + hd/2). (d,) int array:
    the map that reading a Hugging Face checkpoint applies (`xenith_edu.model.hf.pair_rows`).
    """
    return pair_rows(n_head, d // n_head)  # (d,)


def half_rows(d: int, n_head: int) -> np.ndarray:
    """The inverse map: rotate-half coordinate c*hd + j comes from ours (the chapter's tau)."""
    hd = d // n_head
    tau = np.concatenate((np.arange(0, hd, 2), np.arange(1, hd, 2)))  # (hd,)
    return (np.arange(n_head)[:, None] * hd + tau[None, :]).reshape(-1)  # (d,)


def wq_from_rotate_half(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Our W_q (in, out) from a rotate-half checkpoint's nn.Linear weight (out, in), (d, d)."""
    return weight[interleaved_rows(weight.shape[0], n_head), :].T


def _swapped_rows(d: int, n_head: int) -> np.ndarray:
    """The members of each pair exchanged: our 2i + r read from rotate-half (1 - r)*hd/2 + i."""
    hd = d // n_head
    j = np.arange(hd)
    where = (1 - j % 2) * (hd // 2) + j // 2
    return (np.arange(n_head)[:, None] * hd + where[None, :]).reshape(-1)


def _cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    # (what, n_head, hd, dtype). The first case tells every known mistake apart: several heads,
    # and hd >= 6, where the permutation and its inverse differ (for hd = 4 they coincide). The
    # widths d are multiples of 8 where they can be, so that a head count typed in (2, 4)
    # still gives even heads, and the diagnosis can name it.
    sizes = [
        ("", 2 * ints(1, 2), 4 * ints(2, 3), np.float64),
        ("", ints(2, 3), 8 * ints(1, 2), np.float32),
        ("one head, ", 1, 4 * ints(2, 3), np.float64),
        ("hd = 4, ", ints(2, 5), 4, np.float64),
        ("hd = 2 (nothing to reorder), ", ints(2, 6), 2, np.float64),
    ]
    cases = []
    for what, H, hd, dtype in sizes:
        d = H * hd
        weight = randn(rng, (d, d), dtype)  # (d, d) nn.Linear's (out, in), distinct entries
        cases.append(Case(f"{np.dtype(dtype).name}, {what}weight ({d}, {d}), n_head={H}",
                          (weight, H)))
    return cases


def _mistakes(args: tuple, exp: dict) -> list[Mistake]:
    weight, n_head = args
    d = weight.shape[0]
    layout = {
        True: "",
        False: ("the result is in nn.Linear's (out, in) layout: our W_q is (in, out), the "
                "transpose."),
    }
    orders = {  # name -> (rows of the checkpoint for our output coordinates, what is wrong)
        "right": (interleaved_rows(d, n_head), ""),
        "tau": (half_rows(d, n_head),
                "the permutation goes the wrong way: tau maps our order to rotate-half's; "
                "the conversion needs its inverse (our 2i + r reads rotate-half r*hd/2 + i)."),
        "none": (np.arange(d),
                 "the output coordinates are still in rotate-half order: within each head, our "
                 "pair i is (2i, 2i+1), rotate-half's is (i, i + hd/2); reorder them."),
        "one head": (interleaved_rows(d, 1),
                     "the permutation treats the d columns as one head: reorder within each "
                     "head of width hd = d // n_head."),
        "swapped": (_swapped_rows(d, n_head),
                    "the two members of each pair are exchanged: our 2i is rotate-half's i "
                    "(first half of the head), our 2i + 1 is its i + hd/2."),
    }
    table: list[Mistake] = []
    for transposed in (True, False):
        for name, (rows, wrong_order) in orders.items():
            for axis in ("out", "in"):
                if name == "right" and axis == "out" and transposed:
                    continue  # the right answer
                if name == "none" and axis == "in":
                    continue  # the same as axis "out"
                wrong_axis = ("the permutation was applied to the input axis: it reorders the "
                              "output coordinates (the columns of our W_q, the rows of "
                              "nn.Linear's weight)." if axis == "in" else "")
                parts = [p for p in (layout[transposed], wrong_order, wrong_axis) if p]
                table.append((" And ".join(parts), _answer(weight, rows, axis, transposed)))
    for typed in (1, 2, 4, 8, 16, 32):  # n_head typed in instead of read from the argument
        table.append((f"the permutation is the one for n_head = {typed}: read n_head from the "
                      f"argument.",
                      _typed(weight, n_head, typed)))
    return table


def _answer(weight: np.ndarray, rows: np.ndarray, axis: str,
            transposed: bool) -> Callable[[], dict]:
    def make() -> dict:
        moved = weight[rows, :] if axis == "out" else weight[:, rows]
        return {"wq": moved.T if transposed else moved}

    return make


def _typed(weight: np.ndarray, n_head: int, typed: int) -> Callable[[], dict]:
    def make() -> dict:
        d = weight.shape[0]
        if typed == n_head or typed == 1 or d % typed or (d // typed) % 2:
            return {}  # no prediction: the right count, the one-head entry, or impossible
        if np.array_equal(interleaved_rows(d, typed), interleaved_rows(d, n_head)):
            return {}
        return {"wq": weight[interleaved_rows(d, typed), :].T}

    return make


def _diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    """Where the entries of a wrong answer came from, when no known mistake explains it."""
    weight, n_head = args
    g = np.asarray(got["wq"], dtype=np.float64)
    if g.shape != weight.shape:
        return []
    where = {float(v): i for i, v in enumerate(weight.reshape(-1))}  # the entries are distinct
    src = [where.get(float(v)) for v in g.reshape(-1)]
    if any(s is None for s in src):
        if all(where.get(-float(v)) is not None for v in g.reshape(-1)):
            return ["your W_q holds the checkpoint's entries with their sign flipped: the "
                    "conversion only moves entries, it never negates them."]
        return ["your W_q has entries that are not in the checkpoint: the conversion only moves "
                "entries (a transpose and a reordering of rows), it computes nothing."]
    d = weight.shape[0]
    rows, cols = np.divmod(np.array(src).reshape(d, d), d)  # checkpoint (row, col) of each entry
    whole = np.all(rows == rows[:1, :]) and np.array_equal(cols, np.tile(np.arange(d)[:, None],
                                                                          (1, d)))
    if not whole:
        return ["your W_q is a rearrangement of the checkpoint's entries, but its column j is "
                "not one whole row of the checkpoint, transposed: the conversion moves whole "
                "rows (one per output coordinate) and keeps the order within each."]
    expected = interleaved_rows(d, n_head)
    j = int(np.argmax(rows[0] != expected))
    hd = d // n_head
    return [f"your column {j} (head {j // hd}, coordinate {j % hd}) is the checkpoint's row "
            f"{int(rows[0, j])}; it should be row {int(expected[j])} (our coordinate 2i + r "
            f"reads rotate-half r*hd/2 + i)."]


WQ = Spec(
    id="wq_from_rotate_half",
    reference_name="xenith_edu.exercises.torch.wq_from_rotate_half",
    arg_names=("weight", "n_head"),
    out_names=("wq",),
    kinds=("array",),
    reference=lambda weight, n_head: (wq_from_rotate_half(weight, n_head),),
    cases=_cases,
    seed=1414,
    summary="float64 and float32, 1 to 6 heads, hd = 2 to 16",
    single=True,
    mistakes=_mistakes,
    diagnose=_diagnose,
    floor=lambda a: {"wq": amax(a[0])},
    shape_hints={"wq": "W_q is square: (d, d), the checkpoint's shape."},
    dtype_hint="A conversion keeps the checkpoint's dtype: index and transpose, do not cast.",
)


def check_wq_from_rotate_half(fn: Callable) -> CheckResult:
    """`fn(weight (d, d) nn.Linear layout, rotate-half; n_head) -> wq (d, d)`, ours.

    See the "Your backward inside PyTorch" chapter.
    """
    return check(WQ, fn)


SPECS = [WQ]

__all__ = ["check_wq_from_rotate_half"]
