"""The model's sizes: `Config`, with LLaMA's rule for the SwiGLU hidden width.
The lowest floor of `xenith_edu.model`: the parameter table and the model read it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


def default_ffn_hidden(n_embd: int, multiple_of: int = 32) -> int:
    """LLaMA's rule: 8*d/3 rounded up to a multiple of `multiple_of` (d = 128 gives 352)."""
    return multiple_of * math.ceil(8 * n_embd / 3 / multiple_of)


@dataclass(frozen=True)
class Config:
    """The model's sizes. See the book's page "The model at a glance"."""

    vocab_size: int
    n_embd: int
    n_head: int
    n_layer: int
    ffn_hidden: int | None = None
    seq_len: int = 64
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: n_head
    attention: str = "plain"  # "flash": blockwise, no (S, S) array (see the memory chapter)
    flash_block: int = 64  # positions per block of the flash attention
    pad_token_id: int | None = None  # a padding token: out of the loss, its row out of the
    # embedding's gradient, as transformers' padding_idx (see the chapter "A real LLaMA")
    bos_token_id: int | None = None  # the tokenizer's begin and end tokens, which a converted
    eos_token_id: int | tuple[int, ...] | None = None  # model keeps for to-hf (generation stops
    # at an end token); several ends (Llama 3's) are a tuple

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_embd", "n_head", "n_layer", "ffn_hidden", "seq_len",
                     "n_kv_head", "flash_block"):
            value = getattr(self, name)
            if value is None and name in ("ffn_hidden", "n_kv_head"):
                continue  # derived below, from n_embd and n_head once they are checked
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Config.{name} must be an int, got {type(value).__name__}")
            if value <= 0:
                raise ValueError(f"Config.{name} must be positive, got {value}")
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", default_ffn_hidden(self.n_embd))
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.n_embd % self.n_head:
            raise ValueError(
                f"Config.n_embd ({self.n_embd}) must be divisible by Config.n_head ({self.n_head})"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"Config.n_kv_head ({self.n_kv_head}) must divide Config.n_head ({self.n_head}): "
                "each key/value head serves the same number of query heads"
            )
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"Config.n_head: head width n_embd // n_head = {self.n_embd // self.n_head} "
                "must be even for RoPE's pairs"
            )
        if not isinstance(self.tie_embeddings, (bool, np.bool_)):
            raise TypeError("Config.tie_embeddings must be a bool")
        if not self.rope_theta > 0:
            raise ValueError(f"Config.rope_theta must be positive, got {self.rope_theta}")
        if not self.norm_eps > 0:
            raise ValueError(f"Config.norm_eps must be positive, got {self.norm_eps}")
        if isinstance(self.eos_token_id, list):  # a config read back from JSON
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            self._check_token(name)
        if self.attention not in ("plain", "flash"):
            raise ValueError(f"Config.attention must be 'plain' or 'flash', got {self.attention!r}")

    def _check_token(self, name: str) -> None:
        value = getattr(self, name)
        ids = value if isinstance(value, tuple) and name == "eos_token_id" and value else (value,)
        for t in ids:
            if value is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer))
                                      or not 0 <= t < self.vocab_size):
                raise ValueError(f"Config.{name} must be None or a token id in "
                                 f"[0, {self.vocab_size}), got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_dim(self) -> int:
        """The width of the keys (and of the values) of all heads: n_kv_head * head_dim."""
        return self.n_kv_head * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per key/value head: query head j reads key/value head j // group."""
        return self.n_head // self.n_kv_head

    def to_dict(self) -> dict:
        return asdict(self)
