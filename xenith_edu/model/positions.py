"""The model's RoPE tables: its frequency rule (Llama 3's, the linear one), the tables of every
head side by side, and each layer's (a local layer's own base, a layer without RoPE's angle 0).

Only the tables change from model to model: RoPE's forward and backward read them as they are.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from ..rope import rope_tables
from ..rope_scaling import LinearScaling, Llama3Scaling
from .config import Config


def rope_scaling(cfg: Config) -> Llama3Scaling | LinearScaling | None:
    """The frequency rule of `cfg`'s RoPE: Llama 3's scaling, the linear one, or None."""
    if cfg.rope_scaling == "none":
        return None
    if cfg.rope_scaling == "linear":
        return LinearScaling(cfg.rope_factor)
    return Llama3Scaling(cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                         cfg.rope_original_context)


def qk_rope_tables(cfg: Config, seq_len: int, dtype: DTypeLike) -> tuple[np.ndarray, np.ndarray]:
    """The RoPE tables as the attention block takes them: (seq_len, (dq + dkv)/2) each, `dtype`.

    `rope_tables`' (seq_len, hd/2) repeated for the H + Hkv heads that sit side by side in a row
    of the q and k columns, so that one pass over the rows rotates every head: pair j of a row
    gets the angle of pair j mod hd/2. (Rotating head by head, over (B, H + Hkv, S, hd) views,
    gives the same numbers in loops of hd/2 pairs: 2.5 times slower.) Made once per forward
    pass and shared by every layer. With Config.local_rope_theta (Gemma 3) the windowed layers'
    tables, plain RoPE at that base, sit beside them: (seq_len, dq + dkv) each, and
    `layer_tables` takes a layer's half.
    """
    cos, sin = rope_tables(seq_len, cfg.head_dim, cfg.rope_theta,
                           rope_scaling(cfg))  # (seq_len, hd/2) float64
    heads = cfg.n_head + cfg.kv_heads
    cos, sin = np.tile(cos.astype(dtype), heads), np.tile(sin.astype(dtype), heads)
    if cfg.local_rope_theta is None:
        return cos, sin  # (seq_len, (dq + dkv)/2) each
    lcos, lsin = rope_tables(seq_len, cfg.head_dim, cfg.local_rope_theta)  # (seq_len, hd/2)
    return (np.concatenate((cos, np.tile(lcos.astype(dtype), heads)), axis=1),
            np.concatenate((sin, np.tile(lsin.astype(dtype), heads)), axis=1))  # (seq_len,
    # dq + dkv) each: the global tables, then the local ones


def layer_tables(cfg: Config, l: int, cos: np.ndarray, sin: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Layer l's RoPE tables from `qk_rope_tables`' (S, ...): the global or, for a windowed
    layer of a model with Config.local_rope_theta, the local half (S, (dq + dkv)/2); for a
    layer without RoPE (Config.nope_layers) the angle 0 (cos 1, sin 0): a rotation by 0 leaves
    q and k exactly as they are, and its backward, the rotation back by 0, leaves dq and dk.
    Only the tables change."""
    if cfg.local_rope_theta is not None:
        w = cos.shape[1] // 2
        half = slice(0, w) if l in cfg.global_layers else slice(w, None)
        cos, sin = cos[:, half], sin[:, half]  # (S, (dq + dkv)/2) views
    if l not in cfg.nope_layers:
        return cos, sin
    return np.ones_like(cos), np.zeros_like(sin)
