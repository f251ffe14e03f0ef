"""The run directory of the trainer: its checks, its log, its checkpoints and its loss curve.
Everything `train` does besides training lives here, so that its loop reads on one screen.

A run directory holds three files: the checkpoint `ckpt.npz`, the log `log.jsonl` (one JSON
record per line: a "start" record, then "eval" and "train" records) and the picture `loss.png`.
See the training chapter.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..model import Config
from ..tools.boundedjson import parse_json
from ..tools.util import atomic_write, atomic_write_text, interrupts_held, one_line
from .checkpoint import Checkpoint, config_mismatch, load_checkpoint, save_checkpoint
from .data import get_batch
from .rundir import CHECKPOINT, check_run_dir

# Shape legend: E evaluation windows, S positions (seq_len).

EVAL_SEED = 0  # the validation windows depend on this alone, so any two runs compare
LOG, CURVE = "log.jsonl", "loss.png"  # the files of a run directory, with CHECKPOINT


def check_resume(ckpt: Checkpoint, resume: str | Path, cfg: Config, tc: Any) -> None:
    """The one check of a resume: checkpoint `ckpt` (read from `resume`) can continue the run of
    model `cfg` with the settings `tc`, up to `tc.steps` updates. ValueError if not.

    The model and the seed cannot change (the run would not be the one saved); the steps must
    go beyond the checkpoint's. Any other setting may change.
    """
    if ckpt.config != cfg:
        raise ValueError(f"checkpoint '{resume}' is from another model config "
                         f"({config_mismatch(ckpt.config, cfg)}): resume with the settings "
                         "it was trained with (drop the model options and --preset), or start "
                         "a new run with --out")
    seed = ckpt.train.get("seed", tc.seed)
    if tc.seed != seed:
        raise ValueError(f"seed {tc.seed} differs from the checkpoint's seed {seed}: a resumed "
                         "run keeps its seed; drop --seed")
    if ckpt.step >= tc.steps:
        raise ValueError(f"checkpoint '{resume}' is already at step {ckpt.step}, and steps is "
                         f"{tc.steps}: pass --steps greater than {ckpt.step} to train further")


def load_resume(resume: str | Path | None) -> Checkpoint | None:
    """The checkpoint to resume from, checked on load (None for a new run)."""
    return None if resume is None else load_checkpoint(resume)


def eval_windows(
    train_ids: np.ndarray, val_ids: np.ndarray, n_windows: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed evaluation windows, the same for every run: val_x, val_y, train_x, train_y."""
    rng = np.random.default_rng(EVAL_SEED)
    val_x, val_y = get_batch(val_ids, n_windows, seq_len, rng)  # (E, S) each
    train_x, train_y = get_batch(train_ids, n_windows, seq_len, rng)  # (E, S) each
    return val_x, val_y, train_x, train_y


_NEEDS = {"train": "loss", "eval": "val_loss"}  # the figure each kind of record must carry
MAX_LINE = 2**20  # bytes of one log line: a record is a few hundred


def read_log(path: str | Path, damaged: list[str] | None = None) -> list[dict]:
    """The records of a run's log: one JSON object per line, each with an "event" and an
    integer "step" (a "train" record with its "loss", an "eval" record with its "val_loss").

    A damaged line is skipped: not UTF-8, not JSON, or a record without those fields. If
    `damaged` is a list, a note on each ("line 7: not JSON") is appended to it, except for a
    last line cut short without its newline (a run killed mid-write), which is no damage.
    """
    records = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        record, why = _parse(raw)
        if record is not None:  # (why is then None)
            records.append(record)
        elif damaged is not None and n < len(lines):  # the last piece has no newline
            damaged.append(f"line {n}: {why}")
    return records


def _parse(raw: bytes) -> tuple[dict | None, str | None]:
    """A log line's record, or None and what is wrong with it."""
    try:  # the bounded reader: a line too long or nested too deep is damage, never a crash
        record = parse_json(raw, "it", max_bytes=MAX_LINE)
    except ValueError as e:  # "it is not UTF-8 text", "it is not JSON (...)", "it nests ..."
        why = str(e).removeprefix("it ")
        return None, ("not UTF-8" if why.startswith("is not UTF-8") else "not JSON"
                      if why.startswith("is not JSON") else why)
    if not isinstance(record, dict):
        return None, "not a JSON record"
    step, event = record.get("step"), record.get("event")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None, "no step"
    if not isinstance(event, str):
        return None, "no event"
    need = _NEEDS.get(event)
    figure = record.get(need) if need else 0.0
    if isinstance(figure, bool) or not isinstance(figure, (int, float)):
        return None, f"no {need}"
    return record, None


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


class RunLog:
    """The run directory and the console of one run: log records, progress, checkpoints, curve.

    `write=False` (the other ranks of a data-parallel run) keeps the same calls and writes
    nothing, so that a run's files are the same whatever the number of processes.
    """

    def __init__(self, out_dir: Path, tc: Any, cfg: Config, vocab: str, start: int,
                 resume: str | Path | None, *, progress: bool | None, verbose: bool,
                 write: bool = True, tokenizer_spec: str | None = None) -> None:
        self.out_dir, self.tc, self.cfg, self.vocab, self.write = out_dir, tc, cfg, vocab, write
        self.tokenizer_spec = tokenizer_spec  # a BPE run's tokenizer.json, saved with each ckpt
        self.echo = tqdm.write if verbose and write else (lambda s: None)
        self.verbose = verbose and write
        self.last_ckpt = f"{resume} (step {start})" if resume is not None else None
        self.tokens = tc.batch_size * tc.seq_len  # per step
        self.step_ms: list[float] = []
        self.comm_ms: list[float] = []
        self.file = None
        if write:
            out_dir.mkdir(parents=True, exist_ok=True)
            _keep_log_before(out_dir / LOG, start)
            self.file = open(out_dir / LOG, "a", encoding="utf-8")  # closed by close()
        self.record(event="start", step=start, config=tc.to_dict(), vocab_size=cfg.vocab_size,
                    resumed_from=None if resume is None else str(resume))
        self.bar = tqdm(total=tc.steps, initial=start, unit="step", leave=verbose,
                        disable=(not write) or (None if progress is None else not progress),
                        dynamic_ncols=True)

    def record(self, **r: object) -> None:
        if self.file is not None:
            try:
                self.file.write(json.dumps(r) + "\n")
            except OSError as e:
                raise self.cannot_write(LOG, e) from None

    def eval(self, step: int, val_loss: float, train_loss: float | None = None) -> None:
        """An evaluation record, flushed to disk, and one line on the console."""
        extra = {} if train_loss is None else {"train_loss": train_loss}
        self.record(event="eval", step=step, val_loss=val_loss, **extra)
        if self.file is not None:
            try:
                self.file.flush()
            except OSError as e:
                raise self.cannot_write(LOG, e) from None
        self.echo(f"step {step:5d}: val loss {val_loss:.4f}"
                  + (f", train loss {train_loss:.4f}" if extra else ""))

    def checkpoint(self, step: int, params: dict, m: dict, v: dict,
                   rng: np.random.Generator) -> None:
        """Params after `step` updates, the moments, and `rng` ready to draw batch `step`."""
        path = self.out_dir / CHECKPOINT
        with interrupts_held():  # a Ctrl-C waits until the file and `last_ckpt` agree
            if self.write:
                try:
                    save_checkpoint(path, params, m, v, step, rng, self.cfg, self.vocab,
                                    self.tc.to_dict(), self.tokenizer_spec)
                except OSError as e:  # disk full, a read-only folder: the last one is intact
                    raise self.cannot_write(f"the checkpoint of step {step}", e) from None
            self.last_ckpt = f"{path} (step {step})"

    def cannot_write(self, what: str, e: OSError) -> OSError:
        """The one line of a failed write: the folder, why, the checkpoint kept, what to do."""
        why = e.strerror or one_line(e)
        return OSError(f"cannot write {what} into '{self.out_dir}' ({why}): {self.kept()}; "
                       "free some space (or make the folder writable) and resume")

    def train(self, step: int, loss: float, lr: float, norm: float, seconds: float,
              comm_seconds: float | None = None) -> None:
        """A training record, the progress bar, and a console line every 100 steps without it."""
        ms = 1000 * seconds
        self.step_ms.append(ms)
        extra = {}
        if comm_seconds is not None:  # a data-parallel run: the share spent communicating
            self.comm_ms.append(1000 * comm_seconds)
            extra["comm_ms"] = round(1000 * comm_seconds, 2)
        self.record(event="train", step=step, loss=round(loss, 6), lr=float(f"{lr:.6g}"),
                    grad_norm=round(norm, 4), ms=round(ms, 2), **extra)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                             tok_s=f"{self.tokens / seconds:.0f}", refresh=False)
        if self.bar.disable and self.verbose and (step + 1) % 100 == 0:
            self.echo(f"step {step + 1:5d}: loss {loss:.4f}, lr {lr:.2e}, {ms:.1f} ms/step")

    def kept(self) -> str:
        """Which checkpoint a stopped run leaves, for its error message."""
        if self.last_ckpt is None:
            return "no checkpoint was written yet"
        return f"the last good checkpoint is {self.last_ckpt}"

    def close(self, finished: bool) -> None:
        """Close the log and draw the curve so far (an error drawing it counts only at the end)."""
        self.bar.close()
        if self.file is None:
            return
        try:
            self.file.close()
        except OSError as e:  # the disk filled up: it counts only if nothing else went wrong
            if finished:
                raise self.cannot_write(LOG, e) from None
        try:
            plot_log(self.out_dir / LOG, self.out_dir / CURVE)
        except Exception:
            if finished:
                raise
        if finished and self.verbose:
            d = self.out_dir
            self.echo(f"wrote {d / CHECKPOINT}, {d / LOG}, {d / CURVE}")

    def ms_per_step(self) -> tuple[float, float]:
        """The median wall time of one step, and of its communication, in milliseconds."""
        step, comm = (float(np.median(a)) if a else math.nan for a in (self.step_ms,
                                                                         self.comm_ms))
        return step, comm


def _keep_log_before(path: Path, start: int) -> None:
    """A resumed run keeps the records before its start step; a new run starts an empty log.

    The log never blocks a good checkpoint: damaged lines are dropped with a warning, and the
    original log is kept aside as log.jsonl.damaged (or .damaged.2, ...).
    """
    keep: list[dict] = []
    damaged: list[str] = []
    if start > 0 and (path.exists() or path.is_symlink()):
        try:
            keep = [r for r in read_log(path, damaged) if r["step"] < start]
        except OSError as e:  # a folder, an unreadable file: set aside, a new log begins
            damaged.append(f"unreadable ({e.strerror or one_line(e)})")
    if damaged:
        aside = _free_name(path.with_name(path.name + ".damaged"))
        os.replace(path, aside)
        tqdm.write(f"xenith-edu: warning: log '{path}' is damaged ({len(damaged)} line(s) "
                   f"dropped, {'; '.join(damaged[:3])}); the original is kept as "
                   f"'{aside.name}', the run resumes from its checkpoint", file=sys.stderr)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


def _free_name(path: Path) -> Path:
    """`path`, or `path` with .2, .3, ... if it is taken."""
    n, free = 1, path
    while free.exists() or free.is_symlink():
        n += 1
        free = path.with_name(f"{path.name}.{n}")
    return free


__all__ = ["CHECKPOINT", "CURVE", "EVAL_SEED", "LOG", "RunLog", "check_resume", "check_run_dir",
           "eval_windows", "load_resume", "plot_log", "read_log"]
