"""QK-norm: an RMSNorm over each head of q and of k, before RoPE (Qwen3, Gemma 3), and backward.
Each head's hd numbers are normalized on their own and scaled by a gain (hd,) shared by heads.

Derivation: a row of q (H heads of hd) is H independent RMSNorms of hd numbers with one gain, so
the backward is RMSNorm's (see the RMSNorm chapter) on the (N*H, hd) rows; the gain, used by all
N*H rows, fans out, and its gradient sums theirs (the used-twice rule). Gemma 3's gain is 1 + w
(`offset` 1): a constant moves the gain, so dw is the gain's gradient (see `rmsnorm`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .rmsnorm import RMSNormCache, rmsnorm_backward, rmsnorm_forward

# Shape legend: N positions (any leading axes), H heads, hd head width.


class QKNormCache(NamedTuple):
    """What `qk_norm_backward` needs: RMSNorm's cache over the (..., H, hd) heads."""

    norm: RMSNormCache  # per head: xhat (..., H, hd), rstd (..., H, 1), the gain (hd,)
    shape: tuple[int, ...]  # u's shape (..., H*hd), for the gradient's


def qk_norm_forward(u: np.ndarray, w: np.ndarray, eps: float, offset: float = 0.0
                    ) -> tuple[np.ndarray, QKNormCache]:
    """RMSNorm over each head of u (..., H*hd), the heads side by side, gain w (hd,) (or
    offset + w)."""
    hd = w.shape[0]
    heads = u.reshape(*u.shape[:-1], -1, hd)  # (..., H, hd), a copy if u is a strided view
    y, norm = rmsnorm_forward(heads, w, eps, offset)  # (..., H, hd)
    return y.reshape(u.shape), QKNormCache(norm, u.shape)


def qk_norm_backward(dy: np.ndarray, cache: QKNormCache) -> tuple[np.ndarray, np.ndarray]:
    """Gradients `(du, dw)` given dy (..., H*hd): RMSNorm's per head, dw summed over heads."""
    hd = cache.norm.w.shape[0]
    du, dw = rmsnorm_backward(dy.reshape(*dy.shape[:-1], -1, hd), cache.norm)  # (..., H, hd)
    return du.reshape(cache.shape), dw


__all__ = ["QKNormCache", "qk_norm_backward", "qk_norm_forward"]
