"""Compare the NumPy step with PyTorch's, side by side, in alternating separate processes.

Each library runs in its own process (in one process their thread pools fight over the
cores), the runs alternate so that a noisy neighbour hurts both alike, and medians compare.
NumPy runs twice per round: plain (a fresh interpreter, nothing tuned, as a learner's notebook
calls `loss_and_grads`) and with the trainer's settings (`step.py --trainer`: its process
setting `keep_freed_memory`, and its threads sharing the batch, one BLAS thread each).
Every run times forward + backward and the update (clipping and AdamW) separately, so one run
gives both the forward + backward ratios and the whole-step ratio.
Run: python benchmarks/compare.py --torch-python /path/to/venv-with-torch/bin/python [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], env: dict | None) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", required=True, help="a Python with torch installed")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per run")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--cpu", action="store_true",
                        help="compare CPU seconds, not wall seconds (with --threads 1 on a busy "
                             "machine)")
    parser.add_argument("--threads", type=int,
                        help="threads for both libraries (NumPy: OPENBLAS_NUM_THREADS in the "
                             "child's environment, and the trainer's --threads); default: each "
                             "library's own default, PyTorch 2, the trainer's setting")
    args = parser.parse_args()

    common = ["--json", "--whole", "--repeats", str(args.repeats)] + (["--cpu"] if args.cpu else [])
    np_env = None
    torch_threads = ["--threads", str(args.threads or 2)]
    if args.threads:
        np_env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads)}
    commands = {
        "numpy": ([sys.executable, str(HERE / "step.py"), *common], np_env),
        "numpy-trainer": ([sys.executable, str(HERE / "step.py"), *common, "--trainer",
                           *(["--threads", str(args.threads)] if args.threads else [])], np_env),
        "torch-eager": ([args.torch_python, str(HERE / "torch_step.py"), *common,
                         *torch_threads], None),
    }
    if args.compile:
        commands["torch-compile"] = ([args.torch_python, str(HERE / "torch_step.py"), *common,
                                      *torch_threads, "--compile"], None)
    print(f"load average before: {load()}", flush=True)
    results: dict[str, list[dict]] = {k: [] for k in commands}
    for r in range(args.rounds):
        for name, (cmd, env) in commands.items():
            results[name].append(run(cmd, env))
            res = results[name][-1]
            print(f"round {r + 1} {name:14s} fwd+bwd {res['step_ms']:7.2f} ms  "
                  f"whole {res['whole_ms']:7.2f} ms", flush=True)
    print(f"load average after: {load()}\n")

    fields = ("forward_ms", "backward_ms", "step_ms", "update_ms", "whole_ms", "peak_rss_mib",
              "rss_growth_mib")
    med = {k: {f: statistics.median(x[f] for x in v) if v[0][f] is not None else None
               for f in fields} for k, v in results.items()}
    cell = lambda value: f"{value:8.2f}" if value is not None else f"{'-':>8s}"  # noqa: E731
    unit = "CPU ms" if args.cpu else "ms"
    print(f"medians of {args.rounds} rounds ({unit}; memory in MiB)")
    print(f"{'':14s} {'forward':>8s} {'backward':>8s} {'fwd+bwd':>8s} {'update':>7s} "
          f"{'whole':>8s} {'peak RSS':>9s} {'RSS growth':>10s}")
    for k, m in med.items():
        print(f"{k:14s} {cell(m['forward_ms'])} {cell(m['backward_ms'])} {m['step_ms']:8.2f} "
              f"{m['update_ms']:7.2f} {m['whole_ms']:8.2f} {m['peak_rss_mib']:9.1f} "
              f"{m['rss_growth_mib']:10.1f}")
    traced = statistics.median(x["traced_peak_mib"] for x in results["numpy"])
    print(f"NumPy's traced peak of one step (tracemalloc, first step): {traced:.1f} MiB")

    def ratio(a: str, b: str, field: str) -> str:
        per_round = [x[field] / y[field] for x, y in zip(results[a], results[b], strict=True)]
        return (f"{med[a][field] / med[b][field]:.2f} (per-round ratios: median "
                f"{statistics.median(per_round):.2f}, range {min(per_round):.2f}-"
                f"{max(per_round):.2f})")

    print("\nratios NumPy / PyTorch (below 1 means NumPy is faster)")
    print(f"plain NumPy,   forward + backward / eager: {ratio('numpy', 'torch-eager', 'step_ms')}")
    print(f"trainer NumPy, forward + backward / eager: "
          f"{ratio('numpy-trainer', 'torch-eager', 'step_ms')}")
    print(f"trainer NumPy, whole step / eager:         "
          f"{ratio('numpy-trainer', 'torch-eager', 'whole_ms')}")
    if args.compile:
        print(f"trainer NumPy, forward + backward / compile: "
              f"{ratio('numpy-trainer', 'torch-compile', 'step_ms')}")
        print(f"torch compile / eager, forward + backward: "
              f"{ratio('torch-compile', 'torch-eager', 'step_ms')}")


if __name__ == "__main__":
    main()
