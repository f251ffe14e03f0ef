"""The training floor: settings, data, AdamW, the step, the loop, the run folder (checkpoint and
log), the threads, worker processes and MPI ranks that share a batch.

Imports run down only: this floor uses `xenith_edu.model`, the components and `xenith_edu.tools`.
The face is lazy (PEP 562, as the package's): each name below, and each module of the floor,
loads on first use, so `import xenith_edu.training.config` loads that module and what it
imports, not the loop, the run folder or the worker processes. `parallel` (MPI) is never loaded
by a name of the face: a run without MPI never needs mpi4py (`from xenith_edu.training import
parallel` loads it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from .config import BOOK, PRESETS, SMALL, TrainConfig, setting
    from .data import get_batch, load_text, prepare_data, split_ids
    from .loop import TrainResult, train
    from .optim import adamw_step_, adamw_update, clip_by_global_norm, lr_at
    from .runlog import CHECKPOINT, CURVE, EVAL_SEED, LOG, plot_log, read_log
    from .step import TrainingDiverged, evaluate, train_step

# name -> the module of this floor that holds it, imported on first use
_LAZY: dict[str, str] = {
    **dict.fromkeys(("Checkpoint", "load_checkpoint", "save_checkpoint"), "checkpoint"),
    **dict.fromkeys(("BOOK", "PRESETS", "SMALL", "TrainConfig", "setting"), "config"),
    **dict.fromkeys(("get_batch", "load_text", "prepare_data", "split_ids"), "data"),
    **dict.fromkeys(("TrainResult", "train"), "loop"),
    **dict.fromkeys(("adamw_step_", "adamw_update", "clip_by_global_norm", "lr_at"), "optim"),
    **dict.fromkeys(("CHECKPOINT", "CURVE", "EVAL_SEED", "LOG", "plot_log", "read_log"),
                    "runlog"),
    **dict.fromkeys(("TrainingDiverged", "evaluate", "train_step"), "step"),
}
# the modules of the floor that an attribute of it gives (`xenith_edu.training.checkpoint`);
# not `parallel` (mpi4py) nor `shard_worker` (a process's entry point)
_MODULES = ("checkpoint", "config", "data", "finetune", "loop", "optim", "processes", "rundir",
            "runlog", "step", "threads")


def __getattr__(name: str) -> Any:
    """A lazy name of the floor's face, or one of its modules: imported now, and kept."""
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")  # (the import sets it here)
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


__all__ = [
    "BOOK", "CHECKPOINT", "CURVE", "EVAL_SEED", "LOG", "PRESETS", "SMALL", "Checkpoint",
    "TrainConfig", "TrainResult", "TrainingDiverged", "adamw_step_", "adamw_update",
    "clip_by_global_norm", "evaluate", "get_batch", "load_checkpoint", "load_text", "lr_at",
    "plot_log", "prepare_data", "read_log", "save_checkpoint", "setting", "split_ids", "train",
    "train_step",
]
