"""xenith_edu: backpropagation through a tiny LLaMA-style transformer, by hand, in NumPy.

Each module is one chapter of the book; `model` assembles them into forward and backward.
"""

from . import (
    attention,
    checkpoint,
    data,
    embedding,
    exercises,
    flash_attention,
    gradcheck,
    linear,
    optim,
    rmsnorm,
    rope,
    sample,
    softmax_ce,
    swiglu,
    train,
)
from .checkpoint import load_checkpoint, save_checkpoint
from .data import CharTokenizer
from .model import Config, backward, forward, init_params, loss_and_grads, param_shapes
from .optim import adamw_update, clip_by_global_norm, lr_at
from .train import TrainConfig

__version__ = "0.1.0"

__all__ = [
    "CharTokenizer",
    "Config",
    "TrainConfig",
    "adamw_update",
    "attention",
    "backward",
    "checkpoint",
    "clip_by_global_norm",
    "data",
    "embedding",
    "exercises",
    "flash_attention",
    "forward",
    "gradcheck",
    "init_params",
    "linear",
    "load_checkpoint",
    "loss_and_grads",
    "lr_at",
    "optim",
    "param_shapes",
    "rmsnorm",
    "rope",
    "sample",
    "save_checkpoint",
    "softmax_ce",
    "swiglu",
    "train",
]
