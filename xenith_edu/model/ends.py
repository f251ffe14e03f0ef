"""The model's two ends: the embedding that starts the residual stream (times sqrt(d) in
Gemma), and the head that ends it in logits over the vocabulary; each with its backward.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

from ..embedding import EmbeddingCache, embedding_forward
from ..rmsnorm import RMSNormCache, rmsnorm_backward, rmsnorm_forward
from ..tools.workspace import empty, empty_like
from .config import Config, norm_offset
from .cores import blas_threads, on_threads

# Shape legend: N = B*S positions, d the width of the stream, V the vocabulary; a shard of the
# vocabulary is its rows [lo, hi).

SPLIT = 2 ** 27  # multiply-adds of the head's product above which it runs on vocabulary shards


def vocab_shards(N: int, d: int, V: int) -> tuple[tuple[int, int], ...] | None:
    """The head's vocabulary in as many shards as the BLAS has threads now, for a product of
    (N, d) by (d, V) large enough to gain (a real vocabulary's); None: one product.

    Why: each shard's rows of the output projection make their own columns of the logits, and
    in reverse their own part of dxf, on a thread of their own with one BLAS thread, so the
    BLAS's own threads never run: they spin while they wait for the next product, on the core
    that the model's other parts (`model/parts.py`) need."""
    k = min(blas_threads(), V)
    if k < 2 or N * d * V < SPLIT:
        return None
    edges = [V * i // k for i in range(k + 1)]
    return tuple(zip(edges[:-1], edges[1:], strict=True))


# -- the head: final RMSNorm and output projection -----------------------------------------

class HeadCache(NamedTuple):
    """What `head_backward` needs."""

    norm: RMSNormCache  # xf = rmsnorm(h, rms_final)
    xf: np.ndarray | None  # (N, d) the input of the output projection: for dw_out =
    # dlogits.T @ xf (None when the weights are frozen, LoRA: no dw_out is made)
    w_out: np.ndarray  # (V, d) the output projection (wte when tied): for dxf = dlogits @ w_out
    w_out_name: str  # "wte" when the embeddings are tied, else "lm_head": whose gradient it is


def head_forward(h: np.ndarray, params: dict, cfg: Config, frozen: bool = False
                 ) -> tuple[np.ndarray, HeadCache]:
    """The top of the model on the stream h (N, d): logits (N, V) = rmsnorm(h) @ w_out.T.
    `frozen`: no gradient of the output projection will be asked for (LoRA)."""
    xf, norm = rmsnorm_forward(h, params["rms_final"], cfg.norm_eps, norm_offset(cfg))  # (N, d)
    name = "wte" if cfg.tie_embeddings else "lm_head"
    w_out = params[name]  # (V, d)
    (N, d), V = xf.shape, w_out.shape[0]
    logits = empty((N, V), xf.dtype)  # (N, V)
    shards = vocab_shards(N, d, V)
    if shards is None:
        np.matmul(xf, w_out.T, out=logits)
    else:  # each shard's columns of the logits from its rows of w_out
        on_threads([partial(np.matmul, xf, w_out[lo:hi].T, out=logits[:, lo:hi])
                    for lo, hi in shards])
    return logits, HeadCache(norm, None if frozen else xf, w_out, name)


def head_backward(
    dlogits: np.ndarray, cache: HeadCache
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The head in reverse: `(dh, grads)` given dlogits (N, V); grads holds rms_final and the
    output projection's gradient (V, d), under "wte" when tied, else under "lm_head"."""
    # logits = xf @ w_out.T: rules 1 and 2 of the notation page, with w_out transposed. dxf =
    # dlogits @ w_out, made as its transpose w_out.T @ dlogits.T: the same sums, and OpenBLAS
    # threads this form better over a long vocabulary (Llama-3.2-1B's 128256 rows: 1.1 against
    # 1.7 s on two threads); the (d, N) result is then copied into the rows' order
    (N, V), d = dlogits.shape, cache.w_out.shape[1]
    shards = vocab_shards(N, d, V)
    if shards is not None:  # dxf sums the shards' parts; each makes its own rows of dw_out
        return _head_backward_shards(dlogits, cache, shards)
    dxf_t = np.matmul(cache.w_out.T, dlogits.T, out=empty((d, N), dlogits.dtype))  # (d, N)
    dxf = empty((N, d), dlogits.dtype)  # (N, d)
    np.copyto(dxf, dxf_t.T)
    del dxf_t
    # xf = rmsnorm(h, rms_final)
    dh, drms = rmsnorm_backward(dxf, cache.norm)  # (N, d), (d,)
    if cache.xf is None:  # frozen: no (V, d) gradient
        return dh, {}
    dw_out = np.matmul(dlogits.T, cache.xf, out=empty_like(cache.w_out))  # (V, d)
    return dh, {"rms_final": drms, cache.w_out_name: dw_out}


def _head_backward_shards(dlogits: np.ndarray, cache: HeadCache,
                          shards: tuple[tuple[int, int], ...]
                          ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`head_backward` on vocabulary shards, a thread each: dxf = sum over shards of
    dlogits[:, lo:hi] @ w_out[lo:hi], and dw_out[lo:hi] = dlogits[:, lo:hi].T @ xf."""
    w_out, xf = cache.w_out, cache.xf
    dw_out = None if xf is None else empty_like(w_out)  # (V, d)

    def shard(lo: int, hi: int) -> np.ndarray:
        part = dlogits[:, lo:hi] @ w_out[lo:hi]  # (N, d) this shard's part of dxf
        if dw_out is not None and xf is not None:
            np.matmul(dlogits[:, lo:hi].T, xf, out=dw_out[lo:hi])  # (hi - lo, d)
        return part

    parts = on_threads([partial(shard, lo, hi) for lo, hi in shards])
    dxf = parts[0]  # (N, d)
    for part in parts[1:]:
        dxf += part
    # xf = rmsnorm(h, rms_final)
    dh, drms = rmsnorm_backward(dxf, cache.norm)  # (N, d), (d,)
    if dw_out is None:  # frozen: no (V, d) gradient
        return dh, {}
    return dh, {"rms_final": drms, cache.w_out_name: dw_out}


# -- the embedding: h = s * wte[x] -----------------------------------------------------------

def embed_scale(cfg: Config, dtype: np.dtype | type) -> float | None:
    """The embedding's factor: sqrt(n_embd) rounded to `dtype` (Config.scale_embeddings, Gemma:
    transformers casts it to the weights' dtype), or None (the factor one)."""
    return float(np.dtype(dtype).type(cfg.n_embd ** 0.5)) if cfg.scale_embeddings else None


def embed(params: dict, cfg: Config, x: np.ndarray) -> tuple[np.ndarray, EmbeddingCache]:
    """The stream's start (B, S, d): wte[x], times `embed_scale` if the model scales it."""
    h, cache = embedding_forward(params["wte"], x)  # (B, S, d) a new array: ours to scale
    scale = embed_scale(cfg, h.dtype)
    if scale is not None:
        h *= h.dtype.type(scale)
    return h, cache
