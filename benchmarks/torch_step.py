"""The same model and step in PyTorch eager (or compiled), for a side-by-side comparison.

Not a dependency of the project: run it with a Python that has torch and numpy installed, e.g.
`python -m venv /some/venv && /some/venv/bin/pip install torch numpy`, then
`/some/venv/bin/python benchmarks/torch_step.py [--compile] [--json]`. It reads the parameter
table (which parameters get weight decay) from this repository's `xenith_edu/model/params.py`.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time

import torch
from torch_model import loss_fn, rope_tables  # the model, written once for the benchmarks

from xenith_edu.model.params import decays  # which parameters get weight decay

V, D, H, L, FF, S, B = 76, 128, 4, 4, 352, 64, 12
HD = D // H


def rss_mib() -> float:
    """The process's resident memory now, MiB (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def init(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (0.02 * torch.randn(*shape, generator=g)).requires_grad_()

    return {
        "wte": w(V, D), "rms_final": torch.ones(D, requires_grad=True),
        "rms_attn": torch.ones(L, D, requires_grad=True), "wq": w(L, D, D), "wk": w(L, D, D),
        "wv": w(L, D, D), "wo": w(L, D, D), "rms_ffn": torch.ones(L, D, requires_grad=True),
        "w1": w(L, D, FF), "w3": w(L, D, FF), "w2": w(L, FF, D),
    }


def book_loss(p: dict, x: torch.Tensor, y: torch.Tensor, cos, sin) -> torch.Tensor:
    return loss_fn(p, x, y, cos, sin, heads=H, kv_heads=H, eps=1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss")
    parser.add_argument("--whole", action="store_true",
                        help="also clip_grad_norm_ and torch.optim.AdamW.step, as a trainer does")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cpu", action="store_true",
                        help="time CPU seconds, not wall seconds (steadier on a busy machine)")
    args = parser.parse_args()
    clock = time.process_time if args.cpu else time.perf_counter
    torch.set_num_threads(args.threads)
    p = init()
    cos, sin = rope_tables(S, HD, 10000.0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)
    fn = torch.compile(book_loss) if args.compile else book_loss
    decay = [t for k, t in p.items() if decays(k)]
    no_decay = [t for k, t in p.items() if not decays(k)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-6, betas=(0.9, 0.99))
    rss0 = rss_mib()
    fwd, bwd, upd = [], [], []
    for i in range(args.warmup + args.repeats + (10 if args.compile else 0)):
        for t in p.values():
            t.grad = None
        t0 = clock()
        loss = fn(p, x, y, cos, sin)
        t1 = clock()
        loss.backward()
        t2 = clock()
        if args.whole:
            torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
            opt.step()
        t3 = clock()
        if i >= args.warmup + (10 if args.compile else 0):
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            upd.append(t3 - t2)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    med = lambda a: sorted(a)[len(a) // 2]  # noqa: E731
    total = med([a + b for a, b in zip(fwd, bwd, strict=True)])
    whole = med([a + b + c for a, b, c in zip(fwd, bwd, upd, strict=True)])
    flops = 3 * (L * (2 * B * S * D * (4 * D + 3 * FF) + 4 * B * S * S * D) + 2 * B * S * D * V)
    result = {"library": "torch-compile" if args.compile else "torch-eager", "whole": args.whole,
              "forward_ms": round(1e3 * med(fwd), 2), "backward_ms": round(1e3 * med(bwd), 2),
              "step_ms": round(1e3 * total, 2), "update_ms": round(1e3 * med(upd), 2),
              "whole_ms": round(1e3 * whole, 2), "tokens_per_s": round(B * S / total),
              "peak_rss_mib": round(peak_rss, 1), "rss_growth_mib": round(peak_rss - rss0, 1),
              "gflops": round(flops / total / 1e9, 1), "loss": round(loss.item(), 4),
              "torch": torch.__version__, "expected_loss": round(math.log(V), 4)}
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
