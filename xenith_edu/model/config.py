"""The model's sizes: `Config`, with LLaMA's rule for the SwiGLU hidden width.
The lowest floor of `xenith_edu.model`: the parameter table and the model read it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np


def default_ffn_hidden(n_embd: int, multiple_of: int = 32) -> int:
    """LLaMA's rule: 8*d/3 rounded up to a multiple of `multiple_of` (d = 128 gives 352)."""
    return multiple_of * math.ceil(8 * n_embd / 3 / multiple_of)


def _python(value: object) -> object:
    """A NumPy scalar as the Python value it holds (np.int64(3) -> 3), inside a tuple or list
    too; any other value as it is."""
    if isinstance(value, (tuple, list)):
        return type(value)(_python(v) for v in value)
    return value.item() if isinstance(value, np.generic) else value


# The fields the open models added, shown by repr only when they differ from their defaults:
# the book's model prints as it always has.
OPEN_FIELDS = ("head_width", "qkv_bias", "qk_norm", "rope_scaling", "rope_factor",
               "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context",
               "sliding_window", "nope_layers", "family", "bos_token_id", "eos_token_id")


@dataclass(frozen=True, repr=False)
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
    # -- what the open models of 2026 add (see the chapter "A real LLaMA"); each default is
    #    the book's LLaMA, bit for bit --
    head_width: int | None = None  # each head's width when it is not n_embd // n_head (Qwen3:
    # wider); None (which it is also made when it equals that): n_embd // n_head. `head_dim`
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2.5)
    qk_norm: bool = False  # an RMSNorm over each head of q and of k, before RoPE (Qwen3)
    rope_scaling: str = "none"  # "llama3": Llama 3.1's rule for the RoPE frequencies
    rope_factor: float = 8.0  # llama3 scaling: how much longer the context grew
    rope_low_freq_factor: float = 1.0  # llama3 scaling: wavelengths above original/low are
    rope_high_freq_factor: float = 4.0  # divided by factor, below original/high kept, smoothed
    rope_original_context: int = 8192  # between; the context the model was first trained at
    sliding_window: int | None = None  # each query sees only this many positions, itself
    # included (Mistral); None: every earlier position
    nope_layers: tuple[int, ...] = ()  # the layers without RoPE (SmolLM3: every fourth): their
    # q and k are not rotated, as if their tables were the angle 0
    family: str = "llama"  # the Hugging Face family it was read from and is written back as
    # (llama, qwen2, qwen3, mistral): the file's names, not the model's mathematics
    bos_token_id: int | None = None  # the tokenizer's begin and end tokens, which a converted
    eos_token_id: int | tuple[int, ...] | None = None  # model keeps for to-hf (generation stops
    # at an end token); several ends (Llama 3's) are a tuple

    def __post_init__(self) -> None:
        for f in fields(self):  # NumPy scalars as Python's: one form, the one JSON writes
            object.__setattr__(self, f.name, _python(getattr(self, f.name)))
        for name in ("vocab_size", "n_embd", "n_head", "n_layer", "ffn_hidden", "seq_len",
                     "n_kv_head", "flash_block", "head_width", "sliding_window",
                     "rope_original_context"):
            value = getattr(self, name)
            if value is None and name in ("ffn_hidden", "n_kv_head", "head_width",
                                          "sliding_window"):
                continue  # derived below, from n_embd and n_head once they are checked
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Config.{name} must be an int, got {type(value).__name__}")
            if value <= 0:
                raise ValueError(f"Config.{name} must be positive, got {value}")
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", default_ffn_hidden(self.n_embd))
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.head_width == self.n_embd // self.n_head and not self.n_embd % self.n_head:
            object.__setattr__(self, "head_width", None)  # one form for one model
        if self.head_width is None and self.n_embd % self.n_head:
            raise ValueError(
                f"Config.n_embd ({self.n_embd}) must be divisible by Config.n_head ({self.n_head})"
            )
        if self.n_head % self.kv_heads:
            raise ValueError(
                f"Config.n_kv_head ({self.n_kv_head}) must divide Config.n_head ({self.n_head}): "
                "each key/value head serves the same number of query heads"
            )
        if self.head_dim % 2:
            where = ("Config.head_width: the head width" if self.head_width else
                     "Config.n_head: head width n_embd // n_head =")
            raise ValueError(f"{where} {self.head_dim} must be even for RoPE's pairs")
        for name in ("tie_embeddings", "qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"Config.{name} must be a bool")
        self._check_rope_scaling()
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
        if isinstance(self.nope_layers, list):  # a config read back from JSON
            object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        nope = self.nope_layers
        if not isinstance(nope, tuple) or any(
                isinstance(l, bool) or not isinstance(l, (int, np.integer))
                or not 0 <= l < self.n_layer for l in nope) or list(nope) != sorted(set(nope)):
            raise ValueError(f"Config.nope_layers must be increasing layer indices in "
                             f"[0, {self.n_layer}), got {nope!r}")
        if not isinstance(self.family, str) or not self.family:
            raise TypeError(f"Config.family must be a family's name, got {self.family!r}")
        if self.attention == "flash" and self.sliding_window is not None:
            raise ValueError("Config.attention 'flash' has no sliding window yet: use 'plain' "
                             "with Config.sliding_window")

    def _check_rope_scaling(self) -> None:
        if self.rope_scaling not in ("none", "llama3"):
            raise ValueError(f"Config.rope_scaling must be 'none' or 'llama3', got "
                             f"{self.rope_scaling!r}")
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                    or not 0 < value < math.inf:
                raise ValueError(f"Config.{name} must be a positive number, got {value!r}")
        if self.rope_scaling == "none":
            moved = [f"{f.name} = {getattr(self, f.name)}" for f in fields(self)
                     if f.name.startswith("rope_") and f.name not in ("rope_theta",
                                                                       "rope_scaling")
                     and getattr(self, f.name) != f.default]
            if moved:
                raise ValueError(f"Config.{moved[0]} is a setting of the llama3 RoPE scaling: "
                                 "set Config.rope_scaling to 'llama3' as well, or leave it")
        if not self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise ValueError(f"Config.rope_low_freq_factor ({self.rope_low_freq_factor}) must be "
                             f"below Config.rope_high_freq_factor ({self.rope_high_freq_factor})")

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.name not in OPEN_FIELDS or getattr(self, f.name) != f.default]
        return f"Config({', '.join(shown)})"

    def _check_token(self, name: str) -> None:
        value = getattr(self, name)
        ids = value if isinstance(value, tuple) and name == "eos_token_id" and value else (value,)
        for t in ids:
            if value is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer))
                                      or not 0 <= t < self.vocab_size):
                raise ValueError(f"Config.{name} must be None or a token id in "
                                 f"[0, {self.vocab_size}), got {value!r}")

    @property
    def hidden(self) -> int:
        """SwiGLU's hidden width, an int: ffn_hidden as `__post_init__` filled it (LLaMA's rule
        when it was not given). Read this, not the field, whose type also admits None."""
        return self.ffn_hidden if self.ffn_hidden is not None else default_ffn_hidden(self.n_embd)

    @property
    def kv_heads(self) -> int:
        """The key/value heads, an int: n_kv_head as `__post_init__` filled it (n_head when it
        was not given). Read this, not the field, whose type also admits None."""
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def head_dim(self) -> int:
        """Each head's width: head_width if given, else n_embd // n_head."""
        return self.head_width or self.n_embd // self.n_head

    @property
    def q_dim(self) -> int:
        """The width of the queries of all heads: n_head * head_dim (n_embd unless head_dim is
        given)."""
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        """The width of the keys (and of the values) of all heads: n_kv_head * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per key/value head: query head j reads key/value head j // group."""
        return self.n_head // self.kv_heads

    def to_dict(self) -> dict:
        return asdict(self)
