"""A Hugging Face model folder: config.json, model.safetensors (or shards and their index) and
tokenizer.json, read into the book's parameters and written back from them.

Every file is foreign input: each is checked, and what is wrong is one ValueError naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...tools.util import atomic_write_text
from ..config import Config
from ..tokenizer import BPETokenizer
from .extras import write_extras
from .layout import config_from_hf, config_to_hf, params_from_hf, params_to_hf
from .safetensors import read_safetensors, write_safetensors

WEIGHTS, INDEX, CONFIG, TOKENIZER = ("model.safetensors", "model.safetensors.index.json",
                                     "config.json", "tokenizer.json")


class HFModel(NamedTuple):
    """A checkpoint in the book's terms: what a run folder needs to sample and train."""

    params: dict[str, np.ndarray]  # the contract's table, in `dtype`
    config: Config
    tokenizer: BPETokenizer | None  # from tokenizer.json; None if the folder has none


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else f"not JSON: {type(e).__name__}"
        raise ValueError(f"'{path}' cannot be read ({why}): use an intact Hugging Face "
                         "folder") from None


def _shards(folder: Path) -> dict[Path, set[str]]:
    """Each weights file and the tensor names it holds, from the index when sharded."""
    if (folder / WEIGHTS).is_file():
        return {folder / WEIGHTS: None}
    if not (folder / INDEX).is_file():
        raise ValueError(f"'{folder}' has neither {WEIGHTS} nor {INDEX}: only safetensors "
                         "checkpoints are read (save the model with safe_serialization)")
    index = _json(folder / INDEX)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"'{folder / INDEX}' has no weight_map object naming the shards")
    shards: dict[Path, set[str]] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
            raise ValueError(f"'{folder / INDEX}' maps '{name}' to {file!r}, not a file name "
                             "in the folder")
        shards.setdefault(folder / file, set()).add(name)
    return shards


def read_hf(folder: str | Path, dtype: type = np.float32) -> HFModel:
    """The model of a Hugging Face LLaMA folder, in the book's layout and in `dtype`.

    bfloat16 and float16 weights become float32 exactly. Raises ValueError naming the file and
    the field when something is damaged or cannot be represented by the book's model.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"'{folder}' is not a folder: pass a Hugging Face model folder "
                         f"(with {CONFIG} and {WEIGHTS})")
    if not (folder / CONFIG).is_file():
        raise ValueError(f"'{folder}' has no {CONFIG}: pass a Hugging Face model folder")
    try:
        cfg = config_from_hf(_json(folder / CONFIG))
    except ValueError as e:
        raise ValueError(f"'{folder / CONFIG}': {e}") from None
    tensors: dict[str, np.ndarray] = {}
    for path, names in _shards(folder).items():
        if not path.is_file():
            raise ValueError(f"'{folder / INDEX}' names shard '{path.name}', which is missing")
        got = read_safetensors(path, names)
        if names is not None and set(got) != names:
            lost = sorted(names - set(got))[:1]
            raise ValueError(f"shard '{path}' lacks tensor {lost} that its index names")
        tensors.update(got)
    params = params_from_hf(tensors, cfg, dtype)
    tokenizer = None
    if (folder / TOKENIZER).is_file():
        tokenizer = BPETokenizer.from_file(folder / TOKENIZER)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ValueError(f"'{folder / TOKENIZER}' has {tokenizer.vocab_size} tokens, more "
                             f"than the model's vocab_size {cfg.vocab_size}")
    return HFModel(params, cfg, tokenizer)


def write_hf(folder: str | Path, params: dict[str, np.ndarray], cfg: Config,
             tokenizer: BPETokenizer | None = None) -> list[Path]:
    """Write a folder that transformers' `from_pretrained` loads with the same logits: the
    config, the weights (float32, or float64 if the parameters are), the tokenizer, and the
    generation and tokenizer settings (`extras`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / WEIGHTS, folder / CONFIG]
    write_safetensors(folder / WEIGHTS, params_to_hf(params, cfg), {"format": "pt"})
    hf = config_to_hf(cfg)
    hf["torch_dtype"] = str(params["wte"].dtype)
    atomic_write_text(folder / CONFIG, json.dumps(hf, indent=2) + "\n")
    if tokenizer is not None:
        atomic_write_text(folder / TOKENIZER, tokenizer.spec)
        written.append(folder / TOKENIZER)
    return written + write_extras(folder, cfg, tokenizer)
