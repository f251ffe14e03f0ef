"""The trainer: from a text file to a model that writes, in one loop that reads top to bottom.

nanoGPT's order: config, data, model, optimizer, then one loop (learning rate, evaluation and
checkpoint, forward, backward, clip, step, log). Chapter 8 of the book walks through it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .checkpoint import atomic_write, config_mismatch, load_checkpoint, save_checkpoint
from .data import CharTokenizer, get_batch, load_text, prepare_data
from .model import Config, forward, init_params, loss_and_grads
from .optim import adamw_step_, clip_by_global_norm, lr_at, zeros_like_params
from .softmax_ce import per_token_loss

# Shape legend: B batch, S positions (seq_len), E evaluation windows, V vocab.

EVAL_SEED = 0  # the validation windows depend on this alone, so any two runs compare
CHECKPOINT, LOG, CURVE = "ckpt.npz", "log.jsonl", "loss.png"  # the files of a run directory


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is made of: model sizes, data, optimizer and loop settings."""

    # model (the vocabulary size comes from the text)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    ffn_hidden: int = 352
    seq_len: int = 64
    tie_embeddings: bool = True
    # data: None is the shipped Shakespeare
    text: str | None = None
    batch_size: int = 12
    # optimizer: AdamW, warmup then cosine decay from lr to min_lr, clipping by global norm
    lr: float = 1e-3
    min_lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    decay_steps: int = 2000
    grad_clip: float = 1.0
    # loop: evaluate (and checkpoint) every eval_every steps on eval_batches fixed batches
    steps: int = 2000
    eval_every: int = 250
    eval_batches: int = 200
    seed: int = 1337

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "eval_every", "eval_batches"):
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
                      tie_embeddings=self.tie_embeddings)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The inverse of dataclasses.asdict, with a clear error for unknown settings."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}")
        return cls(**d)


# The book recipe: nanoGPT's CPU recipe for char-level Shakespeare, on our model.
BOOK = TrainConfig()
# A run of a few seconds, for tests, demos and the golden loss curve.
SMALL = TrainConfig(n_layer=2, n_head=4, n_embd=64, ffn_hidden=192, seq_len=32, batch_size=16,
                    lr=3e-3, min_lr=3e-4, warmup_steps=20, decay_steps=200, steps=200,
                    eval_every=50, eval_batches=16)
PRESETS = {"book": BOOK, "small": SMALL}


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN or infinite; `step` says at which update."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


@dataclass
class TrainResult:
    """What a run leaves behind: the final model and its figures."""

    params: dict[str, np.ndarray]
    config: Config
    train_config: TrainConfig
    tokenizer: CharTokenizer
    step: int  # updates applied
    val_loss: float  # the last evaluation, on the fixed validation batches
    train_loss: float  # the final evaluation on fixed training batches
    ms_per_step: float  # median wall time of one whole step (batch, forward, backward, clip, AdamW)
    seconds: float  # wall time of this call, evaluations included
    out_dir: Path


def evaluate(
    params: dict[str, np.ndarray], cfg: Config, x: np.ndarray, y: np.ndarray, chunk: int = 48
) -> float:
    """Mean per-token loss over windows x, y (E, S), computed `chunk` windows at a time."""
    total = 0.0
    for i in range(0, len(x), chunk):
        logits, _ = forward(params, cfg, x[i:i + chunk])  # (chunk, S, V)
        total += float(per_token_loss(logits, y[i:i + chunk]).sum(dtype=np.float64))
    return total / y.size


def read_log(path: str | Path) -> list[dict]:
    """The records of a run's log (one JSON object per line).

    A line cut short (a run killed mid-write) is skipped.
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def plot_log(log_path: str | Path, png_path: str | Path) -> None:
    """The loss curve of a run: training loss per step and validation loss at each evaluation."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    records = read_log(log_path)
    tr = [(r["step"], r["loss"]) for r in records if r["event"] == "train"]
    ev = [(r["step"], r["val_loss"]) for r in records if r["event"] == "eval"]
    fig = Figure(figsize=(7, 4), dpi=120)
    ax = fig.add_subplot()
    if tr:
        steps, losses = np.array(tr).T
        ax.plot(steps, losses, color="tab:blue", alpha=0.3, lw=0.8, label="training (per step)")
        k = min(50, len(losses) // 10)  # a moving average shows the trend through the noise
        if k > 1:
            smooth = np.convolve(losses, np.ones(k) / k, mode="valid")  # centred on its window
            ax.plot(steps[k // 2:k // 2 + len(smooth)], smooth, color="tab:blue", lw=1.5,
                    label=f"training ({k}-step mean)")
    if ev:
        steps, losses = np.array(ev).T
        ax.plot(steps, losses, "o-", color="tab:orange", lw=1.5, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per character)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(png_path, lambda f: fig.savefig(f, format="png"))


def _prepare_log(path: Path, start: int) -> None:
    """A resumed run keeps the records before its start step; a new run starts an empty log."""
    keep = []
    if start > 0 and path.exists():
        keep = [r for r in read_log(path) if r["step"] < start]
    text = "".join(json.dumps(r) + "\n" for r in keep)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def train(
    tc: TrainConfig,
    out_dir: str | Path,
    *,
    resume: str | Path | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    verbose: bool = True,
) -> TrainResult:
    """Train a model with settings `tc`; write checkpoint, log and loss curve into `out_dir`.

    `resume`: a checkpoint to continue from (its model config must equal tc's); the run then
    goes on to `tc.steps` updates in total. `progress`: show a tqdm bar (None: only on a
    terminal). Raises ValueError for bad input before any file is written, and
    TrainingDiverged (leaving the last good checkpoint intact) if the loss stops being finite.
    """
    t_start = time.perf_counter()
    echo = tqdm.write if verbose else (lambda s: None)

    # ---- config and output files
    if not isinstance(tc, TrainConfig):
        raise TypeError(f"tc must be a TrainConfig, got {type(tc).__name__}")
    out_dir = Path(out_dir)
    ckpt_path, log_path, png_path = out_dir / CHECKPOINT, out_dir / LOG, out_dir / CURVE
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out_dir '{out_dir}' is a file: pass a directory for the run")
    same_run = resume is not None and Path(resume).resolve() in (ckpt_path.resolve(),
                                                                 out_dir.resolve())
    if ckpt_path.exists() and not overwrite and not same_run:
        raise ValueError(f"out_dir '{out_dir}' already holds a run ({CHECKPOINT}): resume it "
                         "(--resume), choose another directory (--out), or replace it "
                         "(--overwrite)")

    # ---- data
    text = load_text(tc.text)
    ckpt = load_checkpoint(resume) if resume is not None else None
    try:
        tokenizer, train_ids, val_ids = prepare_data(
            text, tc.seq_len, CharTokenizer(ckpt.vocab) if ckpt else None)
    except ValueError as e:
        source = "the shipped text" if tc.text is None else f"text file '{tc.text}'"
        fit = f" does not fit checkpoint '{resume}'" if ckpt else ""
        raise ValueError(f"{source}{fit}: {e}") from None

    # ---- model and optimizer state
    cfg = tc.model_config(tokenizer.vocab_size)
    if ckpt is None:
        params = init_params(cfg, tc.seed, np.float32)
        m, v = zeros_like_params(params), zeros_like_params(params)  # AdamW moments
        start = 0
        rng = np.random.default_rng(tc.seed + 1)  # training batches: a stream apart from init
    else:
        if ckpt.config != cfg:
            raise ValueError(f"checkpoint '{resume}' is from another model config "
                             f"({config_mismatch(ckpt.config, cfg)}): resume with the settings "
                             "it was trained with, or start a new run")
        params, m, v, start, rng = ckpt.params, ckpt.m, ckpt.v, ckpt.step, ckpt.rng()
        if start >= tc.steps:
            raise ValueError(f"checkpoint '{resume}' is already at step {start}, and steps is "
                             f"{tc.steps}: ask for more steps to train further")
    # fixed evaluation windows, the same for every run: E = eval_batches * batch_size
    eval_rng = np.random.default_rng(EVAL_SEED)
    E = tc.eval_batches * tc.batch_size
    val_x, val_y = get_batch(val_ids, E, tc.seq_len, eval_rng)  # (E, S) each
    train_x, train_y = get_batch(train_ids, E, tc.seq_len, eval_rng)  # (E, S) each

    # ---- the loop
    out_dir.mkdir(parents=True, exist_ok=True)
    _prepare_log(log_path, start)
    log = open(log_path, "a", encoding="utf-8")  # closed in the finally clause below

    def record(**r: object) -> None:
        log.write(json.dumps(r) + "\n")

    record(event="start", step=start, config=asdict(tc), vocab_size=cfg.vocab_size,
           resumed_from=None if resume is None else str(resume))
    bar = tqdm(total=tc.steps, initial=start, unit="step", disable=None if progress is None
               else not progress, dynamic_ncols=True, leave=verbose)
    tokens = tc.batch_size * tc.seq_len  # per step
    step_ms: list[float] = []
    val_loss = train_loss = math.nan
    last_ckpt = f"{resume} (step {start})" if ckpt is not None else None
    finished = False
    try:
        for step in range(start, tc.steps + 1):
            # learning rate of this update
            lr = lr_at(step, tc.lr, tc.min_lr, tc.warmup_steps, tc.decay_steps)

            # evaluate on the fixed validation batches, then checkpoint
            if step % tc.eval_every == 0 or step == tc.steps:
                val_loss = evaluate(params, cfg, val_x, val_y)
                if not math.isfinite(val_loss):
                    raise TrainingDiverged(f"the validation loss became {val_loss} at step "
                                           f"{step}", step)
                extra = {}
                if step == tc.steps:  # the training-set figure, once, for comparison
                    train_loss = evaluate(params, cfg, train_x, train_y)
                    extra["train_loss"] = train_loss
                record(event="eval", step=step, val_loss=val_loss, **extra)
                log.flush()
                echo(f"step {step:5d}: val loss {val_loss:.4f}"
                     + (f", train loss {train_loss:.4f}" if extra else ""))
                if step > start:  # params after `step` updates; rng ready for batch `step`
                    save_checkpoint(ckpt_path, params, m, v, step, rng, cfg, tokenizer.vocab,
                                    asdict(tc))
                    last_ckpt = f"{ckpt_path} (step {step})"
            if step == tc.steps:
                break

            t0 = time.perf_counter()
            # forward and backward on one random batch
            x, y = get_batch(train_ids, tc.batch_size, tc.seq_len, rng)  # (B, S) each
            loss, grads = loss_and_grads(params, cfg, x, y)
            # clip, then one AdamW update (t is 1-based)
            grads, norm = clip_by_global_norm(grads, tc.grad_clip)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                bad = f"loss became {loss}" if not math.isfinite(loss) else \
                    f"gradient norm became {norm}"
                raise TrainingDiverged(f"the {bad} at step {step}", step)
            adamw_step_(params, grads, m, v, step + 1, lr, tc.beta1, tc.beta2, tc.eps,
                        tc.weight_decay)
            dt = time.perf_counter() - t0

            # log
            step_ms.append(1000 * dt)
            record(event="train", step=step, loss=round(loss, 6), lr=float(f"{lr:.6g}"),
                   grad_norm=round(norm, 4), ms=round(1000 * dt, 2))
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens / dt:.0f}",
                            refresh=False)
            if bar.disable and verbose and (step + 1) % 100 == 0:
                echo(f"step {step + 1:5d}: loss {loss:.4f}, lr {lr:.2e}, {1000 * dt:.1f} ms/step")
        finished = True
    except TrainingDiverged as e:
        kept = (f"the last good checkpoint is {last_ckpt}" if last_ckpt else
                "no checkpoint was written yet")
        raise TrainingDiverged(f"{e}: training stopped; {kept}", e.step) from None
    finally:
        bar.close()
        log.close()
        try:  # the curve so far, also after an interruption
            plot_log(log_path, png_path)
        except Exception:
            if finished:
                raise
    if verbose:
        echo(f"wrote {ckpt_path}, {log_path}, {png_path}")
    return TrainResult(params=params, config=cfg, train_config=tc, tokenizer=tokenizer,
                       step=tc.steps, val_loss=val_loss, train_loss=train_loss,
                       ms_per_step=float(np.median(step_ms)) if step_ms else math.nan,
                       seconds=time.perf_counter() - t_start, out_dir=out_dir)


__all__ = ["BOOK", "PRESETS", "SMALL", "TrainConfig", "TrainResult", "TrainingDiverged",
           "evaluate", "plot_log", "read_log", "train"]
