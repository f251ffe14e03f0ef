"""Sampling: the trained model writes, one character at a time, with a key-value cache.

Each new token comes from softmax(logits / temperature) at the last position, optionally
restricted to the top-k most likely tokens. The KV cache keeps every layer's rotated keys and
values, so each new token costs one position's forward pass instead of the whole context's
(see the chapter "Memory: attention without the S×S matrix").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..rmsnorm import rmsnorm_forward
from ..rope import rope_forward, rope_tables
from ..swiglu import silu
from .checks import check_params, check_tokens
from .config import Config
from .tokenizer import CharTokenizer
from .transformer import forward

# Shape legend: T new positions fed at once (the prompt, then 1), P = pos + T positions seen,
# d width, H heads, hd head width, f SwiGLU hidden, V vocab, L layers, C = seq_len.


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


class KVCache(NamedTuple):
    """Every layer's keys (after RoPE) and values for the positions seen so far.

    A new query attends to all of them, so they are all the attention of later tokens needs;
    nothing else of a past position is ever read again.
    """

    k: np.ndarray  # (L, H, C, hd) rotated keys, positions [0, pos) filled
    v: np.ndarray  # (L, H, C, hd) values


def kv_cache_bytes(cfg: Config, itemsize: int, batch: int = 1) -> int:
    """Bytes of a full KV cache: keys and values of every layer, head and position."""
    return 2 * cfg.n_layer * batch * cfg.n_head * cfg.seq_len * cfg.head_dim * itemsize


def _prepare(params: dict[str, np.ndarray], cfg: Config) -> dict:
    """The weights as the one-position forward uses them, concatenated once, not per token."""
    dtype = params["wte"].dtype
    cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)  # (C, hd/2) each
    return {
        "wqkv": np.concatenate((params["wq"], params["wk"], params["wv"]), axis=2),  # (L, d, 3d)
        "w13": np.concatenate((params["w1"], params["w3"]), axis=2),  # (L, d, 2f)
        "w_out": params["wte"] if cfg.tie_embeddings else params["lm_head"],  # (V, d)
        "cos": cos.astype(dtype), "sin": sin.astype(dtype),
    }


def _feed(
    params: dict[str, np.ndarray], cfg: Config, w: dict, kv: KVCache, ids: np.ndarray, pos: int
) -> np.ndarray:
    """Run T new tokens `ids` (T,) at positions pos .. pos+T-1; store their k, v; logits (V,).

    The model's forward pass restricted to the new positions: each layer's new queries attend
    to the cached keys of positions [0, pos) and to the new ones up to themselves.
    """
    T, H, hd, f = len(ids), cfg.n_head, cfg.head_dim, cfg.ffn_hidden
    P = pos + T
    cos, sin = w["cos"][pos:P], w["sin"][pos:P]  # (T, hd/2) the new positions' angles
    scale = params["wte"].dtype.type(1.0 / np.sqrt(hd))
    mask = np.triu(np.full((T, P), -np.inf, dtype=params["wte"].dtype), k=pos + 1)  # (T, P)
    h = params["wte"][ids]  # (T, d) residual stream of the new positions
    for l in range(cfg.n_layer):
        xb, _ = rmsnorm_forward(h, params["rms_attn"][l], cfg.norm_eps)  # (T, d)
        qkv = (xb @ w["wqkv"][l]).reshape(T, 3 * H, hd).transpose(1, 0, 2)  # (3H, T, hd)
        q, _ = rope_forward(qkv[:H], cos, sin)  # (H, T, hd)
        kv.k[l, :, pos:P], _ = rope_forward(qkv[H : 2 * H], cos, sin)  # (H, T, hd) cached
        kv.v[l, :, pos:P] = qkv[2 * H :]
        k, v = kv.k[l, :, :P], kv.v[l, :, :P]  # (H, P, hd) every position so far
        att = (q * scale) @ k.transpose(0, 2, 1) + mask  # (H, T, P)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)  # (H, T, P) rows sum to 1
        a = (att @ v).transpose(1, 0, 2).reshape(T, -1)  # (T, d) heads merged
        h = h + a @ params["wo"][l]
        x2b, _ = rmsnorm_forward(h, params["rms_ffn"][l], cfg.norm_eps)  # (T, d)
        h13 = x2b @ w["w13"][l]  # (T, 2f) [gate | up]
        h = h + (silu(h13[:, :f]) * h13[:, f:]) @ params["w2"][l]
    xf, _ = rmsnorm_forward(h[-1], params["rms_final"], cfg.norm_eps)  # (d,) last position
    return xf @ w["w_out"].T  # (V,)


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
) -> np.ndarray:
    """The prompt ids followed by `max_new_tokens` sampled ids, shape (len(prompt) + new,).

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
            p = next_token_probs(logits[0, -1], temperature, top_k)  # (V,)
            ids.append(int(rng.choice(cfg.vocab_size, p=p)))
        return np.array(ids, dtype=np.int64)
    check_params(params, cfg)  # what forward checks, since the cached path does not call it
    check_tokens("prompt_ids", np.array(ids[-cfg.seq_len:], dtype=np.int64)[None, :], cfg)
    w = _prepare(params, cfg)
    shape = (cfg.n_layer, cfg.n_head, cfg.seq_len, cfg.head_dim)  # (L, H, C, hd)
    kv = KVCache(np.empty(shape, params["wte"].dtype), np.empty(shape, params["wte"].dtype))
    pos = 0  # positions [0, pos) of the cache hold the context's keys and values
    new = np.array(ids[-cfg.seq_len:], dtype=np.int64)  # (T,) the first feed: the prompt
    for _ in range(max_new_tokens):
        logits = _feed(params, cfg, w, kv, new, pos)  # (V,)
        pos += len(new)
        p = next_token_probs(logits, temperature, top_k)  # (V,)
        ids.append(int(rng.choice(cfg.vocab_size, p=p)))
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
    ids = generate(params, cfg, prompt_ids, max_new_tokens, rng, temperature, top_k, kv_cache)
    return tokenizer.decode(ids)
