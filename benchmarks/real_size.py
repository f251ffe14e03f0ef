"""One training step at a real model's size: SmolLM-135M's shape, NumPy against PyTorch eager.
Forward + backward, float32, alternating separate processes in one run, with each one's peak memory.

The shape: d 576, 9 query heads and 3 key/value heads (grouped-query attention), 30 layers,
SwiGLU hidden 1536, vocabulary 49152, tied embeddings; one sequence (B 1) of 256 positions.
The weights are random (nothing is downloaded): the step's cost does not depend on their values.
Each library runs in its own process (their thread pools would fight over the cores in one),
with the same weights, tokens and thread count; rounds alternate so that a noisy neighbour
hurts both alike, and medians compare. Peak memory is the process's resident peak during the
steps, warm-up included (Linux's VmHWM, reset once the weights are built), and above them. The
processes' CPU seconds per step are reported too: steadier than wall time on a busy machine.
Run: python benchmarks/real_size.py [--rounds 3] [--steps 2] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from xenith_edu.model.config import Config
from xenith_edu.model.params import PARAM, param_shapes

CFG = Config(vocab_size=49152, n_embd=576, n_head=9, n_layer=30, ffn_hidden=1536,
             seq_len=256, tie_embeddings=True, n_kv_head=3)
B, S = 1, 256


def make_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Weights N(0, 0.02²) and unit gains in float32, drawn in place: no float64 copy."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(CFG).items():
        if PARAM[name].kind == "gain":
            params[name] = np.ones(shape, np.float32)
        else:
            params[name] = rng.standard_normal(shape, dtype=np.float32)
            params[name] *= np.float32(0.02)
    return params


def tokens(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, CFG.vocab_size, (B, S)), rng.integers(0, CFG.vocab_size, (B, S)))


def rss_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Make VmHWM start again from the current resident size (Linux 4.0 on)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def numpy_step(params: dict, x: np.ndarray, y: np.ndarray):
    from xenith_edu import loss_and_grads  # in the child only: the parent imports no model

    def step() -> float:
        return loss_and_grads(params, CFG, x, y)[0]

    return step


def torch_step(params: dict, x: np.ndarray, y: np.ndarray, threads: int):
    import torch  # in the torch child only: the package never imports torch
    import torch_model  # the model in PyTorch, written once (imports torch)
    from torch_model import rope_tables  # with it

    torch.set_num_threads(threads)
    p = {k: torch.from_numpy(v).requires_grad_() for k, v in params.items()}  # shared memory
    H, Hkv, hd = CFG.n_head, CFG.n_kv_head, CFG.head_dim
    cos, sin = rope_tables(S, hd, CFG.rope_theta)  # (S, hd/2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def loss_fn():
        return torch_model.loss_fn(p, xt, yt, cos, sin, heads=H, kv_heads=Hkv, eps=CFG.norm_eps)

    def step() -> float:
        for t in p.values():
            t.grad = None
        loss = loss_fn()
        loss.backward()
        return loss.item()

    return step


def child(lib: str, steps: int, warmup: int, threads: int) -> dict:
    params = make_params()
    x, y = tokens()
    step = numpy_step(params, x, y) if lib == "numpy" else torch_step(params, x, y, threads)
    weights = rss_mib("VmRSS")
    reset_peak()
    times, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    peak = rss_mib("VmHWM")
    return {"lib": lib, "step_s": statistics.median(times), "cpu_s": statistics.median(cpu),
            "loss": loss,
            "weights_rss_mib": round(weights, 1), "peak_rss_mib": round(peak, 1),
            "peak_above_weights_mib": round(peak - weights, 1)}


def run_child(lib: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads),
           "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", lib, "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(results: dict[str, list[dict]]) -> dict:
    med = {lib: {f: statistics.median(r[f] for r in rs) for f in
                 ("step_s", "cpu_s", "peak_rss_mib", "peak_above_weights_mib", "weights_rss_mib")}
           for lib, rs in results.items()}
    n, t = med["numpy"], med["torch"]
    return {"config": {"d": CFG.n_embd, "H": CFG.n_head, "Hkv": CFG.n_kv_head,
                       "L": CFG.n_layer, "f": CFG.ffn_hidden, "V": CFG.vocab_size, "S": S,
                       "B": B, "tied": CFG.tie_embeddings},
            "median": med, "ratio_numpy_over_torch": round(n["step_s"] / t["step_s"], 3),
            "cpu_ratio_numpy_over_torch": round(n["cpu_s"] / t["cpu_s"], 3),
            "peak_ratio": round(n["peak_rss_mib"] / t["peak_rss_mib"], 3),
            "losses": {lib: [r["loss"] for r in rs] for lib, rs in results.items()},
            "rounds": {lib: [round(r["step_s"], 3) for r in rs] for lib, rs in results.items()}}


def table(results: dict[str, list[dict]], out: dict) -> str:
    """The figures side by side: each library's medians, then NumPy's as a fraction of
    PyTorch's (issue 41's targets: wall and CPU time at most 0.5, peak memory at most 0.8),
    and the wall ratio of each round (its two processes ran one after the other)."""
    med = out["median"]
    lines = [f"{'':16} {'wall s/step':>11} {'CPU s/step':>10} {'peak MiB':>9} "
             f"{'above weights':>13}"]
    for lib in ("numpy", "torch"):
        m = med[lib]
        lines.append(f"{lib:16} {m['step_s']:11.3f} {m['cpu_s']:10.3f} {m['peak_rss_mib']:9.0f} "
                     f"{m['peak_above_weights_mib']:13.0f}")
    lines.append(f"{'numpy / torch':16} {out['ratio_numpy_over_torch']:11.2f} "
                 f"{out['cpu_ratio_numpy_over_torch']:10.2f} {out['peak_ratio']:9.2f}"
                 "   (targets: wall <= 0.5, CPU <= 0.5, peak <= 0.8)")
    rounds = [n["step_s"] / t["step_s"] for n, t in zip(results["numpy"], results["torch"],
                                                         strict=True)]
    lines.append("wall ratio by round: " + ", ".join(f"{r:.2f}" for r in rounds))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.warmup, args.threads)))
        return
    results: dict[str, list[dict]] = {"numpy": [], "torch": []}
    for r in range(args.rounds):
        for lib in results:
            results[lib].append(run_child(lib, args))
            res = results[lib][-1]
            print(f"round {r + 1} {lib:6s} step {res['step_s']:.3f} s (cpu "
                  f"{res['cpu_s']:.3f} s)  peak {res['peak_rss_mib']:.0f} MiB "
                  f"({res['peak_above_weights_mib']:.0f} above the weights)  loss "
                  f"{res['loss']:.5f}", file=sys.stderr, flush=True)
    out = summary(results)
    if args.json:
        print(json.dumps(out))
        return
    print(json.dumps(out, indent=1))
    print(table(results, out))


if __name__ == "__main__":
    main()
