"""Sampling: the trained model writes, one character at a time.

Each new token comes from softmax(logits / temperature) at the last position, optionally
restricted to the top-k most likely tokens; the context is cropped to the last seq_len tokens.
"""

from __future__ import annotations

import numpy as np

from .data import CharTokenizer
from .model import Config, forward

# Shape legend: S positions (at most seq_len), V vocab.


def next_token_probs(
    logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None
) -> np.ndarray:
    """Probabilities (V,) in float64 from one position's logits (V,)."""
    z = logits.astype(np.float64) / temperature  # (V,)
    if top_k is not None and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]  # the k-th largest logit
        z = np.where(z < kth, -np.inf, z)  # everything below it gets probability 0
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def generate(
    params: dict[str, np.ndarray],
    cfg: Config,
    prompt_ids: np.ndarray,
    max_new_tokens: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> np.ndarray:
    """The prompt ids followed by `max_new_tokens` sampled ids, shape (len(prompt) + new,)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a np.random.Generator, e.g. np.random.default_rng(seed)")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1 (or None for no limit), got {top_k}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    ids = [int(i) for i in np.asarray(prompt_ids).ravel()]
    if not ids:
        raise ValueError("prompt_ids is empty: give the model at least one token to start from")
    for _ in range(max_new_tokens):
        context = np.array(ids[-cfg.seq_len:], dtype=np.int64)[None, :]  # (1, S) cropped
        logits, _ = forward(params, cfg, context)  # (1, S, V)
        p = next_token_probs(logits[0, -1], temperature, top_k)  # (V,)
        ids.append(int(rng.choice(cfg.vocab_size, p=p)))
    return np.array(ids, dtype=np.int64)


def sample_text(
    params: dict[str, np.ndarray],
    cfg: Config,
    tokenizer: CharTokenizer,
    prompt: str = "\n",
    max_new_tokens: int = 500,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """The prompt and its continuation, as text. Characters outside the vocabulary raise."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if prompt == "":
        raise ValueError("prompt is empty: give at least one character, e.g. a newline")
    try:
        prompt_ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise ValueError(f"prompt: {e}") from e
    rng = np.random.default_rng(seed)
    ids = generate(params, cfg, prompt_ids, max_new_tokens, rng, temperature, top_k)
    return tokenizer.decode(ids)
