"""transformers' LLaMA, Qwen2, Qwen3, Mistral, SmolLM3 and Gemma 3 in float64 without their
float32 casts, for the Hugging Face parity tests.

In float64, transformers still rounds through float32 in RMSNorm, the RoPE tables and the eager
softmax (and Gemma's embedding factor, a float32 buffer); these context managers compute those
in the model's own dtype, so that the comparison with the book's model can be exact to rounding
(1e-10 and below), not to float32 (1e-8). The RoPE frequencies follow transformers' rules (the
plain one, the linear one and Llama 3's, whose lines below are transformers' own
`_compute_llama3_parameters` without the cast to float32).
"""

from __future__ import annotations

import contextlib
import math

import torch
import transformers.models.gemma3.modeling_gemma3 as gemma3
import transformers.models.llama.modeling_llama as llama
import transformers.models.mistral.modeling_mistral as mistral
import transformers.models.qwen2.modeling_qwen2 as qwen2
import transformers.models.qwen3.modeling_qwen3 as qwen3
import transformers.models.smollm3.modeling_smollm3 as smollm3

# each family's module and the names of its RMSNorm and rotary embedding classes
FAMILIES = {"llama": (llama, "Llama"), "qwen2": (qwen2, "Qwen2"), "qwen3": (qwen3, "Qwen3"),
            "mistral": (mistral, "Mistral"), "smollm3": (smollm3, "SmolLM3")}


def _rmsnorm(self, h):
    variance = h.pow(2).mean(-1, keepdim=True)
    return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))


def inv_freq(config, dtype, layer_type=None) -> torch.Tensor:
    """The RoPE frequencies of `config` (of its layers of `layer_type`, Gemma 3's) in `dtype`:
    the plain rule, the linear one, or Llama 3's."""
    rope = config.rope_parameters
    if layer_type is not None:
        rope = rope[layer_type]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv = rope["rope_theta"] ** (-torch.arange(0, head_dim, 2, dtype=dtype) / head_dim)
    if rope.get("rope_type", "default") == "default":
        return inv
    if rope["rope_type"] == "linear":
        return inv / rope["factor"]
    assert rope["rope_type"] == "llama3", rope
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, inv_llama)


def _rope(self, x, position_ids):
    freqs = position_ids[..., None].to(x.dtype) * inv_freq(self.config, x.dtype)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _gemma_rmsnorm(self, h):
    variance = h.pow(2).mean(-1, keepdim=True)
    return (h * torch.rsqrt(variance + self.eps)) * (1.0 + self.weight)


def _gemma_rope(self, x, position_ids, layer_type):
    freqs = position_ids[..., None].to(x.dtype) * inv_freq(self.config, x.dtype, layer_type)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _gemma_embedding(self, input_ids):
    scale = torch.tensor(self.scalar_embed_scale, dtype=self.weight.dtype)  # sqrt(d) in dtype
    return torch.nn.functional.embedding(input_ids, self.weight, self.padding_idx) * scale


def _eager_of(module):
    def _eager(mod, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = module.repeat_kv(key, mod.num_key_value_groups)
        value = module.repeat_kv(value, mod.num_key_value_groups)
        w = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, value).transpose(1, 2).contiguous(), w

    return _eager


@contextlib.contextmanager
def exact_models():
    """Within the block, the families compute everything in their parameters' dtype."""
    saved = []
    gemma = {gemma3: (_gemma_rmsnorm, _gemma_rope)}
    for module, prefix in [*FAMILIES.values(), (gemma3, "Gemma3")]:
        norm = getattr(module, f"{prefix}RMSNorm")
        rotary = getattr(module, f"{prefix}RotaryEmbedding")
        saved.append((module, norm, rotary, norm.forward, rotary.forward,
                      module.eager_attention_forward))
        norm.forward, rotary.forward = gemma.get(module, (_rmsnorm, _rope))
        module.eager_attention_forward = _eager_of(module)
    embedding = gemma3.Gemma3TextScaledWordEmbedding
    embedding_f, embedding.forward = embedding.forward, _gemma_embedding
    try:
        yield
    finally:
        embedding.forward = embedding_f
        for module, norm, rotary, norm_f, rotary_f, eager in saved:
            norm.forward, rotary.forward, module.eager_attention_forward = norm_f, rotary_f, eager


exact_llama = exact_models  # the name the LLaMA tests use


def assert_grads_match(grads: dict, cfg, model: torch.nn.Module, rtol: float = 1e-10) -> None:
    """Every parameter gradient of ours (in the checkpoint's layout) equals transformers'
    `.grad` after its backward, to `rtol` of the gradient's scale (at least 1)."""
    import numpy as np

    from xenith_edu.model.hf import params_to_hf

    theirs = dict(model.named_parameters())
    hf_grads = params_to_hf(grads, cfg)
    assert set(hf_grads) == set(theirs)
    for name, g in hf_grads.items():
        scale = max(1.0, float(np.abs(g).max()))
        assert np.abs(g - theirs[name].grad.numpy()).max() <= rtol * scale, name


def their_step(model: torch.nn.Module, x, y, ignore_index: int | None = None):
    """transformers' logits (NumPy) and mean cross-entropy of `model` on tokens x and targets
    y (B, S), its float32 casts removed, after its backward: each parameter's `.grad` is then
    the gradient. `ignore_index`: a target left out of the loss (our padding token)."""
    V = model.config.vocab_size
    with exact_models():
        logits = model(torch.tensor(x)).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, V), torch.tensor(y).reshape(-1),
            ignore_index=-100 if ignore_index is None else ignore_index)
        loss.backward()
    return logits.detach().numpy(), loss.item()


def assert_step_matches(model: torch.nn.Module, params: dict, cfg, x, y,
                        tol: float = 1e-10) -> None:
    """Our logits, loss and every parameter gradient within `tol` of transformers' `model` on
    (x, y), in float64 (the padding token of `cfg`, if any, out of both losses)."""
    import numpy as np

    from xenith_edu.model import forward, loss_and_grads

    logits, loss = their_step(model, x, y, cfg.pad_token_id)
    our_loss, grads = loss_and_grads(params, cfg, x, y)
    assert np.abs(forward(params, cfg, x)[0] - logits).max() <= tol
    assert abs(our_loss - loss) <= tol
    assert_grads_match(grads, cfg, model, tol)
