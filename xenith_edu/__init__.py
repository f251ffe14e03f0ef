"""xenith_edu: backpropagation through a tiny LLaMA-style transformer, by hand, in NumPy.

The package is built in floors, and imports run one way, down:

    cli/          the `xenith-edu` command line
    gradebook/    a class graded: the journal, points, totals, reports, LMS files, statistics
    booktools/    the student versions of the chapters, written from the installed package
    grader/       the sandboxed grader: one learner's notebooks run, their functions judged
    exercises/    the learner's checks: the engine, the runner, one module per chapter
    training/     settings, data, AdamW, the step, the loop, checkpoints, threads, processes, MPI
    model/        Config, the parameter table, forward and backward, generation, check_model
    softmax_ce, swiglu, rmsnorm, attention, rope, embedding, linear, flash_attention
                  the components: one module per chapter, `*_forward`/`*_backward` pairs
    tools/        finite differences, the workspace, file writes, plots

`chapters` is the registry of the book's chapters, which every floor may read.

The face is light and portable: `import xenith_edu` loads the components, the model and the
ground floor; `training`, `exercises`, the teaching rooms (`booktools`, `grader`,
`gradebook`) and `cli`, and the names taken from them
(`TrainConfig`, `save_checkpoint`, ...), load on first use (PEP 562 `__getattr__` below).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import (
    attention,
    embedding,
    flash_attention,
    linear,
    model,
    rmsnorm,
    rope,
    softmax_ce,
    swiglu,
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

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from . import booktools, cli, exercises, gradebook, grader, training
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

# name -> the module that holds it, imported on first use; a floor's own name maps to itself
_LAZY: dict[str, str] = {
    **{floor: f"{__name__}.{floor}" for floor in (
        "booktools", "cli", "exercises", "grader", "gradebook", "training")},
    **{name: f"{__name__}.training" for name in (
        "TrainConfig", "adamw_update", "checkpoint", "clip_by_global_norm", "data",
        "load_checkpoint", "lr_at", "optim", "save_checkpoint")},
}


def __getattr__(name: str) -> Any:
    """A lazy name of the face: its module is imported now, and the value kept."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if where.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CharTokenizer",
    "Config",
    "TrainConfig",
    "adamw_update",
    "attention",
    "backward",
    "booktools",
    "check_model",
    "checkpoint",
    "cli",
    "clip_by_global_norm",
    "data",
    "embedding",
    "exercises",
    "flash_attention",
    "forward",
    "gradcheck",
    "gradebook",
    "grader",
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
