"""Sampling tokens per second at SmolLM-135M's shape: the book's KV path against transformers'
`generate`, side by side in one run, one thread each, the same random weights, greedy.

SmolLM-135M's published sizes (30 layers, width 576, 9 query and 3 key/value heads, SwiGLU
hidden 1536, vocabulary 49152, tied), float32. A prompt of 16 tokens, then --new tokens; the
prompt's pass is part of both times. Alternating rounds; best (median). Both draw the same
tokens (printed as a check). Tokens per CPU second too (one thread each, one process): steadier
than tokens per second when neighbours load the machine. Needs torch and transformers (tests and
benchmarks only).
Run: python benchmarks/sample_speed.py [--new 32] [--rounds 3] [--layers 30]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread on both sides

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import xenith_edu as xe  # noqa: E402
from xenith_edu.model.generate import generate  # noqa: E402
from xenith_edu.model.hf import config_to_hf, params_to_hf  # noqa: E402


def ours(params: dict, cfg: xe.Config, prompt: np.ndarray, new: int
         ) -> tuple[float, float, list]:
    t0, c0 = time.perf_counter(), time.process_time()
    ids = generate(params, cfg, prompt, new, np.random.default_rng(0), top_k=1)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return new / wall, new / cpu, ids[len(prompt):].tolist()


def theirs(model, torch, prompt: np.ndarray, new: int) -> tuple[float, float, list]:
    x = torch.tensor(prompt)[None, :]
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return new / wall, new / cpu, out[0, len(prompt):].tolist()


def main() -> None:
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=32, help="tokens per run (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--layers", type=int, default=30, help="layers (default 30, SmolLM's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = xe.Config(vocab_size=49152, n_embd=576, n_head=9, n_kv_head=3, n_layer=args.layers,
                    ffn_hidden=1536, seq_len=2048, tie_embeddings=True)
    params = xe.init_params(cfg, seed=0, dtype=np.float32)
    hf = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items()
                                     if k not in ("architectures", "model_type")})
    model = transformers.LlamaForCausalLM(hf).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in params_to_hf(params, cfg).items()},
                          strict=False)
    model.generation_config.pad_token_id = 0
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, 16)
    ours(params, cfg, prompt, 2)  # warm-up of both
    theirs(model, torch, prompt, 2)
    a, b, ca, cb, ratios, same = [], [], [], [], [], True
    for _ in range(args.rounds):
        (ta, ua, ia), (tb, ub, ib) = ours(params, cfg, prompt, args.new), theirs(
            model, torch, prompt, args.new)
        a.append(ta)
        b.append(tb)
        ca.append(ua)
        cb.append(ub)
        ratios.append(ta / tb)
        same &= ia == ib
    print(f"SmolLM-135M's shape ({args.layers} layers), float32, one thread, {args.new} new "
          f"tokens, {args.rounds} alternating rounds: best (median)")
    print(f"{'book KV path tok/s':>20} {'transformers tok/s':>20} {'ratio':>14}  same tokens")
    print(f"{max(a):>11.1f} ({np.median(a):>5.1f}) {max(b):>11.1f} ({np.median(b):>5.1f}) "
          f"{max(a) / max(b):>6.2f} ({np.median(a) / np.median(b):.2f})  {same}")
    print(f"per round, book / transformers: {' '.join(f'{r:.2f}' for r in ratios)}; median "
          f"{np.median(ratios):.2f}")
    print(f"tokens per CPU second, median: {np.median(ca):.1f} against {np.median(cb):.1f}, "
          f"ratio {np.median(ca) / np.median(cb):.2f} (per round "
          f"{' '.join(f'{x / y:.2f}' for x, y in zip(ca, cb, strict=True))})")


if __name__ == "__main__":
    main()
