"""Hugging Face LLaMA checkpoints in the book's model: config.json, safetensors, tokenizer.json.
See the chapter "A real LLaMA". NumPy only: this package never imports transformers or torch.
"""

from .folder import HFModel, read_hf, write_hf
from .layout import config_from_hf, config_to_hf, pair_rows, params_from_hf, params_to_hf
from .safetensors import bf16_to_f32, read_safetensors, write_safetensors

__all__ = ["HFModel", "bf16_to_f32", "config_from_hf", "config_to_hf", "pair_rows",
           "params_from_hf", "params_to_hf", "read_hf", "read_safetensors", "write_hf",
           "write_safetensors"]
