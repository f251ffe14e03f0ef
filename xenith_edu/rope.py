"""Rotary position embedding (RoPE) on interleaved pairs, forward and backward.

Chapter 5 of the book derives the backward: the rotation by the opposite angle.
"""

from __future__ import annotations

import numpy as np

# Shape legend: S positions, hd head width (even); u is (..., S, hd), e.g. (B, H, S, hd).


def rope_tables(
    seq_len: int, head_dim: int, theta: float = 10000.0
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles t * theta**(-2i/hd), each (seq_len, head_dim // 2), float64.

    See chapter 5 (RoPE).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be even and positive, got {head_dim}")
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (hd/2,)
    angle = np.arange(seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]  # (S, hd/2)
    return np.cos(angle), np.sin(angle)


def _rotate(u: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each pair (u[2i], u[2i+1]) at position t by the angle whose cos and sin are given.

    A pair is the complex number u[2i] + 1j * u[2i+1], and a rotation by an angle is a
    multiplication by exp(1j * angle) = cos + 1j * sin: one complex product does both lines
    (u[2i] cos - u[2i+1] sin, u[2i] sin + u[2i+1] cos) at once.
    """
    if u.dtype not in (np.float32, np.float64):
        raise TypeError(f"RoPE needs a float32 or float64 array, got {u.dtype}")
    S, hd = u.shape[-2], u.shape[-1]
    if hd % 2 or cos.shape[0] < S or 2 * cos.shape[-1] != hd or sin.shape != cos.shape:
        raise ValueError(f"RoPE tables of shape {cos.shape} do not fit input of shape {u.shape}")
    ctype = np.complex64 if u.dtype == np.float32 else np.complex128
    rot = np.empty(cos[:S].shape, dtype=ctype)  # (S, hd/2) exp(1j * angle)
    rot.real, rot.imag = cos[:S], sin[:S]
    if u.strides[-1] != u.itemsize:  # the pairs must sit side by side in memory
        u = np.ascontiguousarray(u)
    uc = u.view(ctype)  # (..., S, hd/2) the pairs as complex numbers, no copy
    return (uc * rot).view(u.dtype)  # (..., S, hd) a new array


def rope_forward(u: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each pair (u[2i], u[2i+1]) at position t by its angle. See chapter 5 (RoPE)."""
    return _rotate(u, cos, sin)


def rope_backward(du: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Gradient through RoPE: the transpose of a rotation is the rotation by -angle.

    See chapter 5 (RoPE).
    """
    return _rotate(du, cos, -sin)
