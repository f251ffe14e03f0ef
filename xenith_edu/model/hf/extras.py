"""The files beside the weights that transformers reads to generate: generation_config.json
(the begin, end and padding ids, so that `generate` stops) and tokenizer_config.json.

Both are made from the `Config`, whose special-token ids from-hf kept, and the tokenizer.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...tools.util import atomic_write_text
from ..config import Config
from ..tokenizer import BPETokenizer
from .layout import token_ids

GENERATION, TOKENIZER_CONFIG = "generation_config.json", "tokenizer_config.json"


def generation_config(cfg: Config) -> dict:
    """generation_config.json: the special tokens' ids (the end may be several)."""
    return {"_from_model_config": True, **token_ids(cfg)}


def token_strings(spec: str) -> dict[int, str]:
    """Each token id of a tokenizer.json's text and its string (the added tokens' too)."""
    data = json.loads(spec)
    vocab = data.get("model", {}).get("vocab", {}) if isinstance(data, dict) else {}
    out = {i: t for t, i in vocab.items()} if isinstance(vocab, dict) else {}
    for added in data.get("added_tokens", []) if isinstance(data, dict) else []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            out[added["id"]] = added.get("content")
    return out


def tokenizer_config(cfg: Config, tokenizer: BPETokenizer) -> dict:
    """tokenizer_config.json for transformers' fast tokenizer over tokenizer.json, naming the
    begin, end and padding tokens by their strings (the first end token when there are several)."""
    strings = token_strings(tokenizer.spec)
    out: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.seq_len,
                 "add_bos_token": False, "add_eos_token": False,
                 "clean_up_tokenization_spaces": False}
    for key, value in token_ids(cfg).items():
        first = value[0] if isinstance(value, list) else value
        if first is not None and strings.get(first) is not None:
            out[key.replace("_id", "")] = strings[first]
    return out


def write_extras(folder: Path, cfg: Config, tokenizer: BPETokenizer | None) -> list[Path]:
    """Write generation_config.json, and tokenizer_config.json if there is a tokenizer."""
    files = {folder / GENERATION: generation_config(cfg)}
    if tokenizer is not None:
        files[folder / TOKENIZER_CONFIG] = tokenizer_config(cfg, tokenizer)
    for path, data in files.items():
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return list(files)


__all__ = ["generation_config", "token_strings", "tokenizer_config", "write_extras"]
