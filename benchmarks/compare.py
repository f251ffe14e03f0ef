"""Compare the NumPy step with PyTorch's, side by side, in alternating separate processes.

Each library runs in its own process (in one process their thread pools fight over the
cores), the runs alternate so that a noisy neighbour hurts both alike, and medians compare.
Run: python benchmarks/compare.py --torch-python /path/to/venv-with-torch/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", required=True, help="a Python with torch installed")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--whole", action="store_true",
                        help="time whole training steps: with clipping and AdamW")
    args = parser.parse_args()

    commands = {
        "numpy": [sys.executable, str(HERE / "step.py"), "--json"],
        "torch-eager": [args.torch_python, str(HERE / "torch_step.py"), "--json"],
    }
    if args.compile:
        commands["torch-compile"] = [args.torch_python, str(HERE / "torch_step.py"),
                                     "--json", "--compile"]
    if args.whole:
        for cmd in commands.values():
            cmd.append("--whole")
    results: dict[str, list[dict]] = {k: [] for k in commands}
    for r in range(args.rounds):
        for name, cmd in commands.items():
            results[name].append(run(cmd))
            print(f"round {r + 1} {name:13s} {results[name][-1]['step_ms']:7.2f} ms", flush=True)
    print()
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("forward_ms", "backward_ms",
                                                             "step_ms", "gflops")}
           for k, v in results.items()}
    print(f"{'library':13s} {'forward':>9s} {'backward':>9s} {'step':>9s} {'GFLOP/s':>8s}")
    for k, m in med.items():
        print(f"{k:13s} {m['forward_ms']:7.2f}ms {m['backward_ms']:7.2f}ms "
              f"{m['step_ms']:7.2f}ms {m['gflops']:8.1f}")
    ratio = med["numpy"]["step_ms"] / med["torch-eager"]["step_ms"]
    print(f"\nNumPy step / PyTorch eager step = {ratio:.2f} (below 1 means NumPy is faster)")


if __name__ == "__main__":
    main()
