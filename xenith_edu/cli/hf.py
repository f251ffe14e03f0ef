"""The command line's Hugging Face part: `xenith-edu from-hf`, `to-hf`, and `train --init RUN`.

A Hugging Face LLaMA folder becomes a run folder that `sample`, `gradcheck --run` and
`train --init` use, and a run folder becomes a Hugging Face folder (see "A real LLaMA").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from . import settings


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `from-hf` and `to-hf` subcommands."""
    p = sub.add_parser("from-hf", help="convert a Hugging Face LLaMA folder into a run folder",
                       description="Read a Hugging Face LLaMA folder (config.json, "
                       "model.safetensors or its shards, tokenizer.json) and write a run folder "
                       "(ckpt.npz, float32) that sample, gradcheck --run and train --init use. "
                       "What the book's model cannot represent is refused, and nothing is "
                       "written. Nothing is downloaded: the folder must be on disk.")
    p.add_argument("hf_dir", metavar="HF_DIR", help="the Hugging Face model folder")
    p.add_argument("--out", metavar="RUN", required=True, help="run folder to write")
    p.add_argument("--overwrite", action="store_true",
                   help="allow replacing a run already in --out")
    p.set_defaults(func=cmd_from_hf)

    p = sub.add_parser("to-hf", help="write a run as a Hugging Face LLaMA folder",
                       description="Write config.json, model.safetensors (float32) and, for a "
                       "BPE run, tokenizer.json: a folder that transformers' "
                       "LlamaForCausalLM.from_pretrained loads, with the same logits.")
    p.add_argument("run", metavar="RUN", help="a run folder or its ckpt.npz")
    p.add_argument("--out", metavar="HF_DIR", required=True, help="folder to write")
    p.add_argument("--overwrite", action="store_true",
                   help="allow replacing a model already in --out")
    p.set_defaults(func=cmd_to_hf)


def add_init_argument(p: argparse.ArgumentParser) -> None:
    """`train --init RUN`: fine-tune a run's weights into a new run folder."""
    p.add_argument("--init", metavar="RUN", default=None,
                   help="fine-tune: start a new run (--out) from this run's weights, model and "
                   "tokenizer (e.g. one written by from-hf), with fresh optimizer moments; the "
                   "model settings come from it, the training settings from the options")


def add_run_argument(p: argparse.ArgumentParser) -> None:
    """`gradcheck --run RUN`: check the gradients of a run's own model and weights."""
    p.add_argument("--run", metavar="RUN", default=None,
                   help="check this run's model (e.g. one written by from-hf) with its own "
                   "weights, in float64, on a few random tokens, instead of a tiny random model")


def fine_tune_config(args: argparse.Namespace):
    """The TrainConfig and run folder of `train --init`: the model is the checkpoint's."""
    from ..training.finetune import MODEL_FIELDS, load_init  # on use: --init

    if args.resume is not None:
        raise settings.UsageError("--init starts a new run and --resume continues one: give "
                                  "only one")
    if args.out is None:
        raise settings.UsageError("--init needs --out: the folder of the new run")
    ckpt = load_init(args.init)
    return settings.init_train_config(args, ckpt.config, MODEL_FIELDS), args.out


def cmd_from_hf(args: argparse.Namespace) -> int:
    # the command's modules, loaded when it runs (the parser alone needs none of them)
    from ..model.hf import read_hf
    from ..training.checkpoint import save_checkpoint  # when the command runs: --help stays fast

    # when the command runs: --help stays fast
    from ..training.runlog import CHECKPOINT, check_run_dir

    out = check_run_dir(args.out, None, args.overwrite)
    model = read_hf(args.hf_dir, np.float32)  # every check before anything is written
    if model.tokenizer is None:
        raise ValueError(f"'{args.hf_dir}' has no tokenizer.json: a run needs its tokenizer "
                         "(copy the model's tokenizer.json into the folder)")
    zeros = {k: np.zeros_like(p) for k, p in model.params.items()}
    save_checkpoint(out / CHECKPOINT, model.params, zeros, dict(zeros), 0,
                    np.random.default_rng(0), model.config, "", {}, model.tokenizer.spec)
    cfg = model.config
    n = sum(p.size for p in model.params.values())
    print(f"wrote {out / CHECKPOINT}: {n:,} parameters, {cfg.n_layer} layers, width "
          f"{cfg.n_embd}, {cfg.n_head} heads ({cfg.n_kv_head} key/value), vocabulary "
          f"{cfg.vocab_size}, "
          f"{'tied' if cfg.tie_embeddings else 'untied'}, BPE tokenizer of "
          f"{model.tokenizer.vocab_size} tokens")
    return 0


def cmd_to_hf(args: argparse.Namespace) -> int:
    # the command's modules, loaded when it runs (the parser alone needs none of them)
    from ..model.hf import write_hf  # when the command runs: --help stays fast
    from ..training.checkpoint import load_checkpoint

    out = Path(args.out)
    if (out / "config.json").exists() and not args.overwrite:
        raise ValueError(f"'{out}' already holds a model (config.json): choose another --out "
                         "or replace it (--overwrite)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"'{out}' is a file: pass a folder for the Hugging Face model")
    ckpt = load_checkpoint(args.run)
    tok = ckpt.tokenizer()
    written = write_hf(out, ckpt.params, ckpt.config, tok if tok.kind == "bpe" else None)
    note = "" if tok.kind == "bpe" else (" (a character vocabulary has no tokenizer.json: "
                                         "encode with the run's CharTokenizer)")
    print(f"wrote {', '.join(p.name for p in written)} into {out}{note}")
    return 0


def gradcheck_run(args: argparse.Namespace):
    """The config, float64 weights and a few random tokens (no padding token) of a run."""
    from ..training.checkpoint import load_checkpoint  # on use: gradcheck --run

    ckpt = load_checkpoint(args.run)
    cfg = ckpt.config
    params = {k: p.astype(np.float64) for k, p in ckpt.params.items()}
    rng = np.random.default_rng(args.seed)
    S = min(cfg.seq_len, 6)
    x, y = (rng.integers(0, cfg.vocab_size, size=(2, S)) for _ in range(2))  # (B, S) each
    if cfg.pad_token_id is not None:  # the pad row's gradient is zero on purpose: avoid it
        x[x == cfg.pad_token_id] = (cfg.pad_token_id + 1) % cfg.vocab_size
    return cfg, params, x, y


__all__ = ["add_init_argument", "add_parsers", "add_run_argument", "cmd_from_hf", "cmd_to_hf",
           "fine_tune_config", "gradcheck_run"]
