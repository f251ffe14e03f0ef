"""xenith_edu: backpropagation through a tiny LLaMA-style transformer, by hand, in NumPy.

Each module is one chapter of the book; `model` assembles them into forward and backward.
"""

from . import attention, embedding, gradcheck, rmsnorm, rope, softmax_ce, swiglu
from .model import Config, backward, forward, init_params, loss_and_grads, param_shapes

__version__ = "0.1.0"

__all__ = [
    "Config",
    "attention",
    "backward",
    "embedding",
    "forward",
    "gradcheck",
    "init_params",
    "loss_and_grads",
    "param_shapes",
    "rmsnorm",
    "rope",
    "softmax_ce",
    "swiglu",
]
