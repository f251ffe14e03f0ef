"""One training step and one evaluation: forward, backward, clip, AdamW; the mean loss over windows.
The loop (`loop.py`), the threads and the MPI ranks all call these (see the training chapter).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..model import Config, forward, loss_and_grads
from ..model.adapters import Adapters
from ..softmax_ce import per_token_loss
from .config import TrainConfig
from .optim import adamw_step_, clip_by_global_norm

# Shape legend: B batch, S positions (seq_len), E evaluation windows, V vocab.

Params = dict[str, np.ndarray]
# loss_and_grads(params, cfg, x, y, recompute=...) and the threads' and ranks' versions of it
GradsFn = Callable[..., tuple[float, Params]]


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN or infinite; `step` says at which update."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


def train_step(params: Params, m: Params, v: Params, step: int, lr: float, cfg: Config,
               tc: TrainConfig, x: np.ndarray, y: np.ndarray,
               grads_fn: GradsFn | None = None) -> tuple[float, float]:
    """One update, in place on `params` and the AdamW moments `m`, `v`: forward, backward,
    clip, step. Returns the batch's mean loss and the global gradient norm before clipping.

    `step` counts updates from 0 (AdamW's bias correction counts from 1: step + 1), `lr` is
    the learning rate of this update, `x`, `y` (B, S) the batch and its targets. `grads_fn`
    (default `loss_and_grads`) gives the loss and the gradients; the trainer's threads and a
    data-parallel run pass one that shares the batch (see the "Many processes" chapter). The
    run's recompute choice (`tc.recompute`) is read here, once, and passed down. Raises
    TrainingDiverged, before changing anything, if the loss or the norm is not finite.
    See the training chapter.
    """
    grads_fn = grads_fn or loss_and_grads  # one process, one thread: the model's own
    loss, grads = grads_fn(params, cfg, x, y, recompute=tc.recompute)  # forward, backward
    grads, norm = clip_by_global_norm(grads, tc.grad_clip)  # clip
    if not (math.isfinite(loss) and math.isfinite(norm)):
        bad = f"loss became {loss}" if not math.isfinite(loss) else f"gradient norm became {norm}"
        raise TrainingDiverged(f"the {bad} at step {step}", step)
    adamw_step_(params, grads, m, v, step + 1, lr, tc.beta1, tc.beta2, tc.eps,
                tc.weight_decay)  # step
    return loss, norm


def evaluate(params: Params, cfg: Config, x: np.ndarray, y: np.ndarray, chunk: int = 48,
             adapters: Adapters | None = None) -> float:
    """Mean per-token loss over windows x, y (E, S), computed `chunk` windows at a time (with
    LoRA `adapters` on the frozen `params`, if given)."""
    total = 0.0
    for i in range(0, len(x), chunk):
        logits, _ = forward(params, cfg, x[i:i + chunk], adapters=adapters)  # (chunk, S, V)
        total += float(per_token_loss(logits, y[i:i + chunk]).sum(dtype=np.float64))
    return total / y.size
