"""RoPE frequency scaling: Llama 3.1's rule, which slows the slow rotations for a longer context,
and the linear rule (every frequency divided by one factor: Gemma 3's global layers). Only the
tables change, so RoPE's backward (the rotation by the opposite angle) stays as it is.

Why the backward does not change: RoPE rotates each pair of q and k by an angle t * f_i. The
angles are constants of the model, not functions of any input or parameter, so scaling the
frequencies f_i changes which rotation is applied, never the rule that the transpose of a
rotation is the rotation back. `rope_backward` reads the same (scaled) tables from its cache.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

# Shape legend: hd head width; the frequencies are (hd/2,).


class Llama3Scaling(NamedTuple):
    """The four numbers of config.json's rope_scaling {"rope_type": "llama3", ...}."""

    factor: float  # how much longer the context grew (8 for Llama 3.1, 32 for 3.2)
    low_freq_factor: float  # wavelengths above original / low_freq_factor: divided by factor
    high_freq_factor: float  # wavelengths below original / high_freq_factor: kept
    original_context: int  # the context of the model before it was stretched (8192)


class LinearScaling(NamedTuple):
    """config.json's rope_scaling {"rope_type": "linear", "factor": ...}: positions t / factor."""

    factor: float  # every frequency divided by it (8 in Gemma 3 4B and larger)


def scaled_inv_freq(inv_freq: np.ndarray, s: Llama3Scaling | LinearScaling) -> np.ndarray:
    """The frequencies (hd/2,) after rule `s`, Llama 3's or the linear one."""
    if isinstance(s, LinearScaling):
        return inv_freq / s.factor  # (hd/2,)
    return llama3_inv_freq(inv_freq, s)


def llama3_inv_freq(inv_freq: np.ndarray, s: Llama3Scaling) -> np.ndarray:
    """The frequencies (hd/2,) after Llama 3's rule: slow ones (long wavelength) divided by
    `factor`, fast ones kept, and in between a linear blend in original_context / wavelength."""
    wavelen = 2 * math.pi / inv_freq  # (hd/2,)
    low_wavelen = s.original_context / s.low_freq_factor
    high_wavelen = s.original_context / s.high_freq_factor
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)  # (hd/2,)
    smooth = (s.original_context / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)  # (hd/2,) 0 at the slow end, 1 at the fast
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled  # (hd/2,)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, blended, scaled)


__all__ = ["Llama3Scaling", "LinearScaling", "llama3_inv_freq", "scaled_inv_freq"]
