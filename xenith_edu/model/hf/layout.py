"""A Hugging Face LLaMA, Qwen2.5, Qwen3, Mistral, SmolLM3 or Gemma 3 (text) in the book's layout
and back: config.json as a `Config`, the weights transposed, q and k rows re-paired from
rotate-half to interleaved.

Shape legend: V vocab, d width, H heads, Hkv key/value heads, hd head width, f SwiGLU hidden,
L layers. A checkpoint's nn.Linear weight is (out, in); ours is (in, out).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...tools.util import copy_transposed
from ..config import Config, window_of
from ..params import param_shapes

INT_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "n_embd",
              "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
              "intermediate_size": "ffn_hidden", "max_position_embeddings": "seq_len"}
IGNORED = ("rotary_emb.inv_freq",)  # buffers older checkpoints store: recomputed, not learned


def _refuse(field: str, value: object, why: str) -> ValueError:
    return ValueError(f"config.json field {field} = {value!r}: {why}; nothing was written")


def _int(hf: dict, key: str, default: int | None = None, where: str = "") -> int:
    """Field `key` of `hf` (or `default`), a positive int; ValueError naming it otherwise."""
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not value > 0:
        raise _refuse(where + key, value, "expected a positive int")
    return value


def _float(hf: dict, key: str, default: float | None = None, where: str = "") -> float:
    """Field `key` of `hf` (or `default`), a positive number that a float holds (an int as
    written: 8 stays 8); ValueError naming it otherwise."""
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= sys.float_info.max:
        raise _refuse(where + key, value, "expected a positive float")
    return value


def _rope(hf: dict) -> dict[str, Any]:
    """The Config's RoPE fields: rope_theta, at the top (older files) or in rope_scaling /
    rope_parameters (transformers 5), and Llama 3's frequency scaling if the file asks for it."""
    out: dict[str, Any] = {"rope_theta": float(_float(hf, "rope_theta"))}
    for key in ("rope_scaling", "rope_parameters"):
        rope = hf.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise _refuse(key, rope, "expected a JSON object or null")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "llama3", "linear"):
            raise _refuse(key, kind, "the book's RoPE has the plain frequencies, Llama 3's and "
                                     "the linear scaling only, so this checkpoint cannot be "
                                     "represented")
        if "rope_theta" in rope:
            out["rope_theta"] = float(_float(rope, "rope_theta"))
        if kind == "linear":
            out.update(rope_scaling="linear", rope_factor=_float(rope, "factor", None,
                                                                  f"{key}."))
        if kind == "llama3":
            out.update(rope_scaling="llama3", **{ours: (_float if kind_ is float else _int)(
                                                      rope, theirs, None, f"{key}.")
                                                  for theirs, (ours, kind_) in LLAMA3.items()})
    return out


LLAMA3 = {"factor": ("rope_factor", float), "low_freq_factor": ("rope_low_freq_factor", float),
          "high_freq_factor": ("rope_high_freq_factor", float),
          "original_max_position_embeddings": ("rope_original_context", int)}
# model_type -> the architecture transformers loads; each family's own fields in `_family`
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
            "smollm3": "SmolLM3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def _flag(hf: dict, key: str, allowed: bool, why: str) -> None:
    value = hf.get(key, False)
    if not isinstance(value, bool) or (value and not allowed):
        raise _refuse(key, value, why)


def _nope_layers(hf: dict, n_layer: int) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: no_rope_layers (1 = RoPE, 0 = none, one per layer), or
    by default every no_rope_layer_interval-th layer, as transformers makes them."""
    flags = hf.get("no_rope_layers")
    if flags is None:
        every = _int(hf, "no_rope_layer_interval", 4)
        flags = [int((l + 1) % every != 0) for l in range(n_layer)]
    if not isinstance(flags, list) or len(flags) < n_layer or any(
            f not in (0, 1) or isinstance(f, bool) for f in flags):
        raise _refuse("no_rope_layers", flags, f"expected {n_layer} flags, 1 (RoPE) or 0 (none)")
    return tuple(l for l, f in enumerate(flags[:n_layer]) if f == 0)  # transformers reads a
    # layer's own flag: those of layers a file with fewer layers has not are never read


def _layer_types(hf: dict, n_layer: int, default: list[str]) -> list[str]:
    """config.json's layer_types (one of sliding_attention, full_attention per layer), or the
    family's `default` where the file has none; ValueError naming the field otherwise."""
    types = hf.get("layer_types")
    if types is None:
        return default
    if not isinstance(types, list) or len(types) != n_layer or any(
            t not in ("sliding_attention", "full_attention") for t in types):
        raise _refuse("layer_types", types, f"expected {n_layer} of sliding_attention and "
                                            "full_attention")
    return types


def _windows(hf: dict, kind: str, n_layer: int) -> dict[str, Any]:
    """Which layers see a window, by transformers' rule for each family: Mistral's every layer
    (sliding_window set); Qwen2's and Qwen3's the layers from max_window_layers on, SmolLM3's
    the layers without RoPE, once use_sliding_window is true (layer_types, where the file has
    it, names them). As the book's model holds it: the window, and the layers without it."""
    if kind == "llama":
        _flag(hf, "use_sliding_window", False, "LlamaForCausalLM has no windowed layers")
        return {"sliding_window": None, "global_layers": ()}
    if kind == "mistral":  # transformers' Mistral reads no layer_types: every layer or none
        window = None if hf.get("sliding_window", 4096) is None else _int(hf, "sliding_window",
                                                                          4096)
        _layer_types(hf, n_layer, [])
        types = ["sliding_attention" if window else "full_attention"] * n_layer
        if hf.get("layer_types") not in (None, types):
            raise _refuse("layer_types", hf["layer_types"], "MistralForCausalLM windows every "
                                                            "layer or none")
    else:
        _flag(hf, "use_sliding_window", True, "")
        silent = None if kind == "smollm3" else 4096  # transformers' where the file says none
        on = hf.get("use_sliding_window", False) and hf.get("sliding_window", silent) is not None
        window = _int(hf, "sliding_window", silent) if on else None
        if kind == "smollm3":
            nope = set(_nope_layers(hf, n_layer))
            default = ["sliding_attention" if on and l in nope else "full_attention"
                       for l in range(n_layer)]
        else:
            first = hf.get("max_window_layers", 28)  # 0: every layer windowed
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                raise _refuse("max_window_layers", first, "expected an int >= 0")
            default = ["sliding_attention" if on and l >= first else "full_attention"
                       for l in range(n_layer)]
        types = _layer_types(hf, n_layer, default)
    windowed = [l for l, t in enumerate(types) if t == "sliding_attention" and window]
    if not windowed:
        return {"sliding_window": None, "global_layers": ()}
    return {"sliding_window": window,
            "global_layers": tuple(l for l in range(n_layer) if l not in windowed)}


def _family(hf: dict, kind: str, n_layer: int) -> dict[str, Any]:
    """What the family adds: Qwen2.5's q, k, v biases, Qwen3's QK-norm, the windows, SmolLM3's
    layers without RoPE; and the fields it would need that the book's model has not, refused
    by name."""
    _flag(hf, "mlp_bias", False, "the book's SwiGLU has no bias terms")
    _flag(hf, "attention_bias", False, "the book's attention has no bias on its output "
          "projection (Qwen2.5's biases on q, k and v only are read as model_type qwen2)")
    nope = _nope_layers(hf, n_layer) if kind == "smollm3" else ()
    return {"qkv_bias": kind == "qwen2", "qk_norm": kind == "qwen3", "nope_layers": nope,
            **_windows(hf, kind, n_layer)}


GEMMA_ACT = {"gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}  # hidden_activation -> ours
# What transformers' config class of each family takes for a field its config.json leaves out
# (null key/value heads: as many as the query heads; the window's own defaults in `_windows`)
_LLAMA = {"num_key_value_heads": None, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
          "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
SILENT: dict[str, dict[str, Any]] = {
    "llama": _LLAMA, "mistral": {**_LLAMA, "num_key_value_heads": 8},
    "qwen2": {**_LLAMA, "num_key_value_heads": 32, "bos_token_id": None, "eos_token_id": None},
    "qwen3": {**_LLAMA, "num_key_value_heads": 32, "head_dim": 128, "bos_token_id": None,
              "eos_token_id": None},
    "smollm3": {**_LLAMA, "num_key_value_heads": 4, "tie_word_embeddings": True,
                "rope_theta": 2_000_000.0, "pad_token_id": 128004, "bos_token_id": 128000,
                "eos_token_id": 128001},
    "gemma3_text": {**_LLAMA, "num_key_value_heads": 4, "head_dim": 256,
                    "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "pad_token_id": 0,
                    "eos_token_id": 1, "bos_token_id": 2},
}
GEMMA_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # its default bases


def _gemma_rope(hf: dict) -> dict:
    """Gemma 3's two RoPEs: the global layers' (rope_theta, with rope_scaling) and the windowed
    layers' (rope_local_base_freq, plain); transformers 5 writes them as rope_parameters per
    layer type."""
    per_type = hf.get("rope_parameters")
    if not (isinstance(per_type, dict) and set(per_type) & set(GEMMA_THETA)):
        out = _rope(hf)
        base = _float(hf, "rope_local_base_freq", GEMMA_THETA["sliding_attention"])
        return {**out, "local_rope_theta": float(base)}
    if set(per_type) - set(GEMMA_THETA):
        raise _refuse("rope_parameters", sorted(per_type), "expected full_attention and "
                                                           "sliding_attention only")
    full, local = (per_type.get(t) or {} for t in GEMMA_THETA)
    for name, rope in (("full_attention", full), ("sliding_attention", local)):
        if not isinstance(rope, dict):
            raise _refuse(f"rope_parameters.{name}", rope, "expected a JSON object")
    if local.get("rope_type", "default") != "default":
        raise _refuse("rope_parameters.sliding_attention.rope_type", local.get("rope_type"),
                      "Gemma 3's windowed layers turn at the plain frequencies")
    out = _rope({"rope_theta": GEMMA_THETA["full_attention"], "rope_parameters": full})
    theta = _float(local, "rope_theta", GEMMA_THETA["sliding_attention"],
                    "rope_parameters.sliding_attention.")
    return {**out, "local_rope_theta": float(theta)}


def _gemma_layers(hf: dict, n_layer: int) -> dict:
    """The window and the global layers: layer_types, or every sliding_window_pattern-th layer
    global (6 by default), as transformers makes them; every layer global: no window."""
    key = "_sliding_window_pattern" if "_sliding_window_pattern" in hf else \
        "sliding_window_pattern"
    every = _int(hf, key, 6) if hf.get("layer_types") is None else 1
    types = _layer_types(hf, n_layer, ["sliding_attention" if (l + 1) % every else
                                       "full_attention" for l in range(n_layer)])
    full = tuple(l for l, t in enumerate(types) if t == "full_attention")
    if len(full) == n_layer:
        return {"sliding_window": None, "global_layers": ()}
    return {"sliding_window": _int(hf, "sliding_window", 4096), "global_layers": full}


def _gemma(hf: dict, n_layer: int) -> dict:
    """What Gemma 3 adds: GeGLU, gains 1 + w, norms after the blocks, the scaled embedding,
    QK-norm, the scores' scale, local and global layers with their RoPEs; the fields the book's
    model has not (soft caps, bidirectional attention, biases) refused by name."""
    _flag(hf, "attention_bias", False, "the book's attention has no biases on Gemma's "
          "projections")
    for key, what in (("attn_logit_softcapping", "scores"), ("final_logit_softcapping",
                                                             "logits")):
        if hf.get(key) is not None:
            raise _refuse(key, hf[key], f"the book's model has no soft cap on its {what}")
    if hf.get("use_bidirectional_attention") not in (None, False):
        raise _refuse("use_bidirectional_attention", hf["use_bidirectional_attention"],
                      "the book's attention is causal")
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")
    if not isinstance(act, str) or act not in GEMMA_ACT:
        raise _refuse("hidden_activation", act, "the book's feed-forward gates with "
                                                f"{' or '.join(GEMMA_ACT)}")
    layers = _gemma_layers(hf, n_layer)
    rope = _gemma_rope(hf)
    if layers["sliding_window"] is None:
        rope["local_rope_theta"] = None  # no windowed layer reads it
    return {"activation": GEMMA_ACT[act], "norm_plus_one": True, "post_norms": True,
            "scale_embeddings": True, "qk_norm": True,
            "query_pre_attn_scalar": _int(hf, "query_pre_attn_scalar", 256),
            **layers, **rope}


TOKEN_FIELDS =  ("pad_token_id", "bos_token_id", "eos_token_id")  # same names in both


def _token_ids(hf: dict, key: str, vocab: int) -> int | tuple[int, ...] | None:
    """A special token's id (eos: one id or several) if it names a row of the table, else None:
    some files say -1 or null, and then the table has no such row."""
    value: Any = hf.get(key)  # JSON: anything, checked below
    many = isinstance(value, list) and key == "eos_token_id"
    ids = value if many else [value]
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                          for t in ids):
        return None
    return tuple(ids) if many else value


def config_from_hf(hf: object) -> Config:
    """The `Config` of a config.json of a family the book reads (already parsed); ValueError
    naming the field that the book's model cannot represent (RoPE scaling, biases, head_dim,
    activation, soft caps, type)."""
    if not isinstance(hf, dict):
        raise ValueError(f"config.json holds a {type(hf).__name__}, not a JSON object")
    kind = hf.get("model_type", "llama")
    if not isinstance(kind, str) or kind not in FAMILIES:
        raise _refuse("model_type", kind, f"the book reads {', '.join(FAMILIES)} checkpoints")
    gemma = kind == "gemma3_text"  # its gate is hidden_activation; transformers ignores hidden_act
    if not gemma and hf.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", hf.get("hidden_act"), "the book's SwiGLU gates with SiLU")
    hf = {**SILENT[kind], **hf}  # what transformers takes when the file says nothing
    sizes: dict[str, Any] = {ours: _int(hf, key) for key, ours in INT_FIELDS.items()}
    H = sizes["n_head"]
    hkv = H if hf["num_key_value_heads"] is None else _int(hf, "num_key_value_heads")
    head_dim = hf.get("head_dim")
    if head_dim is not None and _int(hf, "head_dim") % 2:
        raise _refuse("head_dim", head_dim, "RoPE turns pairs: a head's width must be even")
    tie = hf["tie_word_embeddings"]
    if not isinstance(tie, bool):
        raise _refuse("tie_word_embeddings", tie, "expected true or false")
    tokens: dict[str, Any] = {k: _token_ids(hf, k, sizes["vocab_size"]) for k in TOKEN_FIELDS}
    eps = float(_float(hf, "rms_norm_eps"))
    if gemma:  # its errors name its fields
        rope, family = {}, _gemma(hf, sizes["n_layer"])
    else:
        rope, family = _rope(hf), _family(hf, kind, sizes["n_layer"])
    try:
        return Config(**sizes, n_kv_head=hkv, tie_embeddings=tie, norm_eps=eps, family=kind,
                      head_width=head_dim, **rope, **family, **tokens)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.json describes a model the book's cannot be: {e}") from None


# what each family besides Gemma 3 can hold of the pieces the book's model has (a window with
# global layers beside it is "layer windows"), and what it always has: Qwen2's attention always
# has biases on q, k and v, Qwen3's always QK-norm; the first family that can hold a model is
# its writing family unless its own can
HOLDS = {"llama": (), "mistral": ("sliding_window",),
         "smollm3": ("nope_layers", "sliding_window", "layer windows"),
         "qwen2": ("qkv_bias", "sliding_window", "layer windows"),
         "qwen3": ("qk_norm", "sliding_window", "layer windows")}
ALWAYS = {"qwen2": "qkv_bias", "qwen3": "qk_norm"}


# what only Gemma 3 has, and what a gemma3_text always has
GEMMA_MARKS = ("norm_plus_one", "post_norms", "scale_embeddings", "query_pre_attn_scalar",
               "local_rope_theta", "activation")
GEMMA_ALWAYS = ("norm_plus_one", "post_norms", "scale_embeddings", "qk_norm")


def gemma_marks(cfg: Config) -> list[str]:
    """The fields of `cfg` that only Gemma 3 has (an activation other than SiLU among them)."""
    return [k for k in GEMMA_MARKS if getattr(cfg, k) not in (False, (), None, "silu")]


def _gemma_can_hold(cfg: Config, marks: list[str]) -> None:
    """ValueError naming the field if Gemma 3 cannot hold `cfg`, which has Gemma's `marks`."""
    lacking = [k for k in GEMMA_ALWAYS if not getattr(cfg, k)]
    if lacking:
        raise ValueError(f"no Hugging Face family has {marks[0]} without {lacking[0]}: this "
                         "model cannot be written as a transformers folder")
    extra = [k for k in ("qkv_bias", "nope_layers") if getattr(cfg, k)]
    if extra:
        raise ValueError(f"no Hugging Face family has all of {marks[0]} and {extra[0]}: this "
                         "model cannot be written as a transformers folder")
    if cfg.local_rope_theta is None and cfg.rope_scaling != "none" and cfg.sliding_window:
        raise ValueError("no Hugging Face family has windowed layers with rope_scaling beside "
                         "Gemma's local RoPE: set local_rope_theta")


def writing_family(cfg: Config) -> str:
    """The family a model is written as: its own, unless that cannot hold what the model has
    (biases, QK-norm, a window, Gemma 3's pieces), then the one family that can; ValueError
    naming the fields if none can (a mix that no transformers family has)."""
    marks = gemma_marks(cfg)
    if marks:
        _gemma_can_hold(cfg, marks)
        return "gemma3_text"
    has = [k for k in ("qkv_bias", "qk_norm", "nope_layers", "sliding_window") if getattr(cfg, k)]
    if cfg.global_layers:
        has.append("layer windows")
    can = [f for f, holds in HOLDS.items()
           if set(has) <= set(holds) and getattr(cfg, ALWAYS.get(f, "n_layer"))]
    if not can:
        raise ValueError(f"no Hugging Face family has all of {', '.join(has)}: this model "
                         "cannot be written as a transformers folder")
    return cfg.family if cfg.family in can else can[0]


def _gemma_to_hf(cfg: Config, scaling: dict | None) -> dict:
    """Gemma3ForCausalLM's config.json of `cfg` (the fields the families share are added)."""
    windowed = [cfg.sliding_window is not None and l not in cfg.global_layers
                for l in range(cfg.n_layer)]
    return {"hidden_activation": {v: k for k, v in GEMMA_ACT.items()}[cfg.activation],
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar or cfg.head_dim,
            "sliding_window": cfg.sliding_window or cfg.seq_len,  # no layer reads it if None
            "layer_types": ["sliding_attention" if w else "full_attention" for w in windowed],
            "rope_scaling": scaling, "rope_local_base_freq": cfg.local_rope_theta or cfg.rope_theta,
            "attn_logit_softcapping": None, "final_logit_softcapping": None,
            "use_bidirectional_attention": False}


def config_to_hf(cfg: Config) -> dict:
    """The config.json of `cfg` for transformers' model of its family (LlamaForCausalLM, ...)."""
    family = writing_family(cfg)
    scaling = None
    if cfg.rope_scaling == "llama3":
        scaling = {"rope_type": "llama3", **{theirs: getattr(cfg, ours)
                                              for theirs, (ours, _) in LLAMA3.items()}}
    if cfg.rope_scaling == "linear":
        scaling = {"rope_type": "linear", "factor": cfg.rope_factor}
    out = {"architectures": [FAMILIES[family]], "model_type": family,
           "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim,
           "tie_word_embeddings": cfg.tie_embeddings, "rms_norm_eps": cfg.norm_eps,
           "rope_theta": cfg.rope_theta, "rope_scaling": scaling,
           "torch_dtype": "float32", **token_ids(cfg)}
    windowed = [window_of(cfg, l) is not None for l in range(cfg.n_layer)]
    if family in ("smollm3", "qwen2", "qwen3"):  # the windowed layers named one by one
        out.update(use_sliding_window=any(windowed), sliding_window=cfg.sliding_window,
                   max_window_layers=windowed.index(True) if any(windowed) else cfg.n_layer,
                   layer_types=["sliding_attention" if w else "full_attention"
                                for w in windowed])
    if family == "smollm3":
        out["no_rope_layers"] = [int(l not in cfg.nope_layers) for l in range(cfg.n_layer)]
    if family == "mistral":
        out["sliding_window"] = cfg.sliding_window
    if family == "gemma3_text":
        for key in ("hidden_act", "mlp_bias"):
            del out[key]
        out.update(_gemma_to_hf(cfg, scaling))
    out.update({key: getattr(cfg, ours) for key, ours in INT_FIELDS.items()})
    return out


def token_ids(cfg: Config) -> dict[str, int | list[int] | None]:
    """The special tokens' ids as config.json and generation_config.json write them."""
    out = {k: getattr(cfg, k) for k in TOKEN_FIELDS}
    if isinstance(out["eos_token_id"], tuple):
        out["eos_token_id"] = list(out["eos_token_id"])
    return out


def pair_rows(n_heads: int, hd: int) -> np.ndarray:
    """For our output coordinate c*hd + 2i + r (pair i of head c), the checkpoint's row
    c*hd + r*hd/2 + i: rotate-half pairs coordinate i with i + hd/2, we pair 2i with 2i + 1,
    at the same angle, so moving the rows of q and k this way leaves every score q.k as it is."""
    j = np.arange(hd)  # (hd,) our coordinate 2i + r within a head
    where = (j % 2) * (hd // 2) + j // 2  # (hd,) its place r*hd/2 + i in the rotate-half head
    return (np.arange(n_heads)[:, None] * hd + where[None, :]).reshape(-1)  # (n_heads*hd,)


def hf_names(cfg: Config) -> dict[str, tuple[str, int | None]]:
    """Each checkpoint tensor name -> (our parameter, layer or None)."""
    names: dict[str, tuple[str, int | None]] = {"model.embed_tokens.weight": ("wte", None),
                                                "model.norm.weight": ("rms_final", None)}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = ("lm_head", None)
    per_layer = {"input_layernorm": "rms_attn", "post_attention_layernorm": "rms_ffn",
                 "self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv",
                 "self_attn.o_proj": "wo", "mlp.gate_proj": "w1", "mlp.up_proj": "w3",
                 "mlp.down_proj": "w2"}
    if cfg.post_norms:  # Gemma 3: post_attention_layernorm is the attention's output norm
        per_layer.update({"post_attention_layernorm": "rms_attn_post",
                          "pre_feedforward_layernorm": "rms_ffn",
                          "post_feedforward_layernorm": "rms_ffn_post"})
    extra: dict[str, str] = {}
    if cfg.qkv_bias:
        extra.update({"self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
                      "self_attn.v_proj.bias": "bv"})
    if cfg.qk_norm:
        extra.update({"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"})
    for l in range(cfg.n_layer):
        for hf, ours in per_layer.items():
            names[f"model.layers.{l}.{hf}.weight"] = (ours, l)
        for hf, ours in extra.items():
            names[f"model.layers.{l}.{hf}"] = (ours, l)
    return names


def _pairs(name: str, cfg: Config) -> np.ndarray | None:
    """The rows of a q or k tensor (weight, bias or per-head gain) in our pairing, else None."""
    heads = {"wq": cfg.n_head, "bq": cfg.n_head, "wk": cfg.kv_heads, "bk": cfg.kv_heads,
             "q_norm": 1, "k_norm": 1}.get(name)
    return None if heads is None else pair_rows(heads, cfg.head_dim)


def params_from_hf(tensors: Mapping[str, np.ndarray], cfg: Config,
                   dtype: type = np.float32) -> dict[str, np.ndarray]:
    """Our parameters from a checkpoint's tensors; ValueError naming a missing, misshapen or
    unexpected tensor. A tied checkpoint may also store lm_head.weight: it must equal wte."""
    shapes, names = param_shapes(cfg), hf_names(cfg)
    params: dict[str, np.ndarray] = {k: np.empty(s, dtype=dtype) for k, s in shapes.items()}
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise ValueError(f"the checkpoint lacks tensor '{missing[0]}' (and {len(missing) - 1} "
                         "more) that config.json implies")
    for key, w in tensors.items():
        if key.endswith(IGNORED):
            continue
        if key == "lm_head.weight" and cfg.tie_embeddings:
            if not np.array_equal(w, tensors["model.embed_tokens.weight"]):
                raise ValueError("config.json field tie_word_embeddings = true, but the "
                                 "checkpoint's lm_head.weight differs from its embed_tokens")
            continue
        if key not in names:
            raise ValueError(f"the checkpoint has tensor '{key}', which the book's model has "
                             "no place for")
        ours, l = names[key]
        want = shapes[ours][1:] if l is not None else shapes[ours]
        flipped = len(want) == 2 and ours not in ("wte", "lm_head")
        if w.shape != (want[::-1] if flipped else want):
            raise ValueError(f"the checkpoint's tensor '{key}' has shape {w.shape}, config.json "
                             f"implies {want[::-1] if flipped else want}")
        rows = _pairs(ours, cfg)
        w = w if rows is None else w[rows]  # q and k rows in our pairing
        into = params[ours] if l is None else params[ours][l]
        if flipped:  # (out, in) -> our (in, out)
            copy_transposed(into, w)
        else:
            into[...] = w
    bad = [k for k, p in params.items() if not np.isfinite(p).all()]
    if bad:
        raise ValueError(f"the checkpoint has non-finite values in {bad[0]}")
    return params


def params_to_hf(params: dict[str, np.ndarray], cfg: Config) -> dict[str, np.ndarray]:
    """The checkpoint's tensors of our parameters: the inverse of `params_from_hf`."""
    return {key: tensor_to_hf(params, cfg, key) for key in hf_names(cfg)}


def tensor_to_hf(params: dict[str, np.ndarray], cfg: Config, key: str) -> np.ndarray:
    """The checkpoint's tensor `key` of our parameters, alone (a writer makes one at a time)."""
    ours, l = hf_names(cfg)[key]
    w = params[ours] if l is None else params[ours][l]
    if w.ndim == 2 and ours not in ("wte", "lm_head"):  # (in, out) -> (out, in)
        t = np.empty(w.shape[::-1], w.dtype)
        copy_transposed(t, w)
        w = t
    rows = _pairs(ours, cfg)
    if rows is not None:
        w = w[np.argsort(rows)]  # the inverse permutation: back to rotate-half pairs
    return np.ascontiguousarray(w)
