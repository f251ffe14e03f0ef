"""Time one training step (forward and backward) of the book config in NumPy.

Prints ms per step (forward, backward, whole), tokens/s and achieved GFLOP/s, as medians.
Run: python benchmarks/step.py [--repeats 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import xenith_edu as xe
from xenith_edu.optim import adamw_step_, clip_by_global_norm, zeros_like_params
from xenith_edu.perf import keep_freed_memory

BOOK = dict(vocab_size=76, n_embd=128, n_head=4, n_layer=4, ffn_hidden=352, seq_len=64,
            tie_embeddings=True)
BATCH = 12


def step_flops(cfg: xe.Config, B: int) -> int:
    """Matrix-product FLOPs of one forward and backward (2 per multiply-add; backward = 2x)."""
    S, d, f, V, L = cfg.seq_len, cfg.n_embd, cfg.ffn_hidden, cfg.vocab_size, cfg.n_layer
    N = B * S
    per_layer = 2 * N * d * (3 * d + d + 3 * f) + 2 * 2 * B * S * S * d  # projections, attention
    forward = L * per_layer + 2 * N * d * V
    return 3 * forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's allocator as it is (the trainer tunes it)")
    parser.add_argument("--whole", action="store_true",
                        help="time the trainer's whole step: also clipping and the AdamW update")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    tuned = False if args.default_malloc else keep_freed_memory()
    cfg = xe.Config(**BOOK)
    params = xe.init_params(cfg, seed=0, dtype=np.float32)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, (BATCH, cfg.seq_len))
    y = rng.integers(0, cfg.vocab_size, (BATCH, cfg.seq_len))

    m, v = zeros_like_params(params), zeros_like_params(params)
    fwd, bwd = [], []
    for i in range(args.warmup + args.repeats):
        t0 = time.perf_counter()
        _, cache = xe.forward(params, cfg, x)
        t1 = time.perf_counter()
        _, grads = xe.backward(params, cfg, cache, y)
        if args.whole:  # as the trainer does after backward (lr kept tiny: timing only)
            grads, _ = clip_by_global_norm(grads, 1.0)
            adamw_step_(params, grads, m, v, i + 1, 1e-6, 0.9, 0.99, 1e-8, 0.1)
        t2 = time.perf_counter()
        del cache, grads  # as in the trainer, a step's arrays are all freed before the next
        if i >= args.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    f_ms, b_ms = 1e3 * np.median(fwd), 1e3 * np.median(bwd)
    total = 1e3 * np.median(np.add(fwd, bwd))
    result = {
        "library": "numpy", "whole": args.whole, "forward_ms": round(f_ms, 2),
        "backward_ms": round(b_ms, 2),
        "step_ms": round(total, 2), "tokens_per_s": round(BATCH * cfg.seq_len / total * 1e3),
        "gflops": round(step_flops(cfg, BATCH) / total / 1e6, 1), "malloc_tuned": tuned,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"book config, batch {BATCH}, float32, NumPy {np.__version__}, "
          f"allocator tuned: {tuned}, median of {args.repeats} steps")
    print(f"forward  {f_ms:7.2f} ms")
    print(f"backward {b_ms:7.2f} ms" + ("  (with clipping and AdamW)" if args.whole else ""))
    print(f"step     {total:7.2f} ms   {result['tokens_per_s']:,} tokens/s   "
          f"{result['gflops']:.1f} GFLOP/s ({step_flops(cfg, BATCH) / 1e9:.2f} GFLOP per step)")


if __name__ == "__main__":
    main()
