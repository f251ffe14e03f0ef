"""Tests of xenith_edu.threads: the batch shared among threads gives the single call's figures."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import xenith_edu.threads as threads_mod
from xenith_edu import Config, init_params, loss_and_grads
from xenith_edu.threads import ThreadShards, shard_bounds

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


@pytest.mark.parametrize("B, threads", [(6, 2), (5, 2), (7, 3), (3, 5)])
@pytest.mark.parametrize("recompute", [False, True])
def test_sharded_loss_and_gradients_equal_one_call(B, threads, recompute):
    """Equal and unequal shards: the mean of the shards' means, weighted by their windows, is
    the batch's mean, to float64 rounding."""
    params = init_params(CFG, 3, np.float64)
    x, y = _batch(B)
    loss, grads = loss_and_grads(params, CFG, x, y)
    with ThreadShards(threads, recompute=recompute) as shards:
        got_loss, got = shards.loss_and_grads(params, CFG, x, y)
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


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_blas_thread_while_the_shards_run_and_the_setting_restored_after(monkeypatch):
    before, seen = _blas_threads(), []
    real = threads_mod.loss_and_grads

    def spy(params, cfg, x, y):
        seen.append(_blas_threads())
        return real(params, cfg, x, y)

    monkeypatch.setattr(threads_mod, "loss_and_grads", spy)
    params = init_params(CFG, 0, np.float32)
    with ThreadShards(2) as shards:
        shards.loss_and_grads(params, CFG, *_batch(4))
    assert len(seen) == 2
    assert all(all(n == 1 for n in s) for s in seen)
    assert _blas_threads() == before


def test_a_failing_shard_raises_in_the_caller():
    params = init_params(CFG, 0, np.float32)
    x, y = _batch(4)
    y[3, 0] = CFG.vocab_size  # a bad target in the last shard, which a worker thread computes
    with ThreadShards(2) as shards, pytest.raises(ValueError, match="y has token ids"):
        shards.loss_and_grads(params, CFG, x, y)


@pytest.mark.parametrize("threads, error", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_thread_counts_are_refused(threads, error):
    with pytest.raises(error, match="threads"):
        ThreadShards(threads)
