"""The whole model: a tiny LLaMA-style decoder, its forward pass and its backward pass.

The whole backward pass chapter assembles it from the component chapters, as llm.c's
`gpt2_forward` and `gpt2_backward` do: paired block functions, each `*_forward -> (out, cache)`
and `*_backward(dout, cache) -> (din, grads)`; `forward` calls them layer by layer, `backward`
in reverse, and each cache is a NamedTuple that keeps what its backward needs and no more.
Grouped-query attention (`Config.n_kv_head` < `n_head`, as SmolLM and Llama 3) narrows wk and
wv; the attention components share each key/value head among its query heads.

Gemma 3's pieces are switches of the same blocks: GeGLU for SwiGLU (`xenith_edu.geglu`), gains
1 + w (`rmsnorm`'s offset), an RMSNorm on each block's output (`post_norms`; in reverse, the
block's gradient passes through it first), the embedding times s = sqrt(d) (`embed`: dwte
gathers s * dh, the chain rule on a constant factor), the scores scaled by
query_pre_attn_scalar ** -1/2, and local and global layers (`window_of`, `layer_tables`: a
layer's window and RoPE tables are the only things that differ, so nothing else changes).

Where inputs are checked: at the boundaries only. `Config` checks the sizes (with the head
counts and the flash block size); `forward`, `backward` and `loss_and_grads` check the
parameters (keys, shapes, one float32 or float64 dtype) and the tokens (integer ids in [0, V),
shape (B, S) with S <= seq_len, targets shaped like the inputs); the command line and
`load_checkpoint` check what they read. The component functions (softmax_ce, swiglu, rmsnorm,
attention, flash_attention, rope, embedding, linear) and the block functions below trust their
inputs: they do the arithmetic and nothing else.

Speed: the large arrays come from `xenith_edu.tools.workspace`, which reuses them from one call
to the next (no page faults, no process setting); benchmarks/README.md has the measured figures.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np

from ..attention import AttentionCache, causal_attention_backward, causal_attention_forward
from ..bias import BiasCache, bias_backward
from ..embedding import EmbeddingCache, embedding_backward
from ..flash_attention import FlashCache, flash_attention_backward, flash_attention_forward
from ..geglu import GeGLUCache, geglu_backward, geglu_forward
from ..linear import LinearCache, linear_backward, linear_forward
from ..lora import LoraCache, lora_backward, lora_forward
from ..qk_norm import QKNormCache, qk_norm_backward, qk_norm_forward
from ..rmsnorm import RMSNormCache, rmsnorm_backward, rmsnorm_forward
from ..rope import RopeCache, rope_backward, rope_forward
from ..softmax_ce import softmax_cross_entropy
from ..swiglu import GateUpWeights, SwiGLUCache, swiglu_backward, swiglu_forward
from ..tools.workspace import empty, empty_like, give_back, keeping_all, return_freed
from .adapters import (
    Adapters,
    LayerLora,
    adapt_qkv,
    adapter_shapes,
    check_adapters,
    layer_lora,
    lora_qkv_grads,
)
from .blas import one_blas_thread
from .checks import check_params, check_targets, check_tokens
from .config import Config, norm_offset, window_of
from .ends import HeadCache, embed, embed_scale, head_backward, head_forward
from .params import PARAM, layer_names, param_shapes
from .parts import (
    Parts,
    attention_parts,
    backward_parts,
    feed_forward_parts,
    head_groups,
    hidden_slices,
)
from .positions import layer_tables, qk_rope_tables
from .qkv import FrozenQKV, frozen_qkv_dx, qkv_forward

__all__ = [
    "AttentionBlockCache", "FrozenQKV", "LayerCache", "ModelCache", "PastKV",
    "SwiGLUBlockCache", "attention_block_backward", "attention_block_forward", "backward",
    "forward", "layer_backward", "layer_forward", "layer_params", "layer_window",
    "loss_and_grads", "merge_heads", "split_heads",
    "swiglu_block_backward", "swiglu_block_forward",
]

# Shape legend: B batch, S positions, N = B*S, d width, H heads, hd head width (d // H unless
# Config.head_dim is given), dq = H * hd (d unless head_dim is given), Hkv key/value heads
# (grouped-query attention; Hkv = H without it), dkv = Hkv * hd, f SwiGLU hidden, V vocab,
# L layers. The residual stream h is kept flat as (N, d).


def split_heads(u: np.ndarray, B: int, S: int, H: int) -> np.ndarray:
    """(N, H*hd) -> (B, H, S, hd): the columns of head j are j*hd:(j+1)*hd. A view."""
    return u.reshape(B, S, H, -1).transpose(0, 2, 1, 3)


def merge_heads(u: np.ndarray) -> np.ndarray:
    """(B, H, S, hd) -> (N, H*hd), the inverse of `split_heads` (a copy)."""
    B, H, S, hd = u.shape
    out = empty((B, S, H, hd), u.dtype)
    np.copyto(out, u.transpose(0, 2, 1, 3))
    return out.reshape(B * S, H * hd)


def layer_params(params: dict, l: int) -> dict[str, np.ndarray]:
    """Layer l's slice of each (L, ...) stack: {"rms_attn": (d,), "wq": (d, dq), ...}, views."""
    return {name: p[l] for name, p in params.items() if PARAM[name].per_layer}


# -- the attention block: h + attention_block(h) --------------------------------------------

class AttentionBlockCache(NamedTuple):
    """What `attention_block_backward` needs, step by step in reverse."""

    norm: RMSNormCache  # xb = rmsnorm(h, rms_attn): xhat, rstd and the gain
    qkv: LinearCache | FrozenQKV  # qkv = xb @ [wq | wk | wv]: both factors of the one fused
    # product, or with adapters (frozen) the three weights as they are
    bias: BiasCache | None  # qkv += [bq | bk | bv] (Config.qkv_bias): the width, to sum over
    qk_norm: QKNormPair | None  # q, k = rmsnorm of each head of q and of k (Config.qk_norm)
    rope: RopeCache  # q, k = rope(q), rope(k): the tables (S, (dq + dkv)/2) that `forward`
    # made for every layer (`qk_rope_tables`), to rotate dq and dk back
    attention: AttentionCache | FlashCache  # a = attention(q, k, v): rotated q, k, v and the
    # weights (B, H, S, S), or with flash attention the output and its log-sum-exp (B, H, S)
    out: LinearCache  # out = merge_heads(a) @ wo: both factors
    post: RMSNormCache | None = None  # out = rmsnorm(out, rms_attn_post) (Config.post_norms)
    lora: dict[str, LoraCache] | None = None  # each adapter's cache by target (q, k, v, o);
    # None without adapters. With them the base is frozen: no weight gradient is made


class QKNormPair(NamedTuple):
    """QK-norm's caches: one for the heads of q, one for those of k (their gains differ)."""

    q: QKNormCache  # per head of q: xhat, rstd, the gain q_norm (hd,)
    k: QKNormCache  # per head of k: the gain k_norm


class PastKV(NamedTuple):
    """One layer's key/value cache while decoding: what later positions' queries read.

    Position t lives in slot t % C of the cache's C slots: while pos + T <= C, the block writes
    the rotated keys and the values of its T new positions at [pos, pos + T) and its queries
    attend to [0, pos + T). Beyond, the cache is a ring that keeps the last C positions, which
    only a windowed layer may have (C >= its window: no query reads further back).
    Nothing else of a past position is read again.
    """

    k: np.ndarray  # (B, Hkv, C, hd) rotated keys, positions [max(0, pos - C), pos) filled
    v: np.ndarray  # (B, Hkv, C, hd) values
    pos: int  # the position of the first new token


def _with_past(past: PastKV, k: np.ndarray, v: np.ndarray, window: int | None
               ) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Store the new keys and values k, v (B, Hkv, T, hd) in `past`; return the keys and values
    the new queries attend to, and the window to mask them with (None: every one is seen)."""
    T, C, pos = k.shape[2], past.k.shape[2], past.pos
    P = pos + T
    if P <= C:  # in order: position t at slot t
        past.k[:, :, pos:P], past.v[:, :, pos:P] = k, v
        return past.k[:, :, :P], past.v[:, :, :P], window  # (B, Hkv, P, hd)
    if window is None or C < window:
        raise ValueError(f"past: a cache of {C} positions cannot hold position {P - 1} of a "
                         f"layer whose window is {window}")
    if T == 1 and C == window:  # the ring's keys are all in the one query's window once its
        past.k[:, :, pos % C], past.v[:, :, pos % C] = k[:, :, 0], v[:, :, 0]  # own is stored
        return past.k, past.v, None  # (B, Hkv, C, hd), in ring order: softmax sums any order
    kept = np.arange(max(0, pos - C), pos) % C  # the slots of the kept positions, in order
    k_all = np.concatenate((past.k[:, :, kept], k), axis=2)  # (B, Hkv, kept + T, hd)
    v_all = np.concatenate((past.v[:, :, kept], v), axis=2)
    n = min(T, C)  # the last n new positions are the ones the ring keeps
    slots = np.arange(P - n, P) % C
    past.k[:, :, slots], past.v[:, :, slots] = k[:, :, T - n:], v[:, :, T - n:]
    return k_all, v_all, window


def layer_window(cfg: Config, layer: int | None) -> int | None:
    """`window_of(cfg, layer)`; without a layer index, the window that every layer shares."""
    if layer is not None:
        return window_of(cfg, layer)
    if cfg.global_layers:
        raise ValueError("layer: Config.global_layers are without the window: give the "
                         "layer's index")
    return cfg.sliding_window


def _normed_qk(qk: np.ndarray, p: dict, cfg: Config) -> tuple[np.ndarray, QKNormPair | None]:
    """QK-norm (Config.qk_norm) on qk (B, S, dq + dkv): each head of q and of k by its gain."""
    if not cfg.qk_norm:
        return qk, None
    dq, one = cfg.q_dim, norm_offset(cfg)
    qn, qc = qk_norm_forward(qk[..., :dq], p["q_norm"], cfg.norm_eps, one)  # (B, S, dq)
    kn, kc = qk_norm_forward(qk[..., dq:], p["k_norm"], cfg.norm_eps, one)  # (B, S, dkv)
    return np.concatenate((qn, kn), axis=-1), QKNormPair(qc, kc)  # (B, S, dq + dkv)


def attention_block_forward(
    h: np.ndarray, p: dict, cfg: Config, cos: np.ndarray, sin: np.ndarray,
    past: PastKV | None = None, layer: int | None = None, lora: LayerLora | None = None,
) -> tuple[np.ndarray, AttentionBlockCache]:
    """The attention branch of one layer: merge_heads(attention(rope(q), rope(k), v)) @ wo,
    with q, k, v the products of rmsnorm(h, rms_attn) with wq, wk and wv (plus their biases,
    and each head of q and k normalized, when the Config asks for them).

    h is the stream (N, d), N = B*S; p the layer's parameters (`layer_params`); cos and sin
    the RoPE tables of the S positions as `qk_rope_tables` repeats them for the H + Hkv heads of
    q and k, (S, (dq + dkv)/2) each. Query head j reads key/value head j // (H // Hkv). With
    `past` (decoding), the S positions come after `past.pos` earlier ones whose keys and values
    `past` holds. `layer`, the layer's index, gives its sliding window (`window_of`; without
    it, the one all layers share). With `lora` (the layer's adapters) the block's weights are
    frozen and the adapters add their outputs to their projections'. Returns `(out, cache)`,
    out (N, d).
    """
    S, H, Hkv, dq, dkv = cos.shape[0], cfg.n_head, cfg.kv_heads, cfg.q_dim, cfg.kv_dim
    B, w = h.shape[0] // S, dq + 2 * dkv
    xb, norm = rmsnorm_forward(h, p["rms_attn"], cfg.norm_eps, norm_offset(cfg))  # (N, d)
    # q, k, v = xb @ wq (+ bq), xb @ wk (+ bk), xb @ wv (+ bv), as one product
    qkv, qkv_cache, bias = qkv_forward(xb, p, cfg, lora is not None)  # (N, dq + 2dkv)
    adapted = None if lora is None else adapt_qkv(qkv, xb, lora, cfg)  # q, k, v += x A.T B.T
    if adapted is not None and isinstance(qkv_cache, LinearCache):  # the frozen product: no
        qkv_cache = LinearCache(None, qkv_cache.w)  # dW, so its input need not be kept
    qk, qk_norm = _normed_qk(qkv.reshape(B, S, w)[:, :, : dq + dkv], p, cfg)  # (B, S, dq + dkv)
    # q, k = rope(q), rope(k), all heads in one pass over the rows as the product left them:
    # a row's q and k columns are H + Hkv heads side by side, and the repeated tables give pair
    # j the angle of pair j mod hd/2 (see `qk_rope_tables`)
    qk, rope = rope_forward(qk, cos, sin)  # (B, S, dq + dkv)
    qk = split_heads(qk.reshape(B * S, dq + dkv), B, S, H + Hkv)  # (B, H + Hkv, S, hd)
    q, k = qk[:, :H], qk[:, H:]  # (B, H, S, hd) and (B, Hkv, S, hd), views
    v = split_heads(qkv, B, S, H + 2 * Hkv)[:, H + Hkv :]  # (B, Hkv, S, hd), a view
    window = layer_window(cfg, layer)
    if past is not None:  # decoding: keep the new keys and values, attend to those kept
        k, v, window = _with_past(past, k, v, window)  # (B, Hkv, P, hd), P <= pos + S
    attention: AttentionCache | FlashCache
    with one_blas_thread(S * (H // Hkv), q.shape[-1], k.shape[2]):  # its small products
        if cfg.attention == "flash" and past is None:  # the same values, no (S, S) weights
            a, attention = flash_attention_forward(q, k, v, cfg.flash_block, window)  # (B,
            # H, S, hd)
        else:  # (decoding's weights are (S, P), one row per new position: the plain form)
            scale = (None if cfg.query_pre_attn_scalar is None
                     else cfg.query_pre_attn_scalar ** -0.5)
            a, attention = causal_attention_forward(q, k, v, window, scale)  # (B, H, S, hd)
    am = merge_heads(a)  # (N, dq)
    out, out_cache = linear_forward(am, p["wo"])  # (N, d)
    if lora is not None and adapted is not None:
        out_cache = LinearCache(None, out_cache.w)  # frozen wo
        if "o" in lora.A:  # out += scale * (am @ A.T) @ B.T
            with one_blas_thread(am.shape[0], am.shape[1], lora.A["o"].shape[0]):  # thin products
                delta, adapted["o"] = lora_forward(am, lora.A["o"], lora.B["o"], lora.scale)
            out += delta
    post = None
    if cfg.post_norms:  # Gemma 3: the branch's output normalized before it joins the stream
        out, post = rmsnorm_forward(out, p["rms_attn_post"], cfg.norm_eps,
                                    norm_offset(cfg))  # (N, d)
    return out, AttentionBlockCache(norm, qkv_cache, bias, qk_norm, rope, attention, out_cache,
                                    post, adapted)


def _qk_grads(dqk: np.ndarray, pair: QKNormPair, grads: dict) -> None:
    """QK-norm in reverse, in place on dqk (B, S, dq + dkv); its gains' gradients into grads."""
    qc, kc = pair
    dq = qc.shape[-1]
    dqn, grads["q_norm"] = qk_norm_backward(dqk[..., :dq], qc)  # (B, S, dq), (hd,)
    dkn, grads["k_norm"] = qk_norm_backward(dqk[..., dq:], kc)  # (B, S, dkv), (hd,)
    dqk[..., :dq], dqk[..., dq:] = dqn, dkn


def attention_block_backward(
    dout: np.ndarray, cache: AttentionBlockCache
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The attention branch in reverse: `(dh, grads)` given dout (N, d), where dh (N, d) is the
    branch's part of the stream's gradient and grads holds rms_attn, wq, wk, wv and wo (and
    bq, bk, bv, q_norm, k_norm when the forward had them)."""
    B, H, S, hd = cache.attention.q.shape
    Hkv = cache.attention.k.shape[1]
    dq, dkv = H * hd, Hkv * hd
    grads: dict[str, np.ndarray] = {}
    if cache.post is not None:  # out = rmsnorm(out, rms_attn_post): the last step, first back
        dout, grads["rms_attn_post"] = rmsnorm_backward(dout, cache.post)  # (N, d), (d,)
    # out = merge_heads(a) @ wo
    dam, dwo = linear_backward(dout, cache.out)  # (N, dq), (dq, d) (None when frozen)
    if cache.lora and "o" in cache.lora:  # out += the adapter of wo: its dx adds to dam
        rank = cache.lora["o"].u.shape[1]
        with one_blas_thread(dout.shape[0], dout.shape[1], rank):  # thin products
            dx, grads["lora_A.o"], grads["lora_B.o"] = lora_backward(dout, cache.lora["o"])
        dam += dx
    da = split_heads(dam, B, S, H)  # (B, H, S, hd)
    # a = attention(q, k, v): dk and dv (B, Hkv, S, hd) sum the gradients of the query heads
    # that read each key/value head
    with one_blas_thread(S * (H // Hkv), hd, cache.attention.k.shape[2]):  # small products
        if isinstance(cache.attention, FlashCache):
            dqh, dkh, dvh = flash_attention_backward(da, cache.attention)
        else:
            dqh, dkh, dvh = causal_attention_backward(da, cache.attention)
    # q, k, v = the heads of xb @ [wq | wk | wv]: their gradients go into the heads of the
    # fused product's gradient [dq | dk | dv] (N, dq + 2dkv)
    dqkv = empty((B * S, dq + 2 * dkv), dout.dtype)  # (N, dq + 2dkv)
    dheads = split_heads(dqkv, B, S, H + 2 * Hkv)  # (B, H + 2Hkv, S, hd) a view of dqkv
    np.copyto(dheads[:, :H], dqh)
    np.copyto(dheads[:, H : H + Hkv], dkh)
    np.copyto(dheads[:, H + Hkv :], dvh)
    # q, k = rope(q), rope(k): rotate dq and dk back by the opposite angles, in place, all heads
    # in one pass over the rows, as the forward rotated them
    dqk = dqkv.reshape(B, S, dq + 2 * dkv)[:, :, : dq + dkv]  # (B, S, dq + dkv) a view of dqkv
    rope_backward(dqk, cache.rope, out=dqk)
    if cache.qk_norm is not None:  # q, k = per-head rmsnorm(q), rmsnorm(k)
        _qk_grads(dqk, cache.qk_norm, grads)
    if cache.bias is not None:  # qkv += [bq | bk | bv]: each bias sums its column's rows
        _, db = bias_backward(dqkv, cache.bias)  # (dq + 2dkv,)
        grads["bq"], grads["bk"], grads["bv"] = db[:dq], db[dq : dq + dkv], db[dq + dkv :]
    # qkv = xb @ [wq | wk | wv]: xb fans out to q, k and v, so dxb sums the three paths.
    if isinstance(cache.qkv, FrozenQKV):  # frozen: each product's dx, summed
        dxb, dwqkv = frozen_qkv_dx(dqkv, cache.qkv), None  # (N, d)
    else:
        dxb, dwqkv = linear_backward(dqkv, cache.qkv)  # (N, d), (d, dq + 2dkv)
    if cache.lora is not None:  # frozen: the adapters' gradients alone; their dx add to dxb
        lora_qkv_grads(dqkv, dxb, cache.lora, grads, dq, dkv)
        dh, _ = rmsnorm_backward(dxb, cache.norm)  # (N, d)
        return dh, grads
    assert dwqkv is not None and dwo is not None  # trained: the products kept their inputs
    dwq, dwk, dwv = dwqkv[:, :dq], dwqkv[:, dq : dq + dkv], dwqkv[:, dq + dkv :]  # views
    # xb = rmsnorm(h, rms_attn)
    dh, drms = rmsnorm_backward(dxb, cache.norm)  # (N, d), (d,)
    return dh, {"rms_attn": drms, "wq": dwq, "wk": dwk, "wv": dwv, **grads, "wo": dwo}


# -- the SwiGLU block: h + swiglu_block(h) --------------------------------------------------

class SwiGLUBlockCache(NamedTuple):
    """What `swiglu_block_backward` needs: the component caches, unopened."""

    norm: RMSNormCache  # x2b = rmsnorm(h, rms_ffn)
    swiglu: SwiGLUCache | GeGLUCache  # out = swiglu(x2b, w1, w3, w2), or geglu (Gemma)
    post: RMSNormCache | None = None  # out = rmsnorm(out, rms_ffn_post) (Config.post_norms)


def swiglu_block_forward(
    h: np.ndarray, p: dict, cfg: Config, frozen: bool = False
) -> tuple[np.ndarray, SwiGLUBlockCache]:
    """The feed-forward branch of one layer: swiglu(rmsnorm(h, rms_ffn), w1, w3, w2).

    h is the stream (N, d), p the layer's parameters. Returns `(out, cache)`, out (N, d).
    `frozen` (LoRA): no weight gradient will be asked for, so the cache keeps no input of a
    weight's product.
    """
    one = norm_offset(cfg)
    x2b, norm = rmsnorm_forward(h, p["rms_ffn"], cfg.norm_eps, one)  # (N, d)
    ffn: SwiGLUCache | GeGLUCache
    if cfg.activation == "gelu_tanh":  # GeGLU (Gemma): the gate is GELU's tanh form
        out, ffn = geglu_forward(x2b, p["w1"], p["w3"], p["w2"])  # (N, d)
        if frozen:  # no input of a weight's product: no dW is made in the backward
            ffn = ffn._replace(x=None, ha=None)
    else:
        out, ffn = swiglu_forward(x2b, p["w1"], p["w3"], p["w2"], p.get("w13"))  # (N, d); w13:
        # [w1 / 2, w3] when the caller stacked it once (decoding)
        if frozen:  # no input of a weight's product, no stacked copy of the weights
            ffn = ffn._replace(x=None, ha=None, w13=None, w1w3=GateUpWeights(p["w1"], p["w3"]))
    post = None
    if cfg.post_norms:  # Gemma 3: the branch's output normalized before it joins the stream
        out, post = rmsnorm_forward(out, p["rms_ffn_post"], cfg.norm_eps, one)  # (N, d)
    return out, SwiGLUBlockCache(norm, ffn, post)


def swiglu_block_backward(
    dout: np.ndarray, cache: SwiGLUBlockCache
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The feed-forward branch in reverse: `(dh, grads)`, grads holding rms_ffn, w1, w3, w2
    (and rms_ffn_post with Config.post_norms)."""
    post = {}
    if cache.post is not None:  # out = rmsnorm(out, rms_ffn_post): the last step, first back
        dout, post["rms_ffn_post"] = rmsnorm_backward(dout, cache.post)  # (N, d), (d,)
    # out = swiglu(x2b, w1, w3, w2), or geglu's
    dws: list[np.ndarray | None]  # dw1, dw3, dw2: None when frozen (LoRA)
    if isinstance(cache.swiglu, GeGLUCache):
        dx2b, *dws = geglu_backward(dout, cache.swiglu)  # (N, d) and the three weights
    else:
        dx2b, *dws = swiglu_backward(dout, cache.swiglu)
    # x2b = rmsnorm(h, rms_ffn)
    dh, drms = rmsnorm_backward(dx2b, cache.norm)  # (N, d), (d,)
    weights = {k: g for k, g in zip(("w1", "w3", "w2"), dws, strict=True) if g is not None}
    return dh, {"rms_ffn": drms, **weights, **post}


# -- one layer: the two blocks and their residual connections --------------------------------

class LayerCache(NamedTuple):
    """What `layer_backward` needs: the caches of the layer's two blocks."""

    attn: AttentionBlockCache | Parts  # Parts: a frozen block run as a sum over groups of
    # key/value heads (model/parts.py)
    ffn: SwiGLUBlockCache | Parts  # Parts: a frozen block run as a sum over slices of its
    # hidden width


def layer_forward(
    h: np.ndarray, p: dict, cfg: Config, cos: np.ndarray, sin: np.ndarray,
    past: PastKV | None = None, layer: int | None = None, lora: LayerLora | None = None,
) -> tuple[np.ndarray, LayerCache]:
    """One layer on the stream h (N, d): each block reads it and adds its output back.

    cos, sin (S, (d + dkv)/2), `past` (decoding), `layer` (its index) and `lora` (adapters,
    the layer's weights frozen) as `attention_block_forward` takes them."""
    attn: AttentionBlockCache | Parts
    frozen = lora is not None and past is None  # training with adapters: the weights frozen
    groups = head_groups(cfg, h.shape[0]) if frozen else None
    if lora is not None and groups is not None:  # a group of key/value heads per BLAS thread
        out, attn = attention_parts(attention_block_forward, h, p, cfg, cos, sin, layer, lora,
                                    groups)  # (N, d)
    else:
        out, attn = attention_block_forward(h, p, cfg, cos, sin, past, layer, lora)  # (N, d)
    h = np.add(h, out, out=out)  # residual connection h + out (out is ours: its memory is reused)
    ffn: SwiGLUBlockCache | Parts
    slices = hidden_slices(cfg, h.shape[0]) if frozen else None
    if slices is not None:  # frozen: a slice of the hidden units per BLAS thread
        out, ffn = feed_forward_parts(swiglu_block_forward, h, p, cfg, slices)  # (N, d)
    else:
        out, ffn = swiglu_block_forward(h, p, cfg, lora is not None)  # (N, d)
    h = np.add(h, out, out=out)  # residual connection
    return h, LayerCache(attn, ffn)


def layer_backward(
    dh: np.ndarray, cache: LayerCache
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One layer in reverse, SwiGLU block first: the stream's gradient below the layer, and the
    gradients of the layer's parameters."""
    # h = h + swiglu_block(h): the stream passes dh on unchanged, the block adds its part.
    if isinstance(cache.ffn, Parts):
        dx, grads = backward_parts(swiglu_block_backward, dh, cache.ffn, "rms_ffn_post")
    else:
        dx, grads = swiglu_block_backward(dh, cache.ffn)
    dh = np.add(dh, dx, out=dx)  # dh + dx, written over dx (ours)
    # h = h + attention_block(h)
    if isinstance(cache.attn, Parts):
        dx, grads_attn = backward_parts(attention_block_backward, dh, cache.attn,
                                        "rms_attn_post")
    else:
        dx, grads_attn = attention_block_backward(dh, cache.attn)
    dh = np.add(dh, dx, out=dx)
    return dh, {**grads_attn, **grads}


# -- the whole model -----------------------------------------------------------------------

class ModelCache(NamedTuple):
    """What `backward` needs: the tokens, the rope tables, the caches of every step, the logits.

    With `recompute=True` only each layer's input is kept (`layer_inputs`), and `layers` is
    empty: the backward pass runs each layer's forward again just before going back through it.
    """

    x: np.ndarray  # (B, S) the tokens: the targets must have their shape
    embedding: EmbeddingCache  # h = wte[x]
    cos: np.ndarray  # (S, (d + dkv)/2) the RoPE tables of every layer (`qk_rope_tables`), in
    sin: np.ndarray  # (S, (d + dkv)/2) the parameters' dtype: to recompute a layer
    layers: list[LayerCache | None]  # one cache per layer, in forward order (None: released)
    layer_inputs: list[np.ndarray | None]  # (N, d) per layer, kept instead when recomputing
    head: HeadCache
    logits: np.ndarray  # (B, S, V): the loss is computed from them in `backward`
    adapters: Adapters | None = None  # LoRA: the base frozen, gradients of the adapters alone


def forward(
    params: dict, cfg: Config, x: np.ndarray, recompute: bool = False,
    adapters: Adapters | None = None,
) -> tuple[np.ndarray, ModelCache]:
    """Logits (B, S, V) for tokens `x` (B, S), and the cache that `backward` needs.

    With `recompute=True` the cache keeps only each layer's input (see `ModelCache`). See the
    whole backward pass chapter. `adapters` (LoRA, `model.adapters`): added to their
    projections, the base frozen: the cache keeps nothing that only a base gradient needs.
    """
    dtype = check_params(params, cfg)
    if adapters is not None:
        check_adapters(adapters, cfg, dtype)
    x = check_tokens("x", x, cfg)
    B, S = x.shape
    cos, sin = qk_rope_tables(cfg, S, dtype)  # (S, (d + dkv)/2) each, shared by the layers

    h, embedding = embed(params, cfg, x)  # (B, S, d)
    h = h.reshape(B * S, cfg.n_embd)  # (N, d) the residual stream
    layers: list[LayerCache | None] = []
    layer_inputs: list[np.ndarray | None] = []
    for l in range(cfg.n_layer):
        cl, sl = layer_tables(cfg, l, cos, sin)  # (S, (dq + dkv)/2) each
        lora = None if adapters is None else layer_lora(adapters, l)
        if recompute:
            layer_inputs.append(h)
            h, _ = layer_forward(h, layer_params(params, l), cfg, cl, sl, layer=l, lora=lora)
        else:
            h, layer = layer_forward(h, layer_params(params, l), cfg, cl, sl, layer=l, lora=lora)
            layers.append(layer)
    logits, head = head_forward(h, params, cfg, adapters is not None)  # (N, V)
    logits = logits.reshape(B, S, -1)  # (B, S, V)
    return logits, ModelCache(x, embedding, cos, sin, layers, layer_inputs, head, logits,
                              adapters)


def _layer_cache(params: dict, cfg: Config, cache: ModelCache, l: int) -> LayerCache:
    """Layer l's cache: the one forward kept, or (recompute) made again from the layer's input.
    A cache that an earlier `backward(..., release=True)` gave up holds neither."""
    kept = cache.layers[l] if cache.layers else cache.layer_inputs[l]
    if kept is None:
        raise ValueError("cache was spent by an earlier backward(..., release=True) "
                         "(loss_and_grads passes it): run forward again for a new one")
    if isinstance(kept, LayerCache):
        return kept
    cl, sl = layer_tables(cfg, l, cache.cos, cache.sin)  # recompute: layer l's forward again
    lora = None if cache.adapters is None else layer_lora(cache.adapters, l)
    return layer_forward(kept, layer_params(params, l), cfg, cl, sl, layer=l, lora=lora)[1]


def backward(
    params: dict, cfg: Config, cache: ModelCache, y: np.ndarray,
    on_layer: Callable[[int, dict[str, np.ndarray]], None] | None = None,
    *, release: bool = False,
) -> tuple[float, dict[str, np.ndarray]]:
    """Mean loss on targets `y` (B, S) and the gradient of every parameter.

    The forward pass in reverse, block by block. See the whole backward pass chapter.
    `on_layer(l, grads_l)`, if given, is called as soon as layer l's gradients are known: a
    data-parallel run starts their all-reduce there (see the "Many processes" chapter).
    `release=True` says that the caller gives the cache up: each layer's part is dropped from it
    as soon as that layer is done, so its memory can serve the gradients that follow, as
    autograd frees what it saved (`loss_and_grads` does this; the cache is then spent); a full
    workspace lets its arrays go too (`give_back`).
    """
    if not isinstance(cache, ModelCache):
        raise TypeError(f"cache must be the ModelCache that forward returned, "
                        f"got {type(cache).__name__}")
    y = check_targets(y, cache.x, cfg)
    B, S = y.shape

    # loss = mean -log softmax(logits)[y]
    # (targets equal to the padding token, if the model has one, count for neither)
    spent = cache.logits if release and cache.logits.flags.c_contiguous else None  # given up:
    loss, dlogits = softmax_cross_entropy(cache.logits, y, cfg.pad_token_id, spent)  # (B, S,
    # V) written over the logits when the cache is spent (no second (B, S, V) array)
    dh, grads = head_backward(dlogits.reshape(B * S, -1), cache.head)  # (N, d)
    del dlogits  # (B, S, V), read by nothing below: its memory can serve the layers' gradients
    ad = cache.adapters
    stacks = layer_names(cfg) if ad is None else tuple(adapter_shapes(cfg, ad.spec))
    for name in stacks:  # (L, ...) filled layer by layer: the base's, or the adapters' alone
        grads[name] = np.empty_like(ad.weights[name]) if ad else empty_like(params[name])
    for l in reversed(range(cfg.n_layer)):
        layer = _layer_cache(params, cfg, cache, l)
        dh, grads_l = layer_backward(dh, layer)
        given = release and give_back(layer)  # a full workspace lets it go
        if release:  # nothing reads layer l's cache again
            (cache.layers or cache.layer_inputs)[l] = None
        del layer
        if given:  # its memory serves the gradients that follow
            return_freed()
        grads_l = {k: g for k, g in grads_l.items() if k in stacks}
        for name, g in grads_l.items():
            grads[name][l] = g
        if on_layer is not None:
            on_layer(l, grads_l)
    if ad is not None:  # frozen base: the embedding's scatter-add is never made
        return loss, grads
    scale = embed_scale(cfg, dh.dtype)
    if scale is not None:  # h = s * wte[x]: the gathered rows' gradient is s * dh
        dh *= dh.dtype.type(scale)
    # h = wte[x]: scatter-add into the embedding rows.
    dwte = embedding_backward(dh.reshape(B, S, -1), cache.embedding)  # (V, d)
    if cfg.pad_token_id is not None:  # transformers' padding_idx: the pad row learns nothing
        dwte[cfg.pad_token_id] = 0  # from the embedding (tied, it still does as output row)
    if cfg.tie_embeddings:
        grads["wte"] += dwte  # wte is also the output projection: both gradients add
    else:
        grads["wte"] = dwte
    return loss, {name: grads[name] for name in param_shapes(cfg)}  # in the table's order


def loss_and_grads(
    params: dict, cfg: Config, x: np.ndarray, y: np.ndarray, recompute: bool = False,
    adapters: Adapters | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """forward then backward: the mean loss and the gradient of every parameter (with
    `adapters`, LoRA: of every adapter array, and of no base parameter).

    `recompute=True` keeps only each layer's input during the forward pass and recomputes the
    layer during the backward pass: less memory, one more forward pass, the same gradients.
    """
    if isinstance(x, np.ndarray):
        check_targets(y, x, cfg)  # before the forward pass, so a bad y costs nothing
    # frozen (LoRA): the backward makes nothing that the caches' memory could serve, so the
    # workspaces keep every array of the step, for the next (`keeping_all`)
    with keeping_all() if adapters is not None else nullcontext():
        _, cache = forward(params, cfg, x, recompute=recompute, adapters=adapters)
        return backward(params, cfg, cache, y, release=True)  # the cache is ours alone
