"""A Hugging Face model folder: config.json, model.safetensors (or shards and their index) and
tokenizer.json, read into the book's parameters and written back from them.

Every file is foreign input: each is checked, and what is wrong is one ValueError naming the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...tools.boundedjson import read_json
from ...tools.util import atomic_write_text
from ..config import Config
from ..params import param_shapes
from ..tokenizer import BPETokenizer
from .extras import write_extras
from .layout import IGNORED, config_from_hf, config_to_hf, hf_names, params_from_hf, tensor_to_hf
from .safetensors import read_header, read_tensor, write_tensors

WEIGHTS, INDEX, CONFIG, TOKENIZER = ("model.safetensors", "model.safetensors.index.json",
                                     "config.json", "tokenizer.json")
MAX_CONFIG, MAX_INDEX = 2**20, 16 * 2**20  # bytes: real files are a few kB and a few 100 kB
FLOATS = ("F32", "BF16", "F16", "F64")  # the weights' dtypes a checkpoint may hold
Progress = Callable[[str], None]  # told each stage of long work, in a few words


class HFModel(NamedTuple):
    """A checkpoint in the book's terms: what a run folder needs to sample and train."""

    params: dict[str, np.ndarray]  # the contract's table, in `dtype`
    config: Config
    tokenizer: BPETokenizer | None  # from tokenizer.json; None if the folder has none


def _json(path: Path, max_bytes: int) -> object:
    try:
        return read_json(path, max_bytes=max_bytes)
    except ValueError as e:
        raise ValueError(f"{e}: use an intact Hugging Face folder") from None


def _shards(folder: Path) -> Mapping[Path, set[str] | None]:
    """Each weights file and the tensor names it holds, from the index when sharded."""
    if (folder / WEIGHTS).is_file():
        return {folder / WEIGHTS: None}
    if not (folder / INDEX).is_file():
        raise ValueError(f"'{folder}' has neither {WEIGHTS} nor {INDEX}: only safetensors "
                         "checkpoints are read (save the model with safe_serialization)")
    index = _json(folder / INDEX, MAX_INDEX)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"'{folder / INDEX}' has no weight_map object naming the shards")
    shards: dict[Path, set[str]] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
            raise ValueError(f"'{folder / INDEX}' maps '{name[:80]}' to {repr(file)[:80]}, "
                             "not a file name in the folder")
        shards.setdefault(folder / file, set()).add(name)
    return shards


class Stored(NamedTuple):
    """Where one tensor is: its shard, its checked header entry, the shard's data offset."""

    path: Path
    entry: tuple  # (dtype, shape, begin, end)
    start: int


def _headers(folder: Path, shards: Mapping[Path, set[str] | None]) -> dict[str, Stored]:
    """Where every tensor is, from every shard's header: all checked, nothing allocated but
    the headers."""
    entries: dict[str, Stored] = {}
    for path, names in shards.items():
        if not path.is_file():
            raise ValueError(f"'{folder / INDEX}' names shard '{path.name}', which is missing")
        got, start = read_header(path)
        if names is not None and not names <= set(got):
            lost = sorted(names - set(got))[:1]
            raise ValueError(f"shard '{path}' lacks tensor {lost} that its index names")
        entries.update({k: Stored(path, e, start) for k, e in got.items()
                        if names is None or k in names})
    return entries


class Tensors(Mapping[str, np.ndarray]):
    """The checkpoint's tensors by name, each read from its shard when it is asked for and not
    kept: converting them takes the memory of the result and one tensor, not twice the model."""

    def __init__(self, stored: dict[str, Stored], progress: Progress) -> None:
        self.stored, self.say = stored, progress
        self.read: set[str] = set()  # the names asked for so far

    def __getitem__(self, name: str) -> np.ndarray:
        where = self.stored[name]
        with open(where.path, "rb") as f:
            a = read_tensor(f, where.path, name, where.entry, where.start)
        if name not in self.read:  # a tied embedding is read twice, counted once
            self.read.add(name)
            n, total = len(self.read), len(self.stored)
            if n % max(1, total // 10) == 0 or n == total:
                self.say(f"reading the weights: {n} of {total} tensors")
        return a

    def __iter__(self):
        return iter(self.stored)

    def __len__(self) -> int:
        return len(self.stored)


def check_size(cfg: Config, entries: dict[str, Stored], folder: Path) -> int:
    """The size gate, before any array is allocated: the parameters config.json implies are the
    values the safetensors headers hold (a buffer of older files and a tied copy of the
    embedding aside). Returns the count; ValueError naming both figures if they differ."""
    for name, where in entries.items():
        if where.entry[0] not in FLOATS and not name.endswith(IGNORED):
            raise ValueError(f"the checkpoint's tensor '{name[:80]}' holds {where.entry[0]}, not "
                             f"floating-point weights ({', '.join(FLOATS)})")
    per_layer = 9  # tensors per layer; listing the names costs no more than the headers did
    missing = (sorted(set(hf_names(cfg)) - set(entries))
               if per_layer * cfg.n_layer <= len(entries) + per_layer else [])
    if missing:
        raise ValueError(f"the checkpoint lacks tensor '{missing[0]}' (and {len(missing) - 1} "
                         "more) that config.json implies")
    implied = sum(math.prod(s) for s in param_shapes(cfg).values())
    held = sum(math.prod(where.entry[1]) for name, where in entries.items()
               if not name.endswith(IGNORED)
               and not (cfg.tie_embeddings and name == "lm_head.weight"))
    if implied != held:
        raise ValueError(f"'{folder / CONFIG}' implies {implied:,} parameters, but the "
                         f"safetensors files hold {held:,} values: config.json does not "
                         "describe these weights; nothing was written")
    return implied


def _tokenizer(folder: Path, cfg: Config) -> BPETokenizer | None:
    """The folder's tokenizer, through its gate, and the rule of its size against the model's."""
    if not (folder / TOKENIZER).is_file():
        return None
    tokenizer = BPETokenizer.from_file(folder / TOKENIZER)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"'{folder / TOKENIZER}' has {tokenizer.vocab_size} tokens, more "
                         f"than the model's vocab_size {cfg.vocab_size}")
    return tokenizer


def read_hf(folder: str | Path, dtype: type = np.float32,
            progress: Progress | None = None) -> HFModel:
    """The model of a Hugging Face LLaMA folder, in the book's layout and in `dtype`.

    bfloat16 and float16 weights become float32 exactly. Every file passes its gate first
    (config.json, the index, every safetensors header, the size they imply together,
    tokenizer.json), so a refusal allocates nothing: ValueError naming the file and the field.
    """
    folder, say = Path(folder), progress or (lambda s: None)
    if not folder.is_dir():
        raise ValueError(f"'{folder}' is not a folder: pass a Hugging Face model folder "
                         f"(with {CONFIG} and {WEIGHTS})")
    if not (folder / CONFIG).is_file():
        raise ValueError(f"'{folder}' has no {CONFIG}: pass a Hugging Face model folder")
    hf = _json(folder / CONFIG, MAX_CONFIG)  # its errors name the file
    try:
        cfg = config_from_hf(hf)
    except ValueError as e:
        raise ValueError(f"'{folder / CONFIG}': {e}") from None
    stored = _headers(folder, _shards(folder))
    check_size(cfg, stored, folder)
    tokenizer = _tokenizer(folder, cfg)
    say(f"reading {len(stored)} tensors from {folder}")
    return HFModel(params_from_hf(Tensors(stored, say), cfg, dtype), cfg, tokenizer)


def write_hf(folder: str | Path, params: dict[str, np.ndarray], cfg: Config,
             tokenizer: BPETokenizer | None = None,
             progress: Progress | None = None) -> list[Path]:
    """Write a folder that transformers' `from_pretrained` loads with the same logits: the
    config, the weights (float32, or float64 if the parameters are), the tokenizer, and the
    generation and tokenizer settings (`extras`). The weights are written one tensor at a time:
    the memory it takes is one tensor's."""
    folder, say = Path(folder), progress or (lambda s: None)
    folder.mkdir(parents=True, exist_ok=True)
    names, shapes = hf_names(cfg), param_shapes(cfg)
    dtype = params["wte"].dtype
    layout = {}
    for key, (ours, l) in names.items():
        shape = shapes[ours] if l is None else shapes[ours][1:]
        flipped = len(shape) == 2 and ours not in ("wte", "lm_head")  # (in, out) -> (out, in)
        layout[key] = (dtype, shape[::-1] if flipped else shape)
    done = [0]

    def told(name: str) -> None:
        done[0] += 1
        if done[0] % max(1, len(layout) // 10) == 0 or done[0] == len(layout):
            say(f"writing {WEIGHTS}: {done[0]} of {len(layout)} tensors")

    write_tensors(folder / WEIGHTS, layout, lambda key: tensor_to_hf(params, cfg, key),
                  {"format": "pt"}, told)
    written = [folder / WEIGHTS, folder / CONFIG]
    hf = config_to_hf(cfg)
    hf["torch_dtype"] = str(dtype)
    atomic_write_text(folder / CONFIG, json.dumps(hf, indent=2) + "\n")
    if tokenizer is not None:
        atomic_write_text(folder / TOKENIZER, tokenizer.spec)
        written.append(folder / TOKENIZER)
    return written + write_extras(folder, cfg, tokenizer)
