"""The training floor: settings, data, AdamW, the step, the loop, the run folder (checkpoint and
log), the threads, worker processes and MPI ranks that share a batch.

Imports run down only: this floor uses `xenith_edu.model`, the components and `xenith_edu.tools`.
`parallel` (MPI) is not imported here: a run without MPI never needs mpi4py.
"""

from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .config import BOOK, PRESETS, SMALL, TrainConfig, setting
from .data import get_batch, load_text, prepare_data, split_ids
from .loop import TrainResult, train
from .optim import adamw_step_, adamw_update, clip_by_global_norm, lr_at
from .runlog import CHECKPOINT, CURVE, EVAL_SEED, LOG, plot_log, read_log
from .step import TrainingDiverged, evaluate, train_step

__all__ = [
    "BOOK", "CHECKPOINT", "CURVE", "EVAL_SEED", "LOG", "PRESETS", "SMALL", "Checkpoint",
    "TrainConfig", "TrainResult", "TrainingDiverged", "adamw_step_", "adamw_update",
    "clip_by_global_norm", "evaluate", "get_batch", "load_checkpoint", "load_text", "lr_at",
    "plot_log", "prepare_data", "read_log", "save_checkpoint", "setting", "split_ids", "train",
    "train_step",
]
