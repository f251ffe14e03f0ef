"""A LoRA fine-tuning step at Llama-3.2-1B's shape: ours (NumPy, the trainer's `train_step`)
against PyTorch eager with peft, side by side: resident memory and seconds per step.

The shape is Llama-3.2-1B's published config.json (16 layers, width 2048, 32 query heads and 8
key/value heads of 64, SwiGLU hidden 8192, vocabulary 128256, tied embeddings), S = 256 tokens,
batch 1, float32 random weights (nothing is downloaded); LoRA of rank 16, alpha 32 on q, k, v,
o (peft's LoraConfig, no dropout). A step is forward, loss, backward, clipping, AdamW on the
adapters. Each side runs in a fresh process of its own; its memory is Linux's VmRSS once the
weights are made, and the step's peak: VmHWM (the resident high-water mark, reset once the
weights are made) over the warm-up and timed steps; its time, the median wall and CPU seconds
of the timed steps (on a busy machine the CPU time is the steadier figure; "load" is the
machine's load average when the steps start and end: the neighbours). NumPy runs once per
BLAS kernel (the one the environment sets, OpenBLAS's own, and one forced with --force), as the
other benchmarks do.
Run: python benchmarks/lora_memory.py [--layers 16] [--steps 2] [--threads 2]
     [--force OPENBLAS_CORETYPE=Haswell --force OPENBLAS_L2_SIZE=512]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

KERNEL_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # what forces OpenBLAS's kernel
LLAMA_32_1B = dict(vocab_size=128256, n_embd=2048, n_head=32, n_kv_head=8, n_layer=16,
                   ffn_hidden=8192, seq_len=256, tie_embeddings=True, rope_theta=500000.0,
                   norm_eps=1e-5)
TARGETS = ("q", "k", "v", "o")
HF_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
RANK, ALPHA = 16, 32.0


def rss(key: str) -> int:
    """A line of /proc/self/status, in bytes (VmRSS: resident now; VmHWM: its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status (Linux only)")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM back to the current resident size


def ours(layers: int, steps: int) -> dict:
    """Our LoRA step, as the trainer runs it (`train_step` with the LoRA run's gradients)."""
    import numpy as np
    from threadpoolctl import threadpool_info

    from xenith_edu.model import Config, param_shapes
    from xenith_edu.model.adapters import LoraSpec, init_adapters
    from xenith_edu.training import TrainConfig
    from xenith_edu.training.finetune import LoraRun
    from xenith_edu.training.step import train_step

    start = rss("VmRSS:")
    cfg = Config(**{**LLAMA_32_1B, "n_layer": layers})
    rng = np.random.default_rng(0)
    params = {}
    for k, s in param_shapes(cfg).items():  # float32 draws, no float64 copy
        params[k] = rng.standard_normal(s, dtype=np.float32)
        params[k] *= np.float32(1.0 if k.startswith("rms") else 0.02)
    spec = LoraSpec(RANK, ALPHA, TARGETS)
    ad = init_adapters(cfg, spec, rng, np.float32).weights
    m = {k: np.zeros_like(a) for k, a in ad.items()}
    v = {k: np.zeros_like(a) for k, a in ad.items()}
    tc = TrainConfig(weight_decay=0.0)
    run = LoraRun(params, spec)
    x, y = rng.integers(0, cfg.vocab_size, (2, 1, cfg.seq_len))  # (B, S) each
    weights = rss("VmRSS:")
    reset_peak()
    times, cpu = [], []
    load = os.getloadavg()[0]  # the machine's load average as the steps start: the neighbours
    for i in range(steps + 1):  # the first warms up: the workspace's arrays are made there
        t0, c0 = time.perf_counter(), time.process_time()
        loss, _ = train_step(ad, m, v, i, 1e-4, cfg, tc, x, y, run.loss_and_grads)
        if i:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    kernel = f"{blas[0].get('internal_api')} {blas[0].get('architecture')}" if blas else "?"
    return {"start": start, "weights": weights, "peak": rss("VmHWM:"), "seconds": times, "cpu": cpu,
            "loss": loss, "params": sum(p.size for p in params.values()), "kernel": kernel,
            "load": [load, os.getloadavg()[0]]}


def torch_peft(layers: int, steps: int, threads: int) -> dict:
    """PyTorch eager with peft's LoRA: the same shape, step and optimizer settings."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(threads)
    start = rss("VmRSS:")
    c = LLAMA_32_1B
    hf = transformers.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["n_embd"], num_attention_heads=c["n_head"],
        num_key_value_heads=c["n_kv_head"], num_hidden_layers=layers,
        head_dim=c["n_embd"] // c["n_head"],
        intermediate_size=c["ffn_hidden"], max_position_embeddings=c["seq_len"],
        tie_word_embeddings=True, rope_theta=c["rope_theta"], rms_norm_eps=c["norm_eps"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf).to(torch.float32)
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                             target_modules=HF_MODULES))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, c["vocab_size"], (2, 1, c["seq_len"]), generator=g)
    weights = rss("VmRSS:")
    reset_peak()
    times, cpu = [], []
    load = os.getloadavg()[0]
    for i in range(steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits
        if i:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    n = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return {"start": start, "weights": weights, "peak": rss("VmHWM:"), "seconds": times, "cpu": cpu,
            "loss": float(loss), "params": n, "kernel": f"torch {torch.__version__}",
            "load": [load, os.getloadavg()[0]]}


def kernels(forced: list[str], threads: int) -> dict[str, dict]:
    """The NumPy children's environments, by label: the environment's kernel, OpenBLAS's own,
    forced (as benchmarks/compare.py makes them)."""
    base = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
    own = {k: v for k, v in base.items() if k not in KERNEL_VARS}
    envs = {}
    if any(k in os.environ for k in KERNEL_VARS):
        envs["environment"] = base
    envs["own"] = own
    if forced:
        envs["forced"] = {**own, **dict(f.split("=", 1) for f in forced)}
    return envs


def child(side: str, args: argparse.Namespace, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--layers",
           str(args.layers), "--steps", str(args.steps), "--threads", str(args.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{side} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def report(results: dict[str, dict]) -> None:
    gib = 2.0 ** 30
    t = results["torch + peft"]
    print(f"{'':22} {'weights GiB':>11} {'step peak GiB':>13} {'s / step':>9} "
          f"{'CPU s':>7} {'peak / torch':>12} {'time / torch':>12} {'CPU / torch':>11} "
          f"{'load':>9}  kernel")
    for name, r in results.items():
        sec, cpu = median(r["seconds"]), median(r["cpu"])
        print(f"{name:22} {r['weights'] / gib:11.2f} {r['peak'] / gib:13.2f} {sec:9.2f} "
              f"{cpu:7.2f} {r['peak'] / t['peak']:12.2f} {sec / median(t['seconds']):12.2f} "
              f"{cpu / median(t['cpu']):11.2f} {r['load'][0]:4.1f}-{r['load'][1]:<4.1f}"
              f"  {r['kernel']}")
    print(f"(frozen parameters: {t['params']:,}; losses: "
          + ", ".join(f"{n} {r['loss']:.4f}" for n, r in results.items()) + ")")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16, help="layers (16: Llama-3.2-1B)")
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    p.add_argument("--threads", type=int, default=2, help="threads for both libraries")
    p.add_argument("--force", action="append", default=[], metavar="VAR=VALUE",
                   help="also run NumPy with this variable set, e.g. OPENBLAS_CORETYPE=Haswell")
    p.add_argument("--child", choices=["ours", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    if args.child == "ours":
        print(json.dumps(ours(args.layers, args.steps)))
        return
    if args.child == "torch":
        print(json.dumps(torch_peft(args.layers, args.steps, args.threads)))
        return
    print(f"LoRA step at Llama-3.2-1B's shape with {args.layers} layers, S = 256, rank {RANK} "
          f"on {','.join(TARGETS)}, {args.threads} threads, {args.steps} timed steps each")
    results = {}
    for label, env in kernels(args.force, args.threads).items():
        results[f"numpy ({label})"] = child("ours", args, env)
    results["torch + peft"] = child("torch", args, {**os.environ,
                                                    "OPENBLAS_NUM_THREADS": str(args.threads)})
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
