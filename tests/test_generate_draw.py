"""Drawing a token: what `next_token_probs` and one draw give, for any logits and settings;
greedy sampling short-cuts the draw only where the distribution is one token of probability 1."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from xenith_edu.model.generate import draw_token, next_token_probs

logits_st = hnp.arrays(st.sampled_from([np.float32, np.float64]), st.integers(1, 40),
                       elements=st.floats(-30, 30, width=32))


@settings(max_examples=200, deadline=None)
@given(logits=logits_st, top_k=st.none() | st.integers(1, 45),
       temperature=st.sampled_from([0.3, 1.0, 2.5]), seed=st.integers(0, 2**16))
def test_a_drawn_token_has_positive_probability_and_is_the_draw_of_its_distribution(
        logits, top_k, temperature, seed):
    p = next_token_probs(logits, temperature, top_k)
    got = draw_token(logits, np.random.default_rng(seed), temperature, top_k)
    assert p[got] > 0
    if p.max() < 1.0:  # a real draw: the same one, from the same generator
        assert got == int(np.random.default_rng(seed).choice(logits.size, p=p))
    else:  # one token of probability 1
        assert got == int(np.argmax(p))


@settings(max_examples=50, deadline=None)
@given(logits=logits_st, seed=st.integers(0, 2**16))
def test_greedy_ties_are_drawn_among_the_tied(logits, seed):
    logits = logits.copy()
    logits[-1] = logits.max()  # at least two tokens share the largest logit when size > 1
    tied = set(np.flatnonzero(logits == logits.max()))
    seen = {draw_token(logits, np.random.default_rng(seed + i), top_k=1) for i in range(20)}
    assert seen <= tied
    if len(tied) > 1:
        assert len(seen) > 1  # twenty draws among two or more: not always the first
