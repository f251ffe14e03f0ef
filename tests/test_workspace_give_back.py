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
from hypothesis import HealthCheck, example, given, settings
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


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["empty", "empty", "drop", "give_back"]),
                              st.integers(0, 1), st.integers(0, 9)), max_size=80),
       kept=st.integers(0, 8))
@example(ops=[("empty", 0, 0)] * 4 + [("drop", 0, 1), ("empty", 0, 0), ("give_back", 0, 0),
              ("give_back", 0, 1), ("empty", 0, 0)], kept=3)  # the list shrinks by two under
# the search's start, which it kept at 2 (an IndexError once, in a full step)
def test_any_sequence_of_asks_drops_and_give_backs_hands_out_only_free_arrays(ops, kept):
    """Whatever order a step asks, drops and gives back in (lists that shrink under a search's
    remembered start included), `empty` never fails and never hands out an array still held."""
    ws = Workspace(limit_bytes=kept * 800)  # it keeps `kept` arrays, then it is full
    held: list[np.ndarray] = []
    shapes = [(10, 10), (200,)]  # 800 bytes each in float64
    for op, k, i in ops:
        if op == "empty":
            a = ws.empty(shapes[k], np.float64)
            assert all(a is not h for h in held)
            held.append(a)
        elif op == "drop" and held:
            held.pop(i % len(held))
        elif op == "give_back" and held:
            ws.give_back(held[i % len(held)])


def test_a_full_workspace_frees_what_the_shard_threads_made(monkeypatch):
    """With adapters and several BLAS threads, a layer's cache holds arrays that other threads
    made from their own workspaces (the blocks' parts, `model/parts.py`): once those are full,
    `give_back` reaches them too, and every array of layer l dies as the backward leaves it."""
    from threadpoolctl import threadpool_limits

    from xenith_edu.model import cores, parts
    from xenith_edu.model.adapters import LoraSpec, init_adapters

    rng = np.random.default_rng(0)
    cfg = xe.Config(vocab_size=17, n_embd=64, n_head=4, n_kv_head=2, n_layer=3, seq_len=64)
    params = random_params(cfg, rng, dtype=np.float32)
    ad = init_adapters(cfg, LoraSpec(2, 4.0, ("q", "v", "o")), rng, np.float32)
    x, y = rng.integers(0, 17, (4, 64)), rng.integers(0, 17, (4, 64))
    monkeypatch.setattr(parts, "MIN_WORK", 0)
    limit = 2**20  # a few of a layer's arrays: each workspace keeps some, then is full
    monkeypatch.setattr(wsm, "_LIMIT_BYTES", limit)  # the threads' new workspaces
    with threadpool_limits(2):
        monkeypatch.setitem(cores._state, "pool", None)  # a pool of one thread, whose
        cores.on_threads([wsm.workspace, wsm.workspace])  # workspace is new
        for ws in list(wsm._every):  # and the existing ones, from nothing
            ws.clear()
            monkeypatch.setattr(ws, "limit_bytes", limit)
        made_by = set()

        def run() -> None:
            _, cache = transformer.forward(params, cfg, x, adapters=ad)
            assert isinstance(cache.layers[0].attn, parts.Parts)
            assert isinstance(cache.layers[0].ffn, parts.Parts)
            shared = {id(r) for r in wsm._roots([params, ad.weights, cache.cos, cache.sin,
                                                  cache.x, cache.embedding, cache.head,
                                                  cache.logits])}
            refs = [[weakref.ref(r) for r in wsm._roots(layer) if id(r) not in shared]
                    for layer in cache.layers]
            for ws in [wsm.workspace(), *wsm._every]:  # where the layers' arrays came from
                kept = {id(a) for arrays in ws._arrays.values() for a in arrays}
                if any(id(r()) in kept for layer in refs for r in layer):
                    made_by.add(id(ws))
            dead: list[bool] = []
            transformer.backward(params, cfg, cache, y, release=True, on_layer=lambda l, g:
                                 dead.append(all(r() is None for r in refs[l])))
            assert dead == [True] * cfg.n_layer

        try:
            _with_workspace(limit, lambda: (run(), run()))
        finally:
            for ws in list(wsm._every):  # no full workspace left behind for other tests
                ws.clear()
    assert len(made_by) >= 2  # the arrays came from more than this thread's workspace


@settings(max_examples=100, deadline=None)
@given(before=st.lists(st.integers(1, 4), max_size=6), inside=st.lists(st.integers(1, 4),
                                                                        max_size=8),
       held=st.integers(0, 6), limit=st.sampled_from([0, 2**16, 2**30]))
def test_keeping_all_keeps_every_array_of_the_block_and_then_only_those(before, inside, held,
                                                                        limit):
    """Inside `keeping_all` (a LoRA step) the workspace keeps every array it makes, whatever
    its limit, and gives nothing back; when the block ends it holds exactly the arrays the block
    was handed (another call's are forgotten), full if they are above its limit."""
    ws = Workspace(limit_bytes=limit)
    shape = lambda k: (k, wsm._SMALL + 1)  # above `_SMALL`: from the workspace  # noqa: E731
    kept_before = [ws.empty(shape(k), np.float32) for k in before][:held]  # some still held
    old = getattr(wsm._local, "ws", None)
    wsm._local.ws = ws
    try:
        with wsm.keeping_all():
            got = [wsm.empty(shape(k), np.float32) for k in inside]
            assert {id(a) for a in got} <= {id(a) for arrays in ws._arrays.values()
                                            for a in arrays}  # kept, whatever the limit
            assert wsm.give_back(got) is False and ws.nbytes >= sum(a.nbytes for a in got)
            assert not any(a is b for a in got for b in kept_before)  # never a held one
    finally:
        wsm._local.ws = old
    lists = {id(arrays): arrays for arrays in ws._arrays.values()}  # a list may sit under two
    now = [a for arrays in lists.values() for a in arrays]  # spellings of its dtype
    assert {id(a) for a in now} == {id(a) for a in got}
    assert ws.nbytes == sum(a.nbytes for a in now) and ws.full == (ws.nbytes > limit)


@settings(max_examples=30, deadline=None)
@given(made=st.booleans(), depth=st.integers(1, 3), fails=st.booleans(),
       big=st.booleans())
def test_keeping_all_and_give_back_never_wait_on_themselves(made, depth, fails, big):
    """From a thread with or without a workspace of its own yet, inside nested `keeping_all`
    blocks, a LoRA step that succeeds or raises (adapters of the wrong dtype: a learner's
    slip) ends: its error reaches the caller, never a hang. (A first version made the thread's
    workspace while holding the lock that making one takes: the error path hung.)"""
    import threading

    from xenith_edu.model.adapters import LoraSpec, init_adapters

    d = 64 if big else 8  # above `_SMALL` or not: whether the step makes a workspace at all
    cfg = xe.Config(vocab_size=300 if big else 9, n_embd=d, n_head=2, n_layer=1, seq_len=8)
    rng = np.random.default_rng(0)
    params = random_params(cfg, rng, dtype=np.float32)
    ad = init_adapters(cfg, LoraSpec(2), rng, np.float64 if fails else np.float32)
    x = rng.integers(0, cfg.vocab_size, (4, 8))
    outcome: list = []

    def step() -> None:
        if made:
            wsm.workspace()
        try:
            def nest(n: int):
                if n == 0:
                    return xe.loss_and_grads(params, cfg, x, x, adapters=ad)
                with wsm.keeping_all():
                    return nest(n - 1)
            outcome.append(nest(depth - 1))
        except ValueError as e:
            outcome.append(e)

    t = threading.Thread(target=step, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "the step never ended"
    assert isinstance(outcome[0], ValueError) == fails
    assert wsm._keeping[0] == 0  # every block ended, the count back to none
