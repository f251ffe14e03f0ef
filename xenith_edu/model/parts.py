"""A frozen layer's blocks as sums of parts, a part per BLAS thread: the attention block over
groups of key/value heads, the feed-forward block over slices of its hidden width.

Why it is exact: with the weights frozen (LoRA), each block's output is a sum over parts that
share nothing but the block's input.
- Attention: a group of key/value heads and the query heads that read them is an attention
  block of its own. Its q, k, v are its columns of xb @ [wq | wk | wv] (an adapter's B gives its
  rows for those columns, its A is shared), RoPE and QK-norm work head by head, attention reads
  only the group's heads, and merge_heads(a) @ wo is the sum over groups of a_g @ wo's rows for
  the group (the adapter of wo: its A's columns for the group, B shared; the groups' u = a_g @
  A_g.T sum to a @ A.T).
- Feed-forward: the hidden units are independent until w2 sums them: (silu(x @ w1) * (x @ w3))
  @ w2 is the sum over slices c of (silu(x @ w1[:, c]) * (x @ w3[:, c])) @ w2[c] (GeGLU alike).
In reverse, each part's dxb is a part of dxb, and RMSNorm's backward is linear in it: dh is the
sum of the parts' dh. A gradient is the parts' pieces side by side where each part made its own
rows or columns (`SIDE_BY_SIDE`), else their sum. Gemma 3's norm on a block's output is not a
sum: it runs once, on the sum.

Why threads: each part's products and element-wise passes run on a core of their own, with one
BLAS thread, so no part of the step runs on one core while the other waits, and OpenBLAS's own
threads never run: they spin while they wait for the next product, on the core that the other
part needs. Why these splits and not the rows: each part reads only its share of the weights,
and its products keep every row (at Llama-3.2-1B's shape, (256, 2048) by (2048, 4096) ran at 127
GFLOP/s on one thread, (128, 2048) by (2048, 8192) at 98). benchmarks/README.md has the figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache, partial
from typing import Any, NamedTuple

import numpy as np

from ..rmsnorm import RMSNormCache, rmsnorm_backward, rmsnorm_forward
from .adapters import LayerLora
from .config import Config, norm_offset
from .cores import blas_threads, on_threads

# Shape legend: N positions, d width, H query heads and Hkv key/value heads of width hd, G = H
# // Hkv query heads per key/value head, f the feed-forward's hidden width. A head group holds
# key/value heads [lo, hi), so query heads [lo*G, hi*G): its q columns are [lo*G*hd, hi*G*hd)
# of dq, its k and v columns [lo*hd, hi*hd) of dkv. A hidden slice holds units [lo, hi) of f.

MIN_WORK = 2 ** 22  # multiply-adds of a part's products at least: below, a thread costs more
# than it gains (the book's model at its batch of 12 has 9 * 2**22 in its q, k, v product)

# the gradients that a part makes a piece of, by the axis its piece lies along: the output rows
# of B for q, k, v, the input columns of A for o (and the biases', when trained). Every other
# gradient of a part (QK-norm's and the input norm's gains) is a sum over the part, added.
SIDE_BY_SIDE = {"lora_B.q": 0, "lora_B.k": 0, "lora_B.v": 0, "lora_A.o": 1,
                "bq": 0, "bk": 0, "bv": 0}


class Parts(NamedTuple):
    """What the backward of a block run as a sum of parts needs."""

    bounds: tuple[tuple[int, int], ...]  # each part's [lo, hi): key/value heads or hidden units
    caches: tuple[Any, ...]  # each part's cache, as the block made it
    post: RMSNormCache | None  # out = rmsnorm(sum of the parts' outputs) (Config.post_norms)


def _split(n: int, work: int) -> tuple[tuple[int, int], ...] | None:
    """n units in as many near-equal parts as the BLAS has threads now (at most n); None when
    that is one, or when `work` (the block's multiply-adds) gives a part less than MIN_WORK."""
    k = min(blas_threads(), n)
    if k < 2 or work < k * MIN_WORK:
        return None
    edges = [n * i // k for i in range(k + 1)]
    return tuple(zip(edges[:-1], edges[1:], strict=True))


def head_groups(cfg: Config, n: int) -> tuple[tuple[int, int], ...] | None:
    """The groups of key/value heads for n positions, or None: the block runs as it is."""
    return _split(cfg.kv_heads, n * cfg.n_embd * (cfg.q_dim + 2 * cfg.kv_dim))


def hidden_slices(cfg: Config, n: int) -> tuple[tuple[int, int], ...] | None:
    """The slices of the feed-forward's hidden width for n positions, or None."""
    return _split(cfg.hidden, n * cfg.n_embd * cfg.hidden * 3)


@lru_cache(maxsize=64)
def part_config(cfg: Config, kv_heads: int | None = None) -> Config:
    """A part's Config: no norm after the block (it runs on the sum); for a group of
    `kv_heads` key/value heads, G query heads each of the same width."""
    if kv_heads is None:
        return replace(cfg, post_norms=False)
    g = cfg.n_head // cfg.kv_heads
    return replace(cfg, n_head=g * kv_heads, n_kv_head=kv_heads, head_width=cfg.head_dim,
                   post_norms=False)


def group_params(p: dict, lora: LayerLora, cfg: Config, lo: int, hi: int
                 ) -> tuple[dict, LayerLora]:
    """The layer's parameters and adapters as head group [lo, hi)'s block takes them: views of
    its columns of wq, wk, wv (and biases), of its rows of wo, of its rows of B (q, k, v) and of
    its columns of A (o); the norms' gains and the other factors whole."""
    hd, g = cfg.head_dim, cfg.n_head // cfg.kv_heads
    cols = {"q": slice(lo * g * hd, hi * g * hd), "k": slice(lo * hd, hi * hd),
            "v": slice(lo * hd, hi * hd)}
    sub = dict(p)
    for t in "qkv":
        sub[f"w{t}"] = p[f"w{t}"][:, cols[t]]  # (d, group's columns)
        if f"b{t}" in p:
            sub[f"b{t}"] = p[f"b{t}"][cols[t]]
    sub["wo"] = p["wo"][cols["q"]]  # (group's dq, d)
    sub.pop("wqkv", None)  # a fused weight of every head (decoding's): not the group's
    A, B = dict(lora.A), dict(lora.B)
    for t in B:
        if t == "o":
            A[t] = lora.A[t][:, cols["q"]]  # (r, group's dq)
        else:
            B[t] = lora.B[t][cols[t]]  # (group's columns, r)
    return sub, LayerLora(lora.scale, A, B)


def hidden_params(p: dict, lo: int, hi: int) -> dict:
    """The layer's parameters as hidden slice [lo, hi)'s feed-forward block takes them: views of
    its columns of w1 and w3 and of its rows of w2."""
    return {**p, "w1": p["w1"][:, lo:hi], "w3": p["w3"][:, lo:hi], "w2": p["w2"][lo:hi]}


def _sum_parts(parts: list[tuple[np.ndarray, Any]], bounds: tuple[tuple[int, int], ...],
               post_gain: np.ndarray | None, cfg: Config) -> tuple[np.ndarray, Parts]:
    out = parts[0][0]  # (N, d), the first part's: ours to add into
    for o, _ in parts[1:]:
        out += o
    post = None
    if post_gain is not None:  # Gemma 3: the block's output normalized, after the sum
        out, post = rmsnorm_forward(out, post_gain, cfg.norm_eps, norm_offset(cfg))  # (N, d)
    return out, Parts(bounds, tuple(c for _, c in parts), post)


def attention_parts(block: Callable[..., tuple[np.ndarray, Any]], h: np.ndarray, p: dict,
                    cfg: Config, cos: np.ndarray, sin: np.ndarray, layer: int | None,
                    lora: LayerLora, groups: tuple[tuple[int, int], ...]
                    ) -> tuple[np.ndarray, Parts]:
    """`block(h, p, cfg, cos, sin, None, layer, lora) -> (out, cache)`, the attention block,
    run once per group of key/value heads on threads; out (N, d) is the sum of theirs.
    cos, sin (S, (dq + dkv)/2): every head's tables are the same, so a group takes the first
    (its own width) of them."""
    calls = []
    for lo, hi in groups:
        cfg_g = part_config(cfg, hi - lo)
        p_g, lora_g = group_params(p, lora, cfg, lo, hi)
        w = (cfg_g.q_dim + cfg_g.kv_dim) // 2
        calls.append(partial(block, h, p_g, cfg_g, cos[:, :w], sin[:, :w], None, layer, lora_g))
    return _sum_parts(on_threads(calls), groups, p.get("rms_attn_post") if cfg.post_norms
                      else None, cfg)


def feed_forward_parts(block: Callable[..., tuple[np.ndarray, Any]], h: np.ndarray, p: dict,
                       cfg: Config, slices: tuple[tuple[int, int], ...]
                       ) -> tuple[np.ndarray, Parts]:
    """`block(h, p, cfg, True) -> (out, cache)`, the frozen feed-forward block, run once per
    slice of its hidden width on threads; out (N, d) is the sum of theirs."""
    cfg_p = part_config(cfg)
    calls = [partial(block, h, hidden_params(p, lo, hi), cfg_p, True) for lo, hi in slices]
    return _sum_parts(on_threads(calls), slices, p.get("rms_ffn_post") if cfg.post_norms
                      else None, cfg)


def backward_parts(block_backward: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]],
                   dout: np.ndarray, cache: Parts, post_name: str
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The block's backward on each part, on threads: dh (N, d) the sum of the parts', the
    gradients side by side where each part made its own piece (`SIDE_BY_SIDE`), else summed;
    the gain of the norm after the block (Config.post_norms) under `post_name`."""
    grads: dict[str, np.ndarray] = {}
    if cache.post is not None:  # the norm on the sum: the last step, first back
        dout, grads[post_name] = rmsnorm_backward(dout, cache.post)  # (N, d), (d,)
    parts = on_threads([partial(block_backward, dout, c) for c in cache.caches])
    dh = parts[0][0]  # (N, d), the first part's: ours to add into
    for d, _ in parts[1:]:
        dh += d
    for name in parts[0][1]:
        each = [g[name] for _, g in parts]
        if name in SIDE_BY_SIDE:
            grads[name] = np.concatenate(each, axis=SIDE_BY_SIDE[name])
        else:
            grads[name] = sum(each[1:], each[0].copy())
    return dh, grads


__all__ = ["MIN_WORK", "SIDE_BY_SIDE", "Parts", "attention_parts", "backward_parts",
           "feed_forward_parts", "group_params", "head_groups", "hidden_params",
           "hidden_slices", "part_config"]
