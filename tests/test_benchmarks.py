"""The benchmarks' limit: the step's matrix products, recorded as the step runs them, are the ones
its FLOP count says, in the layouts the step used; the kernel children drop exactly the two
variables that force OpenBLAS's kernel. No timings are checked (the machine is shared)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import xenith_edu as xe
from xenith_edu.rope import rope_tables
from xenith_edu.training.threads import ThreadShards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compare  # noqa: E402
import matmul_limit  # noqa: E402
import step  # noqa: E402

CFG = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8,
                tie_embeddings=True)


def _batch(B: int = 4):
    rng = np.random.default_rng(0)
    params = xe.init_params(CFG, seed=0, dtype=np.float32)
    x = rng.integers(0, CFG.vocab_size, (B, CFG.seq_len))
    y = rng.integers(0, CFG.vocab_size, (B, CFG.seq_len))
    return params, x, y


@pytest.mark.parametrize("threads", [1, 2])
def test_recorded_products_are_the_steps_flops(threads):
    params, x, y = _batch()
    with ThreadShards(threads) as shards:
        products = matmul_limit.record(lambda: shards.loss_and_grads(params, CFG, x, y))
    assert len(products) == threads  # one list per thread that computed a shard
    flops = sum(p.flops for thread in products for p in thread)
    assert flops == step.step_flops(CFG, len(x))
    assert np.matmul is not None and np.matmul.__name__ == "matmul"  # the watch is removed


def test_replay_uses_the_recorded_layouts():
    a = np.ones((3, 5), np.float32)
    b = np.ones((4, 5), np.float32).T  # a transposed view, as linear_backward passes w.T
    products = matmul_limit.record(lambda: np.matmul(a, b, out=np.empty((3, 4), np.float32)))
    (p,) = products[0]
    assert p.a == matmul_limit.Operand((3, 5), a.strides, a.dtype)
    assert p.b.strides == b.strides and p.flops == 2 * 3 * 5 * 4
    made = matmul_limit._array(p.b, np.random.default_rng(0))
    assert made.shape == (5, 4) and made.strides == b.strides
    assert matmul_limit.replay_ms(products, repeats=2, warmup=0) > 0
    assert matmul_limit.replay_ms([products[0], products[0]], repeats=2, warmup=0) > 0


def test_kernel_children_drop_only_the_kernel_variables(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    envs = compare.kernels(["OPENBLAS_CORETYPE=SkylakeX"], threads=1)
    assert list(envs) == ["environment", "own", "forced"]
    assert envs["environment"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert not {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"} & set(envs["own"])
    assert envs["forced"]["OPENBLAS_CORETYPE"] == "SkylakeX"
    assert all(e["OPENBLAS_NUM_THREADS"] == "1" for e in envs.values())
    assert envs["own"]["PATH"] == envs["environment"]["PATH"]  # everything else is kept
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.delenv("OPENBLAS_L2_SIZE")
    assert list(compare.kernels([], None)) == ["own"]  # nothing forced: one kernel


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_the_benchmarks_pytorch_model_is_the_books_model(kv_heads):
    """The side-by-side ratios compare one model: PyTorch's loss of the same weights and tokens
    is ours to float64 rounding, with grouped-query attention and without."""
    torch = pytest.importorskip("torch")
    import torch_model

    cfg = xe.Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8,
                    tie_embeddings=True, n_kv_head=kv_heads)
    rng = np.random.default_rng(1)
    params = xe.init_params(cfg, seed=3, dtype=np.float64)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}  # gains != 1
    x = rng.integers(0, cfg.vocab_size, (3, cfg.seq_len))
    y = rng.integers(0, cfg.vocab_size, (3, cfg.seq_len))
    ours = xe.loss_and_grads(params, cfg, x, y)[0]
    cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)  # float64
    p = {k: torch.from_numpy(v) for k, v in params.items()}
    theirs = torch_model.loss_fn(p, torch.from_numpy(x), torch.from_numpy(y),
                                 torch.from_numpy(cos), torch.from_numpy(sin), heads=cfg.n_head,
                                 kv_heads=kv_heads, eps=cfg.norm_eps).item()
    assert abs(ours - theirs) < 1e-12 * abs(ours), (ours, theirs)
    # the benchmarks' own tables are these, in float32
    tables = torch_model.rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
    for t, ref in zip(tables, (cos, sin), strict=True):
        assert t.dtype == torch.float32 and np.abs(t.numpy() - ref).max() < 1e-6


def test_budget_says_whether_the_products_leave_room():
    # 0.55 of 40 ms is 22 ms: products of 18 ms leave 4 ms for a rest that takes 8
    room = compare.budget({"step_ms": 26.0, "limit_ms": 18.0}, 40.0, 0.55)
    assert "22.00 ms" in room and "18.00" in room
    assert "fit in 4.00 ms (0.50 of it)" in room and "out of reach" not in room
    # products of 23 ms alone are over the 22 allowed: nothing but faster products helps
    none = compare.budget({"step_ms": 30.0, "limit_ms": 23.0}, 40.0, 0.55)
    assert "out of reach" in none and "7.00 ms now" in none
    # a step within the target is said to be, even when noise puts it below its products
    met = compare.budget({"step_ms": 17.5, "limit_ms": 18.0}, 40.0, 0.55)
    assert met.endswith("met, the rest of the step takes -0.50 ms of the 4.00 left")
