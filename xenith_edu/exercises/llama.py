"""Exercises of the "A real LLaMA" chapter: the loss of a padded batch and its gradient,
QK-norm's backward (Qwen3's RMSNorm over each head of q and k, one gain for all the heads), and
LoRA's backward (a low-rank adapter beside a frozen layer: dx, dA, dB from the layer's dy).

See the "A real LLaMA" chapter; each check names the usual mistakes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..lora import lora_backward, lora_forward
from ..qk_norm import qk_norm_backward, qk_norm_forward
from ..softmax_ce import softmax_cross_entropy
from .engine import check
from .fit import Term, term
from .kit import amax, int_sampler, log_uniform, magnitudes, randn, rms_parts, softmax64
from .rmsnorm import layernorm_backward64
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: N positions, V vocab, M the positions that count (target != ignore_index);
# QK-norm: u (N, H*hd) the queries (or keys) of N positions, H heads of width hd, w (hd,).
# LoRA: x (N, n) the frozen layer's input, dy (N, m) its output's gradient, A (r, n), B (m, r).


# -- the padded cross-entropy: a derivation ---------------------------------------------------

def _padded_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    cases = []
    n_eq = ints(5, 9)  # N = V: a row sum broadcast along the wrong axis fits the shapes
    big = float(rng.uniform(750, 850))  # exp overflows past ~709 without the max subtracted
    for what, N, V, dtype, ignore, n_pad, scale, shift in (
            ("", ints(6, 10), ints(9, 12), np.float64, "pad", 3, 2.0, 0.0),
            ("N = V, ", n_eq, n_eq, np.float32, "pad", 2, 2.0, 0.0),
            ("ignore_index = -100 (outside the vocabulary), small logits, ", ints(5, 9),
             ints(4, 8), np.float64, -100, 2, 0.02, 0.0),
            ("no padding, large logits, ", ints(3, 6), ints(4, 8), np.float64, "pad", 0, 5.0,
             big),
            ("one position counts, two tokens, ", ints(4, 7), 2, np.float64, "pad", -1, 2.0,
             0.0)):
        logits = randn(rng, (N, V), dtype, scale) + dtype(shift)  # (N, V)
        ignore_index = int(rng.integers(0, V)) if ignore == "pad" else ignore
        targets = rng.integers(0, V, size=N)  # (N,)
        targets[targets == ignore_index] = (ignore_index + 1) % V  # padding only where placed
        n_pad = N - 1 if n_pad < 0 else n_pad
        targets[rng.choice(N, size=n_pad, replace=False)] = ignore_index
        label = f"{np.dtype(dtype).name}, {what}N={N}, V={V}, {n_pad} padded"
        cases.append(Case(label, (logits, targets, ignore_index)))
    return cases


def _padded_reference(logits: np.ndarray, targets: np.ndarray, ignore_index: int) -> tuple:
    return softmax_cross_entropy(logits, targets, ignore_index)


def _padded_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    logits, targets, ignore = args
    N, V = logits.shape
    keep = targets != ignore  # (N,)
    M = int(keep.sum())
    p = softmax64(logits)  # (N, V)
    safe = np.where(keep, targets, 0)
    onehot = np.eye(V)[safe] * keep[:, None]  # (N, V), zero rows where ignored
    nll = -np.log(p[np.arange(N), safe])  # (N,)
    loss, dl = exp["loss"], exp["dlogits"]
    unmasked = (p - onehot) / M  # the ignored rows keep their softmax
    return [
        (f"dlogits is divided by N = {N}, the positions, not by M = {M}, those that count: "
         "the mean is over the counted positions only.", lambda: {"dlogits": dl * M / N}),
        (f"the loss is averaged over all N = {N} positions, not over the M = {M} that count.",
         lambda: {"loss": float(nll[keep].sum() / N)}),
        ("the ignored rows of dlogits are not zero: a padded position contributes nothing, "
         "so its whole row of the gradient is 0, softmax included.",
         lambda: {"dlogits": np.where(keep[:, None], dl, unmasked)}),
        ("the padded positions are counted in the loss: leave them out of the sum and of M.",
         lambda: {"loss": float(nll.mean())}),
        ("sign flipped: dlogits = (softmax - onehot) / M on the counted rows.",
         lambda: {"dlogits": -dl}),
        (f"dlogits is M = {M} times too large: the 1/M of the mean is missing.",
         lambda: {"dlogits": dl * M}),
        ("the loss is summed, not averaged over the counted positions.",
         lambda: {"loss": loss * M}),
    ]


PADDED = Spec(
    id="padded_cross_entropy",
    reference_name="xenith_edu.softmax_ce.softmax_cross_entropy(logits, targets, ignore_index)",
    arg_names=("logits", "targets", "ignore_index"),
    out_names=("loss", "dlogits"),
    kinds=("float", "array"),
    reference=_padded_reference,
    cases=_padded_cases,
    seed=2701,
    summary="float64 and float32, a pad id inside the vocabulary and -100 outside it, no "
            "padding, one counted position",
    mistakes=_padded_mistakes,
    factors=lambda a: {f"N = {a[0].shape[0]}": float(a[0].shape[0]),
                       f"M = {int((a[1] != a[2]).sum())}": float((a[1] != a[2]).sum())},
    floor=lambda a: {"loss": 1.0 + float(np.max(np.abs(a[0]))), "dlogits": 1.0},
)


def check_padded_cross_entropy(fn: Callable) -> CheckResult:
    """`fn(logits (N, V), targets (N,), ignore_index) -> (loss, dlogits (N, V))`: the mean over
    the positions whose target is not `ignore_index`, and its gradient.

    See the "A real LLaMA" chapter.
    """
    return check(PADDED, fn)


# -- QK-norm's backward: RMSNorm over each head, one gain for every head ------------------------

def _qk_reference(dy: np.ndarray, u: np.ndarray, w: np.ndarray, eps: float) -> tuple:
    _, cache = qk_norm_forward(u, w, eps)
    return qk_norm_backward(dy, cache)


def _qk_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    sq_h, sq_hd = 2, 2 * ints(1, 3)  # N = H * hd: u is square
    plans = [  # what, N, H, hd, dtype, scale of u
        ("", ints(3, 6), ints(2, 4), 2 * ints(2, 4), np.float64, 1.0),
        ("", ints(2, 5), ints(2, 3), 2 * ints(3, 5), np.float32, 1.0),
        ("one head (plain RMSNorm), ", ints(2, 4), 1, 2 * ints(2, 4), np.float64, 1.0),
        ("N=1 (one position), ", 1, ints(2, 4), 2 * ints(2, 3), np.float64, 1.0),
        ("N = H*hd (square), ", sq_h * sq_hd, sq_h, sq_hd, np.float64, 1.0),
        ("small inputs where eps matters, ", ints(2, 4), ints(2, 3), 2 * ints(2, 3),
         np.float64, 0.01),
    ]
    cases = []
    for what, N, H, hd, dtype, scale in plans:
        eps = log_uniform(rng, 1e-7, 1e-5)
        loud = np.exp(rng.uniform(-1.5, 1.5, H)).repeat(hd)  # (H*hd,) each head its own size
        u = (randn(rng, (N, H * hd), np.float64, scale) * loud).astype(dtype)  # (N, H*hd)
        w = (1.0 + 0.5 * rng.standard_normal(hd)).astype(dtype)  # (hd,)
        dy = randn(rng, (N, H * hd), dtype)  # (N, H*hd)
        sizes = ", ".join(f"{n}={x}" for n, x in (("N", N), ("H", H), ("hd", hd))
                          if f"{n}=" not in what and not (n == "H" and H == 1))
        cases.append(Case(f"{np.dtype(dtype).name}, {what}{sizes}, eps={eps:.1e}",
                          (dy, u, w, eps)))
    return cases + magnitudes(rng, cases[0], 0, "dy")


def _heads(a: np.ndarray, hd: int) -> np.ndarray:
    return a.reshape(a.shape[0], -1, hd)  # (N, H*hd) -> (N, H, hd)


def _qk_parts(dy: np.ndarray, u: np.ndarray, w: np.ndarray, eps: float) -> tuple:
    """(xhat, rstd, g) per head: (N, H, hd), (N, H, 1), (N, H, hd) with g = dy * w."""
    hd = w.shape[0]
    xhat, rstd = rms_parts(_heads(u, hd), eps)
    return xhat, rstd, _heads(dy, hd) * w


def _centred(dy: np.ndarray, u: np.ndarray, w: np.ndarray, eps: float) -> dict:
    """LayerNorm per head, the mean subtracted first: a mistake's answer."""
    hd = w.shape[0]
    out = layernorm_backward64(_heads(dy, hd), _heads(u, hd), w, 0.0, eps)
    return {"du": out["dx"].reshape(u.shape), "dw": out["dw"].sum(axis=0)}


def _over_positions(dy: np.ndarray, u: np.ndarray, w: np.ndarray, eps: float) -> dict:
    """rstd from the mean of u**2 over the positions, not the head: a mistake's answer."""
    hd = w.shape[0]
    xp, rp = rms_parts(_heads(u, hd), eps, axis=0)  # (N, H, hd), (1, H, hd)
    gp = _heads(dy, hd) * w
    dp = rp * (gp - xp * np.mean(gp * xp, axis=-1, keepdims=True))  # (N, H, hd)
    return {"du": dp.reshape(u.shape), "dw": np.sum(_heads(dy, hd) * xp, axis=(0, 1))}


def _qk_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dy, u, w, eps = args
    N, width = u.shape
    hd = w.shape[0]
    H = width // hd
    xhat, rstd, g = _qk_parts(dy, u, w, eps)
    proj = np.mean(g * xhat, axis=-1, keepdims=True)  # (N, H, 1)
    flat = lambda a: a.reshape(N, width)  # noqa: E731
    dw = np.sum(_heads(dy, hd) * xhat, axis=0)  # (H, hd) per head, before the heads' sum

    def whole_row() -> dict:  # one RMSNorm over the H*hd numbers, the gain repeated per head
        xr, rr = rms_parts(u, eps)  # (N, H*hd), (N, 1)
        gr = dy * np.tile(w, H)
        dx = rr * (gr - xr * np.mean(gr * xr, axis=-1, keepdims=True))
        return {"du": dx, "dw": np.sum(_heads(dy * xr, hd), axis=(0, 1))}

    def strided() -> dict:  # head h taken as the columns h, h + H, h + 2H, ...
        t = lambda a: a.reshape(N, hd, H).swapaxes(1, 2)  # noqa: E731
        xs, rs = rms_parts(t(u), eps)
        gs = t(dy) * w
        ds = rs * (gs - xs * np.mean(gs * xs, axis=-1, keepdims=True))  # (N, H, hd)
        return {"du": ds.swapaxes(1, 2).reshape(N, width), "dw": np.sum(t(dy) * xs, axis=(0, 1))}

    return [
        ("the mean is subtracted first, as LayerNorm does: QK-norm is an RMSNorm, rstd = 1 / "
         "sqrt(mean(u_head**2) + eps) with no centring, so dx has no -mean(g) term.",
         lambda: _centred(dy, u, w, eps)),
        ("the mean of u**2 runs over the positions (axis 0), not over each head's hd numbers "
         "(the last axis of the (N, H, hd) view).", lambda: _over_positions(dy, u, w, eps)),
        (f"the whole row of H*hd = {width} numbers is normalised as one: QK-norm is an RMSNorm "
         f"of each head's hd = {hd} numbers on its own (reshape to (N, H, hd) first).",
         whole_row),
        ("the heads are cut the wrong way: head h is the columns h*hd to (h+1)*hd - 1 "
         "(reshape (N, H, hd)), not every H-th column.", strided),
        ("the mean term of RMSNorm's Jacobian is missing: du = rstd * (g - xhat * mean(g * "
         "xhat)) per head, with g = dy * w.", lambda: {"du": flat(rstd * g)}),
        ("the mean term has the wrong sign: du = rstd * (g - xhat * mean(g * xhat)).",
         lambda: {"du": flat(rstd * (g + xhat * proj))}),
        (f"the mean term sums over the hd = {hd} numbers of a head where the mean is needed.",
         lambda: {"du": flat(rstd * (g - xhat * proj * hd))}),
        ("eps is missing: rstd = 1 / sqrt(mean(u_head**2) + eps).",
         lambda: dict(zip(("du", "dw"), _qk_reference(dy, u, w, 0.0), strict=True))),
        ("du ignores the gain w: the gradient reaching xhat is g = dy * w.",
         lambda: {"du": flat(rstd * (_heads(dy, hd) - xhat * np.mean(
             _heads(dy, hd) * xhat, axis=-1, keepdims=True)))}),
        ("dw uses u where the normalised xhat is needed: dw sums dy * xhat.",
         lambda: {"dw": np.sum(_heads(dy * u, hd), axis=(0, 1))}),
        (f"dw holds the first head's gradient only: the gain is shared by the H = {H} heads, "
         "so their gradients add (the used-twice rule).", lambda: {"dw": dw[0]}),
        (f"dw averages over the H = {H} heads: a gain used by every head gets the sum of "
         "their gradients, not the mean.", lambda: {"dw": dw.mean(axis=0)}),
        (f"dw averages over the N = {N} positions: the gain is shared by them, so the sum.",
         lambda: {"dw": dw.sum(axis=0) / N}),
    ]


def _qk_terms(args: tuple) -> dict[str, list[Term]]:
    """du = rstd * dy * w - rstd * xhat * mean(g * xhat) per head, dw = sum(dy * xhat) over
    the positions and the heads."""
    dy, u, w, eps = args
    N, width = u.shape
    hd = w.shape[0]
    xhat, rstd, g = _qk_parts(dy, u, w, eps)
    proj = np.mean(g * xhat, axis=-1, keepdims=True)  # (N, H, 1)
    flat = lambda a: np.broadcast_to(a, g.shape).reshape(N, width)  # noqa: E731
    per = np.sum(_heads(dy, hd) * xhat, axis=0)  # (H, hd)
    return {
        "du": [term("rstd * dy * w", ("rstd", flat(rstd)), ("dy", dy),
                    ("w", np.tile(w, width // hd))),
               term("-rstd * xhat * mean(g * xhat)", ("rstd", flat(rstd)), ("xhat", flat(xhat)),
                    ("mean(g * xhat)", flat(proj)), sign=-1.0)],
        "dw": [Term("sum(dy * xhat) over the positions and the heads", per.sum(axis=0),
                    slips=(("only the first head's, not the sum over the heads", per[0]),))],
    }


def _qk_floor(args: tuple) -> dict[str, float]:
    dy, u, w, eps = args
    xhat, rstd, _ = _qk_parts(dy, u, w, eps)
    return {"du": amax(dy, w) * float(np.max(rstd)),
            "dw": u.shape[0] * (u.shape[1] // w.shape[0]) * amax(dy, xhat)}


QK_NORM = Spec(
    id="qk_norm_backward",
    reference_name="xenith_edu.qk_norm.qk_norm_backward",
    arg_names=("dy", "u", "w", "eps"),
    out_names=("du", "dw"),
    kinds=("array", "array"),
    reference=_qk_reference,
    cases=_qk_cases,
    seed=2703,
    summary="float64 and float32, 1 to 4 heads of hd = 2 to 10, N = 1 to 12, a square u, "
            "small inputs where eps matters, heads of different sizes, dy from 1e-3 to 1e2",
    mistakes=_qk_mistakes,
    terms=_qk_terms,
    factors=lambda a: {f"N = {a[1].shape[0]}": float(a[1].shape[0]),
                       f"H = {a[1].shape[1] // a[2].shape[0]}": a[1].shape[1] / a[2].shape[0],
                       f"hd = {a[2].shape[0]}": float(a[2].shape[0])},
    floor=_qk_floor,
    shape_hints={"dw": "The gain is (hd,), one entry per coordinate of a head, shared by every "
                       "head and every position: sum dy * xhat over both.",
                 "du": "du has u's shape, (N, H*hd): reshape the (N, H, hd) heads back."},
    hints=("A row of q is H heads side by side, each normalised on its own with one gain w "
           "(hd,): which chapter's backward is each head's, and what does a gain used by H "
           "heads and N positions get back?",
           "Reshape dy and u to (N, H, hd); per head, du = rstd * (g - xhat * mean(g * xhat, "
           "axis=-1, keepdims=True)) with g = dy * w (RMSNorm's); dw sums dy * xhat over the "
           "positions and the heads (the used-twice rule); reshape du back to (N, H*hd).",
           "h = u.reshape(N, H, hd); rstd = 1 / sqrt(mean(h**2, axis=-1, keepdims=True) + eps); "
           "xhat = h * rstd; g = dy.reshape(N, H, hd) * w; du = (rstd * (g - xhat * mean(g * "
           "xhat, axis=-1, keepdims=True))).reshape(N, H*hd); dw = sum(dy.reshape(N, H, hd) * "
           "xhat, axis=(0, 1))"),
)


def check_qk_norm_backward(fn: Callable) -> CheckResult:
    """`fn(dy (N, H*hd), u (N, H*hd), w (hd,), eps) -> (du (N, H*hd), dw (hd,))`: QK-norm's
    backward, an RMSNorm over each head with one gain. See the "A real LLaMA" chapter.
    """
    return check(QK_NORM, fn)


# -- LoRA's backward: a low-rank adapter beside a frozen layer ---------------------------------

def _lora_reference(dy: np.ndarray, x: np.ndarray, A: np.ndarray, B: np.ndarray,
                    scale: float) -> tuple:
    _, cache = lora_forward(x, A, B, scale)
    return lora_backward(dy, cache)


def _lora_cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    sq = ints(6, 9)  # N = n = m: x and dy square, where a transposed x or dy fits the shapes
    plans = [  # what, N, n, m, r, dtype, scale above 1 (alpha > r), B near zero
        ("", ints(4, 8), ints(7, 10), ints(11, 14), ints(2, 3), np.float64, True, False),
        ("", ints(3, 7), ints(11, 14), ints(6, 9), ints(2, 4), np.float32, True, False),
        (f"N = n = m = {sq} (a square projection, x and dy square), ", sq, sq, sq,
         ints(2, 3), np.float64, True, False),
        ("rank 1, alpha < r, ", ints(3, 6), ints(6, 9), ints(7, 10), 1, np.float64, False,
         False),
        ("N=1 (one position), ", 1, ints(6, 9), ints(7, 10), ints(2, 3), np.float64, True,
         False),
        ("B near 0 (a step from peft's start, where B = 0: dB leads), ", ints(3, 6), ints(6, 9),
         ints(7, 10), ints(2, 3), np.float64, True, True),
    ]
    cases = []
    for what, N, n, m, r, dtype, above, small in plans:
        alpha = log_uniform(rng, 2.0 * r, 8.0 * r) if above else log_uniform(rng, 0.1, 0.5) * r
        scale = alpha / r  # a Python float: the arrays keep their dtype
        x = randn(rng, (N, n), dtype)  # (N, n)
        A = randn(rng, (r, n), dtype, 1.0 / np.sqrt(n))  # (r, n), peft's size of draw
        b = log_uniform(rng, 1e-4, 1e-3) if small else 0.5  # B's size
        B = randn(rng, (m, r), dtype, b)  # (m, r)
        dy = randn(rng, (N, m), dtype)  # (N, m)
        sizes = ", ".join(f"{k}={v}" for k, v in (("N", N), ("n", n), ("m", m), ("r", r))
                          if f"{k} =" not in what and f"{k}=" not in what
                          and not (k == "r" and "rank" in what))
        cases.append(Case(f"{np.dtype(dtype).name}, {what}{sizes}, scale={scale:.3g}",
                          (dy, x, A, B, scale)))
    return cases + magnitudes(rng, cases[0], 0, "dy")


def _lora_mistakes(args: tuple, exp: dict) -> list[Mistake]:
    dy, x, A, B, s = args
    N, r = x.shape[0], A.shape[0]
    dx, dA, dB = exp["dx"], exp["dA"], exp["dB"]

    def got(ddx: np.ndarray = dx, ddA: np.ndarray = dA, ddB: np.ndarray = dB) -> dict:
        return {"dx": ddx, "dA": ddA, "dB": ddB}  # every output predicted, the right ones too

    return [
        ("dB forgets the scale: the branch's output is scale * u @ B.T, so dB = scale * dy.T "
         "@ u.", lambda: got(ddB=dB / s)),
        ("du forgets the scale: du = scale * dy @ B, and both dA = du.T @ x and dx = du @ A "
         "carry it.", lambda: got(dx / s, dA / s)),
        ("dA forgets the scale (dx has it): dA = du.T @ x with du = scale * dy @ B.",
         lambda: got(ddA=dA / s)),
        ("dx forgets the scale (dA has it): dx = du @ A with du = scale * dy @ B.",
         lambda: got(ddx=dx / s)),
        ("the scale is forgotten everywhere: every gradient of the branch carries one factor "
         "scale = alpha / r, as its output does.", lambda: got(dx / s, dA / s, dB / s)),
        ("the scale is applied twice in dA: du = scale * dy @ B holds it already, dA = du.T "
         "@ x adds none.", lambda: got(ddA=dA * s)),
        ("the scale is applied twice in dx: du = scale * dy @ B holds it already, dx = du @ A "
         "adds none.", lambda: got(ddx=dx * s)),
        ("the scale is applied twice, in du and again in dA and dx: one factor scale per "
         "gradient.", lambda: got(dx * s, dA * s)),
        (f"the scale is divided by r = {r} once more: scale is alpha / r already, use it as "
         "it is.", lambda: got(dx / r, dA / r, dB / r)),
        (f"dA and dB are averaged over the N = {N} positions: A and B are used by every "
         "position, so their gradients sum (the used-twice rule).",
         lambda: got(ddA=dA / N, ddB=dB / N)),
        ("dx is missing: the branch reads x too, so x gets du @ A from it (added to the frozen "
         "layer's dy @ W.T).", lambda: got(ddx=np.zeros_like(dx))),
    ]


def _lora_terms(args: tuple) -> dict[str, list[Term]]:
    """dx = scale * (dy @ B) @ A, dA = scale * (dy @ B).T @ x, dB = scale * dy.T @ u."""
    dy, x, A, B, s = args
    g = dy @ B  # (N, r): du before its scale
    return {"dx": [term("scale * (dy @ B) @ A", ("scale", s), ("(dy @ B) @ A", g @ A))],
            "dA": [term("scale * (dy @ B).T @ x", ("scale", s), ("(dy @ B).T @ x", g.T @ x))],
            "dB": [term("scale * dy.T @ u", ("scale", s), ("dy.T @ u", dy.T @ (x @ A.T)))]}


def _lora_floor(args: tuple) -> dict[str, float]:
    dy, x, A, B, s = args
    return {"dx": s * amax(dy, B, A), "dA": s * amax(dy, B, x), "dB": s * amax(dy, x @ A.T)}


LORA = Spec(
    id="lora_backward",
    reference_name="xenith_edu.lora.lora_backward",
    arg_names=("dy", "x", "A", "B", "scale"),
    out_names=("dx", "dA", "dB"),
    kinds=("array", "array", "array"),
    reference=_lora_reference,
    cases=_lora_cases,
    seed=2705,
    summary="float64 and float32, N = 1 to 9 positions, n and m from 6 to 14 and a square "
            "projection, rank 1 to 4, scale = alpha / r from 0.1 to 8, B near 0 as a run "
            "starts, dy from 1e-3 to 1e2",
    mistakes=_lora_mistakes,
    terms=_lora_terms,
    factors=lambda a: {f"scale = {a[4]:.3g}": float(a[4]), f"r = {a[2].shape[0]}":
                       float(a[2].shape[0]), f"N = {a[1].shape[0]}": float(a[1].shape[0])},
    floor=_lora_floor,
    shape_hints={"dx": "dx has x's shape (N, n): the gradient goes back through A.",
                 "dA": "dA has A's shape (r, n): it pairs du (N, r) with x (N, n) over the "
                       "positions.",
                 "dB": "dB has B's shape (m, r): B multiplies u = x @ A.T (N, r), not x, so "
                       "dB pairs dy (N, m) with u over the positions."},
    hints=("The branch is two linear layers in a row, u = x @ A.T and out = scale * u @ B.T, "
           "added to the frozen layer's output: which gradient reaches it, and what does each "
           "linear layer's backward give?",
           "With u = x @ A.T (N, r): out = scale * u @ B.T gives dB = scale * dy.T @ u and du = "
           "scale * dy @ B; u = x @ A.T gives dA = du.T @ x and dx = du @ A (the linear "
           "layer's rules, with A and B stored (out, in)).",
           "u = x @ A.T; du = scale * dy @ B; dx = du @ A; dA = du.T @ x; dB = scale * dy.T "
           "@ u"),
)


def check_lora_backward(fn: Callable) -> CheckResult:
    """`fn(dy (N, m), x (N, n), A (r, n), B (m, r), scale) -> (dx (N, n), dA (r, n), dB (m, r))`:
    the backward of a LoRA adapter's branch scale * (x @ A.T) @ B.T, given the gradient dy of
    the frozen layer's output. See the "A real LLaMA" chapter.
    """
    return check(LORA, fn)


SPECS = [PADDED, QK_NORM, LORA]

__all__ = ["check_lora_backward", "check_padded_cross_entropy", "check_qk_norm_backward"]
