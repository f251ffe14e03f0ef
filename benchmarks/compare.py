"""Compare the NumPy step with PyTorch's and with the machine's own limit, in alternating processes.

Each library runs in its own process (in one process their thread pools fight over the
cores), the runs alternate so that a noisy neighbour hurts both alike, and medians compare.
NumPy runs twice per round and per BLAS kernel: plain (a fresh interpreter, nothing tuned, as a
learner's notebook calls `loss_and_grads`) and with the trainer's settings (`step.py --trainer`:
its process setting `keep_freed_memory`, and its threads sharing the batch, one BLAS thread each).
Each NumPy run also times the step's own matrix products alone, the same shapes in the same
threads (`step.py --limit`): the machine's limit for that step, and the BLAS kernel that ran it.
Under each of issue 29's targets against PyTorch it prints what the target leaves for the
step's work other than its products, or that the products alone take longer than it allows.

Kernels: the one the environment sets (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE, if set), and
OpenBLAS's own choice (both variables removed, in the child processes only), which is what a
learner's machine runs; `--force VAR=VALUE` adds a kernel forced in the children the same way.
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

from matmul_limit import KERNEL_VARS

HERE = Path(__file__).resolve().parent
FIELDS = ("forward_ms", "backward_ms", "step_ms", "update_ms", "whole_ms", "limit_ms",
          "limit_gflops", "peak_gflops", "peak_rss_mib", "rss_growth_mib",
          "workers_peak_rss_mib")
# issue 29's targets, on OpenBLAS's own kernel: (numerator, denominator, field, at most)
TARGETS = (("numpy-trainer", "limit", "step_ms", 2.0), ("numpy-trainer", "torch-compile",
           "step_ms", 0.55), ("numpy", "torch-eager", "step_ms", 0.55))


def run(cmd: list[str], env: dict | None) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def kernels(forced: list[str], threads: int | None) -> dict[str, dict]:
    """The child environments, by label: the environment's kernel, OpenBLAS's own, forced."""
    base = {**os.environ, **({"OPENBLAS_NUM_THREADS": str(threads)} if threads else {})}
    own = {k: v for k, v in base.items() if k not in KERNEL_VARS}
    envs = {}
    if any(k in os.environ for k in KERNEL_VARS):
        envs["environment"] = base
    envs["own"] = own  # what a learner's machine runs: no variable forces a kernel
    if forced:
        envs["forced"] = {**own, **dict(f.split("=", 1) for f in forced)}
    return envs


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-python", default=sys.executable,
                        help="a Python with torch installed (default: this one)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per run")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--force", action="append", default=[], metavar="VAR=VALUE",
                        help="also run NumPy with this variable set in its children, e.g. "
                             "--force OPENBLAS_CORETYPE=Haswell --force OPENBLAS_L2_SIZE=512")
    parser.add_argument("--cpu", action="store_true",
                        help="compare CPU seconds, not wall seconds (with --threads 1 on a busy "
                             "machine)")
    parser.add_argument("--threads", type=int,
                        help="threads for both libraries (NumPy: OPENBLAS_NUM_THREADS in the "
                             "child's environment, and the trainer's --threads); default: each "
                             "library's own default, PyTorch 2, the trainer's setting")
    return parser.parse_args()


def commands(args: argparse.Namespace) -> dict[str, tuple[list[str], dict | None]]:
    """Every run of a round, by name: NumPy's per kernel, then PyTorch's."""
    common = ["--json", "--whole", "--repeats", str(args.repeats)] + (["--cpu"] if args.cpu else [])
    step = [sys.executable, str(HERE / "step.py"), *common, "--limit"]
    threads = ["--threads", str(args.threads)] if args.threads else []
    trainer_cpu = ["--parallel", "threads"] if args.cpu else []  # CPU time: one process's
    out = {}
    for label, env in kernels(args.force, args.threads).items():
        out[f"numpy/{label}"] = (step, env)
        out[f"numpy-trainer/{label}"] = ([*step, "--trainer", *threads, *trainer_cpu], env)
    torch = [args.torch_python, str(HERE / "torch_step.py"), *common,
             "--threads", str(args.threads or 2)]
    out["torch-eager"] = (torch, None)
    if args.compile:
        out["torch-compile"] = ([*torch, "--compile"], None)
    return out


def ratio(results: dict, med: dict, a: str, b: str, field: str) -> str:
    """median(a) / median(b), and the per-round ratios' median and range; b == "limit" divides
    by a's own limit, measured in the same process."""
    bf, b = ("limit_ms", a) if b == "limit" else (field, b)
    per_round = [x[field] / y[bf] for x, y in zip(results[a], results[b], strict=True)]
    mid = statistics.median(per_round)
    return (f"{med[a][field] / med[b][bf]:.2f} (per-round: median {mid:.2f}"
            f", range {min(per_round):.2f}-{max(per_round):.2f})")


def report(args: argparse.Namespace, results: dict[str, list[dict]]) -> None:
    med = {k: {f: statistics.median(x[f] for x in v) if v[0].get(f) is not None else None
               for f in FIELDS} for k, v in results.items()}
    cell = lambda value, w=8: f"{value:{w}.2f}" if value is not None else f"{'-':>{w}s}"  # noqa: E731
    print(f"medians of {args.rounds} rounds ({'CPU ms' if args.cpu else 'ms'}; memory in MiB)")
    print(f"{'':22s} {'forward':>8s} {'backward':>8s} {'fwd+bwd':>8s} {'update':>7s} {'whole':>8s} "
          f"{'limit':>7s} {'GFLOP/s':>8s} {'peak':>6s} {'RSS growth':>10s}")
    for k, m in med.items():
        print(f"{k:22s} {cell(m['forward_ms'])} {cell(m['backward_ms'])} {cell(m['step_ms'])} "
              f"{cell(m['update_ms'], 7)} {cell(m['whole_ms'])} {cell(m['limit_ms'], 7)} "
              f"{cell(m['limit_gflops'])} {cell(m['peak_gflops'], 6)} {m['rss_growth_mib']:10.1f}")
    print("(limit: the step's matrix products alone, same shapes and threads, and their GFLOP/s; "
          "peak: one (1024, 1024) float32 product, GFLOP/s)")
    for k, m in med.items():
        if m["workers_peak_rss_mib"]:
            print(f"{k}: its worker process's peak RSS {m['workers_peak_rss_mib']:.1f} MiB, "
                  "not in its RSS growth above")
    traced = statistics.median(x["traced_peak_mib"] for x in results["numpy/own"])
    print(f"NumPy's traced peak of one step (tracemalloc, first step): {traced:.1f} MiB")
    for label in kernels(args.force, args.threads):
        report_kernel(args, results, med, label)
    if "torch-compile" in results:
        print(f"\ntorch compile / eager, fwd + bwd: "
              f"{ratio(results, med, 'torch-compile', 'torch-eager', 'step_ms')}")


def report_kernel(args: argparse.Namespace, results: dict, med: dict, label: str) -> None:
    plain, trainer = f"numpy/{label}", f"numpy-trainer/{label}"
    b = results[plain][0]["blas"]
    forced = ", ".join(f"{k}={b[k]}" for k in KERNEL_VARS if b.get(k)) or "neither variable set"
    seen = " (what a learner's machine runs)" if label == "own" else ""
    print(f"\n== kernel {b['kernel']} ({b['internal_api']} {b['version']}; {forced}){seen}")
    lines = [("plain NumPy / its limit, fwd + bwd", plain, "limit", "step_ms"),
             ("trainer NumPy / its limit, fwd + bwd", trainer, "limit", "step_ms"),
             ("plain NumPy / eager, fwd + bwd", plain, "torch-eager", "step_ms"),
             ("trainer NumPy / eager, fwd + bwd", trainer, "torch-eager", "step_ms"),
             ("trainer NumPy / eager, whole step", trainer, "torch-eager", "whole_ms")]
    if args.compile:
        lines.append(("trainer NumPy / compile, fwd + bwd", trainer, "torch-compile", "step_ms"))
    for text, a, den, field in lines:
        print(f"{text:38s} {ratio(results, med, a, den, field)}")
    if label != "own":
        return
    for a, den, field, most in TARGETS:
        if den in results or den == "limit":
            key = f"{a}/{label}"
            value = med[key][field] / (med[key]["limit_ms"] if den == "limit" else med[den][field])
            print(f"target: {a} / {den}, fwd + bwd, at most {most}: {value:.2f} "
                  f"{'met' if value <= most else 'not met'}")
            if den != "limit":
                print(f"  {budget(med[key], med[den][field], most)}")


def budget(numpy: dict, theirs_ms: float, most: float) -> str:
    """What a target against PyTorch leaves for the step's work other than its products.

    `most` times PyTorch's median is the time the NumPy step may take; its own products alone
    (its limit, the same shapes in the same threads) take `numpy["limit_ms"]` of it whatever
    the rest of the step does. So the target is within reach of the element-wise work and
    Python only if the products leave room; if not, only faster products could meet it.
    """
    allowed, limit = most * theirs_ms, numpy["limit_ms"]
    rest = numpy["step_ms"] - limit
    head = f"{most} of PyTorch's step is {allowed:.2f} ms; its products alone take {limit:.2f}"
    if limit >= allowed:
        return (f"{head}: out of reach for any change but faster products "
                f"(the rest of the step, {rest:.2f} ms now, would have to take none)")
    if numpy["step_ms"] <= allowed:  # met (with timing noise the rest can even look negative)
        return (f"{head}: met, the rest of the step takes {rest:.2f} ms "
                f"of the {allowed - limit:.2f} left")
    return (f"{head}: the rest of the step (element-wise work and Python, {rest:.2f} ms now) "
            f"would have to fit in {allowed - limit:.2f} ms ({(allowed - limit) / rest:.2f} of it)")


def main() -> None:
    args = parse()
    runs = commands(args)
    print(f"load average before: {load()}", flush=True)
    results: dict[str, list[dict]] = {k: [] for k in runs}
    for r in range(args.rounds):
        for name, (cmd, env) in runs.items():
            res = run(cmd, env)
            results[name].append(res)
            extra = f"  limit {res['limit_ms']:6.2f} ms" if "limit_ms" in res else ""
            print(f"round {r + 1} {name:22s} fwd+bwd {res['step_ms']:7.2f} ms  "
                  f"whole {res['whole_ms']:7.2f} ms{extra}", flush=True)
    print(f"load average after: {load()}\n")
    report(args, results)


if __name__ == "__main__":
    main()
