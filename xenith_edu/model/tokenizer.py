"""Tokenizers: text to ids and back, one character per token or BPE from a tokenizer.json.
A model comes with its vocabulary, so a run carries its tokenizer.

Shape legend: T tokens.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..tools.boundedjson import MAX_BYTES, parse_json


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


PROBE = "Hello, world: 1.5"  # encoded and decoded once when a tokenizer is made (plain text)
NO_TOKEN = "\N{REPLACEMENT CHARACTER}"  # what decode writes for an id past the tokenizer's last


@contextmanager
def _native_stderr_held() -> Iterator[None]:
    """While the library runs, what native code writes on file descriptor 2 (a Rust panic's
    message and backtrace, printed before Python sees the error) goes to the null device, so
    that a refusal stays one line. Python's own sys.stderr is not touched."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield  # no descriptor 2 to guard (an embedded interpreter)
        return
    try:
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _library_error(e: BaseException) -> str:
    """The first line of an error of the `tokenizers` library (its own types, or a Rust panic,
    which Python sees as a BaseException)."""
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _checked_spec(spec: str) -> tuple[str, list[str]]:
    """The tokenizer.json text `spec` after its gate, and notes on what was switched off.

    The JSON is read with a byte and nesting cap before the library sees it; truncation and
    padding are switched off (a run encodes whole texts, one id per token: a truncation would
    cut a text silently, a huge fixed padding would abort the process from native code)."""
    value = parse_json(spec.encode("utf-8", "surrogatepass"), "tokenizer.json")
    if not isinstance(value, dict) or not isinstance(value.get("model"), dict):
        raise ValueError("tokenizer.json is not a tokenizer: it needs a \"model\" object")
    notes = []
    for key in ("truncation", "padding"):
        if value.get(key) is not None:
            notes.append(f"tokenizer.json's {key} is switched off (a run encodes whole texts)")
            value[key] = None
    return (json.dumps(value, ensure_ascii=False) if notes else spec), notes


class BPETokenizer:
    """A byte-pair-encoding tokenizer from a Hugging Face `tokenizer.json`, through the
    `tokenizers` library: the interface of `CharTokenizer` (encode, decode, vocab_size).

    The file is checked before the library reads it (`_checked_spec`: sizes, nesting,
    truncation and padding off), then a probe text is encoded and decoded: every error of the
    library, at any of these steps, is one ValueError. `notes` says what was switched off.
    The rule for a model with more embedding rows than tokens: those ids decode as U+FFFD."""

    kind = "bpe"

    def __init__(self, spec: str) -> None:
        if not isinstance(spec, str):
            raise TypeError(f"spec must be the text of a tokenizer.json, got {type(spec).__name__}")
        lib = _tokenizers()
        spec, self.notes = _checked_spec(spec)
        try:
            with _native_stderr_held():
                self._tok = lib.Tokenizer.from_str(spec)
                self._tok.decode(self._tok.encode(PROBE, add_special_tokens=False).ids)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # the library's own type, or a panic (a BaseException)
            raise ValueError(f"tokenizer.json cannot be used by tokenizers "
                             f"({_library_error(e)})") from None
        self.spec = spec
        self.vocab = ""  # no character vocabulary: the checkpoint stores `spec` instead

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer of a `tokenizer.json` file."""
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)  # the JSON reader's cap: never more is read
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"tokenizer file '{path}' cannot be read as UTF-8 text "
                             f"({type(e).__name__})") from None
        try:
            return cls(text)
        except ValueError as e:
            raise ValueError(f"tokenizer file '{path}': {e}") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, shape (T,)) of `text`, without special tokens added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            with _native_stderr_held():
                ids = self._tok.encode(text, add_special_tokens=False).ids
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # e.g. a character without a token and no unknown token
            raise ValueError(f"the tokenizer cannot encode this text ({_library_error(e)})"
                             ) from None
        return np.array(ids, dtype=np.int64)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of token ids (any iterable of ints >= 0); an id the tokenizer has no token
        for (a model's spare embedding rows) decodes as U+FFFD, the text around it as usual."""
        ids = np.asarray(ids).ravel()
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0):
            raise ValueError("ids must be integers >= 0")
        V, parts, start = self.vocab_size, [], 0
        for at in [*np.flatnonzero(ids >= V).tolist(), len(ids)]:
            if at > start:
                parts.append(self._decode(ids[start:at].tolist()))
            if at < len(ids):
                parts.append(NO_TOKEN)
            start = at + 1
        return "".join(parts)

    def _decode(self, ids: list[int]) -> str:
        try:
            with _native_stderr_held():
                return self._tok.decode(ids, skip_special_tokens=False)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            raise ValueError(f"the tokenizer cannot decode these ids ({_library_error(e)})"
                             ) from None

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


Tokenizer = CharTokenizer | BPETokenizer


def tokenizer_of(vocab: str, spec: str | None) -> Tokenizer:
    """A run's tokenizer: BPE from its tokenizer.json text `spec` if it has one, else characters."""
    return CharTokenizer(vocab) if spec is None else BPETokenizer(spec)
