"""The capstone's layer in 36 steps: its backward agrees with central finite differences in
float64 and with the package's model, a right answer passes (even one that drops the max's
zero gradient), and each planted mistake is rejected with the step and the table's row."""

from __future__ import annotations

import numpy as np

from xenith_edu.exercises import capstone as cp
from xenith_edu.model.config import Config
from xenith_edu.model.transformer import layer_backward, layer_forward
from xenith_edu.rope import rope_tables

from .helpers import catalogue_tests

PARAMS = ("wte", "g1", "wq", "wk", "wv", "wo", "g2", "w1", "w3", "w2")


def example(S=5, d=6, f=8, V=3, theta=100.0, seed=0) -> tuple:
    """A float64 case of the check (tokens repeat: S > V)."""
    rng = np.random.default_rng(seed)
    case = cp._cases(rng)[0].args
    tokens = rng.integers(0, V, S)
    cos, sin = rope_tables(S, d, theta)  # (S, d/2) each
    r = lambda *shape, s=1.0: s * rng.standard_normal(shape)  # noqa: E731
    wte, g1, g2 = r(V, d), 1 + r(d, s=0.3), 1 + r(d, s=0.3)
    wq, wk, wv, wo = (r(d, d, s=1.5 / np.sqrt(d)) for _ in range(4))
    w1, w3, w2 = r(d, f, s=d ** -0.5), r(d, f, s=d ** -0.5), r(f, d, s=f ** -0.5)
    assert len(case) == 15
    return (tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, r(S, d), 3e-6)


def test_the_backward_agrees_with_central_differences_in_float64() -> None:
    args = list(example())
    dy, eps = args[13], args[14]
    got = dict(zip(cp.OUT_NAMES, cp.layer_backward_steps(*args), strict=True))

    def loss() -> float:
        return float(np.sum(cp.layer_steps(*args[:13], eps)["y"] * dy))

    h = 1e-6
    for i, name in enumerate(PARAMS, start=1):
        w = args[i]
        num = np.zeros_like(w)
        for j in np.ndindex(w.shape):
            keep = w[j]
            w[j] = keep + h
            up = loss()
            w[j] = keep - h
            num[j] = (up - loss()) / (2 * h)
            w[j] = keep
        analytic = got[f"d{name}"]
        err = np.max(np.abs(analytic - num)) / np.max(np.abs(num))
        assert err < 1e-7, f"d{name}: relative error {err:.1e} against central differences"


def test_the_layer_is_the_package_layer_with_one_head() -> None:
    tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps = example(theta=100.0)
    S, d = len(tokens), wte.shape[1]
    cfg = Config(vocab_size=wte.shape[0], n_embd=d, n_head=1, n_layer=1, ffn_hidden=w1.shape[1],
                 seq_len=S, rope_theta=100.0, norm_eps=eps)
    p = {"rms_attn": g1, "wq": wq, "wk": wk, "wv": wv, "wo": wo, "rms_ffn": g2, "w1": w1,
         "w3": w3, "w2": w2}
    t = cp.layer_steps(tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, eps)
    # the attention block takes the tables repeated for the H + Hkv heads of a row (qk_rope_tables)
    heads = cfg.n_head + cfg.n_kv_head
    y, cache = layer_forward(wte[tokens].copy(), p, cfg, np.tile(cos, heads), np.tile(sin, heads))
    np.testing.assert_allclose(t["y"], y, rtol=1e-12, atol=1e-12)
    dh, grads = layer_backward(dy.copy(), cache)
    g = dict(zip(cp.OUT_NAMES, cp.layer_backward_steps(
        tokens, wte, g1, wq, wk, wv, wo, g2, w1, w3, w2, cos, sin, dy, eps), strict=True))
    np.testing.assert_allclose(g["dh"], dh, rtol=1e-10, atol=1e-12)
    names = {"rms_attn": "dg1", "rms_ffn": "dg2"}
    for key, value in grads.items():
        np.testing.assert_allclose(g[names.get(key, f"d{key}")], value, rtol=1e-10, atol=1e-12,
                                   err_msg=key)


def learner(**wrong):
    """A step-by-step backward; each keyword plants one mistake at one step."""
    def my_layer_backward(*args):
        g = dict(zip(cp.OUT_NAMES, cp.layer_backward_steps(*args), strict=True))
        t = cp.layer_steps(*args[:13], args[14])
        if wrong.get("detach_max"):  # right: the max's gradient is zero, dropping it is fine
            g["dm"] = np.zeros_like(g["dm"])
            g["dzm"] = g["dzs"]
        if "dsg" in wrong:  # a wrong step, and every step below it computed from it
            g["dsg"] = g["dsu"] * t["sg"]
        if "de" in wrong:
            g["de"] = g["dp"] / t["den"]
        if "dwte" in wrong:
            g["dwte"] = np.zeros_like(args[1])
            g["dwte"][args[0]] = g["dh"]
        if "dq0" in wrong:
            C = np.repeat(args[11], 2, axis=1)
            g["dq0"] = g["dq"] * C + cp.pairswap(g["dq0s"])
        return tuple(g[name] for name in cp.OUT_NAMES)
    return my_layer_backward


CATALOGUE = [
    ({"dsg": 1}, ["dsg (step 33, su = u * sg)", "elementwise: dsg = dsu * u"]),
    ({"de": 1}, ["de (steps 21 and 20", "the path through den, dden, is missing"]),
    ({"dwte": 1}, ["dwte (step 1, h = wte[tokens])", "np.add.at(dwte, tokens, dh)"]),
    ({"dq0": 1}, ["dq0 (steps 11 and 10", "pairswap's transpose is -pairswap"]),
]
# right: the reference's lines, and an answer that drops the max's gradient (zero, up to rounding)
RIGHT = {"capstone_layer": (learner(), learner(detach_max=True), cp.layer_backward_steps)}
MUTANTS = [("capstone_layer", learner(**wrong), words) for wrong, words in CATALOGUE]
(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_the_steps_cover_a_whole_layer() -> None:
    t = cp.layer_steps(*example()[:13], 1e-5)
    assert len(t) == 36 and {"h", "m", "zm", "q0s", "sg", "y"} <= set(t)
    assert len(cp.OUT_NAMES) == len(set(cp.OUT_NAMES)) == 45
    rows = {"elementwise", "broadcast", "sum", "matmul", "reshape", "gather", "used twice"}
    assert {rule.split(":")[0].split(" (")[0] for _, _, rule in cp.STEPS} <= rows
