"""The published config.json of each family the book reads, as the Hub serves them, and a tiny
random folder of each: the same file with fewer layers (and a small vocabulary where the ids in
the file allow it), random weights, and a BPE tokenizer trained here. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from transformers.initialization import no_init_weights

# -- the published files (the fields every one of them has; transformers' own defaults fill
#    the rest exactly as it does for the downloaded file) --------------------------------------

SMOLLM_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.02, "intermediate_size": 1536, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
    "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152,
}
SMOLLM2_135M = {
    **SMOLLM_135M, "max_position_embeddings": 8192, "rope_theta": 100000,
    "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "is_llama_config": True,
    "rope_interleaved": False, "pad_token_id": None,
}
SMOLLM2_360M = {
    **SMOLLM2_135M, "hidden_size": 960, "intermediate_size": 2560, "num_attention_heads": 15,
    "num_hidden_layers": 32, "num_key_value_heads": 5,
}
TINYLLAMA = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False,
    "torch_dtype": "float32", "transformers_version": "4.31.0.dev0", "use_cache": True,
    "vocab_size": 32000,
}

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
    "use_cache": True, "vocab_size": 32000,
}

SMOLLM3_3B = {
    "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536,
    "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3",
    "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0] * 9,
    "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4,
    "pad_token_id": 128004, "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0", "use_cache": False,
    "use_sliding_window": False, "vocab_size": 128256,
}

# google/gemma-3-1b-it (Gemma3ForCausalLM, the text model): GeGLU, gains 1 + w, four norms a
# layer, the scaled embedding, QK-norm, five windowed layers (RoPE base 10000) to one global
# (1e6); its file predates layer_types and names the pattern
GEMMA_3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144,
}

# The new families in the order, and for the float64 tests each one narrowed: the same
# file with widths, heads and (Mistral) window small, every relation between them kept (the
# query heads per key/value head, Qwen3's head width of twice the model width over the heads,
# a window shorter than the test's 12 tokens so that it is active). The vocabulary is cut to the
# test's: the special ids of these files then lie outside it and read as none.
NEW = {"Llama-3.2-1B": LLAMA_3_2_1B, "Qwen2.5-0.5B": QWEN2_5_0_5B, "Qwen3-0.6B": QWEN3_0_6B,
       "Mistral-7B-v0.1": MISTRAL_7B, "SmolLM3-3B": SMOLLM3_3B, "Gemma-3-1B": GEMMA_3_1B}
NARROW = {
    "Llama-3.2-1B": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                     "num_key_value_heads": 1, "head_dim": 8},  # its 4 frequencies at
    # theta 500000 fall in all three of Llama 3's bands (kept, blended, divided)
    "Qwen2.5-0.5B": {"hidden_size": 28, "intermediate_size": 48, "num_attention_heads": 7,
                     "num_key_value_heads": 1},
    "Qwen3-0.6B": {"hidden_size": 16, "intermediate_size": 48, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 16},
    "SmolLM3-3B": {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
                   "num_key_value_heads": 1, "num_hidden_layers": 4,
                   "no_rope_layers": [1, 1, 1, 0]},  # four layers: the fourth without RoPE
    "Mistral-7B-v0.1": {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
                        "num_key_value_heads": 1, "sliding_window": 4},
    # 1152 wide, 4 heads of 256 (queries 1024 wide: 9/8), 1 key/value head; narrowed to 36
    # wide, 4 heads of 8. The scores' scale at 27B's rule (query_pre_attn_scalar = width /
    # heads, not the head width) so that it is not head_dim's; a window of 4 of the test's 12
    # tokens; the pattern 2 so that the two layers are one windowed, one global
    "Gemma-3-1B": {"hidden_size": 36, "intermediate_size": 48, "num_attention_heads": 4,
                   "num_key_value_heads": 1, "head_dim": 8, "query_pre_attn_scalar": 9,
                   "sliding_window": 4, "sliding_window_pattern": 2},
}

# Windows by each family's own switch, beside the published files (which switch them off):
# Qwen2.5 from max_window_layers on, Qwen3 by layer_types, SmolLM3 on its layers without RoPE
WINDOWED = {"Qwen2.5-0.5B windowed": QWEN2_5_0_5B, "Qwen3-0.6B windowed": QWEN3_0_6B,
            "SmolLM3-3B windowed": SMOLLM3_3B}
NARROW.update({
    "Qwen2.5-0.5B windowed": {**NARROW["Qwen2.5-0.5B"], "use_sliding_window": True,
                              "sliding_window": 4, "max_window_layers": 1},
    "Qwen3-0.6B windowed": {**NARROW["Qwen3-0.6B"], "use_sliding_window": True,
                            "sliding_window": 3,
                            "layer_types": ["sliding_attention", "full_attention"]},
    "SmolLM3-3B windowed": {**NARROW["SmolLM3-3B"], "use_sliding_window": True,
                            "sliding_window": 5},
})

TODAY = {"SmolLM-135M": SMOLLM_135M, "SmolLM2-135M": SMOLLM2_135M,
         "SmolLM2-360M": SMOLLM2_360M, "TinyLlama-1.1B": TINYLLAMA}

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 12


def their_windows(cfg) -> list[int | None]:
    """Each layer's window as transformers' model of the family reads its config (None: the
    layer sees every earlier position): Mistral's attention takes config.sliding_window on every
    layer; Qwen2's, Qwen3's and Gemma 3's on the layers layer_types calls sliding_attention;
    SmolLM3's there once use_sliding_window is on; LLaMA's never."""
    L, kind = cfg.num_hidden_layers, cfg.model_type
    if kind == "llama":
        return [None] * L
    if kind == "mistral":
        return [cfg.sliding_window] * L
    on = kind != "smollm3" or cfg.use_sliding_window
    return [cfg.sliding_window if on and t == "sliding_attention" else None
            for t in cfg.layer_types]


def bpe_json(vocab: int = 120) -> str:
    """A byte-level BPE tokenizer.json trained on TEXT, special tokens 0..3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + vocab, initial_alphabet=alphabet,
                                  special_tokens=["<s>", "</s>", "<pad>", "<unk>"])
    tok.train_from_iterator([TEXT], trainer)
    return tok.to_str()


def reduced(published: dict, layers: int = 2, vocab: int | None = None) -> dict:
    """The published file with `layers` layers and, if given, a vocabulary of `vocab` rows
    (only when every special id of the file stays in the table)."""
    hf = {**published, "num_hidden_layers": layers}
    if vocab is not None:
        hf["vocab_size"] = vocab
        if (hf.get("pad_token_id") or 0) >= vocab:  # transformers' embedding needs its pad row
            hf["pad_token_id"] = None
    return hf


def tiny_model(hf: dict, seed: int = 0, scale: float = 0.02, dtype=torch.float32):
    """A random model of config.json `hf` (transformers' AutoConfig reads it as the file)."""
    torch.manual_seed(seed)
    hf = json.loads(json.dumps(hf))  # a copy all the way down: transformers changes the nested
    # rope_scaling it is given, and the published files are shared by every test
    cfg = transformers.AutoConfig.for_model(**hf)
    cfg._attn_implementation = "eager"
    with no_init_weights():  # its own draws are replaced below: not made twice
        m = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype)
    m.tie_weights()  # what the skipped initialisation would have tied
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0, scale)
    return m.eval()


def tiny_folder(folder: Path, published: dict, spec: str | None = None,
                narrowed: dict | None = None, **kw) -> Path:
    """A Hugging Face folder of the family `published` (with the `narrowed` fields, if given):
    2 layers, random weights, the vocabulary of tokenizer `spec` (a few spare rows), its
    tokenizer.json."""
    spec = spec or bpe_json()
    V = json.loads(spec)["model"]["vocab"].__len__() + 8
    m = tiny_model({**reduced(published, vocab=V), **(narrowed or {})}, **kw)
    m.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(spec, encoding="utf-8")
    return folder
