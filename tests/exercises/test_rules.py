"""The exercises of "The rules of backprop": right answers pass; each wrong gradient of the
broadcast row, and each wrong intermediate of the block, is rejected with a verdict that names it
and the row of the table it needs."""

from __future__ import annotations

import numpy as np
import pytest

from xenith_edu import exercises
from xenith_edu.exercises import rules
from xenith_edu.exercises.rules import (
    OUT_NAMES,
    block_forward,
    check_broadcast_backward,
    check_rules_block,
)
from xenith_edu.tools.gradcheck import check_gradient

from .helpers import catalogue_tests


def learner(**wrong):
    """A step-by-step backward of the block; each keyword plants one known mistake."""

    def my_block_backward(x, w, W, target, eps):
        _, c = block_forward(x, w, W, target, eps)
        N, d = x.shape
        m = W.shape[1]
        de = np.full_like(c["e"], {"none": 1 / (2 * N), "ones": 1.0, "half": 1 / N,
                                   "all": 1 / (2 * N * m)}[wrong.get("de", "none")])
        ddiff = {"none": de * 2 * c["diff"], "no2": de * c["diff"],
                 "no_de": 2 * c["diff"]}[wrong.get("ddiff", "none")]
        dout = -ddiff if wrong.get("dout") == "sign" else ddiff
        dW = {"none": c["u"].T @ dout, "T": dout.T @ c["u"], "xhat": c["xhat"].T @ dout,
              "x": x.T @ dout}[wrong.get("dW", "none")]
        du = dout @ W if wrong.get("du") == "noT" else dout @ W.T
        dw = {"none": (du * c["xhat"]).sum(axis=0), "x": (du * x).sum(axis=0),
              "nofactor": du.sum(axis=0), "unsummed": du * c["xhat"]}[wrong.get("dw", "none")]
        dxhat = du if wrong.get("dxhat") == "nogain" else du * w
        dr = {"none": (dxhat * x).sum(axis=1, keepdims=True),
              "xhat": (dxhat * c["xhat"]).sum(axis=1, keepdims=True),
              "mean": (dxhat * x).mean(axis=1, keepdims=True),
              "unsummed": dxhat * x}[wrong.get("dr", "none")]
        dvar = {"none": dr * -0.5 * c["var"] ** -1.5, "power": dr * -0.5 * c["var"] ** -0.5,
                "nohalf": dr * c["var"] ** -1.5, "nodr": -0.5 * c["var"] ** -1.5 + 0 * dr,
                "eps": dr * -0.5 * (c["ms"] + 1e-5) ** -1.5}[wrong.get("dvar", "none")]
        dms = dvar
        dsq = {"none": np.broadcast_to(dms / d, x.shape),
               "nod": np.broadcast_to(dms, x.shape),
               "byN": np.broadcast_to(dms / N, x.shape)}[wrong.get("dsq", "none")]
        dx = {"none": dxhat * c["r"] + dsq * 2 * x, "no_sq": dxhat * c["r"],
              "no_xhat": dsq * 2 * x, "no2": dxhat * c["r"] + dsq * x,
              "xhat": dxhat * c["xhat"] + dsq * 2 * x,
              "minus": dxhat * c["r"] - dsq * 2 * x}[wrong.get("dx", "none")]
        return de, ddiff, dout, dW, du, dw, dxhat, dr, dvar, dms, dsq, dx

    return my_block_backward


# (mistake, words the verdict must contain): each names the wrong intermediate and the fix.
CATALOGUE = [
    (dict(de="ones"), ["de is wrong", "de (step 10", "1 / (2N) of the loss is missing"]),
    (dict(de="half"), ["de (step 10", "the 1/2 of the loss is missing"]),
    (dict(de="all"), ["de (step 10", "divides by all N * m"]),
    (dict(ddiff="no2"), ["ddiff is wrong", "(de is right.)", "factor 2 of the derivative"]),
    (dict(ddiff="no_de"), ["ddiff (step 9", "not multiplied by de"]),
    (dict(dout="sign"), ["dout (step 8", "derivative +1"]),
    (dict(dW="T"), ["dW has shape", "transposed"]),
    (dict(dW="xhat"), ["dW (step 7", "uses xhat where u"]),
    (dict(dW="x"), ["dW (step 7", "uses x where u"]),
    (dict(du="noT"), ["du", "matmul"]),
    (dict(dw="x"), ["dw (step 6", "uses x where xhat is needed"]),
    (dict(dw="nofactor"), ["dw (step 6", "misses the factor xhat"]),
    (dict(dw="unsummed"), ["dw has shape", "copied over the N rows"]),
    (dict(dxhat="nogain"), ["dxhat (step 6", "ignores the gain"]),
    (dict(dr="xhat"), ["dr (step 5", "uses xhat where x is needed"]),
    (dict(dr="mean"), ["dr (step 5", "mean over the columns"]),
    (dict(dr="unsummed"), ["dr has shape", "sum dxhat * x along each row"]),
    (dict(dvar="power"), ["dvar (step 4", "-0.5 * var**-1.5, not -0.5 * var**-0.5"]),
    (dict(dvar="nohalf"), ["dvar (step 4", "the -0.5 is missing"]),
    (dict(dvar="nodr"), ["dvar (step 4", "not multiplied by dr"]),
    (dict(dvar="eps"), ["dvar (step 4", "eps is fixed at 1e-05"]),
    (dict(dsq="nod"), ["dsq (step 2", "1 / d of the mean is missing"]),
    (dict(dsq="byN"), ["dsq (step 2", "divides by N"]),
    (dict(dx="no_sq"), ["dx is wrong", "x is used twice", "path through sq = x**2"]),
    (dict(dx="no_xhat"), ["dx (steps 5 and 1", "path through xhat = x * r"]),
    (dict(dx="no2"), ["dx (steps 5 and 1", "derivative of x**2 is 2 * x"]),
    (dict(dx="xhat"), ["dx (steps 5 and 1", "multiplies by xhat where r is needed"]),
    (dict(dx="minus"), ["dx (steps 5 and 1", "the two paths are subtracted"]),
]


def broadcast_learner(wrong: str = "none"):
    """`(da, dc)` of Y = X * a and Y = X * c; `wrong` plants one known mistake."""

    def my_broadcast_backward(dY, X):
        P = dY * X  # (N, n) each use's gradient times its local derivative
        da = {"nolocal_a": dY.sum(axis=0), "mean_a": P.mean(axis=0), "axis_a": P.sum(axis=1),
              "unsummed": P, "swapped": P.sum(axis=1)}.get(wrong, P.sum(axis=0))
        dc = {"nolocal_c": dY.sum(axis=1, keepdims=True),
              "mean_c": P.mean(axis=1, keepdims=True), "keepdims": P.sum(axis=1),
              "swapped": P.sum(axis=0)[:, None]}.get(wrong, P.sum(axis=1, keepdims=True))
        return da, dc

    return my_broadcast_backward


BROADCAST_CATALOGUE = [
    ("nolocal_a", ["da is wrong", "(dc is right.)", "da misses the local derivative X"]),
    ("nolocal_c", ["dc is wrong", "(da is right.)", "dc misses the local derivative X"]),
    ("mean_a", ["da is wrong", "da takes a mean over the N = ", "needs a sum"]),
    ("mean_c", ["dc is wrong", "dc takes a mean over the n = ", "needs a sum"]),
    ("axis_a", ["da has shape", "copied over the N rows", "axis=0"]),
    ("keepdims", ["dc has shape", "keepdims=True"]),
    ("unsummed", ["da has shape", "sum dY * X over them"]),
    ("swapped", ["da has shape", "copied over the N rows"]),
]


def einsum_broadcast(dY, X):
    return np.einsum("ij,ij->j", dY, X), np.einsum("ij,ij->i", dY, X)[:, None]


RIGHT = {"rules_block": (learner(), rules.block_backward),
         "broadcast_backward": (broadcast_learner(), rules.broadcast_backward, einsum_broadcast)}
MUTANTS = ([("rules_block", learner(**wrong), words) for wrong, words in CATALOGUE]
           + [("broadcast_backward", broadcast_learner(wrong), words)
              for wrong, words in BROADCAST_CATALOGUE])
(test_right_answers_pass, test_mutant_is_rejected_with_its_diagnosis,
 test_the_catalogue_covers_the_chapter) = catalogue_tests(RIGHT, MUTANTS)


def test_the_block_backward_is_the_gradient_of_the_loss() -> None:
    """The reference itself, against finite differences for each input (not only the check)."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((4, 5)), 1 + 0.3 * rng.standard_normal(5)
    W, target, eps = rng.standard_normal((5, 3)), rng.standard_normal((4, 3)), 1e-3
    grads = dict(zip(OUT_NAMES, rules.block_backward(x, w, W, target, eps), strict=True))
    for name, arg, f in [
        ("dx", x, lambda a: block_forward(a, w, W, target, eps)[0]),
        ("dw", w, lambda a: block_forward(x, a, W, target, eps)[0]),
        ("dW", W, lambda a: block_forward(x, w, a, target, eps)[0]),
    ]:
        res = check_gradient(f, arg, grads[name], name=name)
        assert res.passed, str(res)


def test_a_right_answer_passes(capsys) -> None:
    result = check_rules_block(learner())
    assert result.passed and result.status == "passed", result.message
    assert result.message.startswith("[passed] rules_block: all 8 cases")
    assert capsys.readouterr().out.strip() == result.message


def test_the_broadcast_mistakes_on_a_square_x_are_named() -> None:
    """On the square case a sum over the wrong axis has the right shape: the table names it."""
    (case,) = [c for c in rules.BROADCAST.make_cases() if "square" in c.label]
    dY, X = case.args
    exp = dict(zip(("da", "dc"), rules.broadcast_backward(dY, X), strict=True))
    texts = [text for text, make in rules.BROADCAST.mistakes(case.args, exp) if make()]
    assert any("sums over the columns" in t for t in texts)
    assert any("swapped" in t for t in texts)
    one = [c for c in rules.BROADCAST.make_cases() if c.args[1].shape[0] == 1][0]
    exp1 = dict(zip(("da", "dc"), rules.broadcast_backward(*one.args), strict=True))
    made = [make() for text, make in rules.BROADCAST.mistakes(one.args, exp1)
            if "mean over the N" in text]
    assert made == [{}]  # one position: a mean over the rows is the sum itself


def test_the_broadcast_reference_is_the_gradient() -> None:
    rng = np.random.default_rng(8)
    X, dY = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    a, c = rng.standard_normal(5), rng.standard_normal((3, 1))
    da, dc = rules.broadcast_backward(dY, X)
    assert check_gradient(lambda t: np.sum(X * t * dY), a, da, name="da").passed
    assert check_gradient(lambda t: np.sum(X * t * dY), c, dc, name="dc").passed


def test_the_check_is_registered_with_its_chapter() -> None:
    assert exercises.CHECKS["broadcast_backward"] == ("rules", check_broadcast_backward)
    assert exercises.CHECKS["rules_block"] == ("rules", check_rules_block)
    assert exercises.check_rules_block is check_rules_block
    assert exercises.SPECS["rules_block"].chapter == "rules"


@pytest.mark.parametrize("wrong,words", CATALOGUE,
                         ids=["-".join(f"{k}={v}" for k, v in m.items()) for m, _ in CATALOGUE])
def test_each_wrong_intermediate_is_named(wrong, words) -> None:
    result = check_rules_block(learner(**wrong))
    assert result.status == "failed" and not result.passed
    for word in words:
        assert word in result.message, f"{word!r} not in:\n{result.message}"
    (name,) = wrong
    earlier = OUT_NAMES[:OUT_NAMES.index(name)]
    # every gradient above the planted mistake is reported right, none of them wrong
    for other in earlier:
        assert f"{other} is wrong" not in result.message, result.message


def test_an_unknown_mistake_names_the_first_wrong_gradient() -> None:
    def odd(x, w, W, target, eps):
        out = list(learner()(x, w, W, target, eps))
        i = OUT_NAMES.index("dms")
        out[i] = out[i] * 1.7 + 0.1  # no known mistake gives this
        for j in range(i + 1, len(out)):
            out[j] = out[j] + 1.0  # and the later ones go wrong with it
        return tuple(out)

    message = check_rules_block(odd).message
    assert "first wrong gradient, going backward, is dms (step 3" in message, message
    assert "adding eps has derivative 1" in message
    assert "fix dms first" in message


def test_the_cases_vary_with_the_rng() -> None:
    a = rules.BLOCK.make_cases(np.random.default_rng(1))
    b = rules.BLOCK.make_cases(np.random.default_rng(2))
    assert [c.label for c in a] != [c.label for c in b]
    assert rules.BLOCK.make_cases()[0].label == rules.BLOCK.make_cases()[0].label
