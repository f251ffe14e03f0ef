"""Exercises of the RoPE chapter: the backward, learned frequencies, the rotate-half convention.

See the "RoPE" chapter; each check diagnoses the usual mistakes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..rope import rope_tables
from .engine import check
from .fit import Term
from .kit import amax, int_sampler, log_uniform, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: B batch, H heads, S positions, hd head width (even).


def package_rope_backward(du: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The package's RoPE backward in the learner's signature (du, cos, sin)."""
    from .. import rope  # the package's own, as the notebook has it

    _, cache = rope.rope_forward(du, cos, sin)  # the cache holds the tables, not du
    return rope.rope_backward(du, cache)


def tables(S: int, hd: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    return rope_tables(S, hd, theta)


def _rope_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    sq = ints(2, 4)

    shapes = [  # label, shape, dtype, theta
        ("", (ints(4, 8), 2 * ints(2, 5)), np.float64, log_uniform(rng, 1e3, 1e5)),
        ("", (2, ints(2, 3), ints(3, 6), 4), np.float32, log_uniform(rng, 1e3, 1e5)),
        ("S=1 (one position), ", (1, 2, 1, 2 * ints(2, 4)), np.float64,
         log_uniform(rng, 1e3, 1e5)),
        ("", (ints(2, 4), ints(5, 8), 2), np.float64, log_uniform(rng, 1e3, 1e5)),
        ("long sequence, ", (2, ints(48, 64), 16), np.float64, log_uniform(rng, 50, 200)),
        ("S=hd (square), ", (2, 2 * sq, 2 * sq), np.float64, log_uniform(rng, 1e3, 1e5)),
    ]
    cases = []
    for what, shape, dtype, theta in shapes:
        cos, sin = tables(shape[-2], shape[-1], theta)  # (S, hd/2) each
        label = f"{np.dtype(dtype).name}, {what}du {shape}, theta={theta:.4g}"
        cases.append(Case(label, (randn(rng, shape, dtype), cos, sin)))
    return cases + magnitudes(rng, cases[0], 0, "du")


def pairs(u: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Interleaved pairs (u[2i], u[2i+1]) rotated by the angle of (c, s)."""
    out = np.empty_like(u)
    out[..., 0::2] = u[..., 0::2] * c - u[..., 1::2] * s
    out[..., 1::2] = u[..., 0::2] * s + u[..., 1::2] * c
    return out


def halves(u: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Rotate-half pairs (u[i], u[i + hd/2]) rotated by the angle of (c, s)."""
    h = u.shape[-1] // 2
    a, b = u[..., :h], u[..., h:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def _swap_pairs(du: np.ndarray) -> np.ndarray:
    """The index that swaps the two elements of every pair: 1, 0, 3, 2, ..."""
    return np.arange(du.shape[-1]).reshape(-1, 2)[:, ::-1].reshape(-1)


def _rope_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    du, cos, sin = args
    return [
        ("RoPE rotated the wrong way: the backward is the rotation by -angle (the transpose), "
         "(du[2i]*cos + du[2i+1]*sin, -du[2i]*sin + du[2i+1]*cos).",
         lambda: {"du_in": pairs(du, cos, sin)}),
        ("du came back unrotated: the backward rotates each pair by -angle.",
         lambda: {"du_in": du}),
        ("cos and sin are swapped.", lambda: {"du_in": pairs(du, sin, -cos)}),
        ("the pairs are (u[i], u[i + hd/2]) (the rotate-half convention); this book pairs "
         "neighbours (u[2i], u[2i+1]).", lambda: {"du_in": halves(du, cos, -sin)}),
        ("the pairs are shifted by one: u[2i+1] is taken as a pair's first element and u[2i] "
         "as its second; a pair is (u[2i], u[2i+1]), the even index first.",
         lambda: {"du_in": pairs(du[..., _swap_pairs(du)], cos, -sin)}),
        ("the pairs are shifted by one: they start at u[1], (u[2i+1], u[2i+2]); a pair is "
         "(u[2i], u[2i+1]), starting at u[0].", lambda: {"du_in": _shifted(du, cos, sin)}),
        ("the pairs are (u[i], u[i + hd/2]) and rotated the wrong way; this book pairs "
         "neighbours (u[2i], u[2i+1]) and the backward rotates by -angle.",
         lambda: {"du_in": halves(du, cos, sin)}),
    ]


def _slots(du: np.ndarray, even: np.ndarray | None = None,
           odd: np.ndarray | None = None) -> np.ndarray:
    """An array like du holding `even` at the slots 2i and `odd` at 2i+1 (zeros elsewhere)."""
    out = np.zeros_like(du)  # (..., S, hd)
    if even is not None:
        out[..., 0::2] = even
    if odd is not None:
        out[..., 1::2] = odd
    return out


def _rope_terms(args: tuple) -> dict[str, list[Term]]:
    """du_in[2i] = du[2i] cos + du[2i+1] sin, du_in[2i+1] = -du[2i] sin + du[2i+1] cos."""
    du, cos, sin = args
    a, b = du[..., 0::2], du[..., 1::2]  # (..., S, hd/2) the pairs' first and second
    return {"du_in": [Term("du[2i] * cos (at 2i)", _slots(du, even=a * cos)),
                      Term("du[2i+1] * sin (at 2i)", _slots(du, even=b * sin)),
                      Term("-du[2i] * sin (at 2i+1)", _slots(du, odd=-a * sin)),
                      Term("du[2i+1] * cos (at 2i+1)", _slots(du, odd=b * cos))]}


def _shifted(du: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The backward with pairs that start one element later: (u[2i+1], u[2i+2]), wrapping."""
    return np.roll(pairs(np.roll(du, -1, axis=-1), cos, -sin), 1, axis=-1)


ROPE = Spec(
    id="rope_backward",
    reference_name="xenith_edu.rope.rope_backward",
    arg_names=("du", "cos", "sin"),
    out_names=("du_in",),
    kinds=("array",),
    reference=lambda du, cos, sin: (package_rope_backward(du, cos, sin),),
    cases=_rope_cases,
    seed=505,
    summary="float64 and float32, 2-D to 4-D, S = 1 to 64, square S = hd, du from 1e-3 to 1e2",
    single=True,
    mistakes=_rope_mistakes,
    terms=_rope_terms,
    hints=("RoPE is linear: each pair (u[2i], u[2i+1]) is multiplied by a 2 x 2 matrix R, so "
           "its vector-Jacobian product multiplies the pair's gradient by the transpose of R. "
           "What is the transpose of a rotation?",
           "a, b = du[..., 0::2], du[..., 1::2]; out[..., 0::2] = a * cos + b * sin; "
           "out[..., 1::2] = -a * sin + b * cos (the forward with sin negated).",
           "du_in[2i] = du[2i] cos + du[2i+1] sin; du_in[2i+1] = -du[2i] sin + du[2i+1] cos"),
    floor=lambda a: {"du_in": amax(a[0])},
    dtype_hint="The tables are float64: cast them to du's dtype (cos.astype(du.dtype)).",
)


def check_rope_backward(fn: Callable) -> CheckResult:
    """`fn(du (..., S, hd), cos (S, hd/2), sin (S, hd/2)) -> du_in`, same shape.

    See the "RoPE" chapter.
    """
    return check(ROPE, fn)


def rope_freq_grad(du_out: np.ndarray, u: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """d loss / d omega (hd/2,) of RoPE with learned frequencies: angle t * omega_i."""
    return _freq_grad(du_out, u, omega)


def _freq_grad(du_out: np.ndarray, u: np.ndarray, omega: np.ndarray, *, start: int = 0,
               with_t: bool = True, rotated: bool = True, mean: bool = False) -> np.ndarray:
    """The reference, and (with a switch set) one of the mistakes of the table below."""
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(S, dtype=np.float64) + start  # (S,) positions
    v = pairs(u, *_angles(t, omega)) if rotated else u  # (..., S, hd) u' = rope(u)
    dphi = du_out[..., 1::2] * v[..., 0::2] - du_out[..., 0::2] * v[..., 1::2]  # (..., S, hd/2)
    rows = dphi.reshape(-1, S, h)  # (n, S, hd/2) n rows of the leading axes
    dphi = rows.mean(axis=0) if mean else rows.sum(axis=0)  # (S, hd/2)
    return np.sum((t[:, None] if with_t else 1.0) * dphi, axis=0)  # (hd/2,)


def _freq_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    # S >= 4 everywhere: the factors t, t + 1 and 1 then give three different answers
    shapes = [(ints(4, 8), 2 * ints(3, 5)), (ints(2, 4), ints(5, 10), 2 * ints(2, 4)),
              (2, ints(2, 3), ints(6, 12), 8), (2, ints(16, 24), 16), (2, 6, 6)]
    cases = []
    for shape in shapes:
        hd, theta = shape[-1], log_uniform(rng, 1e2, 1e4)
        init = theta ** (-2.0 * np.arange(hd // 2) / hd)  # (hd/2,) the usual frequencies
        omega = init * np.exp(0.2 * rng.standard_normal(hd // 2))  # (hd/2,) learned: drifted
        label = f"du_out and u {shape}, omega ({hd // 2},) from theta={theta:.4g}"
        cases.append(Case(label, (randn(rng, shape), randn(rng, shape), omega)))
    return cases + magnitudes(rng, cases[0], 0, "du_out")


def _freq_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    du, u, omega = args
    n = int(np.prod(u.shape[:-2]))  # rows of the leading axes

    def bwd(**switch: bool) -> dict:
        return {"domega": _freq_grad(du, u, omega, **switch)}

    h = u.shape[-1] // 2
    perm = np.stack([np.arange(h), np.arange(h) + h], axis=-1).reshape(-1)  # (hd,)
    back = pairs(du, *_angles(_positions(u), omega, sign=-1.0))  # (..., S, hd) du
    return [
        ("the factor t is missing: the angle is phi[t, i] = t * omega[i], so "
         "d phi / d omega = t, and domega[i] = sum over t of t * dphi[t, i].",
         lambda: bwd(with_t=False)),
        ("positions start at 1: they start at 0 (the first token is not rotated).",
         lambda: bwd(start=1)),
        ("the derivative of the rotation acts on the rotated pair: d u'/d phi is u' turned by "
         "a quarter turn, (-u'[2i+1], u'[2i]), so dphi pairs du' with u' = rope(u), not with u.",
         lambda: bwd(rotated=False)),
        ("it pairs du = rope_backward(du') with u' = rope(u): pair du' with u', or du with u "
         "(both give the same dphi).", lambda: {"domega": _freq_grad(back, u, omega)}),
        ("that is du' . u', the gradient of a scale of each pair, not of its angle: "
         "d u'/d phi is u' turned by a quarter turn, (-u'[2i+1], u'[2i]).",
         lambda: {"domega": _scale_grad(du, u, omega)}),
        (f"omega is shared by the {n} rows of the leading axes: their dphi add up (the "
         "broadcast row), a mean divides by their number.",
         lambda: bwd(mean=True) if n > 1 else {}),
        ("the pairs are (u[i], u[i + hd/2]) (the rotate-half convention); this book pairs "
         "neighbours (u[2i], u[2i+1]).",
         lambda: {"domega": _freq_grad(du[..., perm], u[..., perm], omega)}),
        ("the sign of the quarter turn: d u'[2i]/d phi = -u'[2i+1] and "
         "d u'[2i+1]/d phi = +u'[2i].", lambda: {"domega": -exp["domega"]}),
    ]


def _angles(t: np.ndarray, omega: np.ndarray, sign: float = 1.0) -> tuple:
    """cos and sin (S, hd/2) of the angles t * omega (times sign) at the positions t (S,)."""
    phi = t[:, None] * omega[None, :]  # (S, hd/2)
    return np.cos(phi), sign * np.sin(phi)


def _positions(u: np.ndarray) -> np.ndarray:
    return np.arange(u.shape[-2], dtype=np.float64)  # (S,) t = 0 .. S-1


def _scale_grad(du: np.ndarray, u: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """The mistake du' . u' in place of the quarter turn: a scale's gradient, times t."""
    v = pairs(u, *_angles(_positions(u), omega))  # (..., S, hd)
    S, h = u.shape[-2], u.shape[-1] // 2
    dot = (du[..., 0::2] * v[..., 0::2] + du[..., 1::2] * v[..., 1::2]).reshape(-1, S, h)
    return np.sum(np.arange(S)[:, None] * dot.sum(axis=0), axis=0)  # (hd/2,)


def _freq_terms(args: tuple) -> dict[str, list[Term]]:
    """domega = sum t du'[2i+1] u'[2i] - sum t du'[2i] u'[2i+1], over the rows and positions."""
    du, u, omega = args
    S, h = u.shape[-2], u.shape[-1] // 2
    t = np.arange(S, dtype=np.float64)[:, None]  # (S, 1)

    def total(x: np.ndarray, w: np.ndarray) -> np.ndarray:  # (..., S, hd/2) -> (hd/2,)
        return np.sum(w * x.reshape(-1, S, h).sum(axis=0), axis=0)

    v = pairs(u, *_angles(_positions(u), omega))  # (..., S, hd) u' = rope(u)
    out = []
    for name, g, k, sign in (("t * du'[2i+1] * u'[2i]", 1, 0, 1.0),
                             ("-t * du'[2i] * u'[2i+1]", 0, 1, -1.0)):
        x, x0 = du[..., g::2] * v[..., k::2], du[..., g::2] * u[..., k::2]
        out.append(Term(name, sign * total(x, t), slips=(
            ("the factor t is missing (d phi / d omega = t)", sign * total(x, 1.0)),
            ("it takes u where u' = rope(u) belongs", sign * total(x0, t)))))
    return {"domega": out}


ROPE_FREQ = Spec(
    id="rope_freq_grad",
    reference_name="xenith_edu.exercises.rope.rope_freq_grad",
    arg_names=("du_out", "u", "omega"),
    out_names=("domega",),
    kinds=("array",),
    reference=lambda du, u, omega: (rope_freq_grad(du, u, omega),),
    cases=_freq_cases,
    seed=506,
    summary="2-D to 4-D, S = 4 to 24, hd/2 = 2 to 8, square S = hd, du_out from 1e-3 to 1e2",
    single=True,
    mistakes=_freq_mistakes,
    terms=_freq_terms,
    hints=("omega reaches the loss through every angle phi[t, i] = t * omega[i], at every "
           "position and every row of the leading axes (the broadcast row: their gradients "
           "add), and each angle through its pair u' = R(phi) u, whose derivative in phi is "
           "R(phi) turned by a quarter turn.",
           "u2 = rope(u) (rope_forward with the tables of omega); dphi = du_out[..., 1::2] * "
           "u2[..., 0::2] - du_out[..., 0::2] * u2[..., 1::2]; sum dphi over the leading "
           "axes, multiply by t[:, None] and sum over the positions.",
           "domega[i] = sum over the rows and t of t * (du'[t, 2i+1] u'[t, 2i] - "
           "du'[t, 2i] u'[t, 2i+1])"),
    floor=lambda a: {"domega": amax(a[0], a[1]) * a[1].shape[-2]},  # one term: t du' u'
    shape_hints={"domega": "One number per pair, the shape of omega: (head_dim // 2,); sum "
                           "over the positions and over every leading axis."},
)


def check_rope_freq_grad(fn: Callable) -> CheckResult:
    """`fn(du_out (..., S, hd), u (..., S, hd), omega (hd/2,)) -> domega (hd/2,)`.

    RoPE with learned frequencies: pair i at position t turns by t * omega[i]. See the "RoPE"
    chapter.
    """
    return check(ROPE_FREQ, fn)


def _half_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    du, cos, sin = args
    return [
        ("rotated the wrong way: the backward is the rotation by -angle (the transpose), "
         "(du[i]*cos + du[i+hd/2]*sin, -du[i]*sin + du[i+hd/2]*cos).",
         lambda: {"du_in": halves(du, cos, sin)}),
        ("du came back unrotated: the backward rotates each pair by -angle.",
         lambda: {"du_in": du}),
        ("the pairs are neighbours (u[2i], u[2i+1]), the interleaved convention; rotate-half "
         "pairs u[i] with u[i + hd/2].", lambda: {"du_in": pairs(du, cos, -sin)}),
        ("cos and sin are swapped.", lambda: {"du_in": halves(du, sin, -cos)}),
    ]


ROPE_HALF = Spec(
    id="rope_half_backward",
    reference_name="the rotate-half RoPE backward",
    arg_names=("du", "cos", "sin"),
    out_names=("du_in",),
    kinds=("array",),
    reference=lambda du, cos, sin: (halves(du, cos.astype(du.dtype), -sin.astype(du.dtype)),),
    cases=lambda rng: _rope_cases(rng),
    seed=507,
    summary="float64 and float32, 2-D to 4-D, S = 1 to 64, square S = hd, du from 1e-3 to 1e2",
    single=True,
    mistakes=_half_mistakes,
    floor=lambda a: {"du_in": amax(a[0])},
    dtype_hint="The tables are float64: cast them to du's dtype (cos.astype(du.dtype)).",
)


def check_rope_half_backward(fn: Callable) -> CheckResult:
    """`fn(du (..., S, hd), cos (S, hd/2), sin (S, hd/2)) -> du_in` for rotate-half RoPE.

    The rotate-half forward pairs u[i] with u[i + hd/2] (GPT-NeoX, Hugging Face LLaMA):
    (u[i] cos - u[i + hd/2] sin, u[i] sin + u[i + hd/2] cos). See the "RoPE" chapter.
    """
    return check(ROPE_HALF, fn)


def half_to_interleaved(n_heads: int, head_dim: int) -> np.ndarray:
    """Columns of wq (d, H*hd) for rotate-half RoPE, reordered for interleaved RoPE.

    Inside each head, interleaved column 2i takes rotate-half column i and 2i+1 takes
    i + hd/2, so both conventions give the same rotated queries (in the interleaved order).
    """
    h = head_dim // 2
    one = np.stack([np.arange(h), np.arange(h) + h], axis=-1).reshape(-1)  # (hd,)
    return (one[None, :] + head_dim * np.arange(n_heads)[:, None]).reshape(-1)


def _perm_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    H, hd = args
    h = hd // 2
    one = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])  # the inverse, one head
    heads = hd * np.arange(H)[:, None]
    return [
        ("that is the inverse permutation (interleaved to rotate-half): column 2i of the "
         "interleaved weights must take rotate-half column i.",
         lambda: {"perm": (one[None, :] + heads).reshape(-1)}),
        ("the permutation runs over all H * hd columns as if they were one head: it must act "
         "inside each head's hd columns.",
         lambda: {"perm": half_to_interleaved(1, H * hd)} if H > 1 else {}),
        ("each pair is in the wrong order: column 2i takes rotate-half column i, and 2i+1 takes "
         "i + hd/2.", lambda: {"perm": (np.stack([np.arange(h) + h, np.arange(h)], axis=-1)
                                        .reshape(-1)[None, :] + heads).reshape(-1)}),
    ]


def _perm_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)

    # head_dim 6 at least somewhere: for 2 and 4 the permutation is its own inverse
    sizes = [(ints(2, 4), 2 * ints(3, 4)), (1, 2 * ints(2, 5)), (ints(2, 3), 2)]
    return [Case(f"n_heads={H}, head_dim={hd}", (H, hd)) for H, hd in sizes]


ROPE_PERMUTATION = Spec(
    id="rope_permutation",
    reference_name="xenith_edu.exercises.rope.half_to_interleaved",
    arg_names=("n_heads", "head_dim"),
    out_names=("perm",),
    kinds=("array",),
    reference=lambda H, hd: (half_to_interleaved(H, hd),),
    cases=_perm_cases,
    seed=508,
    summary="one to four heads, head_dim 2 to 10",
    single=True,
    mistakes=_perm_mistakes,
    floor=lambda a: {"perm": 1.0},
    tol=0.0,
    shape_hints={"perm": "One index per column of wq: n_heads * head_dim of them."},
    dtype_hint="Build it with np.arange (integers).",
)


def check_rope_permutation(fn: Callable) -> CheckResult:
    """`fn(n_heads, head_dim) -> perm (n_heads*head_dim,)`: wq[:, perm] turns rotate-half
    weights into interleaved ones (and wk likewise). See the "RoPE" chapter."""
    return check(ROPE_PERMUTATION, fn)


SPECS = [ROPE, ROPE_FREQ, ROPE_HALF, ROPE_PERMUTATION]

__all__ = ["check_rope_backward", "check_rope_freq_grad", "check_rope_half_backward",
           "check_rope_permutation"]
