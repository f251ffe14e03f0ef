"""The trainer: from a text file to a model that writes, in one loop that reads top to bottom.

nanoGPT's order: config, data, model, optimizer, then one loop (learning rate, evaluation and
checkpoint, forward, backward, clip, step, log). The training chapter walks through it; the
run directory's files are `xenith_edu.runlog`'s, the data-parallel ranks `xenith_edu.parallel`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .data import CharTokenizer, get_batch, load_text, prepare_data
from .model import Config, forward, init_params, loss_and_grads
from .optim import adamw_step_, clip_by_global_norm, lr_at, zeros_like_params
from .runlog import (
    CHECKPOINT,
    CURVE,
    EVAL_SEED,
    LOG,
    RunLog,
    check_resume,
    check_run_dir,
    eval_windows,
    load_resume,
    plot_log,
    read_log,
)
from .softmax_ce import per_token_loss
from .threads import ThreadShards

if TYPE_CHECKING:  # parallel.py imports mpi4py, which a single-process run never needs
    from .checkpoint import Checkpoint
    from .parallel import DataParallel

# Shape legend: B batch, S positions (seq_len), E evaluation windows, V vocab.

Params = dict[str, np.ndarray]
GradsFn = Callable[[Params, Config, np.ndarray, np.ndarray], tuple[float, Params]]


def setting(default: Any, group: str, help: str) -> Any:
    """A TrainConfig field with its group and its help text, which the command line shows."""
    return field(default=default, metadata={"group": group, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is made of: model sizes, data, optimizer and loop settings.

    Every field is a command-line option (`--n-layer 6`, or `--set n_layer=6`).
    """

    n_layer: int = setting(4, "model", "transformer layers")
    n_head: int = setting(4, "model", "attention heads per layer (must divide n_embd)")
    n_embd: int = setting(128, "model", "width d of the residual stream")
    ffn_hidden: int = setting(352, "model", "hidden width of SwiGLU (it does not follow n_embd)")
    seq_len: int = setting(64, "model", "context length: positions per training window")
    tie_embeddings: bool = setting(True, "model", "use the embedding table as output layer")
    rope_theta: float = setting(10000.0, "model", "RoPE base of the rotation frequencies")
    norm_eps: float = setting(1e-5, "model", "epsilon inside RMSNorm's square root")
    attention: str = setting("plain", "model", "attention kernel: plain, or flash (blockwise, no "
                             "S x S matrix; see the memory chapter)")
    flash_block: int = setting(64, "model", "block size of flash attention")
    recompute: bool = setting(False, "model", "keep only each layer's input and recompute its "
                              "forward during the backward (same gradients, less memory)")
    text: str | None = setting(None, "data", "UTF-8 text file to train on")
    batch_size: int = setting(12, "data", "windows per step (the global batch over all ranks)")
    lr: float = setting(1e-3, "optimizer", "peak learning rate, reached after the warmup")
    min_lr: float = setting(1e-4, "optimizer", "learning rate at the end of the cosine decay")
    beta1: float = setting(0.9, "optimizer", "AdamW decay rate of the first moment")
    beta2: float = setting(0.99, "optimizer", "AdamW decay rate of the second moment")
    eps: float = setting(1e-8, "optimizer", "AdamW epsilon, added to sqrt(v_hat)")
    weight_decay: float = setting(0.1, "optimizer", "decoupled weight decay of the matrices")
    warmup_steps: int = setting(100, "optimizer", "steps of linear learning-rate warmup")
    decay_steps: int = setting(2000, "optimizer", "step at which the decay reaches min_lr "
                               "(it does not follow steps, so a resumed run matches one run)")
    grad_clip: float = setting(1.0, "optimizer", "clip the gradients to this global norm")
    steps: int = setting(2000, "loop", "total number of updates (with --resume: the total "
                         "to reach, counting the steps already done)")
    eval_every: int = setting(250, "loop", "evaluate and save a checkpoint every N steps")
    eval_batches: int = setting(200, "loop", "batches of fixed windows per evaluation")
    seed: int = setting(1337, "loop", "seed of the initial weights and of the batches")
    threads: int = setting(2, "loop", "threads that share each batch in a single-process run, "
                           "one BLAS thread each (1: one thread, BLAS threads the products); "
                           "under mpiexec each rank uses one")

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "eval_every", "eval_batches", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "decay_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must lie in [0, lr = {self.lr}], got {self.min_lr}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive, got {self.grad_clip}")
        self.model_config(vocab_size=1)  # the model sizes are checked by Config itself

    def model_config(self, vocab_size: int) -> Config:
        """The model's Config for a vocabulary of `vocab_size` characters."""
        return Config(vocab_size=vocab_size, n_embd=self.n_embd, n_head=self.n_head,
                      n_layer=self.n_layer, ffn_hidden=self.ffn_hidden, seq_len=self.seq_len,
                      tie_embeddings=self.tie_embeddings, rope_theta=self.rope_theta,
                      norm_eps=self.norm_eps, attention=self.attention,
                      flash_block=self.flash_block)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The inverse of dataclasses.asdict, with a clear error for unknown settings.

        Settings added since a run was made take their defaults.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}")
        return cls(**d)


# The book recipe: nanoGPT's CPU recipe for char-level Shakespeare, on our model.
BOOK = TrainConfig()
# A run of a few seconds, for tests, demos and the golden loss curve; in one thread, so that
# it is bit for bit the training chapter's own loop and the baseline of the data-parallel runs.
SMALL = TrainConfig(n_layer=2, n_head=4, n_embd=64, ffn_hidden=192, seq_len=32, batch_size=16,
                    lr=3e-3, min_lr=3e-4, warmup_steps=20, decay_steps=200, steps=200,
                    eval_every=50, eval_batches=16, threads=1)
PRESETS = {"book": BOOK, "small": SMALL}


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN or infinite; `step` says at which update."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


@dataclass
class TrainResult:
    """What a run leaves behind: the final model and its figures."""

    params: Params
    config: Config
    train_config: TrainConfig
    tokenizer: CharTokenizer
    step: int  # updates applied
    val_loss: float  # the last evaluation, on the fixed validation batches
    train_loss: float  # the final evaluation on fixed training batches
    ms_per_step: float  # median wall time of one whole step (batch, forward, backward, clip, AdamW)
    seconds: float  # wall time of this call, evaluations included
    out_dir: Path
    comm_ms_per_step: float = math.nan  # median time of a step's all-reduce (data-parallel runs)


def train_step(params: Params, m: Params, v: Params, step: int, lr: float, cfg: Config,
               tc: TrainConfig, x: np.ndarray, y: np.ndarray,
               grads_fn: GradsFn | None = None) -> tuple[float, float]:
    """One update, in place on `params` and the AdamW moments `m`, `v`: forward, backward,
    clip, step. Returns the batch's mean loss and the global gradient norm before clipping.

    `step` counts updates from 0 (AdamW's bias correction counts from 1: step + 1), `lr` is
    the learning rate of this update, `x`, `y` (B, S) the batch and its targets. `grads_fn`
    (default `loss_and_grads`) gives the loss and the gradients; a data-parallel run passes
    one that averages them over its ranks (see the "Many processes" chapter). Raises
    TrainingDiverged, before changing anything, if the loss or the norm is not finite.
    See the training chapter.
    """
    if grads_fn is None:  # one process: the model's own, recomputing if the settings say so
        grads_fn = partial(loss_and_grads, recompute=True) if tc.recompute else loss_and_grads
    loss, grads = grads_fn(params, cfg, x, y)  # forward, backward
    grads, norm = clip_by_global_norm(grads, tc.grad_clip)  # clip
    if not (math.isfinite(loss) and math.isfinite(norm)):
        bad = f"loss became {loss}" if not math.isfinite(loss) else f"gradient norm became {norm}"
        raise TrainingDiverged(f"the {bad} at step {step}", step)
    adamw_step_(params, grads, m, v, step + 1, lr, tc.beta1, tc.beta2, tc.eps,
                tc.weight_decay)  # step
    return loss, norm


def evaluate(params: Params, cfg: Config, x: np.ndarray, y: np.ndarray, chunk: int = 48) -> float:
    """Mean per-token loss over windows x, y (E, S), computed `chunk` windows at a time."""
    total = 0.0
    for i in range(0, len(x), chunk):
        logits, _ = forward(params, cfg, x[i:i + chunk])  # (chunk, S, V)
        total += float(per_token_loss(logits, y[i:i + chunk]).sum(dtype=np.float64))
    return total / y.size


def load_data(tc: TrainConfig, ckpt: Checkpoint | None,
              resume: str | Path | None) -> tuple[CharTokenizer, np.ndarray, np.ndarray]:
    """The tokenizer (the checkpoint's, when resuming) and the training and validation ids."""
    try:
        return prepare_data(load_text(tc.text), tc.seq_len,
                            CharTokenizer(ckpt.vocab) if ckpt else None)
    except ValueError as e:
        source = "the shipped text" if tc.text is None else f"text file '{tc.text}'"
        fit = f" does not fit checkpoint '{resume}'" if ckpt else ""
        raise ValueError(f"{source}{fit}: {e}") from None


def initial_state(tc: TrainConfig, cfg: Config, ckpt: Checkpoint | None
                  ) -> tuple[Params, Params, Params, int, np.random.Generator]:
    """params, AdamW moments m and v, the start step, and the generator of the batches."""
    if ckpt is not None:
        return ckpt.params, ckpt.m, ckpt.v, ckpt.step, ckpt.rng()
    params = init_params(cfg, tc.seed, np.float32)
    rng = np.random.default_rng(tc.seed + 1)  # training batches: a stream apart from init
    return params, zeros_like_params(params), zeros_like_params(params), 0, rng


def evaluate_at(step: int, tc: TrainConfig, params: Params, cfg: Config, windows: tuple,
                evaluate_fn: Callable[..., float] = evaluate) -> tuple[float, float | None]:
    """The validation loss at `step`, and at the last step the training loss too (else None).

    `windows` are `eval_windows`' fixed (E, S) arrays; raises TrainingDiverged if the validation
    loss is not finite.
    """
    val_x, val_y, train_x, train_y = windows
    val_loss = evaluate_fn(params, cfg, val_x, val_y)
    if not math.isfinite(val_loss):
        raise TrainingDiverged(f"the validation loss became {val_loss} at step {step}", step)
    if step < tc.steps:
        return val_loss, None
    return val_loss, evaluate_fn(params, cfg, train_x, train_y)  # once, for comparison


def train(
    tc: TrainConfig,
    out_dir: str | Path,
    *,
    resume: str | Path | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    verbose: bool = True,
    ranks: DataParallel | None = None,
) -> TrainResult:
    """Train a model with settings `tc`; write checkpoint, log and loss curve into `out_dir`.

    `resume`: a checkpoint to continue from, up to `tc.steps` updates in total. `progress`: a
    tqdm bar (None: only on a terminal). `ranks`: the processes of a data-parallel run
    (`xenith_edu.parallel`), of which rank 0 alone writes. Raises ValueError for bad input
    before any file is written, and TrainingDiverged (leaving the last good checkpoint intact)
    if the loss stops being finite.
    """
    t_start = time.perf_counter()
    if not isinstance(tc, TrainConfig):  # config and run directory
        raise TypeError(f"tc must be a TrainConfig, got {type(tc).__name__}")
    out_dir, ckpt = check_run_dir(out_dir, resume, overwrite), load_resume(resume)
    tokenizer, train_ids, val_ids = load_data(tc, ckpt, resume)  # data
    cfg = tc.model_config(tokenizer.vocab_size)  # model
    if ckpt is not None:
        check_resume(ckpt, resume, cfg, tc.steps)
    if ranks is not None:
        ranks.ready(tc)  # every rank has passed the checks above
    params, m, v, start, rng = initial_state(tc, cfg, ckpt)  # parameters, optimizer, batches
    windows = eval_windows(train_ids, val_ids, tc.eval_batches * tc.batch_size, tc.seq_len)
    workers = ranks or ThreadShards(tc.threads, tc.recompute)  # ranks, or threads, share a batch
    evaluate_fn = ranks.evaluate if ranks else evaluate
    log = RunLog(out_dir, tc, cfg, tokenizer.vocab, start, resume, progress=progress,
                 verbose=verbose, write=ranks is None or ranks.is_root)
    val_loss = train_loss = math.nan
    finished = False
    try:
        for step in range(start, tc.steps + 1):
            lr = lr_at(step, tc.lr, tc.min_lr, tc.warmup_steps, tc.decay_steps)
            if step % tc.eval_every == 0 or step == tc.steps:  # evaluate, then checkpoint
                val_loss, last = evaluate_at(step, tc, params, cfg, windows, evaluate_fn)
                train_loss = math.nan if last is None else last
                log.eval(step, val_loss, last)
                if step > start:
                    log.checkpoint(step, params, m, v, rng)
            if step == tc.steps:
                break
            t0 = time.perf_counter()
            x, y = get_batch(train_ids, tc.batch_size, tc.seq_len, rng)  # (B, S) each
            loss, norm = train_step(params, m, v, step, lr, cfg, tc, x, y, workers.loss_and_grads)
            log.train(step, loss, lr, norm, time.perf_counter() - t0,
                      ranks.take_comm_seconds() if ranks else None)
        finished = True
    except TrainingDiverged as e:
        raise TrainingDiverged(f"{e}: training stopped; {log.kept()}", e.step) from None
    finally:
        log.close(finished)
    ms, comm_ms = log.ms_per_step()
    return TrainResult(params, cfg, tc, tokenizer, tc.steps, val_loss, train_loss, ms,
                       time.perf_counter() - t_start, out_dir, comm_ms)


__all__ = ["BOOK", "CHECKPOINT", "CURVE", "EVAL_SEED", "LOG", "PRESETS", "SMALL", "TrainConfig",
           "TrainResult", "TrainingDiverged", "evaluate", "evaluate_at", "initial_state",
           "load_data", "plot_log", "read_log", "setting", "train", "train_step"]
