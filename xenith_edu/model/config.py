"""The model's sizes: `Config`, with LLaMA's rule for the SwiGLU hidden width.
The lowest floor of `xenith_edu.model`: the parameter table and the model read it.
"""

from __future__ import annotations

import functools
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
               "sliding_window", "nope_layers", "activation", "norm_plus_one", "post_norms",
               "scale_embeddings", "query_pre_attn_scalar", "global_layers", "local_rope_theta",
               "family", "bos_token_id", "eos_token_id")
ACTIVATIONS = ("silu", "gelu_tanh")  # the feed-forward's gate: SwiGLU's, GeGLU's (Gemma)


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
    # -- Gemma 3's pieces (see `xenith_edu.geglu` and the model's docstring) --
    activation: str = "silu"  # the feed-forward's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    norm_plus_one: bool = False  # every RMSNorm's gain (QK-norm's too) is 1 + w, w stored:
    # zeros mean the gain one (Gemma)
    post_norms: bool = False  # an RMSNorm on each block's output before it joins the stream
    # (Gemma 3): gains rms_attn_post and rms_ffn_post, four norms a layer
    scale_embeddings: bool = False  # the embedding times sqrt(n_embd), rounded to the
    # parameters' dtype (Gemma); the tied output projection is not scaled
    query_pre_attn_scalar: int | None = None  # the scores' factor is its -1/2 power (Gemma 3);
    # None (which it is also made when it equals head_dim): head_dim's
    global_layers: tuple[int, ...] = ()  # with sliding_window: the layers without the window,
    # which see every earlier position (Gemma 3's global layers, every sixth)
    local_rope_theta: float | None = None  # the windowed layers' RoPE base, without
    # rope_scaling (Gemma 3's rope_local_base_freq); None: rope_theta and rope_scaling for all
    family: str = "llama"  # the Hugging Face family it was read from and is written back as
    # (llama, qwen2, qwen3, mistral, smollm3, gemma3_text): the file's names, not the model's
    # mathematics
    bos_token_id: int | None = None  # the tokenizer's begin and end tokens, which a converted
    eos_token_id: int | tuple[int, ...] | None = None  # model keeps for to-hf (generation stops
    # at an end token); several ends (Llama 3's) are a tuple

    def __post_init__(self) -> None:
        for f in fields(self):  # NumPy scalars as Python's: one form, the one JSON writes
            object.__setattr__(self, f.name, _python(getattr(self, f.name)))
        for name in ("vocab_size", "n_embd", "n_head", "n_layer", "ffn_hidden", "seq_len",
                     "n_kv_head", "flash_block", "head_width", "sliding_window",
                     "rope_original_context", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is None and name in ("ffn_hidden", "n_kv_head", "head_width",
                                          "sliding_window", "query_pre_attn_scalar"):
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
        for name in ("tie_embeddings", "qkv_bias", "qk_norm", "norm_plus_one", "post_norms",
                     "scale_embeddings"):
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
        self._layers("nope_layers")
        if not isinstance(self.family, str) or not self.family:
            raise TypeError(f"Config.family must be a family's name, got {self.family!r}")
        self._check_gemma()

    def _layers(self, name: str) -> tuple[int, ...]:
        """Config.`name`, a tuple of increasing layer indices (a list read back from JSON)."""
        value = getattr(self, name)
        if isinstance(value, list):
            value = tuple(value)
            object.__setattr__(self, name, value)
        if not isinstance(value, tuple) or any(
                isinstance(l, bool) or not isinstance(l, (int, np.integer))
                or not 0 <= l < self.n_layer for l in value) or list(value) != sorted(set(value)):
            raise ValueError(f"Config.{name} must be increasing layer indices in "
                             f"[0, {self.n_layer}), got {value!r}")
        return value

    def _check_gemma(self) -> None:
        """Gemma 3's fields: each checked, and each in one form for one model."""
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Config.activation must be one of {', '.join(ACTIVATIONS)}, got "
                             f"{self.activation!r}")
        if self.query_pre_attn_scalar == self.head_dim:
            object.__setattr__(self, "query_pre_attn_scalar", None)  # one form for one model
        if self.attention == "flash" and self.query_pre_attn_scalar is not None:
            raise ValueError("Config.attention 'flash' scales by head_dim only: use 'plain' "
                             "with Config.query_pre_attn_scalar")
        full = self._layers("global_layers")
        if full and self.sliding_window is None:
            raise ValueError("Config.global_layers are the layers without the window: set "
                             "Config.sliding_window too, or leave them ()")
        if len(full) == self.n_layer:
            raise ValueError("Config.global_layers holds every layer: leave "
                             "Config.sliding_window None instead")
        theta = self.local_rope_theta
        if theta is None:
            return
        if isinstance(theta, bool) or not isinstance(theta, (int, float, np.number)) \
                or not 0 < theta < math.inf:
            raise ValueError(f"Config.local_rope_theta must be None or a positive number, got "
                             f"{theta!r}")
        if self.sliding_window is None:
            raise ValueError("Config.local_rope_theta is the windowed layers' RoPE base: set "
                             "Config.sliding_window too, or leave it None")
        if theta == self.rope_theta and self.rope_scaling == "none":
            object.__setattr__(self, "local_rope_theta", None)  # the tables of every layer

    def _check_rope_scaling(self) -> None:
        if self.rope_scaling not in ("none", "llama3", "linear"):
            raise ValueError(f"Config.rope_scaling must be 'none', 'llama3' or 'linear', got "
                             f"{self.rope_scaling!r}")
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                    or not 0 < value < math.inf:
                raise ValueError(f"Config.{name} must be a positive number, got {value!r}")
        if self.rope_scaling != "llama3":  # the linear rule reads rope_factor only
            kept = ("rope_theta", "rope_scaling") + (("rope_factor",)
                                                     if self.rope_scaling == "linear" else ())
            moved = [f"{f.name} = {getattr(self, f.name)}" for f in fields(self)
                     if f.name.startswith("rope_") and f.name not in kept
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


def window_of(cfg: Config, layer: int) -> int | None:
    """Layer `layer`'s sliding window: how many positions each query sees, itself included, or
    None for full causal attention. The one rule every path asks (the plain, flash and KV-cache
    attention, and the cache's size): `cfg.sliding_window` on every layer but
    `cfg.global_layers` (Gemma 3's global layers see every earlier position), None there."""
    return None if layer in cfg.global_layers else cfg.sliding_window


@functools.lru_cache(maxsize=256)
def norm_offset(cfg: Config) -> float:
    """The constant of the RMSNorm gains: 1 for Gemma's 1 + w (Config.norm_plus_one), else 0."""
    return 1.0 if cfg.norm_plus_one else 0.0
