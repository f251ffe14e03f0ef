"""The model's two ends: the embedding that starts the residual stream (times sqrt(d) in
Gemma), and the head that ends it in logits over the vocabulary; each with its backward.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..embedding import EmbeddingCache, embedding_forward
from ..rmsnorm import RMSNormCache, rmsnorm_backward, rmsnorm_forward
from ..tools.workspace import empty, empty_like
from .config import Config, norm_offset

# Shape legend: N = B*S positions, d the width of the stream, V the vocabulary.


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
    logits = np.matmul(xf, w_out.T, out=empty((xf.shape[0], w_out.shape[0]), xf.dtype))  # (N, V)
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
    N, d = dlogits.shape[0], cache.w_out.shape[1]
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
