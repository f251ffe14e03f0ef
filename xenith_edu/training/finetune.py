"""Fine-tuning: a new run that starts from the weights of another (a checkpoint of ours, or one
that `xenith-edu from-hf` converted), with its model, its tokenizer and fresh AdamW moments.

See the chapter "A real LLaMA". The loop is the trainer's own; this module decides what the new
run takes from the checkpoint it starts from.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from ..model import Config
from .checkpoint import Checkpoint, load_checkpoint
from .config import NOT_SETTINGS, TrainConfig

RUN_OWN = ("seq_len", "attention", "flash_block")  # the model settings that stay the run's
# The model settings a fine-tuning run takes from its checkpoint: every field of Config but the
# run's own (seq_len, the attention kernel: a shorter context than the model's is fine) and
# the text's and tokenizer's (which come with the checkpoint's tokenizer). Derived, so that a
# field added to Config is the checkpoint's too: the architecture never comes from defaults.
MODEL_FIELDS = tuple(f.name for f in fields(Config) if f.name not in (*RUN_OWN, *NOT_SETTINGS))
# The sizes that a TrainConfig passed to `train(..., init=...)` must repeat (else the run is
# refused: the caller asked for another model); every other field of the checkpoint's Config,
# the key/value heads, the open models' pieces, the tokens, is carried over as it is.
SIZES = ("n_layer", "n_head", "n_embd", "ffn_hidden", "tie_embeddings", "rope_theta", "norm_eps")


def load_init(init: str | Path) -> Checkpoint:
    """The checkpoint whose weights start a fine-tuning run, checked on load."""
    ckpt = load_checkpoint(init)
    if ckpt.params["wte"].dtype != np.float32:
        raise ValueError(f"checkpoint '{init}' holds {ckpt.params['wte'].dtype} weights; the "
                         "trainer trains float32: convert it with from-hf (float32 by default)")
    return ckpt


def adopt_model(tc: TrainConfig, cfg: Config) -> TrainConfig:
    """`tc` with the architecture of `cfg`, the model a fine-tuning run starts from."""
    return replace(tc, model=replace(tc.model, **{k: getattr(cfg, k) for k in MODEL_FIELDS}))


def run_config(tc: TrainConfig, vocab_size: int, ckpt: Checkpoint | None) -> Config:
    """The model of a run: `tc`'s sizes, and, when it continues or starts from a checkpoint, the
    checkpoint's vocabulary size and the fields that `TrainConfig` does not carry (a padding
    token, key/value heads): a BPE table may have more rows than its tokenizer has tokens.

    A converted model (whose context is not its training windows') keeps its context: a
    SmolLM fine-tuned on windows of 256 is still a model of 2048 positions."""
    if ckpt is None:
        return tc.model_config(vocab_size)
    cfg = tc.model_config(ckpt.config.vocab_size)
    carried = {k: v for k, v in ckpt.config.to_dict().items()
               if k not in (*SIZES, *RUN_OWN, "vocab_size")}
    context = ckpt.config.seq_len
    if ckpt.train.get("seq_len") != context and tc.seq_len <= context:
        carried["seq_len"] = context  # the windows are tc.seq_len; the model keeps its context
    return replace(cfg, **carried)


def check_init(init: str | Path, ckpt: Checkpoint, cfg: Config, tc: TrainConfig) -> None:
    """The run's model is the checkpoint's (up to seq_len and the attention kernel)."""
    mismatch = [f"{k}: {getattr(ckpt.config, k)} in the checkpoint, {getattr(cfg, k)} asked"
                for k in SIZES if getattr(ckpt.config, k) != getattr(cfg, k)]
    if mismatch:
        raise ValueError(f"checkpoint '{init}' is another model ({'; '.join(mismatch)}): drop "
                         "the model settings, a fine-tuning run takes them from --init")
    if tc.seq_len > ckpt.config.seq_len:
        raise ValueError(f"seq_len {tc.seq_len} is longer than the {ckpt.config.seq_len} "
                         f"positions of checkpoint '{init}': pass --seq-len {ckpt.config.seq_len}"
                         " or less")


def init_state(ckpt: Checkpoint, tc: TrainConfig
               ) -> tuple[dict, dict, dict, int, np.random.Generator]:
    """The checkpoint's weights (copied), zero AdamW moments, step 0, a fresh batch generator."""
    params = {k: p.copy() for k, p in ckpt.params.items()}
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    m, v = zeros, {k: np.zeros_like(p) for k, p in params.items()}
    return params, m, v, 0, np.random.default_rng(tc.seed + 1)


__all__ = ["MODEL_FIELDS", "adopt_model", "check_init", "init_state", "load_init", "run_config"]
