"""The whole model: a tiny LLaMA-style decoder, its forward pass and its backward pass.

Chapter 7 of the book assembles it from the six component chapters; backward mirrors forward.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .attention import causal_attention_backward, causal_attention_forward
from .embedding import embedding_backward, embedding_forward
from .linear import linear_backward, linear_forward
from .rmsnorm import rmsnorm_backward, rmsnorm_forward
from .rope import rope_backward, rope_forward, rope_tables
from .softmax_ce import softmax_cross_entropy
from .swiglu import swiglu_backward, swiglu_forward

# Shape legend: B batch, S positions, N = B*S, d width, H heads, hd = d // H head width,
# f SwiGLU hidden, V vocab, L layers. The residual stream h is kept flat as (N, d).


def default_ffn_hidden(n_embd: int, multiple_of: int = 32) -> int:
    """LLaMA's rule: 8*d/3 rounded up to a multiple of `multiple_of` (d = 128 gives 352)."""
    return multiple_of * math.ceil(8 * n_embd / 3 / multiple_of)


@dataclass(frozen=True)
class Config:
    """The model's sizes. See the book's page "The model at a glance"."""

    vocab_size: int
    n_embd: int
    n_head: int
    n_layer: int
    ffn_hidden: int | None = None
    seq_len: int = 64
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", default_ffn_hidden(self.n_embd))
        for name in ("vocab_size", "n_embd", "n_head", "n_layer", "ffn_hidden", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Config.{name} must be an int, got {type(value).__name__}")
            if value <= 0:
                raise ValueError(f"Config.{name} must be positive, got {value}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"Config.n_embd ({self.n_embd}) must be divisible by Config.n_head ({self.n_head})"
            )
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"Config.n_head: head width n_embd // n_head = {self.n_embd // self.n_head} "
                "must be even for RoPE's pairs"
            )
        if not isinstance(self.tie_embeddings, (bool, np.bool_)):
            raise TypeError("Config.tie_embeddings must be a bool")
        if not self.rope_theta > 0:
            raise ValueError(f"Config.rope_theta must be positive, got {self.rope_theta}")
        if not self.norm_eps > 0:
            raise ValueError(f"Config.norm_eps must be positive, got {self.norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The parameter keys and shapes of the contract's table, in forward order."""
    V, d, L, f = cfg.vocab_size, cfg.n_embd, cfg.n_layer, cfg.ffn_hidden
    shapes = {
        "wte": (V, d),
        "rms_attn": (L, d),
        "wq": (L, d, d),
        "wk": (L, d, d),
        "wv": (L, d, d),
        "wo": (L, d, d),
        "rms_ffn": (L, d),
        "w1": (L, d, f),
        "w3": (L, d, f),
        "w2": (L, f, d),
        "rms_final": (d,),
    }
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (V, d)
    return shapes


def init_params(cfg: Config, seed: int = 0, dtype: type = np.float32) -> dict[str, np.ndarray]:
    """Weights drawn from N(0, 0.02**2), RMSNorm gains set to one."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.startswith("rms"):
            params[name] = np.ones(shape, dtype=dtype)
        else:
            params[name] = (0.02 * rng.standard_normal(shape)).astype(dtype)
    return params


def _check_params(params: dict, cfg: Config) -> np.dtype:
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    shapes = param_shapes(cfg)
    missing = [k for k in shapes if k not in params]
    if missing:
        raise ValueError(f"params is missing keys {missing} for this config")
    extra = [k for k in params if k not in shapes]
    if extra:
        raise ValueError(f"params has keys {extra} that this config does not use")
    dtype = params["wte"].dtype
    for k, shape in shapes.items():
        p = params[k]
        if not isinstance(p, np.ndarray):
            raise TypeError(f"params['{k}'] must be a NumPy array, got {type(p).__name__}")
        if p.shape != shape:
            raise ValueError(f"params['{k}'] has shape {p.shape}, the config expects {shape}")
        if p.dtype != dtype or dtype.kind != "f":
            raise TypeError(f"params['{k}'] has dtype {p.dtype}; all must share one float dtype")
    return dtype


def _check_tokens(name: str, t: object, cfg: Config) -> np.ndarray:
    if not isinstance(t, np.ndarray):
        raise TypeError(f"{name} must be a NumPy integer array of shape (B, S)")
    if t.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {t.dtype}")
    if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (B, S) with B, S >= 1, got {t.shape}")
    if t.shape[1] > cfg.seq_len:
        raise ValueError(
            f"{name} has {t.shape[1]} positions, longer than Config.seq_len = {cfg.seq_len}"
        )
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise ValueError(f"{name} has token ids in [{lo}, {hi}], outside [0, {cfg.vocab_size})")
    return t


def _split_heads(u: np.ndarray, B: int, S: int, H: int) -> np.ndarray:
    return u.reshape(B, S, H, -1).transpose(0, 2, 1, 3)  # (N, d) -> (B, H, S, hd)


def _merge_heads(u: np.ndarray) -> np.ndarray:
    B, H, S, hd = u.shape
    return u.transpose(0, 2, 1, 3).reshape(B * S, H * hd)  # (B, H, S, hd) -> (N, d)


def forward(params: dict, cfg: Config, x: np.ndarray) -> tuple[np.ndarray, dict]:
    """Logits (B, S, V) for tokens `x` (B, S), and the cache that `backward` needs.

    See chapter 7 (the whole backward pass).
    """
    dtype = _check_params(params, cfg)
    x = _check_tokens("x", x, cfg)
    B, S = x.shape
    H, eps = cfg.n_head, cfg.norm_eps
    cos, sin = rope_tables(S, cfg.head_dim, cfg.rope_theta)
    cos, sin = cos.astype(dtype), sin.astype(dtype)  # (S, hd/2)

    h = embedding_forward(params["wte"], x).reshape(B * S, -1)  # (N, d) residual stream
    layers = []
    for l in range(cfg.n_layer):
        # attention block: h = h + merge_heads(attn(rope(q), rope(k), v)) @ wo
        xb, rms1 = rmsnorm_forward(h, params["rms_attn"][l], eps)  # (N, d)
        # q, k, v = xb @ wq, xb @ wk, xb @ wv, as one product with [wq | wk | wv]
        wqkv = np.concatenate((params["wq"][l], params["wk"][l], params["wv"][l]), axis=1)
        qkv, _ = linear_forward(xb, wqkv)  # (N, 3d); its cache is (xb, wqkv), kept below
        qkv = _split_heads(qkv, B, S, 3 * H)  # (B, 3H, S, hd): heads of q, then k, v
        qk = rope_forward(qkv[:, : 2 * H], cos, sin)  # (B, 2H, S, hd) rope(q), rope(k)
        q, k, v = qk[:, :H], qk[:, H:], qkv[:, 2 * H :]  # (B, H, S, hd) each
        a, att = causal_attention_forward(q, k, v)  # (B, H, S, hd)
        am = _merge_heads(a)  # (N, d)
        attn_out, _ = linear_forward(am, params["wo"][l])  # (N, d); its cache is (am, wo)
        h = h + attn_out
        # feed-forward block: h = h + swiglu(rmsnorm(h))
        x2b, rms2 = rmsnorm_forward(h, params["rms_ffn"][l], eps)  # (N, d)
        ffn_out, ffn = swiglu_forward(x2b, params["w1"][l], params["w3"][l], params["w2"][l])
        h = h + ffn_out
        # per layer, backward needs: the two norms' caches, xb and wqkv (the q, k, v product),
        # the attention cache (q, k, v after RoPE, att), am (input of wo), the SwiGLU cache.
        layers.append({"rms1": rms1, "xb": xb, "wqkv": wqkv, "att": att, "am": am,
                       "rms2": rms2, "ffn": ffn})
    xf, rmsf = rmsnorm_forward(h, params["rms_final"], eps)  # (N, d)
    w_out = params["wte"] if cfg.tie_embeddings else params["lm_head"]  # (V, d)
    logits = (xf @ w_out.T).reshape(B, S, -1)  # (B, S, V)
    cache = {"x": x, "cos": cos, "sin": sin, "layers": layers, "rmsf": rmsf, "xf": xf,
             "logits": logits}
    return logits, cache


def backward(params: dict, cfg: Config, cache: dict, y: np.ndarray) -> tuple[float, dict]:
    """Mean loss on targets `y` (B, S) and the gradient of every parameter.

    The forward pass in reverse, one component function per step. See chapter 7.
    """
    x = cache["x"]
    y = _check_tokens("y", y, cfg)
    if y.shape != x.shape:
        raise ValueError(f"y has shape {y.shape}, but the inputs x have shape {x.shape}")
    B, S = x.shape
    H, V = cfg.n_head, cfg.vocab_size
    cos, sin = cache["cos"], cache["sin"]
    grads = {}

    # loss = mean -log softmax(logits)[y]
    loss, dlogits = softmax_cross_entropy(cache["logits"], y)  # (B, S, V)
    dlogits = dlogits.reshape(B * S, V)  # (N, V)
    # logits = xf @ w_out.T
    w_out = params["wte"] if cfg.tie_embeddings else params["lm_head"]
    dw_out = dlogits.T @ cache["xf"]  # (V, d)
    dxf = dlogits @ w_out  # (N, d)
    # xf = rmsnorm(h, rms_final)
    dh, grads["rms_final"] = rmsnorm_backward(dxf, cache["rmsf"])  # (N, d)

    for name in ("rms_attn", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w3", "w2"):
        grads[name] = np.zeros_like(params[name])
    for l in reversed(range(cfg.n_layer)):
        c = cache["layers"][l]
        # h = h + swiglu(x2b): the residual passes dh through and adds the block's dx.
        dx2b, grads["w1"][l], grads["w3"][l], grads["w2"][l] = swiglu_backward(dh, c["ffn"])
        # x2b = rmsnorm(h, rms_ffn[l])
        dxn, grads["rms_ffn"][l] = rmsnorm_backward(dx2b, c["rms2"])
        dh = dh + dxn
        # h = h + am @ wo[l]
        dam, grads["wo"][l] = linear_backward(dh, (c["am"], params["wo"][l]))  # (N, d), (d, d)
        da = _split_heads(dam, B, S, H)  # (B, H, S, hd)
        # a = attention(q, k, v)
        dq, dk, dv = causal_attention_backward(da, c["att"])  # (B, H, S, hd) each
        # qk = rope(q, k): rotate the gradients back by the opposite angle
        dqkv = np.empty((B, 3 * H, S, cfg.head_dim), dtype=dh.dtype)  # (B, 3H, S, hd)
        dqkv[:, :H], dqkv[:, H : 2 * H], dqkv[:, 2 * H :] = dq, dk, dv
        dqkv[:, : 2 * H] = rope_backward(dqkv[:, : 2 * H], cos, sin)
        dqkv = _merge_heads(dqkv)  # (N, 3d) = [dq | dk | dv]
        # qkv = xb @ [wq | wk | wv]: xb fans out to q, k and v, so its gradient sums the three.
        dxb, dwqkv = linear_backward(dqkv, (c["xb"], c["wqkv"]))  # (N, d), (d, 3d)
        grads["wq"][l], grads["wk"][l], grads["wv"][l] = np.split(dwqkv, 3, axis=1)
        # xb = rmsnorm(h, rms_attn[l])
        dxn, grads["rms_attn"][l] = rmsnorm_backward(dxb, c["rms1"])
        dh = dh + dxn

    # h = wte[x]: scatter-add into the embedding rows.
    dwte = embedding_backward(x, dh.reshape(B, S, -1), V)  # (V, d)
    if cfg.tie_embeddings:
        dwte += dw_out  # wte is also the output projection: both gradients add
    else:
        grads["lm_head"] = dw_out
    grads["wte"] = dwte
    return loss, grads


def loss_and_grads(params: dict, cfg: Config, x: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    """forward then backward: the mean loss and the gradient of every parameter."""
    if isinstance(y, np.ndarray) and isinstance(x, np.ndarray) and y.shape != x.shape:
        raise ValueError(f"y has shape {y.shape}, but the inputs x have shape {x.shape}")
    _, cache = forward(params, cfg, x)
    return backward(params, cfg, cache, y)
