"""Tokenizers: text to ids and back, one character per token or BPE from a tokenizer.json.
A model comes with its vocabulary, so a run carries its tokenizer.

Shape legend: T tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np


def _show(chars: Iterable[str], limit: int = 10) -> str:
    """Characters as a readable list: 'é', '\\t' (repr shows invisible ones)."""
    chars = list(chars)
    shown = ", ".join(repr(c) for c in chars[:limit])
    return shown + (f" and {len(chars) - limit} more" if len(chars) > limit else "")


class CharTokenizer:
    """One token per character: id i is the i-th character of the sorted vocabulary."""

    kind = "char"

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


def _tokenizers():
    """The `tokenizers` library, which only a BPE model needs (the extra `hf`)."""
    try:
        import tokenizers  # imported here: character-level runs never need it
    except ImportError:
        raise ValueError("this model's tokenizer is BPE, which needs the tokenizers library: "
                         "pip install 'xenith-edu[hf]' (or pip install tokenizers)") from None
    return tokenizers


class BPETokenizer:
    """A byte-pair-encoding tokenizer from a Hugging Face `tokenizer.json`, through the
    `tokenizers` library: the interface of `CharTokenizer` (encode, decode, vocab_size)."""

    kind = "bpe"

    def __init__(self, spec: str) -> None:
        if not isinstance(spec, str):
            raise TypeError(f"spec must be the text of a tokenizer.json, got {type(spec).__name__}")
        lib = _tokenizers()
        try:
            self._tok = lib.Tokenizer.from_str(spec)
        except Exception as e:  # the library raises its own exception type for a bad file
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"tokenizer.json cannot be read by tokenizers ({first})") from None
        self.spec = spec
        self.vocab = ""  # no character vocabulary: the checkpoint stores `spec` instead

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer of a `tokenizer.json` file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"tokenizer file '{path}' cannot be read as UTF-8 text "
                             f"({type(e).__name__})") from None
        return cls(text)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, shape (T,)) of `text`, without special tokens added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return np.array(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of token ids (any iterable of ints in [0, vocab_size))."""
        ids = np.asarray(ids)
        V = self.vocab_size
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"ids must be integers in [0, {V})")
        return self._tok.decode(ids.ravel().tolist(), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


Tokenizer = CharTokenizer | BPETokenizer


def tokenizer_of(vocab: str, spec: str | None) -> Tokenizer:
    """A run's tokenizer: BPE from its tokenizer.json text `spec` if it has one, else characters."""
    return CharTokenizer(vocab) if spec is None else BPETokenizer(spec)
