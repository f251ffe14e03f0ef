"""xenith_edu: backpropagation through a tiny LLaMA-style transformer, by hand, in NumPy.

The package is built in floors, and imports run one way, down:

    cli/          the `xenith-edu` command line
    classroom/    student versions of the notebooks and the sandboxed grader
    exercises/    the learner's checks: the engine, the runner, one module per chapter
    training/     settings, data, AdamW, the step, the loop, checkpoints, threads, processes, MPI
    model/        Config, the parameter table, forward and backward, generation, check_model
    softmax_ce, swiglu, rmsnorm, attention, rope, embedding, linear, flash_attention
                  the components: one module per chapter, `*_forward`/`*_backward` pairs
    tools/        finite differences, the workspace, file writes, plots

`chapters` is the registry of the book's chapters, which every floor may read.
"""

from . import (
    attention,
    embedding,
    exercises,
    flash_attention,
    linear,
    model,
    rmsnorm,
    rope,
    softmax_ce,
    swiglu,
    training,
)
from .model import (
    CharTokenizer,
    Config,
    backward,
    check_model,
    forward,
    init_params,
    loss_and_grads,
    param_shapes,
)
from .tools import gradcheck
from .training import (
    TrainConfig,
    adamw_update,
    checkpoint,
    clip_by_global_norm,
    data,
    load_checkpoint,
    lr_at,
    optim,
    save_checkpoint,
)

__version__ = "0.1.0"

__all__ = [
    "CharTokenizer",
    "Config",
    "TrainConfig",
    "adamw_update",
    "attention",
    "backward",
    "check_model",
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
    "model",
    "optim",
    "param_shapes",
    "rmsnorm",
    "rope",
    "save_checkpoint",
    "softmax_ce",
    "swiglu",
    "training",
]
