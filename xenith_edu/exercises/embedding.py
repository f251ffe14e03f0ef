"""Exercises of the embedding chapter: the scatter-add, tied embeddings, and relatives.

See the "Embedding scatter-add" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .engine import check, close
from .kit import amax, int_sampler, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: B batch, S positions, N = B*S positions, d width, V vocab.


def package_embedding_backward(x: np.ndarray, dh: np.ndarray, vocab_size: int) -> np.ndarray:
    """The package's embedding backward in the learner's signature (x, dh, vocab_size)."""
    from .. import embedding  # the package's own, as the notebook has it

    wte = np.zeros((vocab_size, dh.shape[-1]), dtype=dh.dtype)  # (V, d) only its shape counts
    _, cache = embedding.embedding_forward(wte, x)
    return embedding.embedding_backward(dh, cache)


def token_cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, int, int, type]]:
    """(label, x (B, S), V, d, dtype): repeated tokens, one token, one token everywhere..."""
    ints = int_sampler(rng)

    B1, S1, V1, d1 = ints(2, 3), ints(4, 6), ints(6, 9), ints(2, 4)
    B2, S2, V2, d2 = ints(2, 4), ints(3, 5), ints(8, 12), ints(4, 6)
    B3, S3, V3 = ints(1, 2), ints(3, 4), ints(4, 6)
    V4, d4 = 2 * ints(2, 4), ints(3, 5)
    S5, V5 = ints(9, 12), ints(14, 24)  # longer than the rest, and d = S (a square dh[b])
    return [
        (f"float64, B={B1}, S={S1}, V={V1}, d={d1}, repeated tokens",
         rng.integers(0, 4, size=(B1, S1)), V1, d1, np.float64),
        (f"float32, B={B2}, S={S2}, V={V2}, d={d2}, repeated tokens",
         rng.integers(0, V2, size=(B2, S2)), V2, d2, np.float32),
        (f"float64, S=1 (one token), V={V3}, d={d1}", rng.integers(0, V3, size=(1, 1)), V3, d1,
         np.float64),
        (f"float64, every token the same, B={B3}, S={S3}, V={V3}, d={d4}",
         np.full((B3, S3), ints(0, V3 - 1)), V3, d4, np.float64),
        (f"float64, all tokens distinct, B=2, S={V4 // 2}, V={V4}, d={d4}",
         rng.permutation(V4).reshape(2, V4 // 2), V4, d4, np.float64),
        (f"float64, longer, B=2, S={S5}, V={V5}, d={S5}", rng.integers(0, V5, size=(2, S5)),
         V5, S5, np.float64),
    ]


def _embedding_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for label, x, V, d, dtype in token_cases(rng):
        dh = randn(rng, x.shape + (d,), dtype)  # (B, S, d)
        cases.append(Case(label, (x, dh, V)))
    return cases + magnitudes(rng, cases[0], 1, "dh")


def _scatter(x: np.ndarray, dh: np.ndarray, V: int) -> np.ndarray:
    """(V, d) float64: the sum of dh's rows per token of x, the scatter-add."""
    out = np.zeros((V, dh.shape[-1]))
    np.add.at(out, x.reshape(-1), dh.reshape(-1, dh.shape[-1]))
    return out


def _one_sequence(x: np.ndarray, dh: np.ndarray, V: int, part: np.ndarray,
                  tol: float) -> int | None:
    """The sequence b whose scatter alone is the learner's scatter part, if one is."""
    if x.ndim < 2 or x.shape[0] < 2:
        return None
    return next((b for b in range(x.shape[0]) if close(part, _scatter(x[b], dh[b], V), tol)),
                None)


def _overwritten(x: np.ndarray, dh: np.ndarray, part: np.ndarray, rows: np.ndarray,
                 tol: float) -> bool:
    """Whether each of `rows` holds one gradient of its token, all picked in one order (the
    last occurrence, as an assignment dwte[x] = dh keeps, or all the first)."""
    flat_x, flat = x.reshape(-1), dh.reshape(-1, dh.shape[-1])
    for pick in (-1, 0):
        at = [np.nonzero(flat_x == v)[0][pick] for v in rows]
        if all(close(part[v], flat[n], tol) for v, n in zip(rows, at, strict=True)):
            return True
    return False


def repeats_diagnose(x: np.ndarray, dh: np.ndarray, V: int, got: np.ndarray, exp: np.ndarray,
                     tol: float, name: str) -> list[str]:
    """Wrong only on the rows of tokens that occur more than once: the scatter doesn't add; or
    a scatter of one sequence of the batch only."""
    counts = np.bincount(x.reshape(-1), minlength=V)  # (V,)
    scale = max(float(np.max(np.abs(exp))), 1e-300)
    bad_rows = np.nonzero(np.max(np.abs(got - exp), axis=-1) > tol * scale)[0]
    if bad_rows.size == 0:
        return []
    part = got - (exp - _scatter(x, dh, V))  # the learner's scatter-add part, (V, d)
    b = _one_sequence(x, dh, V, part, tol)
    if b is not None:
        which = "the first sequence (x[0])" if b == 0 else f"sequence {b} of the batch"
        return [f"{name} scatters only the tokens of {which}: the table is shared by the "
                f"{x.shape[0]} sequences, so every position of every sequence adds its "
                "gradient (flatten the batch: x.reshape(-1), dh.reshape(-1, d))."]
    if np.all(counts[bad_rows] == 0):
        return [f"{name} has non-zero rows for tokens that never occur: start from np.zeros, "
                "not np.empty."]
    if not np.all(counts[bad_rows] > 1):
        return []
    v = int(bad_rows[np.argmax(counts[bad_rows])])
    if close(part[v], _scatter(x, dh, V)[v] / counts[v], tol):
        return [f"repeated tokens are averaged instead of summed: token {v} occurs "
                f"{counts[v]} times and its row is the sum of all {counts[v]} gradients."]
    if not _overwritten(x, dh, part, bad_rows, tol):
        return []  # the rows are not single gradients picked as an assignment does
    return [f"repeated tokens overwrite instead of accumulate: token {v} occurs "
            f"{counts[v]} times and its row must sum all {counts[v]} gradients "
            "(np.add.at(dwte, x, dh); dwte[x] = dh and dwte[x] += dh keep only one)."]


def _embedding_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    x, dh, V = args
    return repeats_diagnose(x, dh, V, np.asarray(got["dwte"], dtype=np.float64), exp["dwte"],
                            tol, "dwte")


EMBEDDING = Spec(
    id="embedding_backward",
    reference_name="xenith_edu.embedding.embedding_backward",
    arg_names=("x", "dh", "vocab_size"),
    out_names=("dwte",),
    kinds=("array",),
    reference=lambda x, dh, V: (package_embedding_backward(x, dh, V),),
    cases=_embedding_cases,
    seed=606,
    summary="float64 and float32, repeated tokens, one token, one token repeated everywhere, "
            "unused vocabulary rows, S up to 12, dh from 1e-3 to 1e2",
    single=True,
    diagnose=_embedding_diagnose,
    floor=lambda a: {"dwte": amax(a[1])},
    shape_hints={"dwte": "One row per vocabulary entry: dwte is (vocab_size, d)."},
    dtype_hint="Create dwte with dtype=dh.dtype.",
)


def check_embedding_backward(fn: Callable) -> CheckResult:
    """`fn(x (B, S) int, dh (B, S, d), vocab_size) -> dwte (V, d)`.

    See the "Embedding scatter-add" chapter.
    """
    return check(EMBEDDING, fn)


def _tied_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for label, x, V, d, dtype in token_cases(rng):
        N = x.size
        dh = randn(rng, x.shape + (d,), dtype)  # (B, S, d)
        dlogits = randn(rng, (N, V), dtype, 0.5)  # (N, V)
        xf = randn(rng, (N, d), dtype)  # (N, d)
        cases.append(Case(label, (x, dh, dlogits, xf, V)))
    return cases + magnitudes(rng, cases[0], 2, "dlogits")


def _tied_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    x, dh, dlogits, xf, V = args
    proj = dlogits.T @ xf  # (V, d)
    scatter = exp["dwte"] - proj
    return [
        ("only the output-projection term dlogits.T @ xf: add the embedding scatter-add, "
         "wte is used twice.", lambda: {"dwte": proj}),
        ("only the embedding scatter-add: add the output-projection term dlogits.T @ xf, "
         "wte is used twice.", lambda: {"dwte": scatter}),
        ("the output-projection term has its sign flipped.", lambda: {"dwte": scatter - proj}),
    ]


def _tied_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    x, dh, dlogits, xf, V = args
    got64 = np.asarray(got["dwte"], dtype=np.float64)
    proj = dlogits.T @ xf  # (V, d) a right projection term leaves the scatter's mistake
    return repeats_diagnose(x, dh, V, got64 - proj, exp["dwte"] - proj, tol, "dwte")


TIED = Spec(
    id="tied_wte_grad",
    reference_name="xenith_edu.embedding.embedding_backward(x, dh, V) + dlogits.T @ xf",
    arg_names=("x", "dh", "dlogits", "xf", "vocab_size"),
    out_names=("dwte",),
    kinds=("array",),
    reference=lambda x, dh, dl, xf, V: (package_embedding_backward(x, dh, V) + dl.T @ xf,),
    cases=_tied_cases,
    seed=607,
    summary="float64 and float32, repeated tokens, one token, unused vocabulary rows, S up to "
            "12, dlogits from 1e-3 to 1e2",
    single=True,
    mistakes=_tied_mistakes,
    diagnose=_tied_diagnose,
    floor=lambda a: {"dwte": amax(a[1]) + a[2].shape[0] * amax(a[2], a[3])},
    shape_hints={"dwte": "One row per vocabulary entry: dwte is (vocab_size, d)."},
    dtype_hint="Create dwte with dtype=dh.dtype.",
)


def check_tied_wte_grad(fn: Callable) -> CheckResult:
    """`fn(x, dh, dlogits (N, V), xf (N, d), vocab_size) -> dwte (V, d)`, tied embeddings.

    See the "Embedding scatter-add" chapter.
    """
    return check(TIED, fn)


def _pos_reference(x, dh, vocab_size, block_size) -> tuple:
    d = dh.shape[-1]
    dwte = np.zeros((vocab_size, d), dtype=dh.dtype)  # (V, d)
    np.add.at(dwte, x.reshape(-1), dh.reshape(-1, d))  # h = wte[x] + wpe[:S]: the gather
    dwpe = np.zeros((block_size, d), dtype=dh.dtype)  # (block_size, d)
    dwpe[: x.shape[1]] = dh.sum(axis=0)  # wpe[:S] is broadcast over the batch: sum it back
    return dwte, dwpe


def _pos_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for label, x, V, d, dtype in token_cases(rng):
        S = x.shape[1]
        block = S + int(rng.integers(0, 4))
        dh = randn(rng, x.shape + (d,), dtype)  # (B, S, d)
        cases.append(Case(f"{label}, block_size={block}", (x, dh, V, block)))
    return cases + magnitudes(rng, cases[0], 1, "dh")


def _pos_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    x, dh, V, block = args
    B, S = x.shape
    pos = exp["dwpe"].copy()
    return [
        (f"dwpe is averaged over the B = {B} sequences: the table row is used by every "
         "sequence, so its gradient is the sum.",
         lambda: {"dwpe": pos / B} if B > 1 else {}),
        ("dwpe keeps only the first sequence's gradient: sum dh over the batch (axis=0).",
         lambda: {"dwpe": np.pad(dh[0], ((0, block - S), (0, 0)))} if B > 1 else {}),
        ("dwpe and dwte are swapped.", lambda: {"dwte": exp["dwpe"], "dwpe": exp["dwte"]}),
    ]


def _pos_diagnose(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    x, dh, V, block = args
    if "dwte" not in wrong:
        return []
    return repeats_diagnose(x, dh, V, np.asarray(got["dwte"], dtype=np.float64), exp["dwte"],
                            tol, "dwte")


POSITION = Spec(
    id="position_embedding_backward",
    reference_name="the scatter-add into wte and the batch sum into wpe",
    arg_names=("x", "dh", "vocab_size", "block_size"),
    out_names=("dwte", "dwpe"),
    kinds=("array", "array"),
    reference=_pos_reference,
    cases=_pos_cases,
    seed=608,
    summary="float64 and float32, repeated tokens, one token, tables longer than the sequence, "
            "S up to 12, dh from 1e-3 to 1e2",
    mistakes=_pos_mistakes,
    diagnose=_pos_diagnose,
    floor=lambda a: {"dwte": amax(a[1]), "dwpe": amax(a[1])},
    shape_hints={"dwte": "One row per vocabulary entry: dwte is (vocab_size, d).",
                 "dwpe": "One row per position of the table: (block_size, d), summed over "
                         "the batch, rows past the sequence stay 0."},
    dtype_hint="Create the gradients with dtype=dh.dtype.",
)


def check_position_embedding_backward(fn: Callable) -> CheckResult:
    """`fn(x (B,S), dh (B,S,d), vocab_size, block_size) -> (dwte (V,d), dwpe (block_size,d))`.

    The forward is h = wte[x] + wpe[:S], a learned absolute position table (GPT-2).
    See the "Embedding scatter-add" chapter.
    """
    return check(POSITION, fn)


SPECS = [EMBEDDING, TIED, POSITION]

__all__ = ["check_embedding_backward", "check_tied_wte_grad",
           "check_position_embedding_backward"]
