"""The training data: the text file, its ids through the run's tokenizer, random windows.

The trainer's first step (the Training the model chapter): text -> ids -> (x, y) batches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..model import CharTokenizer
from ..model.tokenizer import Tokenizer

# Shape legend: B batch (sequences per step), S positions (seq_len), T tokens in a split.

DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "data" / "shakespeare.txt"
TRAIN_FRACTION = 0.9  # the first 90% of the tokens train, the last 10% validate


def load_text(path: str | Path | None = None) -> str:
    """The UTF-8 text of `path` (the shipped Shakespeare if None); a ValueError says why not."""
    path = DEFAULT_TEXT if path is None else Path(path)
    if not path.exists():
        raise ValueError(f"text file '{path}' does not exist: pass the path of a UTF-8 text file")
    if path.is_dir():
        raise ValueError(f"text file '{path}' is a directory: pass the path of a UTF-8 text file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"text file '{path}' cannot be read ({e.strerror}): check its "
                         "permissions") from e
    if len(raw) == 0:
        raise ValueError(f"text file '{path}' is empty: pass a text file with some text in it")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"text file '{path}' is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}): "
            "save it as UTF-8 and try again"
        ) from e


def split_ids(
    ids: np.ndarray, train_fraction: float = TRAIN_FRACTION
) -> tuple[np.ndarray, np.ndarray]:
    """The first `train_fraction` of the tokens for training, the rest for validation."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    n = int(len(ids) * train_fraction)
    return ids[:n], ids[n:]


def prepare_data(
    text: str, seq_len: int, tokenizer: Tokenizer | None = None
) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """Tokenizer (built from `text` if None), training and validation ids, checked for length.

    Each split must hold at least seq_len + 1 tokens: one window and its shifted targets.
    """
    if tokenizer is None:
        tokenizer = CharTokenizer.from_text(text)
    ids = tokenizer.encode(text)  # (T,)
    train, val = split_ids(ids)
    need = seq_len + 1
    short = [(name, len(s)) for name, s in (("training", train), ("validation", val))
             if len(s) < need]
    if short:
        name, n = short[0]
        at_least = int(np.ceil(need / (1.0 - TRAIN_FRACTION))) + 1  # enough for both splits
        raise ValueError(
            f"text is too short: its {name} split has {n} tokens, but seq_len {seq_len} needs "
            f"at least {need} in each split; use a text of at least {at_least} characters "
            "or a shorter seq_len"
        )
    return tokenizer, train, val


def get_batch(
    data: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`batch` random windows of `data`: inputs x and targets y (x shifted by one), each (B, S)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a np.random.Generator, e.g. np.random.default_rng(seed)")
    if len(data) < seq_len + 1:
        raise ValueError(f"data has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = rng.integers(0, len(data) - seq_len, size=batch)  # (B,) window starts
    idx = starts[:, None] + np.arange(seq_len)  # (B, S)
    x = data[idx]  # (B, S)
    y = data[idx + 1]  # (B, S) the next character at every position
    return x, y
