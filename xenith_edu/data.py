"""Character-level data: a tokenizer, the text file it reads, and random training windows.

The trainer's first step (the Training the model chapter): text -> ids -> (x, y) batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

# Shape legend: B batch (sequences per step), S positions (seq_len), T tokens in a split.

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "shakespeare.txt"
TRAIN_FRACTION = 0.9  # the first 90% of the tokens train, the last 10% validate


def _show(chars: Iterable[str], limit: int = 10) -> str:
    """Characters as a readable list: 'é', '\\t' (repr shows invisible ones)."""
    chars = list(chars)
    shown = ", ".join(repr(c) for c in chars[:limit])
    return shown + (f" and {len(chars) - limit} more" if len(chars) > limit else "")


class CharTokenizer:
    """One token per character: id i is the i-th character of the sorted vocabulary."""

    def __init__(self, vocab: str) -> None:
        if not isinstance(vocab, str):
            raise TypeError(f"vocab must be a str of distinct characters, "
                            f"got {type(vocab).__name__}")
        if len(vocab) == 0:
            raise ValueError("vocab is empty: build the tokenizer from a non-empty text")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has repeated characters: each character must appear once")
        if list(vocab) != sorted(vocab):
            raise ValueError("vocab must be sorted by code point, as from_text makes it")
        self.vocab = vocab
        # sorted code points: encode looks each character up with one binary search
        self._codes = np.frombuffer(vocab.encode("utf-32-le"), dtype=np.uint32)  # (V,)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is every distinct character of `text`."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, shape (T,)) of `text`; a character outside the vocabulary raises."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (T,)
        ids = np.searchsorted(self._codes, codes)  # (T,) position in the sorted vocabulary
        known = self._codes[np.minimum(ids, len(self._codes) - 1)] == codes
        if not known.all():
            bad = sorted({chr(c) for c in codes[~known]})
            first = int(np.argmin(known))
            raise ValueError(
                f"text has {len(bad)} character(s) outside the vocabulary: {_show(bad)} "
                f"(first at position {first}); use only characters the model was trained on"
            )
        return ids.astype(np.int64)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of token ids (any iterable of ints in [0, vocab_size))."""
        ids = np.asarray(ids)
        V = len(self.vocab)
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"ids must be integers in [0, {len(self.vocab)})")
        return "".join(self.vocab[i] for i in ids.ravel().tolist())

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


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
    text: str, seq_len: int, tokenizer: CharTokenizer | None = None
) -> tuple[CharTokenizer, np.ndarray, np.ndarray]:
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
