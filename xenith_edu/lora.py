"""LoRA, a low-rank adapter beside a frozen linear layer: out = scale * (x @ A.T) @ B.T.
The fast form the model runs; the derivation below is the readable form (the chapter "A real
LLaMA" fine-tunes with it). The frozen layer's own product x @ W stays in `linear`.

A frozen projection y = x @ W (W (n, m), stored (in, out) as the notation page writes) becomes

    y = x @ W + scale * (x @ A.T) @ B.T,    A (r, n), B (m, r), scale = alpha / r,

with A and B named and shaped as peft's lora_A and lora_B (torch's (out, in)), r << n, m. Only
A and B learn. Their gradients need nothing of W: the adapter's branch is added to the frozen
output, so it receives the same upstream gradient dy (N, m) as the frozen product does. Name
the branch's middle u = x @ A.T (N, r), so that out = scale * u @ B.T. Two linear layers in a
row, and the rules of backprop (dX = dY @ W.T, dW = X.T @ dY, here with the torch layout):

    dB = scale * dy.T @ u        (m, r)   B multiplies u: its gradient sums dy against u
    du = scale * dy @ B          (N, r)   u fans out to the m outputs through B
    dA = du.T @ x                (r, n)   A multiplies x
    dx = du @ A                  (N, n)   added to the frozen layer's dy @ W.T

Cost: two thin products each way (r columns), against the frozen layer's dW = x.T @ dy that a
frozen layer never computes: that (n, m) gradient and its two AdamW moments are what full
fine-tuning holds and LoRA does not. With B = 0 at the start (peft's init), out = 0 and the
model is the frozen one; dA is then 0 too, and dB = scale * dy.T @ u is what moves first.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

# Shape legend: N positions (any leading axes ... are flattened for dA and dB), n in, m out,
# r the adapter's rank.


class LoraCache(NamedTuple):
    """What `lora_backward` needs: each factor of the two thin products, and the scale."""

    x: np.ndarray  # (..., n) the input: for dA = du.T @ x
    A: np.ndarray  # (r, n) the down projection: for dx = du @ A
    B: np.ndarray  # (m, r) the up projection: for du = scale * dy @ B
    u: np.ndarray  # (N, r) x @ A.T, the rank-r middle: for dB = scale * dy.T @ u
    scale: float  # alpha / r, multiplies both dB and du


def lora_forward(x: np.ndarray, A: np.ndarray, B: np.ndarray, scale: float
                 ) -> tuple[np.ndarray, LoraCache]:
    """The adapter's output scale * (x @ A.T) @ B.T (..., m) for x (..., n), A (r, n), B (m, r).

    Returns `(out, cache)`; the caller adds out to the frozen layer's x @ W.
    """
    x2 = x.reshape(-1, x.shape[-1])  # (N, n)
    u = x2 @ A.T  # (N, r)
    out = u @ (scale * B.T)  # (N, m): scale folded into the (r, m) factor, the smaller one
    return out.reshape(*x.shape[:-1], B.shape[0]), LoraCache(x, A, B, u, scale)


def lora_backward(dout: np.ndarray, cache: LoraCache
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients `(dx, dA, dB)` of the adapter given dout (..., m): see the module's derivation."""
    x, A, B, u, scale = cache
    dy = dout.reshape(-1, dout.shape[-1])  # (N, m)
    x2 = x.reshape(-1, x.shape[-1])  # (N, n)
    dB = (dy.T @ u) * scale  # (m, r)
    du = dy @ (scale * B)  # (N, r)
    dA = du.T @ x2  # (r, n)
    dx = du @ A  # (N, n)
    return dx.reshape(x.shape), dA, dB


def lora_init(n: int, m: int, rank: int, rng: np.random.Generator,
              dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """A fresh adapter for an (n in, m out) layer: A (rank, n) and B (m, rank) as peft draws them.

    peft's default: A from torch's kaiming_uniform_ with a = sqrt(5) (uniform in +-1/sqrt(n)),
    B zero, so the adapted layer starts as the frozen one. Randomness from `rng`.
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
    bound = 1.0 / math.sqrt(n)  # gain sqrt(2 / (1 + 5)) * sqrt(3 / n)
    A: np.ndarray = rng.uniform(-bound, bound, (rank, n)).astype(dtype)  # (r, n)
    B: np.ndarray = np.zeros((m, rank), dtype)  # (m, r)
    return A, B


__all__ = ["LoraCache", "lora_backward", "lora_forward", "lora_init"]
