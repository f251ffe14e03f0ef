"""Rotary position embedding (RoPE) on interleaved pairs, forward and backward.
The fast form the model runs; the readable form is the RoPE chapter's (`rope_real`, "The
forward: a 2x2 rotation of every pair"), which derives the backward: the rotation by the
opposite angle.

Fast how: a pair is a complex number and one complex product rotates it ("The complex view" of
the same chapter), written into the caller's buffer if given; the same values as the readable
form to float32 rounding. No input checks, `rope_tables` included: `Config` checks the sizes at
the model's boundary. Measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .rope_scaling import LinearScaling, Llama3Scaling, scaled_inv_freq
from .tools.workspace import empty

# Shape legend: S positions, hd head width (even); u is (..., S, hd), e.g. (B, H, S, hd).


class RopeCache(NamedTuple):
    """What `rope_backward` needs: the tables, to rotate the gradient back by the same angles."""

    cos: np.ndarray  # (>= S, hd/2) cos of the angles, as given to rope_forward
    sin: np.ndarray  # (>= S, hd/2) sin of the angles


def rope_tables(
    seq_len: int, head_dim: int, theta: float = 10000.0,
    scaling: Llama3Scaling | LinearScaling | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles t * theta**(-2i/hd), each (seq_len, head_dim // 2), float64;
    with `scaling`, the frequencies theta**(-2i/hd) after Llama 3's or the linear rule
    (`rope_scaling`).

    The sizes are trusted (a positive seq_len, an even head_dim: `Config` checks them). See the
    RoPE chapter.
    """
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (hd/2,)
    if scaling is not None:
        inv_freq = scaled_inv_freq(inv_freq, scaling)  # (hd/2,) only the tables change
    angle = np.arange(seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]  # (S, hd/2)
    return np.cos(angle), np.sin(angle)


def _rotate(
    u: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Rotate each pair (u[2i], u[2i+1]) at position t by the angle whose cos and sin are given.

    A pair is the complex number u[2i] + 1j * u[2i+1], and a rotation by an angle is a
    multiplication by exp(1j * angle) = cos + 1j * sin: one complex product does both lines
    (u[2i] cos - u[2i+1] sin, u[2i] sin + u[2i+1] cos) at once. u is float32 or float64 with an
    even last axis, and the tables have at least S rows (`forward` and Config see to it).
    `out`, if given, is u's shape and dtype with its pairs side by side (its last axis
    contiguous) and receives the result; else a new array does.
    """
    S = u.shape[-2]
    ctype = np.complex64 if u.dtype == np.float32 else np.complex128
    rot = np.empty(cos[:S].shape, dtype=ctype)  # (S, hd/2) exp(1j * angle)
    rot.real, rot.imag = cos[:S], sin[:S]
    if u.strides[-1] != u.itemsize:  # the pairs must sit side by side in memory
        u = np.ascontiguousarray(u)
    uc = u.view(ctype)  # (..., S, hd/2) the pairs as complex numbers, no copy
    outc = empty(uc.shape, ctype) if out is None else out.view(ctype)  # (..., S, hd/2)
    return np.multiply(uc, rot, out=outc).view(u.dtype)  # (..., S, hd)


def rope_forward(u: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, RopeCache]:
    """Rotate each pair (u[2i], u[2i+1]) at position t by its angle; u is (..., S, hd).

    Returns `(out, cache)`, out shaped like u. See the RoPE chapter.
    """
    return _rotate(u, cos, sin), RopeCache(cos, sin)


def rope_backward(
    dout: np.ndarray, cache: RopeCache, out: np.ndarray | None = None
) -> np.ndarray:
    """Gradient `du` through RoPE: the transpose of a rotation is the rotation by -angle.

    `out` (dout's shape, last axis contiguous), if given, receives du: the model writes it
    straight into its (N, 3d) gradient of the fused q, k, v product. See the RoPE chapter.
    """
    return _rotate(dout, cache.cos, -cache.sin, out)
