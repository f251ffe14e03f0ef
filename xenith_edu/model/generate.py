"""Sampling: the trained model writes, one token at a time, with a key-value cache.
The cached decoding is the model's own forward pass, block by block, on the new positions only.

Each new token comes from softmax(logits / temperature) at the last position, optionally
restricted to the top-k most likely tokens. The KV cache keeps every layer's rotated keys and
values, so each new token costs one position's forward pass instead of the whole context's
(see the chapter "Memory: attention without the S×S matrix"). With grouped-query attention
the cache holds the n_kv_head key/value heads only, smaller by the group factor; a layer with
a sliding window keeps its last `window` positions only, in a ring (`PastKV`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import DTypeLike

from ..swiglu import stacked_gate_up
from .checks import check_params, check_tokens
from .config import Config, window_of
from .ends import embed, head_forward
from .positions import layer_tables, qk_rope_tables
from .tokenizer import CharTokenizer
from .transformer import PastKV, forward, layer_forward, layer_params

# Shape legend: T new positions fed at once (the prompt, then 1), P = pos + T positions seen,
# d width, Hkv key/value heads, hd head width, V vocab, L layers, C = seq_len.


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


def draw_token(logits: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
               top_k: int | None = None) -> int:
    """One token drawn from `next_token_probs(logits, temperature, top_k)`, logits (V,).

    Greedy (top_k = 1) with one largest logit, that token is the only one of probability 1:
    it is returned without the float64 softmax and the draw (rng is left as it is)."""
    if top_k == 1:
        best = int(np.argmax(logits))
        if np.count_nonzero(logits == logits[best]) == 1:
            return best
    return int(rng.choice(logits.shape[-1], p=next_token_probs(logits, temperature, top_k)))


class KVCache(NamedTuple):
    """Every layer's keys (after RoPE) and values for the positions its later queries read.

    A new query attends to all of them (a windowed layer's: to its window), so they are all the
    attention of later tokens needs; nothing else of a past position is ever read again. One
    sequence (B = 1); the key/value heads only (Hkv = n_kv_head), which the query heads of a
    group share. Indexed by layer: layer l's arrays are k[l] and v[l].
    """

    k: tuple[np.ndarray, ...]  # L arrays (1, Hkv, C_l, hd) rotated keys (`cache_positions`)
    v: tuple[np.ndarray, ...]  # L arrays (1, Hkv, C_l, hd) values


def cache_positions(cfg: Config, layer: int) -> int:
    """How many positions layer `layer`'s cache holds: seq_len, or its window if smaller (a
    ring of the last `window` positions: no query of the layer reads further back)."""
    window = window_of(cfg, layer)
    return cfg.seq_len if window is None else min(window, cfg.seq_len)


def kv_cache_bytes(cfg: Config, itemsize: int, batch: int = 1) -> int:
    """Bytes of a full KV cache: keys and values of every layer, key/value head and position
    it keeps."""
    positions = sum(cache_positions(cfg, l) for l in range(cfg.n_layer))
    return 2 * batch * cfg.kv_heads * positions * cfg.head_dim * itemsize


def empty_kv_cache(cfg: Config, dtype: DTypeLike) -> KVCache:
    """A KV cache for one sequence of up to seq_len positions, nothing filled yet."""
    shapes = [(1, cfg.kv_heads, cache_positions(cfg, l), cfg.head_dim)  # (1, Hkv, C_l, hd)
              for l in range(cfg.n_layer)]
    return KVCache(tuple(np.empty(s, dtype) for s in shapes),
                   tuple(np.empty(s, dtype) for s in shapes))


class Prepared(NamedTuple):
    """What every feed reads and nothing changes: made once per `generate`, not per token."""

    cos: np.ndarray  # (C, (d + dkv)/2) the RoPE tables of every position (`qk_rope_tables`)
    sin: np.ndarray  # (C, (d + dkv)/2)
    layers: list[dict[str, np.ndarray]]  # each layer's parameters, `layer_params` views, and
    # "wqkv" and "w13", its fused q, k, v and SwiGLU gate and up weights


def _prepare(params: dict[str, np.ndarray], cfg: Config) -> Prepared:
    cos, sin = qk_rope_tables(cfg, cfg.seq_len, params["wte"].dtype)  # (C, (d + dkv)/2)
    layers = [layer_params(params, l) for l in range(cfg.n_layer)]
    for p in layers:  # the fused weights, once rather than at every token: q, k, v's
        p["wqkv"] = np.concatenate((p["wq"], p["wk"], p["wv"]), axis=1)  # (d, dq + 2dkv)
        p["w13"] = stacked_gate_up(p["w1"], p["w3"])  # (2, d, f) SwiGLU's [w1 / 2, w3]
    return Prepared(cos, sin, layers)


def _feed(
    params: dict[str, np.ndarray], cfg: Config, w: Prepared, kv: KVCache, ids: np.ndarray,
    pos: int,
) -> np.ndarray:
    """Run T new tokens `ids` (T,) at positions pos .. pos+T-1; store their k, v; logits (V,).

    The model's forward pass, its own block functions, restricted to the new positions: each
    layer's new queries attend to the cached keys of positions [0, pos) and to the new ones up
    to themselves (`PastKV`). Only the last position goes through the head.
    """
    T = len(ids)
    cos, sin = w.cos[pos : pos + T], w.sin[pos : pos + T]  # (T, (d + dkv)/2) new positions
    h, _ = embed(params, cfg, np.asarray(ids)[None, :])  # (1, T, d)
    h = h.reshape(T, cfg.n_embd)  # (T, d) the residual stream of the new positions
    for l, p in enumerate(w.layers):
        cl, sl = layer_tables(cfg, l, cos, sin)  # the angle 0 in a layer without RoPE
        h, _ = layer_forward(h, p, cfg, cl, sl, PastKV(kv.k[l], kv.v[l], pos), l)  # (T, d)
    logits, _ = head_forward(h[-1:], params, cfg)  # (1, V) the last position only
    return logits[0]  # (V,)


def _check_sampling(rng: object, temperature: float, top_k: int | None,
                    max_new_tokens: int, prompt_ids: np.ndarray) -> list[int]:
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
    return ids


def generate(
    params: dict[str, np.ndarray],
    cfg: Config,
    prompt_ids: np.ndarray,
    max_new_tokens: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
    top_k: int | None = None,
    kv_cache: bool = True,
    on_token: Callable[[int], None] | None = None,
) -> np.ndarray:
    """The prompt ids followed by `max_new_tokens` sampled ids, shape (len(prompt) + new,).
    `on_token(id)`, if given, is called with each id as soon as it is drawn (streaming).

    The context is cropped to the last seq_len tokens. With `kv_cache` (the default) the prompt
    is fed once and then one token at a time; once the context is longer than seq_len, every
    position shifts at each step, so the cache is rebuilt from the cropped context, which costs
    what recomputing costs. `kv_cache=False` recomputes the whole context for every token.
    Both draw the same tokens from the same rng, up to rounding of the logits.
    """
    ids = _check_sampling(rng, temperature, top_k, max_new_tokens, prompt_ids)
    if not kv_cache:
        for _ in range(max_new_tokens):
            context = np.array(ids[-cfg.seq_len:], dtype=np.int64)[None, :]  # (1, S) cropped
            logits, _ = forward(params, cfg, context)  # (1, S, V)
            ids.append(draw_token(logits[0, -1], rng, temperature, top_k))
            if on_token is not None:
                on_token(ids[-1])
        return np.array(ids, dtype=np.int64)
    check_params(params, cfg)  # what forward checks, since the cached path does not call it
    check_tokens("prompt_ids", np.array(ids[-cfg.seq_len:], dtype=np.int64)[None, :], cfg)
    w, kv = _prepare(params, cfg), empty_kv_cache(cfg, params["wte"].dtype)
    pos = 0  # positions [0, pos) of the cache hold the context's keys and values
    new = np.array(ids[-cfg.seq_len:], dtype=np.int64)  # (T,) the first feed: the prompt
    for _ in range(max_new_tokens):
        logits = _feed(params, cfg, w, kv, new, pos)  # (V,)
        pos += len(new)
        ids.append(draw_token(logits, rng, temperature, top_k))
        if on_token is not None:
            on_token(ids[-1])
        if pos < cfg.seq_len:
            new = np.array(ids[-1:], dtype=np.int64)  # (1,) only the token just drawn
        else:  # the window slides: every position moves, rebuild from the cropped context
            pos, new = 0, np.array(ids[-cfg.seq_len:], dtype=np.int64)
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
    kv_cache: bool = True,
    on_text: Callable[[str], None] | None = None,
) -> str:
    """The prompt and its continuation, as text. Characters outside the vocabulary raise.

    `on_text(piece)`, if given, receives the text as it comes: the prompt, then each new
    token's text once it decodes whole (a byte-level token may end in half a character, which
    waits for the next); the pieces joined are the returned text."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if prompt == "":
        raise ValueError("prompt is empty: give at least one character, e.g. a newline")
    try:
        prompt_ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise ValueError(f"prompt: {e}") from e
    rng = np.random.default_rng(seed)
    stream = None if on_text is None else _Stream(tokenizer, list(prompt_ids), on_text)
    ids = generate(params, cfg, prompt_ids, max_new_tokens, rng, temperature, top_k, kv_cache,
                   None if stream is None else stream.add)
    text = tokenizer.decode(ids)
    if stream is not None:
        stream.finish(text)
    return text


class _Stream:
    """Sends the decoded text of the ids so far, piece by piece, never a half character."""

    def __init__(self, tokenizer: CharTokenizer, ids: list[int],
                 send: Callable[[str], None]) -> None:
        self.tokenizer, self.ids, self.send = tokenizer, ids, send
        self.sent = tokenizer.decode(ids)
        send(self.sent)

    def add(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.sent) and not text.endswith("\ufffd"):
            self.send(text[len(self.sent):])
            self.sent = text

    def finish(self, text: str) -> None:
        """The rest: a half character the last token left, shown as the decoder shows it."""
        if text.startswith(self.sent) and len(text) > len(self.sent):
            self.send(text[len(self.sent):])
