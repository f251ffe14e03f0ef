"""The attention block's first product: q, k and v side by side, xb @ [wq | wk | wv] (plus the
biases when the model has them), as one fused product, or with the weights frozen (LoRA) as
three products into their columns.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..bias import BiasCache, bias_forward
from ..linear import LinearCache, linear_forward
from ..tools.workspace import empty
from .adapters import qkv_columns
from .config import Config

# Shape legend: N positions, d width, dq the queries' width, dkv the keys' (and values').


class FrozenQKV(NamedTuple):
    """The frozen q, k, v products (LoRA): what dxb = dq @ wq.T + dk @ wk.T + dv @ wv.T needs.
    No input (no weight gradient is made) and no fused copy of the three weights."""

    wq: np.ndarray  # (d, dq)
    wk: np.ndarray  # (d, dkv)
    wv: np.ndarray  # (d, dkv)


def qkv_forward(xb: np.ndarray, p: dict, cfg: Config, frozen: bool = False
                ) -> tuple[np.ndarray, LinearCache | FrozenQKV, BiasCache | None]:
    """q, k, v side by side (N, dq + 2dkv): xb @ [wq | wk | wv], plus [bq | bk | bv] if any.
    `frozen` (LoRA): three products into their columns, the weights as they are."""
    (N, d), w = xb.shape, cfg.q_dim + 2 * cfg.kv_dim
    wqkv = p.get("wqkv")  # (d, dq + 2dkv) made once by a caller that runs the layer often
    qkv_cache: LinearCache | FrozenQKV
    if frozen and wqkv is None:  # no (d, dq + 2dkv) copy of the weights, and none kept (at
        # Llama-3.2-1B's shape, 25 MB a layer)
        qkv = empty((N, w), xb.dtype)  # (N, dq + 2dkv)
        for t, cols in qkv_columns(cfg.q_dim, cfg.kv_dim).items():
            np.matmul(xb, p[f"w{t}"], out=qkv[:, cols])  # q, k, v each into its columns
        qkv_cache = FrozenQKV(p["wq"], p["wk"], p["wv"])
    else:
        if wqkv is None:  # (decoding: `generate` fuses each layer's once, not at every token)
            wqkv = np.concatenate((p["wq"], p["wk"], p["wv"]), axis=1,
                                  out=empty((d, w), xb.dtype))
        qkv, qkv_cache = linear_forward(xb, wqkv)  # (N, dq + 2dkv)
    if not cfg.qkv_bias:
        return qkv, qkv_cache, None
    b = np.concatenate((p["bq"], p["bk"], p["bv"]))  # (dq + 2dkv,)
    qkv, bias = bias_forward(qkv, b, out=qkv)  # in place: qkv is ours
    return qkv, qkv_cache, bias


def frozen_qkv_dx(dqkv: np.ndarray, frozen: FrozenQKV) -> np.ndarray:
    """dxb (N, d) = dq @ wq.T + dk @ wk.T + dv @ wv.T, each d* its columns of dqkv."""
    (N, _), (d, dq), dkv = dqkv.shape, frozen.wq.shape, frozen.wk.shape[1]
    cols = qkv_columns(dq, dkv)
    dxb = np.matmul(dqkv[:, cols["q"]], frozen.wq.T, out=empty((N, d), dqkv.dtype))  # (N, d)
    part = empty((N, d), dqkv.dtype)  # (N, d)
    for t, w in (("k", frozen.wk), ("v", frozen.wv)):  # xb fans out to q, k and v: dx adds
        dxb += np.matmul(dqkv[:, cols[t]], w.T, out=part)
    return dxb


__all__ = ["FrozenQKV", "frozen_qkv_dx", "qkv_forward"]
