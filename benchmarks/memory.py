"""Memory and time of one training step: plain or flash attention, with or without recomputation.

A small model (4 layers, width 64, 4 heads of 16, batch 2, float32) as the context S grows from
64 to 2048. Peak memory is traced with tracemalloc in its own step, with the package's workspace
of reusable arrays switched off (else it counts only what earlier calls did not leave behind).
Time, with the workspace on as in training, is the best of a few steps, the four combinations
alternating round by round (on a shared machine the minimum is the least noisy estimate of a
step's cost; the median is kept in the JSON too). Prints a table, writes the package's copy of
the figures, xenith_edu/data/memory.json (the memory chapter reads it), and benchmarks/memory.png.
Run: python benchmarks/memory.py [--lengths 64 128 ...] [--repeats 5] [--out benchmarks]
"""

from __future__ import annotations

import os

# One BLAS thread unless the caller says otherwise: on a shared machine two spinning BLAS threads
# per process make single timings vary tenfold; both sides of every comparison run alike.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import xenith_edu as xe  # noqa: E402
from xenith_edu.tools.util import atomic_write, atomic_write_text  # noqa: E402
from xenith_edu.tools.workspace import workspace  # noqa: E402

MODEL = dict(vocab_size=76, n_embd=64, n_head=4, n_layer=4, ffn_hidden=192)
BATCH = 2
# the one copy of the figures: package data of the repository's xenith_edu, read by the chapter
PACKAGE_JSON = Path(__file__).resolve().parents[1] / "xenith_edu" / "data" / "memory.json"
COMBOS = [("plain", False), ("plain", True), ("flash", False), ("flash", True)]


def name(attention: str, recompute: bool) -> str:
    return attention + (" + recompute" if recompute else "")


def one_step(cfg: xe.Config, params: dict, x: np.ndarray, y: np.ndarray, recompute: bool):
    return xe.loss_and_grads(params, cfg, x, y, recompute=recompute)


def setup(S: int, attention: str, block: int) -> tuple:
    cfg = xe.Config(**MODEL, seq_len=S, attention=attention, flash_block=block)
    params = xe.init_params(cfg, seed=0, dtype=np.float32)
    x, y = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, BATCH, S))  # (B, S) each
    return cfg, params, x, y


def traced_peak(S: int, attention: str, recompute: bool, block: int) -> float:
    """Peak traced MiB of one forward + backward, with the package's workspace off."""
    cfg, params, x, y = setup(S, attention, block)
    ws = workspace()  # the package's reusable arrays: off, so the peak is what the step needs
    ws.clear()
    limit, ws.limit_bytes = ws.limit_bytes, 0
    tracemalloc.start()
    try:
        one_step(cfg, params, x, y, recompute)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        ws.limit_bytes = limit
    return peak / 2**20


def timings(S: int, repeats: int, block: int) -> dict[tuple, list[float]]:
    """Seconds of one step for each combination, in alternating rounds (a noisy neighbour
    slows all four alike), after one warm-up step each."""
    setups = {(a, r): setup(S, a, block) for a, r in COMBOS}
    times: dict[tuple, list[float]] = {c: [] for c in COMBOS}
    for round_ in range(repeats + 1):
        for (attention, recompute), (cfg, params, x, y) in setups.items():
            t0 = time.perf_counter()
            one_step(cfg, params, x, y, recompute)
            if round_:  # round 0 is the warm-up
                times[(attention, recompute)].append(time.perf_counter() - t0)
    return times


def measure(S: int, repeats: int, block: int) -> list[dict]:
    """One row per combination: peak traced MiB, best and median ms."""
    times = timings(S, repeats, block)
    return [{"S": S, "attention": a, "recompute": r,
             "peak_mib": round(traced_peak(S, a, r, block), 2),
             "ms": round(1e3 * min(times[(a, r)]), 1),
             "ms_median": round(1e3 * float(np.median(times[(a, r)])), 1)} for a, r in COMBOS]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for attention, recompute in COMBOS:
        mine = [r for r in rows if r["attention"] == attention and r["recompute"] == recompute]
        S = [r["S"] for r in mine]
        style = ("o-" if attention == "plain" else "s-") if not recompute else \
            ("o--" if attention == "plain" else "s--")
        for ax, key in zip(axes, ("peak_mib", "ms"), strict=True):
            ax.loglog(S, [r[key] for r in mine], style, label=name(attention, recompute))
    lengths = sorted({r["S"] for r in rows})
    for ax, label in zip(axes, ("peak traced memory (MiB)", "time of one step (ms)"),
                         strict=True):
        ax.set(xlabel="context length S", ylabel=label, xticks=lengths, xticklabels=lengths)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=9)
    fig.suptitle(f"one training step (forward + backward): {MODEL['n_layer']} layers, "
                 f"d = {MODEL['n_embd']}, H = {MODEL['n_head']}, batch {BATCH}, float32")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[64, 128, 256, 512, 1024, 2048], help="context lengths S")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per point (default 5)")
    parser.add_argument("--block", type=int, default=64, help="flash block size (default 64)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent,
                        help="folder for memory.png (default: benchmarks/)")
    parser.add_argument("--json", type=Path, default=PACKAGE_JSON,
                        help="where the figures go (default: the package's copy, which the "
                        "memory chapter reads)")
    args = parser.parse_args()

    print(f"one step, {MODEL['n_layer']} layers, d={MODEL['n_embd']}, H={MODEL['n_head']}, "
          f"batch {BATCH}, float32, flash block {args.block}; peak traced MiB / best ms")
    header = "".join(f"{name(a, r):>26}" for a, r in COMBOS)
    print(f"{'S':>6}{header}")
    rows = []
    for S in args.lengths:
        line = f"{S:>6}"
        for r in measure(S, args.repeats, args.block):
            rows.append(r)
            line += f"{r['peak_mib']:>13.1f} MiB {r['ms']:>7.0f} ms"
        print(line, flush=True)
    atomic_write_text(args.json, json.dumps(
        {"model": MODEL, "batch": BATCH, "block": args.block, "rows": rows}, indent=1) + "\n")
    plot(rows, args.out / "memory.png")
    print(f"wrote {args.json} and {args.out / 'memory.png'}")


if __name__ == "__main__":
    main()
