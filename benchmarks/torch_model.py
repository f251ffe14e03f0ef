"""The book's model in PyTorch, written the ordinary way, defined once for the benchmarks.
`torch_step.py` (the book's size) and `real_size.py` (SmolLM-135M's shape) both import it.

It uses `F.scaled_dot_product_attention`, `F.silu` and `F.cross_entropy`, and autograd for the
backward; RoPE rotates interleaved pairs, as the book's model does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

# Shape legend: B batch, S positions, d width, V vocabulary, L layers, hd head width.


def rope_tables(S: int, hd: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the S positions' angles, (S, hd/2) each, float32."""
    ang = torch.arange(S)[:, None] * theta ** (-torch.arange(0, hd, 2) / hd)[None, :]  # (S, hd/2)
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs of u, (B, heads, S, hd)."""
    ue, uo = u[..., 0::2], u[..., 1::2]
    return torch.stack((ue * cos - uo * sin, ue * sin + uo * cos), dim=-1).flatten(-2)


def rms(u: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps) * w


def loss_fn(p: dict, x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            *, heads: int, kv_heads: int, eps: float) -> torch.Tensor:
    """The mean cross-entropy of the model `p` (stacked per-layer weights) on tokens x, y (B, S)."""
    B, S = x.shape
    L, V = p["wq"].shape[0], p["wte"].shape[0]
    hd = p["wq"].shape[2] // heads
    gqa = {"enable_gqa": True} if kv_heads != heads else {}
    h = p["wte"][x]  # (B, S, d)
    for l in range(L):
        xb = rms(h, p["rms_attn"][l], eps)
        q = (xb @ p["wq"][l]).view(B, S, heads, hd).transpose(1, 2)
        k = (xb @ p["wk"][l]).view(B, S, kv_heads, hd).transpose(1, 2)
        v = (xb @ p["wv"][l]).view(B, S, kv_heads, hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v,
                                           is_causal=True, **gqa)
        h = h + a.transpose(1, 2).reshape(B, S, -1) @ p["wo"][l]
        x2b = rms(h, p["rms_ffn"][l], eps)
        h = h + (F.silu(x2b @ p["w1"][l]) * (x2b @ p["w3"][l])) @ p["w2"][l]
    logits = rms(h, p["rms_final"], eps) @ p["wte"].T  # (B, S, V)
    return F.cross_entropy(logits.view(-1, V), y.view(-1))
