"""A full workspace gives a released cache back: the step's memory falls as the backward goes.

The invariants: `give_back` never changes a value anyone holds and never hands a held array
out again (it only forgets); below its limit the workspace keeps everything (the book's sizes
keep reusing their arrays, no page faults); once full, every array of a released layer's cache
dies as the backward leaves the layer (its memory serves the gradients that follow); and the
loss and gradients are bit for bit the same whatever the workspace's limit.
"""

from __future__ import annotations

import weakref

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xenith_edu as xe
from xenith_edu.model import transformer
from xenith_edu.model.params import random_params
from xenith_edu.tools import workspace as wsm
from xenith_edu.tools.workspace import Workspace


def test_below_its_limit_the_workspace_keeps_what_is_given_back():
    ws = Workspace()
    a = ws.empty((100, 100), np.float32)
    assert ws.give_back((a, [a[1:]], {"x": a})) is False
    del a
    assert ws.nbytes == 40000 and ws.empty((100, 100), np.float32) is not None


def test_a_full_workspace_forgets_what_is_given_back_and_nothing_else():
    ws = Workspace(limit_bytes=80000)
    a = ws.empty((100, 100), np.float32)  # kept: 40000 bytes
    b = ws.empty((100, 100), np.float32)  # kept: 80000
    c = ws.empty((100, 100), np.float32)  # not kept: the workspace is full now
    a[:], b[:] = 1.0, 2.0
    assert ws.give_back((a.reshape(-1)[5:], c)) is True  # a view names its base
    assert ws.nbytes == 40000
    np.testing.assert_array_equal(a, 1.0)  # forgetting changes no value
    del b
    assert ws.empty((100, 100), np.float32) is not a  # only b's array comes back
    assert all(x is not a for x in ws._arrays[((100, 100), np.float32)])


def _model(rng, n_layer=3, n_embd=32, seq_len=16):
    cfg = xe.Config(vocab_size=17, n_embd=n_embd, n_head=4, n_kv_head=2, n_layer=n_layer,
                    ffn_hidden=48, seq_len=seq_len)
    return cfg, random_params(cfg, rng)


def _with_workspace(limit: int, fn):
    old = getattr(wsm._local, "ws", None)
    wsm._local.ws = Workspace(limit_bytes=limit)
    try:
        return fn()
    finally:
        wsm._local.ws = old


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(0, 3 * 2**20), seed=st.integers(0, 2**16),
       recompute=st.booleans())
def test_gradients_are_bit_for_bit_whatever_the_limit(limit, seed, recompute):
    rng = np.random.default_rng(seed)
    cfg, params = _model(rng)
    x, y = rng.integers(0, 17, (2, 16)), rng.integers(0, 17, (2, 16))
    want = xe.loss_and_grads(params, cfg, x, y, recompute=recompute)
    for _ in range(2):  # twice: the second step runs on a workspace that gave arrays back
        got = _with_workspace(limit, lambda: xe.loss_and_grads(params, cfg, x, y,
                                                               recompute=recompute))
        assert got[0] == want[0]
        for k in want[1]:
            np.testing.assert_array_equal(got[1][k], want[1][k], err_msg=k)


def test_a_full_workspace_frees_each_layers_cache_as_the_backward_leaves_it():
    """Full (its limit below one step's arrays), the workspace lets every array of layer l's
    cache die as soon as the backward is done with layer l: its memory serves the gradients
    that follow. Below the limit, it keeps them all for the next step."""
    rng = np.random.default_rng(0)
    cfg, params = _model(rng, n_layer=4, n_embd=64, seq_len=64)  # arrays above `_SMALL`
    x, y = rng.integers(0, 17, (4, 64)), rng.integers(0, 17, (4, 64))
    for limit, full in ((2**20, True), (2**30, False)):
        def run(full: bool = full) -> None:
            _, cache = transformer.forward(params, cfg, x)
            shared = {id(r) for r in wsm._roots([params, cache.cos, cache.sin, cache.x,
                                                  cache.embedding, cache.head, cache.logits])}
            refs = [[weakref.ref(r) for r in wsm._roots(layer) if id(r) not in shared]
                    for layer in cache.layers]
            assert all(refs)
            dead: list[bool] = []
            transformer.backward(params, cfg, cache, y, release=True, on_layer=lambda l, g:
                                 dead.append(all(r() is None for r in refs[l])))
            assert dead == [full] * cfg.n_layer

        _with_workspace(limit, lambda: (run(), run()))  # twice: from a used workspace too


@settings(max_examples=50, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["take", "drop", "give"]), st.integers(0, 7)),
                    max_size=60))
def test_any_order_of_asking_dropping_and_giving_back_hands_out_only_free_arrays(ops):
    """Whatever the order of `empty`, dropped holders and `give_back` on a full workspace (its
    lists shrink under their search positions), `empty` returns an array nobody else holds."""
    ws = Workspace(limit_bytes=4 * 400)  # four (10, 10) float32 arrays: full after four
    held: list[np.ndarray] = []
    for op, k in ops:
        if op == "take":
            a = ws.empty((10, 10), np.float32)
            assert all(a is not h for h in held)
            held.append(a)
        elif op == "drop" and held:
            held.pop(k % len(held))
        elif op == "give" and held:
            ws.give_back(held.pop(k % len(held)))


def test_a_list_shrunk_below_its_search_position_is_searched_from_its_head():
    """The search position of a list (where the last free array was found) may lie beyond
    its end once `give_back` has shortened it: `empty` still finds the free array."""
    ws = Workspace(limit_bytes=4 * 400)
    a, b, c, d = (ws.empty((10, 10), np.float32) for _ in range(4))  # kept: full
    e = ws.empty((10, 10), np.float32)  # declined: the workspace is full
    del c
    c = ws.empty((10, 10), np.float32)  # found at index 2: the next search starts at 3
    for held in (a, b, c):
        ws.give_back(held)  # the list is [d] now
    del d
    f = ws.empty((10, 10), np.float32)
    assert all(f is not h for h in (a, b, c, e))
