"""Fine-tuning: a new run that starts from the weights of another (a checkpoint of ours, or one
that `xenith-edu from-hf` converted), with its model, its tokenizer and fresh AdamW moments.

See the chapter "A real LLaMA". The loop is the trainer's own; this module decides what the new
run takes from the checkpoint it starts from.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from ..model import Config, loss_and_grads
from ..model.adapters import Adapters, LoraSpec, init_adapters
from .checkpoint import Checkpoint, load_checkpoint
from .config import NOT_SETTINGS, TrainConfig
from .step import evaluate

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


def check_lora(tc: TrainConfig, ckpt: Checkpoint | None, base: Checkpoint | None,
               data_parallel: bool) -> LoraSpec | None:
    """The run's LoRA adapters, or None; ValueError, before anything is written, for a run
    that cannot have them: no model to adapt, a resume that would change its adapters, MPI."""
    lora = tc.lora_spec()
    if ckpt is not None:  # a resume keeps what trains
        had = ckpt.adapters.spec if ckpt.adapters is not None else None
        if had != lora:
            raise ValueError(f"the checkpoint trains {_what(had)}, the settings ask for "
                             f"{_what(lora)}: a resumed run keeps its adapters; drop the "
                             "--lora options")
    elif lora is not None and base is None:
        raise ValueError("--lora-rank needs a model to adapt: pass --init with a converted "
                         "model or a run (LoRA adapts frozen weights; a new model has none "
                         "worth keeping)")
    if lora is not None and data_parallel:
        raise ValueError("LoRA runs in one process (its products use the BLAS threads): run "
                         "it without mpiexec")
    return lora


def _what(spec: LoraSpec | None) -> str:
    return ("the whole model" if spec is None else
            f"LoRA adapters of rank {spec.rank}, alpha {spec.alpha} on {','.join(spec.targets)}")


def lora_state(lora: LoraSpec, tc: TrainConfig, cfg: Config, ckpt: Checkpoint | None,
               base: Checkpoint | None) -> tuple[dict, dict, dict, dict, int,
                                                 np.random.Generator]:
    """The frozen base, the adapters (what trains), their AdamW moments, the start step and the
    batch generator: a resumed run's as saved, or the `--init` model's weights with fresh
    adapters (A drawn from the run's seed, B zero: the model starts as the base exactly)."""
    if ckpt is not None:
        assert ckpt.base is not None and ckpt.adapters is not None and ckpt.m and ckpt.v
        return ckpt.base, ckpt.adapters.weights, ckpt.m, ckpt.v, ckpt.step, ckpt.rng()
    assert base is not None
    frozen = base.params  # never written: no gradient of it is made, AdamW never sees it
    weights = init_adapters(cfg, lora, np.random.default_rng(tc.seed), np.float32).weights
    m = {k: np.zeros_like(a) for k, a in weights.items()}
    v = {k: np.zeros_like(a) for k, a in weights.items()}
    return frozen, weights, m, v, 0, np.random.default_rng(tc.seed + 1)


class LoraRun:
    """A LoRA run's workers, in the trainer's terms: the loss and the adapters' gradients, and
    the evaluation, of the frozen base with the adapters that train (the dict the loop updates).
    One process: the products of a frozen layer use the BLAS threads."""

    def __init__(self, frozen: dict[str, np.ndarray], lora: LoraSpec) -> None:
        self.frozen, self.lora = frozen, lora

    def loss_and_grads(self, params: dict, cfg: Config, x: np.ndarray, y: np.ndarray,
                       recompute: bool = False) -> tuple[float, dict[str, np.ndarray]]:
        return loss_and_grads(self.frozen, cfg, x, y, recompute, Adapters(self.lora, params))

    def evaluate(self, params: dict, cfg: Config, x: np.ndarray, y: np.ndarray) -> float:
        """The mean per-token loss over windows x, y (E, S) of the base with the adapters."""
        return evaluate(self.frozen, cfg, x, y, adapters=Adapters(self.lora, params))

    def saved(self, params: dict) -> dict[str, np.ndarray]:
        """What the checkpoint holds: the frozen base and the adapters."""
        return {**self.frozen, **params}

    def shared(self, params: dict) -> dict:
        return params

    def close(self) -> None:
        pass


__all__ = ["MODEL_FIELDS", "LoraRun", "adopt_model", "check_init", "check_lora", "init_state",
           "load_init", "lora_state", "run_config"]
