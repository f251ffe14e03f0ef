"""transformers' LLaMA in float64 without its float32 casts, for the Hugging Face parity tests.

In float64, transformers still rounds through float32 in RMSNorm, the RoPE tables and the eager
softmax; these context managers compute those in the model's own dtype, so that the comparison
with the book's model can be exact to rounding (1e-10 and below), not to float32 (1e-8).
"""

from __future__ import annotations

import contextlib

import torch
import transformers.models.llama.modeling_llama as llama


def _rmsnorm(self, h):
    variance = h.pow(2).mean(-1, keepdim=True)
    return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))


def _rope(self, x, position_ids):
    theta = self.config.rope_parameters["rope_theta"]
    dim = self.inv_freq.shape[0] * 2
    inv = theta ** (-torch.arange(0, dim, 2, dtype=x.dtype) / dim)  # as the book's rope_tables
    freqs = position_ids[..., None].to(x.dtype) * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key = llama.repeat_kv(key, module.num_key_value_groups)
    value = llama.repeat_kv(value, module.num_key_value_groups)
    w = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w, dim=-1)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), w


@contextlib.contextmanager
def exact_llama():
    """Within the block, LlamaForCausalLM computes everything in its parameters' dtype."""
    saved = (llama.LlamaRMSNorm.forward, llama.LlamaRotaryEmbedding.forward,
             llama.eager_attention_forward)
    llama.LlamaRMSNorm.forward = _rmsnorm
    llama.LlamaRotaryEmbedding.forward = _rope
    llama.eager_attention_forward = _eager
    try:
        yield
    finally:
        (llama.LlamaRMSNorm.forward, llama.LlamaRotaryEmbedding.forward,
         llama.eager_attention_forward) = saved
