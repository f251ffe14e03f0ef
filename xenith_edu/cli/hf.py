"""The command line's Hugging Face part: `xenith-edu from-hf`, `to-hf`, and `train --init RUN`.

A Hugging Face LLaMA folder becomes a run folder that `sample`, `gradcheck --run` and
`train --init` use, and a run folder becomes a Hugging Face folder (see "A real LLaMA").
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..tools.util import sigterm_raises
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
                   help="allow replacing a model already in --out: the whole folder is "
                   "replaced at once, by a new one built beside it")
    p.add_argument("--merge", action="store_true",
                   help="a LoRA run: write one model, each adapter merged into its weight "
                   "(without it: the frozen base, and its adapters in HF_DIR/adapter, a folder "
                   "that peft's PeftModel.from_pretrained loads over it)")
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
    """The TrainConfig and run folder of `train --init`: the model is the checkpoint's, read
    from its metadata alone (the trainer reads the weights, once)."""
    from ..training.checkpoint import read_meta  # on use: --init
    from ..training.finetune import MODEL_FIELDS  # on use: --init
    from ..training.rundir import check_start  # on use: --init

    try:
        check_start(args.resume, args.init, ("--init", "--resume"))
    except ValueError as e:  # the options' words, as a usage error
        raise settings.UsageError(str(e)) from None
    if args.out is None:
        raise settings.UsageError("--init needs --out: the folder of the new run")
    cfg = read_meta(args.init)["config"]
    return settings.init_train_config(args, cfg, MODEL_FIELDS), args.out


def say(command: str) -> Callable[[str], None]:
    """The progress of long work on stdout, flushed: a line per stage through a pipe; on a
    terminal, a count ("12 of 30 tensors") rewrites its own line until it is done. Output a
    program captures in-process (no file descriptor: a notebook, a test) gets no progress."""
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return lambda text: None
    tty = sys.stdout.isatty()

    def told(text: str) -> None:
        count = re.search(r"(\d+) of (\d+) tensors", text)
        done = count is None or count[1] == count[2]
        if tty and count:
            print(f"\r{command}: {text}", end="\n" if done else "", flush=True)
        elif done:  # through a pipe, a count's last line alone
            print(f"{command}: {text}", flush=True)
    return told


class Stage:
    """Where a command that writes a folder is: `writing` once its files are being made."""

    def __init__(self) -> None:
        self.writing = False


@contextmanager
def _guarded(out: Path, kept: Callable[[], str]) -> Iterator[Stage]:
    """A command that writes folder `out`: its lock (a second writer, or a running trainer,
    stops it in one line), the sweep of temporary names, SIGTERM as Ctrl-C, and the one line
    of a stop or a failed write (the folder, and what `kept()` says is left)."""
    from ..training.rundir import cannot_write, locked  # when the command runs

    stage = Stage()
    with sigterm_raises():
        try:
            stage.writing = True  # the lock makes the folder: its failure is a write's
            with locked(out):
                stage.writing = False
                yield stage
        except KeyboardInterrupt as e:
            raise type(e)(kept()) from None
        except OSError as e:
            if not stage.writing:
                raise
            raise cannot_write(out, e, kept()) from None


def cmd_from_hf(args: argparse.Namespace) -> int:
    # the command's modules, loaded when it runs (the parser alone needs none of them)
    from ..model.hf import read_hf
    from ..training.checkpoint import save_checkpoint  # when the command runs: --help stays fast

    # when the command runs: --help stays fast
    from ..training.rundir import CHECKPOINT, check_run_dir

    done: list[bool] = []  # one entry once the checkpoint is whole
    out, told = Path(args.out), say("from-hf")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir '{out}' is a file: pass a directory for the run")
    had = (out / CHECKPOINT).exists()

    def kept() -> str:
        if done:
            return f"'{out / CHECKPOINT}' is complete"
        return ("the run already there is kept, unchanged" if had else
                f"nothing was written into '{out}'")

    with _guarded(out, kept) as stage:
        check_run_dir(out, None, args.overwrite)
        model = read_hf(args.hf_dir, np.float32, told)  # every gate before anything is written
        if model.tokenizer is None:
            raise ValueError(f"'{args.hf_dir}' has no tokenizer.json: a run needs its tokenizer "
                             "(copy the model's tokenizer.json into the folder)")
        told(f"writing {out / CHECKPOINT}")
        stage.writing = True
        save_checkpoint(out / CHECKPOINT, model.params, None, None, 0,
                        np.random.default_rng(0), model.config, "", {}, model.tokenizer.spec)
        done.append(True)
    _summary(out / CHECKPOINT, model)
    return 0


def _summary(path: Path, model) -> None:
    cfg, tok = model.config, model.tokenizer
    n = sum(p.size for p in model.params.values())
    print(f"wrote {path}: {n:,} parameters, {cfg.n_layer} layers, width "
          f"{cfg.n_embd}, {cfg.n_head} heads ({cfg.n_kv_head} key/value), vocabulary "
          f"{cfg.vocab_size}, "
          f"{'tied' if cfg.tie_embeddings else 'untied'}, BPE tokenizer of "
          f"{tok.vocab_size} tokens")
    for note in tok.notes:
        print(f"note: {note}")
    if tok.vocab_size < cfg.vocab_size:
        print(f"note: the model has {cfg.vocab_size - tok.vocab_size} embedding rows past the "
              f"tokenizer's {tok.vocab_size} tokens; an id among them decodes as U+FFFD")


def cmd_to_hf(args: argparse.Namespace) -> int:
    # the command's modules, loaded when it runs (the parser alone needs none of them)
    from ..model.hf import write_hf  # when the command runs: --help stays fast
    from ..model.hf.adapters import write_adapter_folder  # when the command runs
    from ..training.checkpoint import load_checkpoint
    from ..training.rundir import LOCK, replace_folder, temp_name  # when the command runs

    done: list[bool] = []  # one entry once the folder is whole
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"'{out}' is a file: pass a folder for the Hugging Face model")
    had = (out / "config.json").exists()

    def kept() -> str:
        if done:
            return f"'{out}' holds the new model, complete"
        return ("the model already there is kept, unchanged" if had else
                f"nothing was written into '{out}'")

    with _guarded(out, kept) as stage:
        others = sorted(p.name for p in out.iterdir() if p.name != LOCK)
        if had and not args.overwrite:
            raise ValueError(f"'{out}' already holds a model (config.json): choose another "
                             "--out or replace it (--overwrite)")
        if others and not had:
            raise ValueError(f"'{out}' holds files that are not a model ({others[0]}, ...): "
                             "choose a new or empty folder for --out")
        ckpt = load_checkpoint(args.run, groups=("params",))  # the weights alone, once
        tok = ckpt.tokenizer()
        build = temp_name(out)  # the new folder is made beside, then swapped in whole
        stage.writing = True
        apart = None if args.merge else ckpt.adapters  # LoRA: the base and its adapters
        try:
            written = write_hf(build, ckpt.base if apart and ckpt.base else ckpt.params,
                               ckpt.config, tok if tok.kind == "bpe" else None, say("to-hf"))
            if apart is not None:
                written += [Path("adapter") / p.name for p in write_adapter_folder(
                    build / "adapter", apart, ckpt.config, base="..")]
            replace_folder(out, build)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        done.append(True)
    note = "" if tok.kind == "bpe" else (" (a character vocabulary has no tokenizer.json: "
                                         "encode with the run's CharTokenizer)")
    print(f"wrote {', '.join(p.name for p in written)} into {out}{note}")
    return 0


def sample_config(cfg, tokenizer, prompt: str, n_new: int):
    """The model's config for sampling `n_new` tokens after `prompt`: its context capped by what
    is used (the KV cache is allocated for seq_len positions; a config.json may claim millions).
    Up to the cap no context is ever cropped, so the tokens drawn are the same."""
    try:
        used = len(tokenizer.encode(prompt)) + max(int(n_new), 0)
    except (TypeError, ValueError):
        return cfg  # sample_text says what is wrong with the prompt
    return replace(cfg, seq_len=max(1, min(cfg.seq_len, used)))


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
           "fine_tune_config", "gradcheck_run", "sample_config", "say"]
