"""The trainer: from a text file to a model that writes, in one loop that reads top to bottom.

nanoGPT's order: config, data, model, optimizer, then one loop (learning rate, evaluation and
checkpoint, forward, backward, clip, step, log). The training chapter walks through it; the
run directory's files are `runlog`'s, the data-parallel ranks `parallel`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..model import Config, init_params
from ..model.adapters import Adapters, merged
from ..model.tokenizer import Tokenizer
from .config import TrainConfig
from .data import get_batch, load_text, prepare_data
from .finetune import (
    LoraRun,
    check_init,
    check_lora,
    init_state,
    load_init,
    lora_state,
    run_config,
)
from .optim import lr_at, zeros_like_params
from .processes import ProcessShards, batch_shards
from .rundir import check_start, locked
from .runlog import (
    RunLog,
    check_resume,
    check_run_dir,
    eval_windows,
    load_resume,
)
from .step import Params, TrainingDiverged, evaluate, train_step
from .threads import ThreadShards

if TYPE_CHECKING:  # parallel.py imports mpi4py, which a run without MPI never needs
    from .checkpoint import Checkpoint
    from .parallel import DataParallel

# Shape legend: B batch, S positions (seq_len), E evaluation windows, V vocab.


@dataclass
class TrainResult:
    """What a run leaves behind: the final model and its figures."""

    params: Params
    config: Config
    train_config: TrainConfig
    tokenizer: Tokenizer
    step: int  # updates applied
    val_loss: float  # the last evaluation, on the fixed validation batches
    train_loss: float  # the final evaluation on fixed training batches
    ms_per_step: float  # median wall time of one whole step (batch, forward, backward, clip, AdamW)
    seconds: float  # wall time of this call, evaluations included
    out_dir: Path
    comm_ms_per_step: float = math.nan  # median time of a step's all-reduce (data-parallel runs)


def load_data(tc: TrainConfig, ckpt: Checkpoint | None,
              resume: str | Path | None) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """The tokenizer (the checkpoint's, when resuming or fine-tuning) and the training and
    validation ids."""
    text = load_text(tc.text)  # its errors name the file
    try:
        return prepare_data(text, tc.seq_len, ckpt.tokenizer() if ckpt else None)
    except ValueError as e:
        source = "the shipped text" if tc.text is None else f"text file '{tc.text}'"
        fit = f" does not fit checkpoint '{resume}'" if ckpt else ""
        raise ValueError(f"{source}{fit}: {e}") from None


def checkpoints(out_dir: str | Path, resume: str | Path | None, overwrite: bool,
                init: str | Path | None) -> tuple[Path, Checkpoint | None, Checkpoint | None]:
    """The run directory, the checkpoint to resume and the one to fine-tune (each or None)."""
    check_start(resume, init)
    out_dir, ckpt = check_run_dir(out_dir, resume, overwrite), load_resume(resume)
    return out_dir, ckpt, load_init(init) if init is not None else None


def data_and_model(tc: TrainConfig, ckpt: Checkpoint | None, resume: str | Path | None,
                   base: Checkpoint | None, init: str | Path | None) -> tuple:
    """The tokenizer, the training and validation ids, and the model's Config, checked against
    the checkpoint the run resumes (`ckpt`) or fine-tunes (`base`)."""
    tokenizer, train_ids, val_ids = load_data(tc, ckpt or base, resume or init)
    cfg = run_config(tc, tokenizer.vocab_size, ckpt or base)
    if ckpt is not None and resume is not None:  # (a checkpoint is read only when resuming)
        check_resume(ckpt, resume, cfg, tc)  # the model, the seed, the steps
    if base is not None and init is not None:
        check_init(init, base, cfg, tc)
    return tokenizer, train_ids, val_ids, cfg


def initial_state(tc: TrainConfig, cfg: Config, ckpt: Checkpoint | None
                  ) -> tuple[Params, Params, Params, int, np.random.Generator]:
    """params, AdamW moments m and v, the start step, and the generator of the batches."""
    if ckpt is not None:  # a file of weights alone (from-hf) starts its moments at zero
        m = ckpt.m if ckpt.m is not None else zeros_like_params(ckpt.params)
        v = ckpt.v if ckpt.v is not None else zeros_like_params(ckpt.params)
        return ckpt.params, m, v, ckpt.step, ckpt.rng()
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
    init: str | Path | None = None,
) -> TrainResult:
    """Train a model with settings `tc`; write checkpoint, log and loss curve into `out_dir`.

    `resume`: a checkpoint to continue from, up to `tc.steps` updates in total. `progress`: a
    tqdm bar (None: only on a terminal). `ranks`: the processes of a data-parallel run
    (`xenith_edu.parallel`), of which rank 0 alone writes. Raises ValueError for bad input
    before any file is written (and if another trainer holds the folder's lock), and
    TrainingDiverged (leaving the last good checkpoint intact) if the loss stops being finite;
    an interruption (KeyboardInterrupt) says which checkpoint it leaves. `init`: a checkpoint
    to fine-tune (see `finetune`).
    """
    t_start = time.perf_counter()
    if not isinstance(tc, TrainConfig):  # config and run directory
        raise TypeError(f"tc must be a TrainConfig, got {type(tc).__name__}")
    if ranks is not None and not ranks.is_root:  # rank 0 alone writes, and holds the lock
        return _train(tc, out_dir, resume, overwrite, init, progress, verbose, ranks, t_start)
    with locked(Path(out_dir)):  # a second writer stops here; temporary names swept both ends
        return _train(tc, out_dir, resume, overwrite, init, progress, verbose, ranks, t_start)


def _workers(tc: TrainConfig, ranks: DataParallel | None, lora: LoraRun | None, params: dict
             ) -> tuple[LoraRun | ProcessShards | ThreadShards | None, dict, Callable, Callable]:
    """Who computes each batch's gradients: MPI's ranks, or (ours to close at the end) LoRA's
    one process, the base frozen apart, or processes or threads that share each batch; the
    parameters as they read them, their loss_and_grads and evaluate."""
    if ranks is not None:
        return None, params, ranks.loss_and_grads, ranks.evaluate
    shards = lora or batch_shards(tc.threads, tc.parallel)
    params = shards.shared(params)  # worker processes read them where the loop updates them
    return shards, params, shards.loss_and_grads, lora.evaluate if lora else evaluate


def _train(tc: TrainConfig, out_dir: str | Path, resume: str | Path | None, overwrite: bool,
           init: str | Path | None, progress: bool | None, verbose: bool,
           ranks: DataParallel | None, t_start: float) -> TrainResult:
    """`train`'s body, with the run folder locked."""
    out_dir, ckpt, base = checkpoints(out_dir, resume, overwrite, init)
    tokenizer, train_ids, val_ids, cfg = data_and_model(tc, ckpt, resume, base, init)
    if ranks is not None:
        ranks.ready(tc)  # every rank has passed the checks above
    write = ranks is None or ranks.is_root
    lora = check_lora(tc, ckpt, base, ranks is not None)  # LoRA: the adapters alone train
    if lora is None:
        params, m, v, start, rng = (init_state(base, tc) if base is not None
                                    else initial_state(tc, cfg, ckpt))  # params, optimizer,
    else:  # batches; with LoRA the trainer's params are the adapters, the base frozen apart
        frozen, params, m, v, start, rng = lora_state(lora, tc, cfg, ckpt, base)
    windows = eval_windows(train_ids, val_ids, tc.eval_batches * tc.batch_size, tc.seq_len)
    run = LoraRun(frozen, lora) if lora else None
    shards, params, loss_fn, evaluate_fn = _workers(tc, ranks, run, params)
    log = RunLog(out_dir, tc, cfg, tokenizer.vocab, start, resume, progress=progress,
                 verbose=verbose, write=write, tokenizer_spec=getattr(tokenizer, "spec", None))
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
                    kept = shards.saved(params) if isinstance(shards, LoraRun) else params
                    log.checkpoint(step, kept, m, v, rng)
            if step == tc.steps:
                break
            t0 = time.perf_counter()
            x, y = get_batch(train_ids, tc.batch_size, tc.seq_len, rng)  # (B, S) each
            loss, norm = train_step(params, m, v, step, lr, cfg, tc, x, y, loss_fn)
            log.train(step, loss, lr, norm, time.perf_counter() - t0,
                      ranks.take_comm_seconds() if ranks else None)
        finished = True
    except TrainingDiverged as e:
        raise TrainingDiverged(f"{e}: training stopped; {log.kept()}", e.step) from None
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (the command line raises it as one)
        raise type(e)(log.kept()) from None
    finally:
        if shards is not None:
            shards.close()  # the worker processes end with the run
        log.close(finished)
    ms, comm_ms = log.ms_per_step()
    if lora is not None:  # the model: each adapter merged into its frozen weight
        params = merged(frozen, Adapters(lora, params))
    return TrainResult(params, cfg, tc, tokenizer, tc.steps, val_loss, train_loss, ms,
                       time.perf_counter() - t_start, out_dir, comm_ms)


__all__ = ["TrainResult", "checkpoints", "data_and_model", "evaluate_at", "initial_state",
           "load_data", "train"]
