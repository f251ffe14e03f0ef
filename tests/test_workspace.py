"""The workspace reuses only arrays that nothing else holds: results are never overwritten."""

from __future__ import annotations

import threading

import numpy as np

import xenith_edu as xe
from xenith_edu.model.params import random_params
from xenith_edu.tools.workspace import Workspace, empty, workspace


def test_a_held_array_is_never_handed_out_again():
    ws = Workspace()
    a = ws.empty((4, 3), np.float32)
    b = ws.empty((4, 3), np.float32)
    assert a is not b  # a is still held here
    view = b[1:]
    del b
    c = ws.empty((4, 3), np.float32)
    assert c is not view.base  # a view keeps its base in use
    del a
    d = ws.empty((4, 3), np.float32)
    assert d.shape == (4, 3) and d.dtype == np.float32
    assert ws.empty((4, 3), np.float64).dtype == np.float64  # another dtype, another array


def test_a_dropped_array_is_reused():
    ws = Workspace()
    first = id(ws.empty((5,), np.float64))  # dropped at once
    assert id(ws.empty((5,), np.float64)) == first
    assert ws.nbytes == 40


def test_the_limit_stops_keeping_arrays():
    ws = Workspace(limit_bytes=100)
    ws.empty((10,), np.float64)  # 80 bytes: kept
    ws.empty((10,), np.float64)  # free again, reused
    ws.empty((20,), np.float64)  # 160 bytes: made, not kept
    assert ws.nbytes == 80
    ws.clear()
    assert ws.nbytes == 0


def test_each_thread_has_its_own_workspace():
    seen = []
    t = threading.Thread(target=lambda: seen.append(workspace()))
    t.start()
    t.join()
    assert seen[0] is not workspace()
    assert empty((2, 2), np.float32).shape == (2, 2)


def _model(rng):
    cfg = xe.Config(vocab_size=13, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)
    return cfg, random_params(cfg, rng)


def test_results_survive_later_calls(rng):
    """Gradients and caches handed out stay as they were while the caller holds them."""
    cfg, params = _model(rng)
    x1, y1 = rng.integers(0, 13, (2, 8)), rng.integers(0, 13, (2, 8))
    x2, y2 = rng.integers(0, 13, (2, 8)), rng.integers(0, 13, (2, 8))
    loss1, g1 = xe.loss_and_grads(params, cfg, x1, y1)
    kept = {k: v.copy() for k, v in g1.items()}
    logits1, cache1 = xe.forward(params, cfg, x1)
    logits1_copy = logits1.copy()
    for _ in range(3):  # the same shapes again: the workspace has arrays of every size now
        xe.loss_and_grads(params, cfg, x2, y2)
        xe.forward(params, cfg, x2)
    for k in g1:
        np.testing.assert_array_equal(g1[k], kept[k], err_msg=k)
    np.testing.assert_array_equal(logits1, logits1_copy)
    loss1b, g1b = xe.backward(params, cfg, cache1, y1)  # the old cache is intact
    assert loss1b == loss1
    for k in g1:
        np.testing.assert_array_equal(g1b[k], kept[k], err_msg=k)


def test_repeated_calls_give_identical_results(rng):
    cfg, params = _model(rng)
    x, y = rng.integers(0, 13, (3, 7)), rng.integers(0, 13, (3, 7))
    first = xe.loss_and_grads(params, cfg, x, y)
    for _ in range(3):
        again = xe.loss_and_grads(params, cfg, x, y)
        assert again[0] == first[0]
        for k in first[1]:
            np.testing.assert_array_equal(again[1][k], first[1][k], err_msg=k)


def test_an_array_held_once_elsewhere_is_not_free():
    """The reference count that means "free" is measured; one more reference means "in use"."""
    from xenith_edu.tools.workspace import _FREE_REFS, _free_index

    held = np.empty(3)
    arrays = [np.empty(2), held, np.empty(4)]
    first, last = arrays[0], arrays[2]
    assert _free_index(arrays, 0, _FREE_REFS) == -1
    del first
    assert _free_index(arrays, 1, _FREE_REFS) == 0  # the search wraps around
    del held
    assert _free_index(arrays, 1, _FREE_REFS) == 1
    assert last is arrays[2]
