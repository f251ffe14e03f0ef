"""What a conversion costs at a real model's size: SmolLM-135M's shape through from-hf and to-hf.
Prints the run checkpoint's bytes per parameter and each command's peak memory above its start.

The shape is SmolLM-135M's published config.json (d 576, 9 heads and 3 key/value heads, 30
layers, SwiGLU hidden 1536, vocabulary 49152, tied embeddings); the weights are random float32
(nothing is downloaded) and the tokenizer a small BPE trained here. Each command runs in its own
process; its peak is Linux's VmHWM (resident high-water mark) minus its resident size once
the command's modules are imported, in bytes per parameter (float32 weights are 4).
Run: python benchmarks/conversion_memory.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from xenith_edu.model.config import Config
from xenith_edu.model.params import param_shapes

SMOLLM = Config(vocab_size=49152, n_embd=576, n_head=9, n_kv_head=3, n_layer=30,
                ffn_hidden=1536, seq_len=2048, tie_embeddings=True, rope_theta=10000.0,
                norm_eps=1e-5)

# run in a child: import the command's modules, note the resident size, run it, print both
CHILD = """
import json, sys
from xenith_edu.cli.main import main
import xenith_edu.model.hf, xenith_edu.training.checkpoint, xenith_edu.training.rundir, tokenizers
def rss(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open('/proc/self/clear_refs', 'w').write('5')  # resets VmHWM to the current resident size
start = rss('VmRSS:')
rc = main(sys.argv[1:])
print(json.dumps({'rc': rc, 'start': start, 'peak': rss('VmHWM:')}), file=sys.stderr)
"""


def build(folder: Path) -> int:
    """A Hugging Face folder of SmolLM-135M's shape, random float32 weights; its parameters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from xenith_edu.model import BPETokenizer
    from xenith_edu.model.hf import write_hf

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["To be, or not to be, that is the question."] * 50, trainer)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)
              for k, s in param_shapes(SMOLLM).items()}
    write_hf(folder, params, SMOLLM, BPETokenizer(tok.to_str()))
    return sum(math.prod(s) for s in param_shapes(SMOLLM).values())


def measured(argv: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {p.stderr.strip().splitlines()[-1]}")
    return json.loads(p.stderr.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", default=None, help="work in this folder and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        n = build(work / "hf")
        ff = measured(["from-hf", str(work / "hf"), "--out", str(work / "run")])
        ckpt = (work / "run" / "ckpt.npz").stat().st_size
        th = measured(["to-hf", str(work / "run"), "--out", str(work / "back")])
        weights = (work / "hf" / "model.safetensors").stat().st_size
    print(f"SmolLM-135M's shape: {n:,} parameters, model.safetensors {weights / 1e6:,.0f} MB "
          "(float32)")
    print(f"ckpt.npz written by from-hf: {ckpt / 1e6:,.0f} MB, {ckpt / n:.2f} bytes per "
          "parameter (float32 weights: 4)")
    for name, r in (("from-hf", ff), ("to-hf", th)):
        extra = r["peak"] - r["start"]
        print(f"{name} peak memory above its start: {extra / 1e6:,.0f} MB, {extra / n:.2f} "
              f"bytes per parameter ({r['start'] / 1e6:,.0f} MB at its start)")


if __name__ == "__main__":
    main()
