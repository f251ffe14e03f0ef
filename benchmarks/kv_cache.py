"""Tokens per second of sampling with the KV cache against recomputing the whole context.

The book's model sizes (4 layers, width 128, 4 heads) with context C = 64 and 256, float32:
a prompt of C - n tokens, then n new tokens, so every new token sees about C positions. The
prompt's own pass is part of the cached sampler's time. Alternating rounds; the best round and
the median are printed (on a shared machine the best is the least noisy).
Run: python benchmarks/kv_cache.py [--new 32] [--rounds 5]
"""

from __future__ import annotations

import os

# One BLAS thread unless the caller says otherwise: on a shared machine two spinning BLAS threads
# per process make single timings vary tenfold; both sides of every comparison run alike.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import xenith_edu as xe  # noqa: E402
from xenith_edu.model.generate import generate  # noqa: E402


def tokens_per_s(params: dict, cfg: xe.Config, prompt: np.ndarray, new: int, cached: bool) -> float:
    t0 = time.perf_counter()
    generate(params, cfg, prompt, new, np.random.default_rng(0), kv_cache=cached)
    return new / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=32, help="tokens sampled per run (default 32)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args()
    print(f"book sizes, float32, {args.new} new tokens per run, "
          f"{args.rounds} alternating rounds: best (median)")
    print(f"{'context':>8} {'recompute tok/s':>18} {'KV cache tok/s':>18} {'speed-up':>14}")
    for C in (64, 256):
        cfg = xe.Config(vocab_size=76, n_embd=128, n_head=4, n_layer=4, seq_len=C)
        params = xe.init_params(cfg, seed=0, dtype=np.float32)
        prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, C - args.new)
        tokens_per_s(params, cfg, prompt, 2, True)  # warm-up of both paths
        tokens_per_s(params, cfg, prompt, 2, False)
        plain, cached = [], []
        for _ in range(args.rounds):
            plain.append(tokens_per_s(params, cfg, prompt, args.new, False))
            cached.append(tokens_per_s(params, cfg, prompt, args.new, True))
        p, c = max(plain), max(cached)
        pm, cm = float(np.median(plain)), float(np.median(cached))
        print(f"{C:>8} {p:>9.0f} ({pm:>5.0f}) {c:>10.0f} ({cm:>5.0f}) "
              f"{c / p:>6.1f}x ({cm / pm:.1f}x)")


if __name__ == "__main__":
    main()
