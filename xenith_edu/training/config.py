"""The training settings: `TrainConfig`, every field a command-line option, and the presets.

The book recipe is nanoGPT's CPU recipe for character-level Shakespeare, on our model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..model import Config


def setting(default: Any, group: str, help: str) -> Any:
    """A TrainConfig field with its group and its help text, which the command line shows."""
    return field(default=default, metadata={"group": group, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is made of: model sizes, data, optimizer and loop settings.

    Every field is a command-line option (`--n-layer 6`, or `--set n_layer=6`).
    """

    n_layer: int = setting(4, "model", "transformer layers")
    n_head: int = setting(4, "model", "attention heads per layer (must divide n_embd)")
    n_embd: int = setting(128, "model", "width d of the residual stream")
    ffn_hidden: int = setting(352, "model", "hidden width of SwiGLU (it does not follow n_embd)")
    seq_len: int = setting(64, "model", "context length: positions per training window")
    tie_embeddings: bool = setting(True, "model", "use the embedding table as output layer")
    rope_theta: float = setting(10000.0, "model", "RoPE base of the rotation frequencies")
    norm_eps: float = setting(1e-5, "model", "epsilon inside RMSNorm's square root")
    attention: str = setting("plain", "model", "attention kernel: plain, or flash (blockwise, no "
                             "S x S matrix; see the memory chapter)")
    flash_block: int = setting(64, "model", "block size of flash attention")
    recompute: bool = setting(False, "model", "keep only each layer's input and recompute its "
                              "forward during the backward (same gradients, less memory)")
    text: str | None = setting(None, "data", "UTF-8 text file to train on")
    batch_size: int = setting(12, "data", "windows per step (the global batch over all ranks)")
    lr: float = setting(1e-3, "optimizer", "peak learning rate, reached after the warmup")
    min_lr: float = setting(1e-4, "optimizer", "learning rate at the end of the cosine decay")
    beta1: float = setting(0.9, "optimizer", "AdamW decay rate of the first moment")
    beta2: float = setting(0.99, "optimizer", "AdamW decay rate of the second moment")
    eps: float = setting(1e-8, "optimizer", "AdamW epsilon, added to sqrt(v_hat)")
    weight_decay: float = setting(0.1, "optimizer", "decoupled weight decay of the matrices")
    warmup_steps: int = setting(100, "optimizer", "steps of linear learning-rate warmup")
    decay_steps: int = setting(2000, "optimizer", "step at which the decay reaches min_lr "
                               "(it does not follow steps, so a resumed run matches one run)")
    grad_clip: float = setting(1.0, "optimizer", "clip the gradients to this global norm")
    steps: int = setting(2000, "loop", "total number of updates (with --resume: the total "
                         "to reach, counting the steps already done)")
    eval_every: int = setting(250, "loop", "evaluate and save a checkpoint every N steps")
    eval_batches: int = setting(200, "loop", "batches of fixed windows per evaluation")
    seed: int = setting(1337, "loop", "seed of the initial weights and of the batches")
    threads: int = setting(2, "loop", "threads that share each batch in a single-process run, "
                           "one BLAS thread each (1: one thread, BLAS threads the products); "
                           "under mpiexec each rank uses one")

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "eval_every", "eval_batches", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "decay_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must lie in [0, lr = {self.lr}], got {self.min_lr}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive, got {self.grad_clip}")
        self.model_config(vocab_size=1)  # the model sizes are checked by Config itself

    def model_config(self, vocab_size: int) -> Config:
        """The model's Config for a vocabulary of `vocab_size` characters."""
        return Config(vocab_size=vocab_size, n_embd=self.n_embd, n_head=self.n_head,
                      n_layer=self.n_layer, ffn_hidden=self.ffn_hidden, seq_len=self.seq_len,
                      tie_embeddings=self.tie_embeddings, rope_theta=self.rope_theta,
                      norm_eps=self.norm_eps, attention=self.attention,
                      flash_block=self.flash_block)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The inverse of dataclasses.asdict, with a clear error for unknown settings.

        Settings added since a run was made take their defaults.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}")
        return cls(**d)


# The book recipe: nanoGPT's CPU recipe for char-level Shakespeare, on our model.
BOOK = TrainConfig()
# A run of a few seconds, for tests, demos and the golden loss curve; in one thread, so that
# it is bit for bit the training chapter's own loop and the baseline of the data-parallel runs.
SMALL = TrainConfig(n_layer=2, n_head=4, n_embd=64, ffn_hidden=192, seq_len=32, batch_size=16,
                    lr=3e-3, min_lr=3e-4, warmup_steps=20, decay_steps=200, steps=200,
                    eval_every=50, eval_batches=16, threads=1)
PRESETS = {"book": BOOK, "small": SMALL}
