"""The optimizer: AdamW with bias correction, clipping by global norm, warmup then cosine decay.
The training chapter walks through `adamw_update`; the trainer runs `adamw_step_`, the same
floating-point operations in place, without temporaries per step.
"""

from __future__ import annotations

import math

import numpy as np

from ..model.params import decays

# Shape legend: p, g, m, v all have the shape of one parameter (any shape); AdamW is elementwise.
# Dicts of arrays are keyed by the parameter names of the model (wte, rms_attn, wq, ...).


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """The learning rate of update `step` (0-based): linear warmup, then cosine decay to min_lr.

    Warmup: max_lr * (step + 1) / warmup_steps for step < warmup_steps, so the first update
    already moves. Then a half cosine from max_lr (at step warmup_steps) down to min_lr
    (at step decay_steps), and min_lr after that.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0 or decay_steps < 0:
        raise ValueError(f"warmup_steps and decay_steps must be >= 0, got {warmup_steps}, "
                         f"{decay_steps}")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 -> 0
    return min_lr + coeff * (max_lr - min_lr)


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """sqrt of the sum of squares of every gradient entry, as if they were one long vector."""
    total = 0.0
    for g in grads.values():
        flat = g.ravel()
        total += float(np.dot(flat, flat))
    return math.sqrt(total)


def clip_by_global_norm(
    grads: dict[str, np.ndarray], max_norm: float
) -> tuple[dict[str, np.ndarray], float]:
    """Gradients scaled down together so their global norm is at most `max_norm`.

    Returns the (new) gradient dict and the norm before clipping. If the norm is within bounds,
    or not finite (for the caller to stop on), the same arrays come back unchanged; the inputs
    are never modified.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    norm = global_norm(grads)
    if max_norm < norm < math.inf:
        scale = max_norm / (norm + 1e-6)  # as PyTorch's clip_grad_norm_
        grads = {k: g * scale for k, g in grads.items()}
    return grads, norm


def adamw_update(
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One AdamW update of parameter `p` with gradient `g`; returns new arrays (p, m, v).

    `m` and `v` are the running first and second moments, `t` the 1-based update count.
    The weight decay is decoupled (Loshchilov and Hutter): it shrinks p directly and does not
    pass through the moments. The inputs are not modified.
    """
    if t < 1:
        raise ValueError(f"t is the 1-based update count, got {t}")
    p = p * (1.0 - lr * weight_decay)  # decoupled weight decay
    m = beta1 * m + (1.0 - beta1) * g  # first moment: running mean of g
    v = beta2 * v + (1.0 - beta2) * g * g  # second moment: running mean of g**2
    m_hat = m / (1.0 - beta1**t)  # bias correction: m and v start at zero
    v_hat = v / (1.0 - beta2**t)
    p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def adamw_step_(
    params: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    m: dict[str, np.ndarray],
    v: dict[str, np.ndarray],
    t: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """`adamw_update` on every parameter, in place (params, m, v), bit for bit the same result.

    Weight decay applies only where `decays(name)`, from the parameter table of
    `xenith_edu.params`. Each line repeats one operation of `adamw_update` in the same order,
    writing into existing arrays instead of new ones.
    """
    if t < 1:
        raise ValueError(f"t is the 1-based update count, got {t}")
    bc1, bc2 = 1.0 - beta1**t, 1.0 - beta2**t
    for name, p in params.items():
        g, mk, vk = grads[name], m[name], v[name]
        tmp = np.empty_like(p)
        wd = weight_decay if decays(name) else 0.0
        p *= 1.0 - lr * wd  # p = p * (1 - lr*wd)
        mk *= beta1  # m = beta1*m + (1 - beta1)*g
        np.multiply(g, 1.0 - beta1, out=tmp)
        mk += tmp
        np.multiply(g, 1.0 - beta2, out=tmp)  # v = beta2*v + (1 - beta2)*g*g
        tmp *= g
        vk *= beta2
        vk += tmp
        np.divide(mk, bc1, out=tmp)  # lr * m_hat
        tmp *= lr
        den = np.divide(vk, bc2)  # sqrt(v_hat) + eps
        np.sqrt(den, out=den)
        den += eps
        tmp /= den
        p -= tmp


def zeros_like_params(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fresh AdamW moments: one zero array per parameter."""
    return {k: np.zeros_like(p) for k, p in params.items()}


__all__ = ["adamw_step_", "adamw_update", "clip_by_global_norm", "decays", "global_norm", "lr_at",
           "zeros_like_params"]
