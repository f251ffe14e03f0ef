"""LoRA adapters as a peft adapter folder: adapter_config.json and adapter_model.safetensors
with peft's key names, which `peft.PeftModel.from_pretrained` loads over the base model that
to-hf writes; and back, through one gate.

Shape legend: L layers, r rank, n in, m out of the adapted projection. peft stores each layer's
lora_A (r, n) and lora_B (m, r), as ours are stacked (L, r, n) and (L, m, r). The only change
of layout: the output rows of q's and k's lora_B, re-paired from our interleaved RoPE pairs to
rotate-half ones, as q_proj's and k_proj's rows are (`layout.pair_rows`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...tools.boundedjson import read_json
from ...tools.util import atomic_write_text
from ..adapters import TARGETS, Adapters, LoraSpec, adapter_shapes, check_adapters
from ..config import Config
from .layout import pair_rows
from .safetensors import read_safetensors, write_safetensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model.model.layers"  # peft's names: PeftModel > LlamaForCausalLM > model


def _rows(cfg: Config, t: str) -> np.ndarray | None:
    """Our output rows of target t in the checkpoint's pairing (q and k only), else None."""
    heads = {"q": cfg.n_head, "k": cfg.n_kv_head}.get(t)
    return None if heads is None else pair_rows(heads, cfg.head_dim)


def adapter_names(cfg: Config, spec: LoraSpec) -> dict[str, tuple[str, int]]:
    """peft's tensor name -> (our adapter array, layer)."""
    names = {}
    for l in range(cfg.n_layer):
        for t in spec.targets:
            for part in ("A", "B"):
                module = TARGETS[t][1]
                names[f"{_PREFIX}.{l}.{module}.lora_{part}.weight"] = (f"lora_{part}.{t}", l)
    return names


def adapters_to_peft(adapters: Adapters, cfg: Config) -> dict[str, np.ndarray]:
    """Each layer's lora_A and lora_B under peft's names, in the checkpoint's layout."""
    out = {}
    for key, (ours, l) in adapter_names(cfg, adapters.spec).items():
        w = adapters.weights[ours][l]  # (r, n) or (m, r)
        rows = _rows(cfg, ours[-1]) if ours.startswith("lora_B") else None
        out[key] = np.ascontiguousarray(w if rows is None else w[np.argsort(rows)])
    return out


def peft_config(spec: LoraSpec, base: str = "") -> dict:
    """adapter_config.json: peft's LoRA on the spec's modules, no dropout, no bias."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(spec.rank),
            "lora_alpha": float(spec.alpha), "lora_dropout": 0.0, "bias": "none",
            "target_modules": [TARGETS[t][1].split(".")[-1] for t in spec.targets],
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "base_model_name_or_path": base}


def write_adapter_folder(folder: str | Path, adapters: Adapters, cfg: Config,
                         base: str = "") -> list[Path]:
    """Write a folder that `peft.PeftModel.from_pretrained(model, folder)` loads; `base` names
    the base model's folder in its config. Each file written atomically."""
    folder = Path(folder)
    check_adapters(adapters, cfg, adapters.weights[next(iter(adapters.weights))].dtype)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / ADAPTER_WEIGHTS, adapters_to_peft(adapters, cfg), {"format": "pt"})
    atomic_write_text(folder / ADAPTER_CONFIG,
                      json.dumps(peft_config(adapters.spec, base), indent=2) + "\n")
    return [folder / ADAPTER_WEIGHTS, folder / ADAPTER_CONFIG]


def spec_from_peft(conf: object) -> LoraSpec:
    """The LoraSpec of an adapter_config.json, refused in one line if ours cannot hold it."""
    if not isinstance(conf, dict):
        raise ValueError(f"{ADAPTER_CONFIG} is a {type(conf).__name__}, not a JSON object")
    if conf.get("peft_type") != "LORA":
        raise ValueError(f"{ADAPTER_CONFIG} peft_type = {conf.get('peft_type')!r}: only LORA")
    for key, allowed in (("use_dora", (False, None)), ("use_rslora", (False, None)),
                         ("fan_in_fan_out", (False, None)), ("bias", ("none", None)),
                         ("modules_to_save", (None, [])), ("layers_to_transform", (None,)),
                         ("rank_pattern", ({}, None)), ("alpha_pattern", ({}, None))):
        if conf.get(key) not in allowed:
            raise ValueError(f"{ADAPTER_CONFIG} {key} = {conf.get(key)!r}: the book's LoRA "
                             f"reads only {allowed[0]!r}")
    modules = conf.get("target_modules")
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ValueError(f"{ADAPTER_CONFIG} target_modules = {modules!r}: expected a list of "
                         "module names")
    ours = {v[1].split(".")[-1]: t for t, v in TARGETS.items()}
    unknown = [m for m in modules if m not in ours]
    if unknown:
        raise ValueError(f"{ADAPTER_CONFIG} targets {unknown}: the book's LoRA adapts "
                         f"{', '.join(ours)}")
    return LoraSpec(conf.get("r", 0), conf.get("lora_alpha", 8),
                    tuple(ours[m] for m in modules))


def read_adapter_folder(folder: str | Path, cfg: Config, dtype: type = np.float32) -> Adapters:
    """The adapters of a peft folder for the base `cfg`: every tensor checked (names, shapes,
    finite values) before it is used; ValueError naming what is wrong."""
    folder = Path(folder)
    spec = spec_from_peft(read_json(folder / ADAPTER_CONFIG, max_bytes=2**20))  # bounded
    names = adapter_names(cfg, spec)
    tensors = read_safetensors(folder / ADAPTER_WEIGHTS)
    missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
    if missing or extra:
        raise ValueError(f"{ADAPTER_WEIGHTS} lacks {missing[:2]} or has unexpected {extra[:2]} "
                         "for its adapter_config.json and the base model")
    weights: dict[str, np.ndarray] = {k: np.empty(s, dtype)
                                      for k, s in adapter_shapes(cfg, spec).items()}
    for key, (ours, l) in names.items():
        w = tensors[key]
        if w.shape != weights[ours].shape[1:]:
            raise ValueError(f"{ADAPTER_WEIGHTS} tensor '{key}' has shape {w.shape}, the base "
                             f"model implies {weights[ours].shape[1:]}")
        rows = _rows(cfg, ours[-1]) if ours.startswith("lora_B") else None
        weights[ours][l] = w if rows is None else w[rows]
    return check_adapters(Adapters(spec, weights), cfg, np.dtype(dtype))


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_names", "adapters_to_peft",
           "peft_config", "read_adapter_folder", "spec_from_peft", "write_adapter_folder"]
