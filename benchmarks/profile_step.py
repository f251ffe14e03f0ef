"""Where the time of one NumPy training step goes: forward and backward per component.

Times every component function the model calls (its self time: nested calls are subtracted),
and inside it every `np.matmul` call where it runs, to split each component into matrix products
and element-wise work. Prints a table; `--figure PATH` draws it.
Run: python benchmarks/profile_step.py [--steps 20] [--figure benchmarks/profile_step.png] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import xenith_edu as xe
from xenith_edu.model import transformer as model

BOOK = dict(vocab_size=76, n_embd=128, n_head=4, n_layer=4, ffn_hidden=352, seq_len=64,
            tie_embeddings=True)
BATCH = 12  # --batch 6: one of the trainer's two shards
CLOCK = time.perf_counter  # --cpu: time.process_time, steadier on a busy machine (one thread)

# The functions that `model` calls, each the forward or the backward of one component. What is
# left (concatenating weights, splitting heads, residual additions, the head's products) is
# charged to "model glue".
COMPONENTS = {
    "embedding": ("embedding_forward", "embedding_backward"),
    "rmsnorm": ("rmsnorm_forward", "rmsnorm_backward"),
    "linear (q, k, v and o)": ("linear_forward", "linear_backward"),
    "rope": ("rope_forward", "rope_backward"),
    "attention": ("causal_attention_forward", "causal_attention_backward"),
    "swiglu": ("swiglu_forward", "swiglu_backward"),
    "softmax cross-entropy": (None, "softmax_cross_entropy"),  # the loss is computed in backward
}
GLUE = ("attention_block_forward", "attention_block_backward", "swiglu_block_forward",
        "swiglu_block_backward", "layer_forward", "layer_backward", "head_forward",
        "head_backward", "forward", "backward")


class SelfTimer:
    """Wraps functions so that each call adds its own time, minus its children's, to a total,
    and the time of the `np.matmul` calls made in it (not in its children) to another."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.matmul: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []  # time spent in children, per open call
        self._keys: list[str] = []  # the open calls' keys, innermost last

    def wrap(self, fn, key: str):
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            self._keys.append(key)
            t0 = CLOCK()
            try:
                out = fn(*args, **kwargs)
            finally:
                self._keys.pop()
            elapsed = CLOCK() - t0
            children = self._stack.pop()
            self.total[key] += elapsed - children
            if self._stack:
                self._stack[-1] += elapsed
            return out
        return timed

    def wrap_matmul(self, matmul):
        def timed(*args, **kwargs):
            t0 = CLOCK()
            out = matmul(*args, **kwargs)
            if self._keys:
                self.matmul[self._keys[-1]] += CLOCK() - t0
            return out
        return timed


def profile(steps: int, warmup: int = 3, batch: int = BATCH) -> dict:
    cfg = xe.Config(**BOOK)
    params = xe.init_params(cfg, seed=0, dtype=np.float32)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, (batch, cfg.seq_len))
    y = rng.integers(0, cfg.vocab_size, (batch, cfg.seq_len))

    timer = SelfTimer()
    saved = {}
    for comp, names in COMPONENTS.items():
        for name, pass_ in zip(names, ("forward", "backward"), strict=True):
            if name:
                saved[name] = getattr(model, name)
                setattr(model, name, timer.wrap(saved[name], (comp, pass_)))
    for name in GLUE:
        pass_ = "backward" if name.endswith("backward") else "forward"
        saved[name] = getattr(model, name)
        setattr(model, name, timer.wrap(saved[name], ("model glue", pass_)))
    # the components call np.matmul through the numpy module: timed where they call it (the few
    # products written with the @ operator, such as attention's row sums, count as other work)
    matmul = np.matmul
    np.matmul = timer.wrap_matmul(matmul)
    try:
        totals = []
        for i in range(warmup + steps):
            if i == warmup:
                timer.total.clear()
                timer.matmul.clear()
            t0 = CLOCK()
            model.loss_and_grads(params, cfg, x, y)
            if i >= warmup:
                totals.append(CLOCK() - t0)
    finally:
        np.matmul = matmul
        for name, fn in saved.items():
            setattr(model, name, fn)
    per_step = {k: v / steps for k, v in timer.total.items()}
    rows = []
    for key in sorted(per_step, key=per_step.get, reverse=True):
        t = per_step[key]
        m = timer.matmul[key] / steps
        rows.append({"component": key[0], "pass": key[1], "ms": 1e3 * t,
                     "matmul_ms": 1e3 * m, "elementwise_ms": 1e3 * (t - m)})
    clock = "CPU time" if CLOCK is time.process_time else "wall time"
    return {"step_ms": 1e3 * float(np.mean(totals)), "rows": rows, "clock": clock,
            "batch": batch}


def print_table(result: dict) -> None:
    step = result["step_ms"]
    print(f"one step (forward + backward), book config, batch {result['batch']}: {step:.1f} ms per "
          f"step ({result['clock']}, mean, with the timers' overhead)")
    print(f"{'component':<24}{'pass':<10}{'ms':>7}{'share':>7}{'matmul':>8}{'other':>8}")
    for r in result["rows"]:
        print(f"{r['component']:<24}{r['pass']:<10}{r['ms']:7.2f}{100 * r['ms'] / step:6.0f}%"
              f"{r['matmul_ms']:8.2f}{r['elementwise_ms']:8.2f}")
    mm = sum(r["matmul_ms"] for r in result["rows"])
    other = sum(r["elementwise_ms"] for r in result["rows"])
    print(f"{'total':<34}{mm + other:7.2f}{'':>7}{mm:8.2f}{other:8.2f}   "
          f"matrix products {100 * mm / (mm + other):.0f}%")


def draw(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [f"{r['component']}, {r['pass']}" for r in rows][::-1]
    mm = [r["matmul_ms"] for r in rows][::-1]
    other = [r["elementwise_ms"] for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    ax.barh(labels, mm, color="tab:blue", label="matrix products")
    ax.barh(labels, other, left=mm, color="tab:orange", label="element-wise and other work")
    ax.set(xlabel=f"ms per step ({result['clock']})",
           title=f"One NumPy step, book config: {result['step_ms']:.0f} ms")
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"figure written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="profiled steps (default 20)")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"windows (default {BATCH})")
    parser.add_argument("--figure", type=Path, help="also draw the table as a bar chart")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--cpu", action="store_true",
                        help="measure CPU time, not wall time (use with OPENBLAS_NUM_THREADS=1)")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="tune glibc first, as the trainer does (xenith_edu.tools.perf)")
    args = parser.parse_args()
    global CLOCK
    if args.cpu:
        CLOCK = time.process_time
    if args.keep_freed_memory:
        from xenith_edu.tools.perf import keep_freed_memory
        keep_freed_memory()
    result = profile(args.steps, batch=args.batch)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    if args.figure:
        draw(result, args.figure)


if __name__ == "__main__":
    main()
