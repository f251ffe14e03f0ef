"""Tests of training.threads: a batch shared among threads gives the single call's figures."""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import xenith_edu.training.threads as threads_mod
from xenith_edu import Config, init_params, loss_and_grads
from xenith_edu.training.threads import ThreadShards, shard_bounds

CFG = Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)


def _batch(B: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, CFG.vocab_size, (B, 8)), rng.integers(0, CFG.vocab_size, (B, 8))


@pytest.mark.parametrize("B, threads, want", [
    (12, 2, [(0, 6), (6, 12)]),
    (5, 2, [(0, 2), (2, 5)]),
    (7, 3, [(0, 2), (2, 4), (4, 7)]),
    (2, 4, [(0, 1), (1, 2)]),  # never an empty shard
    (3, 1, [(0, 3)]),
])
def test_shard_bounds_cover_the_batch_evenly(B, threads, want):
    assert shard_bounds(B, threads) == want


@pytest.mark.parametrize("B, threads", [(6, 2), (5, 2), (7, 3), (3, 5), (4, 1), (1, 2)])
@pytest.mark.parametrize("recompute", [False, True])
def test_sharded_loss_and_gradients_equal_one_call(B, threads, recompute):
    """Equal and unequal shards: the mean of the shards' means, weighted by their windows, is
    the batch's mean, to float64 rounding."""
    params = init_params(CFG, 3, np.float64)
    x, y = _batch(B)
    loss, grads = loss_and_grads(params, CFG, x, y)
    with ThreadShards(threads) as shards:
        got_loss, got = shards.loss_and_grads(params, CFG, x, y, recompute=recompute)
    assert got_loss == pytest.approx(loss, rel=1e-13)
    assert list(got) == list(grads)
    for name in grads:
        np.testing.assert_allclose(got[name], grads[name], rtol=1e-11, atol=1e-15, err_msg=name)


def test_sharded_gradients_are_the_same_every_time():
    params = init_params(CFG, 4, np.float32)
    x, y = _batch(6, seed=1)
    with ThreadShards(2) as shards:
        first = shards.loss_and_grads(params, CFG, x, y)
        again = shards.loss_and_grads(params, CFG, x, y)
    assert first[0] == again[0]
    for name in first[1]:
        np.testing.assert_array_equal(first[1][name], again[1][name])


@pytest.mark.parametrize("B, threads", [(6, 3), (7, 3)])
def test_the_shards_gradients_are_summed_then_scaled_when_equal(B, threads):
    """Equal shards: (g0 + g1 + g2) / 3, two passes over each gradient; unequal ones: each
    weighted by its windows, then summed. Bit for bit, the rule each case states."""
    params = init_params(CFG, 5, np.float32)
    x, y = _batch(B, seed=2)
    bounds = shard_bounds(B, threads)
    with threadpool_limits(limits=1, user_api="blas"):  # as each shard runs
        parts = [loss_and_grads(params, CFG, x[lo:hi], y[lo:hi])[1] for lo, hi in bounds]
    with ThreadShards(threads) as shards:
        _, got = shards.loss_and_grads(params, CFG, x, y)
    for name in got:
        if B % threads == 0:
            want = parts[0][name].copy()
            for p in parts[1:]:
                want += p[name]
            want *= 1 / threads
        else:
            want = parts[0][name] * ((bounds[0][1] - bounds[0][0]) / B)
            for (lo, hi), p in zip(bounds[1:], parts[1:], strict=True):
                want += p[name] * ((hi - lo) / B)
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def _spy(monkeypatch) -> list[dict]:
    """Record, for every shard's call of `loss_and_grads`: its windows, its `recompute`
    argument, the BLAS threads during the call, and the thread that made it."""
    seen, real = [], threads_mod.loss_and_grads

    def spy(params, cfg, x, y, **kw):
        seen.append({"B": len(x), "recompute": kw.get("recompute"), "blas": _blas_threads(),
                     "thread": threading.get_ident()})
        return real(params, cfg, x, y, **kw)

    monkeypatch.setattr(threads_mod, "loss_and_grads", spy)
    return seen


@pytest.mark.parametrize("B", [2, 4])
def test_one_blas_thread_per_shard_while_they_run_and_the_setting_restored_after(monkeypatch, B):
    before, seen = _blas_threads(), _spy(monkeypatch)
    params = init_params(CFG, 0, np.float32)
    with ThreadShards(2) as shards:
        shards.loss_and_grads(params, CFG, *_batch(B))
    assert sorted(s["B"] for s in seen) == [B // 2, B // 2]  # two shards, even with B = 2
    assert len({s["thread"] for s in seen}) == 2  # in two threads
    assert all(all(n == 1 for n in s["blas"]) for s in seen)
    assert _blas_threads() == before


@pytest.mark.parametrize("threads, B", [(1, 4), (2, 1)])
def test_one_shard_runs_in_the_caller_and_leaves_blas_alone(monkeypatch, threads, B):
    before, seen = _blas_threads(), _spy(monkeypatch)
    with ThreadShards(threads) as shards:
        shards.loss_and_grads(init_params(CFG, 0, np.float32), CFG, *_batch(B))
    assert [(s["B"], s["blas"], s["thread"]) for s in seen] == [
        (B, before, threading.get_ident())]


@pytest.mark.parametrize("recompute", [False, True])
def test_every_shard_recomputes_when_asked(monkeypatch, recompute):
    seen = _spy(monkeypatch)
    with ThreadShards(2) as shards:
        shards.loss_and_grads(init_params(CFG, 0, np.float32), CFG, *_batch(4),
                              **({"recompute": True} if recompute else {}))  # or the default
    assert [s["recompute"] for s in seen] == [recompute, recompute]


def test_dropping_the_shards_without_close_ends_the_worker_threads():
    before = threading.active_count()
    shards = ThreadShards(2)
    shards.loss_and_grads(init_params(CFG, 0, np.float32), CFG, *_batch(4))
    assert threading.active_count() == before + 1
    del shards
    gc.collect()
    for _ in range(100):  # the worker ends once it has read the pool's stop signal
        if threading.active_count() == before:
            break
        time.sleep(0.01)
    assert threading.active_count() == before


def test_only_the_blas_pools_are_limited():
    """Other thread pools of the process (an OpenMP runtime, say) keep their threads."""
    calls = []

    class Recorder:
        def limit(self, **kw):
            calls.append(kw)
            return contextlib.nullcontext()

    with ThreadShards(2) as shards:
        shards._blas = Recorder()
        shards.loss_and_grads(init_params(CFG, 0, np.float32), CFG, *_batch(4))
    assert calls == [{"limits": 1, "user_api": "blas"}]


def test_close_ends_the_worker_threads_and_later_calls_still_work():
    params, (x, y) = init_params(CFG, 5, np.float64), _batch(4)
    before = threading.active_count()
    shards = ThreadShards(3)
    loss, _ = shards.loss_and_grads(params, CFG, x, y)
    assert threading.active_count() > before  # the pool's workers exist
    shards.close()
    assert threading.active_count() == before
    shards.close()  # twice is harmless
    assert shards.loss_and_grads(params, CFG, x, y)[0] == pytest.approx(loss, rel=1e-13)


def test_a_failing_shard_raises_in_the_caller():
    params = init_params(CFG, 0, np.float32)
    x, y = _batch(4)
    y[3, 0] = CFG.vocab_size  # a bad target in the last shard, which a worker thread computes
    with ThreadShards(2) as shards, pytest.raises(ValueError, match="y has token ids"):
        shards.loss_and_grads(params, CFG, x, y)


@pytest.mark.parametrize("threads, error, match", [
    (0, ValueError, "threads must be at least 1, got 0"),
    (1.5, TypeError, "threads must be an int, got float"),
    (True, TypeError, "threads must be an int, got bool"),
])
def test_bad_thread_counts_are_refused(threads, error, match):
    with pytest.raises(error, match=match):
        ThreadShards(threads)
