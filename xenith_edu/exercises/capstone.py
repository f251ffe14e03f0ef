"""Exercise of the chapter "Capstone: a whole layer, step by step": one LLaMA layer in 36 steps.

The learner backpropagates a whole layer (the gather, RMSNorm, q/k/v with RoPE, a max-subtracted
causal softmax, SwiGLU, both residuals); the check names the first wrong gradient in the
backward order and the row of the duality table its step needs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..rope import rope_tables
from . import engine
from .engine import check
from .kit import amax, int_sampler, magnitudes, randn
from .types import Case, CheckResult, Mistake, Spec

# Shape legend: S positions (one sequence), d width (one head of width d, even), f SwiGLU
# hidden width, V vocabulary; (S, 1) a column of row statistics, (S, S) the scores.

ARG_NAMES = ("tokens", "wte", "g1", "wq", "wk", "wv", "wo", "g2", "w1", "w3", "w2", "cos",
             "sin", "dy", "eps")

# The gradients the learner returns, in the backward order: each with the forward step(s) it
# goes back through and the row of the duality table ("The rules of backprop") it needs.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("df", "step 36, y = h1 + f", "elementwise: a sum has derivative 1 in each term, df = dy"),
    ("dgg", "step 35, f = gg @ w2", "matmul: dgg = df @ w2.T"),
    ("dw2", "step 35, f = gg @ w2", "matmul: dw2 = gg.T @ df, of shape (f, d)"),
    ("dsu", "step 34, gg = su * gt", "elementwise: dsu = dgg * gt"),
    ("dgt", "step 34, gg = su * gt", "elementwise: dgt = dgg * su"),
    ("dsg", "step 33, su = u * sg", "elementwise: dsg = dsu * u"),
    ("du", "steps 33 and 32, su = u * sg and sg = sigmoid(u)",
     "used twice: du = dsu * sg + dsg * sg * (1 - sg)"),
    ("dw1", "step 30, u = x2 @ w1", "matmul: dw1 = x2.T @ du"),
    ("dw3", "step 31, gt = x2 @ w3", "matmul: dw3 = x2.T @ dgt"),
    ("dx2", "steps 30 and 31, u = x2 @ w1 and gt = x2 @ w3",
     "used twice: dx2 = du @ w1.T + dgt @ w3.T"),
    ("dg2", "step 29, x2 = hn2 * g2",
     "broadcast: g2 is copied over the S rows, so dg2 sums dx2 * hn2 over them (axis=0)"),
    ("dhn2", "step 29, x2 = hn2 * g2", "elementwise: dhn2 = dx2 * g2"),
    ("dr2", "step 28, hn2 = h1 * r2",
     "broadcast: r2 (S, 1) is copied over the d columns: sum dhn2 * h1 along each row"),
    ("dms2", "step 27, r2 = (ms2 + eps)**-0.5",
     "elementwise: the derivative is -0.5 * (ms2 + eps)**-1.5"),
    ("dsq2", "step 26, ms2 = sq2.mean(axis=1, keepdims=True)",
     "sum: a mean over d columns copies dms2 / d back to every column"),
    ("dh1", "steps 36, 28 and 25: y = h1 + f, hn2 = h1 * r2, sq2 = h1 * h1",
     "used twice (three times here): dh1 = dy + dhn2 * r2 + dsq2 * 2 * h1"),
    ("do", "step 24, h1 = h + o", "elementwise: a sum has derivative 1, do = dh1"),
    ("da", "step 23, o = a @ wo", "matmul: da = do @ wo.T"),
    ("dwo", "step 23, o = a @ wo", "matmul: dwo = a.T @ do"),
    ("dp", "step 22, a = p @ v", "matmul: dp = da @ v.T, of shape (S, S)"),
    ("dv", "step 22, a = p @ v", "matmul: dv = p.T @ da"),
    ("dden", "step 21, p = e / den",
     "broadcast: den (S, 1) is copied over the columns: dden sums -dp * e / den**2 along "
     "each row"),
    ("de", "steps 21 and 20, p = e / den and den = e.sum(axis=1)",
     "used twice: de = dp / den + dden (the sum's backward copies dden along the row)"),
    ("dzs", "step 19, e = exp(zs)", "elementwise: dzs = de * e"),
    ("dm", "step 18, zs = zm - m",
     "broadcast: m (S, 1) is copied over the columns with a minus: dm = -dzs.sum(axis=1), "
     "which is zero up to rounding (a softmax does not change when a constant is subtracted)"),
    ("dzm", "steps 18 and 17, zs = zm - m and m = zm.max(axis=1)",
     "used twice: dzm = dzs plus dm at the position of each row's maximum (the max picks one "
     "entry: a gather, whose backward puts dm back there)"),
    ("dz", "step 16, zm = where(causal, z, -inf)",
     "elementwise: derivative 1 where the mask keeps z, 0 above the diagonal"),
    ("ds", "step 15, z = s * scale", "elementwise: ds = dz * scale, scale = 1 / sqrt(d)"),
    ("dq", "step 14, s = q @ k.T", "matmul: dq = ds @ k"),
    ("dk", "step 14, s = q @ k.T", "matmul: dk = ds.T @ q (k enters transposed)"),
    ("dq0s", "step 11, q = q0 * C + q0s * Sn", "elementwise: dq0s = dq * Sn"),
    ("dq0", "steps 11 and 10, q = q0 * C + q0s * Sn and q0s = pairswap(q0)",
     "used twice: dq0 = dq * C + (the transpose of pairswap)(dq0s), and pairswap's transpose "
     "is -pairswap (reshape: a fixed rearrangement goes back by its inverse transpose)"),
    ("dk0s", "step 13, k = k0 * C + k0s * Sn", "elementwise: dk0s = dk * Sn"),
    ("dk0", "steps 13 and 12, k = k0 * C + k0s * Sn and k0s = pairswap(k0)",
     "used twice: dk0 = dk * C - pairswap(dk0s)"),
    ("dwq", "step 7, q0 = x1 @ wq", "matmul: dwq = x1.T @ dq0"),
    ("dwk", "step 8, k0 = x1 @ wk", "matmul: dwk = x1.T @ dk0"),
    ("dwv", "step 9, v = x1 @ wv", "matmul: dwv = x1.T @ dv"),
    ("dx1", "steps 7, 8 and 9, the three projections of x1",
     "used twice (three times here): dx1 = dq0 @ wq.T + dk0 @ wk.T + dv @ wv.T"),
    ("dg1", "step 6, x1 = hn1 * g1", "broadcast: dg1 sums dx1 * hn1 over the rows (axis=0)"),
    ("dhn1", "step 6, x1 = hn1 * g1", "elementwise: dhn1 = dx1 * g1"),
    ("dr1", "step 5, hn1 = h * r1", "broadcast: dr1 sums dhn1 * h along each row"),
    ("dms1", "step 4, r1 = (ms1 + eps)**-0.5",
     "elementwise: the derivative is -0.5 * (ms1 + eps)**-1.5"),
    ("dsq1", "step 3, ms1 = sq1.mean(axis=1, keepdims=True)",
     "sum: a mean over d columns copies dms1 / d back to every column"),
    ("dh", "steps 24, 5 and 2: h1 = h + o, hn1 = h * r1, sq1 = h * h",
     "used twice (three times here): dh = dh1 + dhn1 * r1 + dsq1 * 2 * h"),
    ("dwte", "step 1, h = wte[tokens]",
     "gather: its backward is a scatter-add, np.add.at(dwte, tokens, dh): a repeated token "
     "adds, never overwrites"),
)
OUT_NAMES = tuple(name for name, _, _ in STEPS)


def pairswap(u: np.ndarray) -> np.ndarray:
    """(u0, u1, u2, u3, ...) -> (-u1, u0, -u3, u2, ...): each pair turned by a quarter."""
    out = np.empty_like(u)  # (S, d)
    out[:, 0::2], out[:, 1::2] = -u[:, 1::2], u[:, 0::2]
    return out


def layer_steps(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, eps) -> dict:
    """One LLaMA layer on one sequence, one head, as 36 atomic steps; every one by name.

    cos and sin are RoPE's tables (S, d/2); C and Sn repeat each of their columns for the two
    entries of a pair. See the "Capstone: a whole layer, step by step" chapter.
    """
    S, d = len(tokens), wte.shape[1]
    C, Sn = np.repeat(cos, 2, axis=1), np.repeat(sin, 2, axis=1)  # (S, d) each
    causal = np.tril(np.ones((S, S), dtype=bool))  # (S, S) True on and below the diagonal
    t: dict[str, np.ndarray] = {}
    t["h"] = wte[tokens]  # 1 (S, d) gather
    t["sq1"] = t["h"] * t["h"]  # 2 (S, d)
    t["ms1"] = t["sq1"].mean(axis=1, keepdims=True)  # 3 (S, 1)
    t["r1"] = (t["ms1"] + eps) ** -0.5  # 4 (S, 1)
    t["hn1"] = t["h"] * t["r1"]  # 5 (S, d)
    t["x1"] = t["hn1"] * g1  # 6 (S, d)
    t["q0"], t["k0"], t["v"] = t["x1"] @ wq, t["x1"] @ wk, t["x1"] @ wv  # 7, 8, 9 (S, d) each
    t["q0s"] = pairswap(t["q0"])  # 10 (S, d)
    t["q"] = t["q0"] * C + t["q0s"] * Sn  # 11 (S, d) RoPE
    t["k0s"] = pairswap(t["k0"])  # 12 (S, d)
    t["k"] = t["k0"] * C + t["k0s"] * Sn  # 13 (S, d)
    t["s"] = t["q"] @ t["k"].T  # 14 (S, S)
    t["z"] = t["s"] * (1.0 / np.sqrt(d))  # 15 (S, S)
    t["zm"] = np.where(causal, t["z"], -np.inf).astype(t["z"].dtype)  # 16 (S, S)
    t["m"] = t["zm"].max(axis=1, keepdims=True)  # 17 (S, 1)
    t["zs"] = t["zm"] - t["m"]  # 18 (S, S)
    t["e"] = np.exp(t["zs"])  # 19 (S, S), 0 above the diagonal
    t["den"] = t["e"].sum(axis=1, keepdims=True)  # 20 (S, 1)
    t["p"] = t["e"] / t["den"]  # 21 (S, S)
    t["a"] = t["p"] @ t["v"]  # 22 (S, d)
    t["o"] = t["a"] @ wo  # 23 (S, d)
    t["h1"] = t["h"] + t["o"]  # 24 (S, d) first residual
    t["sq2"] = t["h1"] * t["h1"]  # 25 (S, d)
    t["ms2"] = t["sq2"].mean(axis=1, keepdims=True)  # 26 (S, 1)
    t["r2"] = (t["ms2"] + eps) ** -0.5  # 27 (S, 1)
    t["hn2"] = t["h1"] * t["r2"]  # 28 (S, d)
    t["x2"] = t["hn2"] * g2  # 29 (S, d)
    t["u"], t["gt"] = t["x2"] @ w1, t["x2"] @ w3  # 30, 31 (S, f) each
    t["sg"] = 1.0 / (1.0 + np.exp(-t["u"]))  # 32 (S, f)
    t["su"] = t["u"] * t["sg"]  # 33 (S, f) silu(u)
    t["gg"] = t["su"] * t["gt"]  # 34 (S, f)
    t["f"] = t["gg"] @ w2  # 35 (S, d)
    t["y"] = t["h1"] + t["f"]  # 36 (S, d) second residual
    return t


def _ffn_backward(t: dict, g: dict, w1, w3, w2, g2, dy, eps) -> None:
    """Steps 36 down to 25 (the SwiGLU block and its RMSNorm), into g."""
    d = dy.shape[1]
    g["df"] = dy  # 36
    g["dgg"], g["dw2"] = g["df"] @ w2.T, t["gg"].T @ g["df"]  # 35
    g["dsu"], g["dgt"] = g["dgg"] * t["gt"], g["dgg"] * t["su"]  # 34
    g["dsg"] = g["dsu"] * t["u"]  # 33
    g["du"] = g["dsu"] * t["sg"] + g["dsg"] * t["sg"] * (1 - t["sg"])  # 33 and 32
    g["dw1"], g["dw3"] = t["x2"].T @ g["du"], t["x2"].T @ g["dgt"]  # 30, 31
    g["dx2"] = g["du"] @ w1.T + g["dgt"] @ w3.T  # 30 and 31: used twice
    g["dg2"], g["dhn2"] = (g["dx2"] * t["hn2"]).sum(axis=0), g["dx2"] * g2  # 29
    g["dr2"] = (g["dhn2"] * t["h1"]).sum(axis=1, keepdims=True)  # 28
    g["dms2"] = g["dr2"] * -0.5 * (t["ms2"] + eps) ** -1.5  # 27
    g["dsq2"] = np.broadcast_to(g["dms2"] / d, dy.shape).copy()  # 26
    g["dh1"] = dy + g["dhn2"] * t["r2"] + g["dsq2"] * 2 * t["h1"]  # 36, 28, 25: used thrice


def _attention_backward(t: dict, g: dict, wo, cos, sin) -> None:
    """Steps 24 down to 10 (the attention block above its projections), into g."""
    S, d = t["q"].shape
    C, Sn = np.repeat(cos, 2, axis=1), np.repeat(sin, 2, axis=1)  # (S, d) each
    g["do"] = g["dh1"]  # 24
    g["da"], g["dwo"] = g["do"] @ wo.T, t["a"].T @ g["do"]  # 23
    g["dp"], g["dv"] = g["da"] @ t["v"].T, t["p"].T @ g["da"]  # 22
    g["dden"] = (-g["dp"] * t["e"] / t["den"] ** 2).sum(axis=1, keepdims=True)  # 21
    g["de"] = g["dp"] / t["den"] + g["dden"]  # 21 and 20: used twice
    g["dzs"] = g["de"] * t["e"]  # 19
    g["dm"] = -g["dzs"].sum(axis=1, keepdims=True)  # 18
    g["dzm"] = g["dzs"].copy()  # 18 and 17: the max sends dm to each row's argmax
    np.add.at(g["dzm"], (np.arange(S), t["zm"].argmax(axis=1)), g["dm"][:, 0])
    causal = np.tril(np.ones((S, S), dtype=bool))  # (S, S)
    g["dz"] = np.where(causal, g["dzm"], 0).astype(g["dzm"].dtype)  # 16
    g["ds"] = g["dz"] * (1.0 / np.sqrt(d))  # 15
    g["dq"], g["dk"] = g["ds"] @ t["k"], g["ds"].T @ t["q"]  # 14
    g["dq0s"] = g["dq"] * Sn  # 11
    g["dq0"] = g["dq"] * C - pairswap(g["dq0s"])  # 11 and 10: pairswap's transpose is -pairswap
    g["dk0s"] = g["dk"] * Sn  # 13
    g["dk0"] = g["dk"] * C - pairswap(g["dk0s"])  # 13 and 12


def layer_backward_steps(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy,
                         eps) -> tuple[np.ndarray, ...]:
    """The 45 gradients of `layer_steps` for the output gradient dy, in the order of
    `OUT_NAMES`: the backward pass read as the forward in reverse."""
    t = layer_steps(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, eps)
    d = wte.shape[1]
    g: dict[str, np.ndarray] = {}
    _ffn_backward(t, g, w1, w3, w2, g2, dy, eps)
    _attention_backward(t, g, wo, cos, sin)
    x1, h = t["x1"], t["h"]
    g["dwq"], g["dwk"], g["dwv"] = x1.T @ g["dq0"], x1.T @ g["dk0"], x1.T @ g["dv"]  # 7, 8, 9
    g["dx1"] = g["dq0"] @ wq.T + g["dk0"] @ wk.T + g["dv"] @ wv.T  # used three times
    g["dg1"], g["dhn1"] = (g["dx1"] * t["hn1"]).sum(axis=0), g["dx1"] * g1  # 6
    g["dr1"] = (g["dhn1"] * h).sum(axis=1, keepdims=True)  # 5
    g["dms1"] = g["dr1"] * -0.5 * (t["ms1"] + eps) ** -1.5  # 4
    g["dsq1"] = np.broadcast_to(g["dms1"] / d, h.shape).copy()  # 3
    g["dh"] = g["dh1"] + g["dhn1"] * t["r1"] + g["dsq1"] * 2 * h  # 24, 5, 2: used three times
    g["dwte"] = np.zeros_like(wte)  # (V, d)
    np.add.at(g["dwte"], tokens, g["dh"])  # 1: gather's backward, a scatter-add
    return tuple(g[name] for name in OUT_NAMES)


def _cases(rng: np.random.Generator) -> list[Case]:
    ints = int_sampler(rng)
    shapes = [  # what, S, d, f, V, dtype
        ("", ints(4, 6), 2 * ints(3, 4), ints(9, 11), ints(3, 4), np.float64),
        ("", ints(5, 7), 2 * ints(4, 5), ints(12, 14), ints(5, 6), np.float32),
        ("S=1 (one position), ", 1, 2 * ints(2, 3), ints(7, 9), ints(3, 5), np.float64),
        ("two tokens, ", ints(6, 8), 2 * ints(3, 4), ints(9, 11), 2, np.float64),
    ]
    cases = []
    for what, S, d, f, V, dtype in shapes:
        eps = float(np.exp(rng.uniform(np.log(1e-6), np.log(1e-4))))
        tokens = rng.integers(0, V, S)  # (S,)
        if S > 1:  # a token repeated (the scatter-add adds) and two that differ (not degenerate)
            tokens[-1], tokens[1] = tokens[0], (tokens[0] + 1) % V
        cos, sin = rope_tables(S, d, float(rng.uniform(50.0, 200.0)))  # (S, d/2) each
        wte = randn(rng, (V, d), dtype)  # (V, d)
        g1, g2 = ((1.0 + 0.3 * rng.standard_normal(d)).astype(dtype) for _ in range(2))
        wq, wk, wv, wo = (randn(rng, (d, d), dtype, 1.5 / np.sqrt(d)) for _ in range(4))
        w1, w3 = (randn(rng, (d, f), dtype, 1 / np.sqrt(d)) for _ in range(2))
        w2 = randn(rng, (f, d), dtype, 1 / np.sqrt(f))  # (f, d)
        dy = randn(rng, (S, d), dtype)  # (S, d)
        label = f"{np.dtype(dtype).name}, {what}S={S}, d={d}, f={f}, V={V}, eps={eps:.1e}"
        cases.append(Case(label, (tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2,
                                  cos.astype(dtype), sin.astype(dtype), dy, eps)))
    return cases + magnitudes(rng, cases[0], 13, "dy")


def _mistakes(args: tuple, exp: dict) -> list[Mistake]:
    """Known mistakes at one step, each computed from the right gradients above that step."""
    tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps = args
    t = layer_steps(*args[:13], eps)
    g, d = exp, wte.shape[1]
    C = np.repeat(cos, 2, axis=1)  # (S, d) the cos table per entry

    def at(name: str, text: str, value: Callable[[], np.ndarray | None]) -> Mistake:
        step = next(s for n, s, _ in STEPS if n == name)
        above = OUT_NAMES[:OUT_NAMES.index(name)]  # a mistake here leaves these right

        def cand() -> dict:
            v = value()
            return {} if v is None else {**{n: g[n] for n in above}, name: v}
        return f"{name} ({step}): {text}", cand

    def overwritten() -> np.ndarray | None:
        if len(set(tokens.tolist())) == len(tokens):
            return None  # no repeated token: overwriting and adding agree
        out = np.zeros_like(wte)
        out[tokens] = g["dh"]
        return out

    return [
        at("du", "u is used twice, in sg = sigmoid(u) and in su = u * sg: the path through the "
           "sigmoid, dsg * sg * (1 - sg), is missing.", lambda: g["dsu"] * t["sg"]),
        at("dx2", "x2 feeds both u and gt: the two paths add, dx2 = du @ w1.T + dgt @ w3.T.",
           lambda: g["du"] @ w1.T),
        at("dh1", "h1 is used three times, and the residual path y = h1 + f passes dy on "
           "unchanged: dh1 = dy + dhn2 * r2 + dsq2 * 2 * h1.",
           lambda: g["dhn2"] * t["r2"] + g["dsq2"] * 2 * t["h1"]),
        at("de", "e is used twice, in p = e / den and in den = e.sum(): the path through den, "
           "dden, is missing.", lambda: g["dp"] / t["den"]),
        at("ds", f"the scale 1 / sqrt(d) of step 15 is missing (d = {d}).", lambda: g["dz"]),
        at("dk", "dk = ds.T @ q: k enters s = q @ k.T transposed, so its gradient takes the "
           "transpose of ds.", lambda: g["ds"] @ t["q"]),
        at("dq0", "RoPE's pairs are turned back the wrong way: pairswap's transpose is "
           "-pairswap, so dq0 = dq * C - pairswap(dq0s).",
           lambda: g["dq"] * C + pairswap(g["dq0s"])),
        at("dq0", "q0 is used twice, in q directly and through q0s = pairswap(q0): the path "
           "through q0s is missing.", lambda: g["dq"] * C),
        at("dx1", "x1 feeds three projections: dx1 = dq0 @ wq.T + dk0 @ wk.T + dv @ wv.T, the "
           "path through v is missing.", lambda: g["dq0"] @ wq.T + g["dk0"] @ wk.T),
        at("dh", "h is used three times, and the residual path h1 = h + o passes dh1 on "
           "unchanged: dh = dh1 + dhn1 * r1 + dsq1 * 2 * h.",
           lambda: g["dhn1"] * t["r1"] + g["dsq1"] * 2 * t["h"]),
        at("dwte", "a repeated token overwrites its row of dwte instead of adding to it: use "
           "np.add.at(dwte, tokens, dh).", overwritten),
        at("dsq1", f"the 1 / d of the mean is missing: ms1 averages d = {d} columns.",
           lambda: np.broadcast_to(g["dms1"], t["h"].shape)),
    ]


def _first_wrong(args: tuple, exp: dict, got: dict, wrong: set, tol: float) -> list[str]:
    """When no known mistake fits: the first wrong gradient going backward, and its row."""
    return engine.first_wrong(STEPS, exp, got, wrong, tol)


def _floor(args: tuple) -> dict[str, float]:
    """The size of the terms each gradient is made of, so that rounding in a gradient whose
    terms cancel (dm, and de, dzs, dz where a row has one key) is not taken for an error."""
    args = (np.asarray(args[0]).astype(np.int64), *args[1:])  # the token ids, as indices
    g = dict(zip(OUT_NAMES, layer_backward_steps(*args), strict=True))
    t = layer_steps(*args[:13], args[14])
    S, d = len(args[0]), args[1].shape[1]
    size = {name: amax(g[name]) for name in OUT_NAMES}  # where nothing cancels: its own size
    terms = amax(g["dp"]) / float(np.min(t["den"]))  # dp / den, the size of de's terms
    zs = 2 * amax(g["dp"], t["p"])  # the size of dzs's terms, dp * p and dden * e
    size.update(dm=S * zs, dzm=S * zs, dz=S * zs, dzs=zs, de=2 * terms, dden=S * terms)
    size.update(ds=S * zs / np.sqrt(d), dq=S * S * zs * amax(t["k"]) / np.sqrt(d),
                dk=S * S * zs * amax(t["q"]) / np.sqrt(d))
    for name in OUT_NAMES:  # the gradients below the scores (zero when S = 1, say): the size
        size[name] = max(size[name], 1e-3 * amax(args[13]))  # of the gradient that comes in
    return size


LAYER = Spec(
    id="capstone_layer",
    reference_name="xenith_edu.exercises.capstone.layer_backward_steps",
    arg_names=ARG_NAMES,
    out_names=OUT_NAMES,
    kinds=("array",) * len(OUT_NAMES),
    reference=layer_backward_steps,
    cases=_cases,
    seed=2601,
    summary="float64 and float32, S = 1 to 8, a token repeated, the max-subtracted causal "
            "softmax, RoPE, SwiGLU and both residuals, dy from 1e-3 to 1e2",
    mistakes=_mistakes,
    diagnose=_first_wrong,
    floor=_floor,
    shape_hints={"dm": "m is a column (S, 1): its gradient is one too (keepdims=True).",
                 "dden": "den is a column (S, 1): its gradient is one too (keepdims=True).",
                 "dr1": "r1 is a column (S, 1): sum along each row with keepdims=True.",
                 "dr2": "r2 is a column (S, 1): sum along each row with keepdims=True.",
                 "dg1": "g1 is copied over the S rows: sum over axis=0, shape (d,).",
                 "dg2": "g2 is copied over the S rows: sum over axis=0, shape (d,)."},
)


def check_capstone_layer(fn: Callable) -> CheckResult:
    """`fn(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps)` -> the 45
    gradients of a whole layer, in the backward order. See the "Capstone: a whole layer, step
    by step" chapter."""
    return check(LAYER, fn)


SPECS = [LAYER]
__all__ = ["check_capstone_layer"]
