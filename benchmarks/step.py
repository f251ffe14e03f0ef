"""Time one training step (forward and backward) of the book config in NumPy.

Prints ms per step (forward, backward, and with --whole the update), tokens/s, achieved GFLOP/s,
as medians, the memory of a step, and the BLAS kernel in use. --limit also times the step's own
matrix products alone (the same shapes, the same threads: `matmul_limit.py`), the machine's
limit for this step, and gives the step as a multiple of it. By default nothing is tuned: a
plain `loss_and_grads` in a fresh interpreter, as a learner's notebook runs it. --trainer runs
the step as the trainer does: its process setting (`keep_freed_memory`) and its workers
(`TrainConfig.threads` workers share the batch, one BLAS thread each, as worker processes:
`TrainConfig.parallel`; forward and backward are then timed together). The limit is measured
with threads, whose products are recorded in this process: the same shapes as the workers'.
Run: python benchmarks/step.py [--repeats 30] [--whole] [--trainer] [--parallel threads]
     [--limit] [--cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import tracemalloc

import numpy as np
from matmul_limit import KERNEL_VARS, blas, peak_gflops, record, replay_ms

import xenith_edu as xe
from xenith_edu.tools.perf import keep_freed_memory
from xenith_edu.training import TrainConfig
from xenith_edu.training.optim import adamw_step_, clip_by_global_norm, zeros_like_params
from xenith_edu.training.processes import batch_shards
from xenith_edu.training.threads import ThreadShards

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


def measure_limit(threads: int, params: dict, cfg: xe.Config, x: np.ndarray,
                  y: np.ndarray, clock=time.perf_counter) -> dict:
    """The step's matrix products, recorded in one step as the step runs them (each thread its
    shard's: the same products as worker processes would run), timed alone: ms, GFLOP/s, and a
    large product's GFLOP/s for comparison."""
    with ThreadShards(threads) as shards:
        products = record(lambda: shards.loss_and_grads(params, cfg, x, y))
    flops = sum(p.flops for thread in products for p in thread)
    ms = replay_ms(products, clock=clock)  # the step's own clock: wall, or CPU with --cpu
    return {"limit_ms": round(ms, 2), "matmul_gflop": round(flops / 1e9, 3),
            "matmul_calls": sum(len(t) for t in products),
            "limit_gflops": round(flops / ms / 1e6, 1), "peak_gflops": round(peak_gflops(), 1)}


def rss_mib() -> float:
    """The process's resident memory now, MiB (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="the trainer's process setting: tools.perf.keep_freed_memory()")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads that share the batch, one BLAS thread each (default 1, "
                             "with --trainer the trainer's)")
    parser.add_argument("--parallel", choices=("processes", "threads"), default=None,
                        help="how the --threads workers run (default, with --trainer, the "
                             f"trainer's: {TrainConfig().parallel})")
    parser.add_argument("--trainer", action="store_true",
                        help="the trainer's settings: --keep-freed-memory, "
                             f"--threads {TrainConfig().threads} and --parallel "
                             f"{TrainConfig().parallel}")
    parser.add_argument("--whole", action="store_true",
                        help="also time the trainer's update after backward: clipping and AdamW")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--cpu", action="store_true",
                        help="time CPU seconds, not wall seconds (steadier on a busy machine)")
    parser.add_argument("--limit", action="store_true",
                        help="also time the step's matrix products alone (same shapes, same "
                             "threads) and a large product: the machine's limit")
    args = parser.parse_args()
    clock = time.process_time if args.cpu else time.perf_counter

    if args.trainer:
        args.keep_freed_memory = True
        args.threads = TrainConfig().threads if args.threads is None else args.threads
        args.parallel = args.parallel or TrainConfig().parallel
    args.threads = args.threads or 1
    args.parallel = args.parallel or "threads"
    if args.cpu and args.parallel == "processes" and args.threads > 1:
        parser.error("--cpu counts this process's CPU time only, not its workers': add "
                     "--parallel threads")
    tuned = keep_freed_memory() if args.keep_freed_memory else False
    shards = batch_shards(args.threads, args.parallel)
    cfg = xe.Config(**BOOK)
    params = xe.init_params(cfg, seed=0, dtype=np.float32)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, (BATCH, cfg.seq_len))
    y = rng.integers(0, cfg.vocab_size, (BATCH, cfg.seq_len))
    m, v = zeros_like_params(params), zeros_like_params(params)
    rss0 = rss_mib()

    tracemalloc.start()  # the first step, traced: every array it needs is new
    shards.loss_and_grads(params, cfg, x, y)
    traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()

    fwd, bwd, upd = [], [], []
    for i in range(args.warmup + args.repeats):
        t0 = clock()
        if args.threads == 1:
            _, cache = xe.forward(params, cfg, x)
            t1 = clock()
            _, grads = xe.backward(params, cfg, cache, y)
        else:  # each thread runs forward and backward of its shard: one figure for both
            cache, (_, grads) = None, shards.loss_and_grads(params, cfg, x, y)
            t1 = clock()
        t2 = clock()
        if args.whole:  # as the trainer does after backward (lr kept tiny: timing only)
            grads, _ = clip_by_global_norm(grads, 1.0)
            adamw_step_(params, grads, m, v, i + 1, 1e-6, 0.9, 0.99, 1e-8, 0.1)
        t3 = clock()
        del cache, grads  # as in the trainer, a step's arrays are all dropped before the next
        if i >= args.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            upd.append(t3 - t2)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    shards.close()  # the workers end: their peak memory is the children's (0 with threads)
    workers_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    limit = measure_limit(args.threads, params, cfg, x, y, clock) if args.limit else {}
    ms = lambda a: round(1e3 * float(np.median(a)), 2)  # noqa: E731
    step = ms(np.add(fwd, bwd))
    apart = args.threads == 1  # forward and backward timed apart
    result = {
        "library": "numpy", "whole": args.whole, "threads": args.threads,
        "parallel": args.parallel if args.threads > 1 else None,
        "forward_ms": ms(fwd) if apart else None, "backward_ms": ms(bwd) if apart else None,
        "step_ms": step, "update_ms": ms(upd), "whole_ms": ms(np.add(np.add(fwd, bwd), upd)),
        "tokens_per_s": round(BATCH * cfg.seq_len / step * 1e3),
        "gflops": round(step_flops(cfg, BATCH) / step / 1e6, 1), "malloc_tuned": tuned,
        "traced_peak_mib": round(traced_peak, 1),
        "peak_rss_mib": round(peak_rss, 1), "rss_growth_mib": round(peak_rss - rss0, 1),
        "workers_peak_rss_mib": round(workers_rss, 1),
        "blas": blas(), **limit,
    }
    if limit:
        result["step_over_limit"] = round(step / limit["limit_ms"], 3)
    if args.json:
        print(json.dumps(result))
        return
    print(f"book config, batch {BATCH}, float32, NumPy {np.__version__}, "
          f"glibc tuned: {tuned}, threads: {args.threads}"
          + (f" ({args.parallel})" if args.threads > 1 else "")
          + f", median of {args.repeats} steps")
    if apart:
        print(f"forward  {result['forward_ms']:7.2f} ms")
        print(f"backward {result['backward_ms']:7.2f} ms")
    print(f"step     {step:7.2f} ms   {result['tokens_per_s']:,} tokens/s   "
          f"{result['gflops']:.1f} GFLOP/s ({step_flops(cfg, BATCH) / 1e9:.2f} GFLOP per step)")
    if args.whole:
        print(f"update   {result['update_ms']:7.2f} ms (clipping and AdamW); "
              f"whole step {result['whole_ms']:7.2f} ms")
    b = result["blas"]
    print(f"BLAS: {b['internal_api']} {b['version']}, kernel {b['kernel']}, "
          f"{b['num_threads']} threads (" + ", ".join(f"{k}={b[k]}" for k in KERNEL_VARS) + ")")
    if limit:
        print(f"limit: the step's {limit['matmul_calls']} products alone "
              f"({limit['matmul_gflop']:.2f} GFLOP) {limit['limit_ms']:.2f} ms, "
              f"{limit['limit_gflops']:.0f} GFLOP/s; step / limit {result['step_over_limit']:.2f}; "
              f"a (1024, 1024) product {limit['peak_gflops']:.0f} GFLOP/s")
    print(f"memory: traced peak of a first step {traced_peak:.1f} MiB; peak RSS "
          f"{result['peak_rss_mib']:.1f} MiB ({result['rss_growth_mib']:.1f} MiB above the "
          "RSS before the first step)"
          + (f"; the worker processes' largest peak RSS {workers_rss:.1f} MiB (the traced "
             "peak is this process's shard)" if workers_rss else ""))


if __name__ == "__main__":
    main()
