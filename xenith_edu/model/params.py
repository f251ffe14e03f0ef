"""The parameter table: each parameter's shape rule, its kind, and whether it gets weight decay.
One source for every list of parameter names (model, optimizer, command line, tests, benchmarks).

Shape legend: V vocab, d width, L layers, f SwiGLU hidden width, dq = n_head * head_dim the
width of the queries (d unless head_dim is given), dkv = n_kv_head * head_dim the width of the
keys and of the values (d without grouped-query attention), hd head width.

`PARAMS` is the contract's table, the book's LLaMA; `OPEN_PARAMS` the parameters that the open
models add (biases, QK-norm gains, Gemma 3's norms after the blocks), each present when its
Config field asks for it. With Config.norm_plus_one (Gemma) a gain is stored as w in 1 + w: it
starts at zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .config import Config


class Param(NamedTuple):
    """One row of the contract's parameter table."""

    name: str
    shape: Callable[[Config], tuple[int, ...]]  # the shape rule, from the config
    kind: str  # "gain" (RMSNorm, starts at one), "matrix" (linear weight), "embedding" or
    # "bias" (starts at zero)
    decay: bool  # whether AdamW's decoupled weight decay applies
    per_layer: bool  # a stack of shape (L, ...), one slice per layer
    untied_only: bool = False  # present only when the embeddings are not tied
    when: Callable[[Config], bool] | None = None  # present only when this holds (None: always)
    after: str = ""  # in forward order, right after this parameter of the table


# In forward order. The RMSNorm gains are the only parameters without weight decay.
PARAMS: tuple[Param, ...] = (
    Param("wte", lambda c: (c.vocab_size, c.n_embd), "embedding", True, False),
    Param("rms_attn", lambda c: (c.n_layer, c.n_embd), "gain", False, True),
    Param("wq", lambda c: (c.n_layer, c.n_embd, c.q_dim), "matrix", True, True),
    Param("wk", lambda c: (c.n_layer, c.n_embd, c.kv_dim), "matrix", True, True),
    Param("wv", lambda c: (c.n_layer, c.n_embd, c.kv_dim), "matrix", True, True),
    Param("wo", lambda c: (c.n_layer, c.q_dim, c.n_embd), "matrix", True, True),
    Param("rms_ffn", lambda c: (c.n_layer, c.n_embd), "gain", False, True),
    Param("w1", lambda c: (c.n_layer, c.n_embd, c.hidden), "matrix", True, True),
    Param("w3", lambda c: (c.n_layer, c.n_embd, c.hidden), "matrix", True, True),
    Param("w2", lambda c: (c.n_layer, c.hidden, c.n_embd), "matrix", True, True),
    Param("rms_final", lambda c: (c.n_embd,), "gain", False, False),
    Param("lm_head", lambda c: (c.vocab_size, c.n_embd), "matrix", True, False, untied_only=True),
)
# What the open models add, none of it in the book's LLaMA: biases and gains, no weight decay.
OPEN_PARAMS: tuple[Param, ...] = (
    Param("bq", lambda c: (c.n_layer, c.q_dim), "bias", False, True,
          when=lambda c: c.qkv_bias, after="wv"),
    Param("bk", lambda c: (c.n_layer, c.kv_dim), "bias", False, True,
          when=lambda c: c.qkv_bias, after="bq"),
    Param("bv", lambda c: (c.n_layer, c.kv_dim), "bias", False, True,
          when=lambda c: c.qkv_bias, after="bk"),
    Param("q_norm", lambda c: (c.n_layer, c.head_dim), "gain", False, True,
          when=lambda c: c.qk_norm, after="wv"),
    Param("k_norm", lambda c: (c.n_layer, c.head_dim), "gain", False, True,
          when=lambda c: c.qk_norm, after="q_norm"),
    Param("rms_attn_post", lambda c: (c.n_layer, c.n_embd), "gain", False, True,
          when=lambda c: c.post_norms, after="wo"),
    Param("rms_ffn_post", lambda c: (c.n_layer, c.n_embd), "gain", False, True,
          when=lambda c: c.post_norms, after="w2"),
)


def _in_forward_order() -> tuple[Param, ...]:
    order = list(PARAMS)
    for p in OPEN_PARAMS:  # each right after its `after`, behind what is already there
        at = order.index(next(q for q in order if q.name == p.after)) + 1
        while at < len(order) and order[at].after and order[at].name != p.after:
            at += 1
        order.insert(at, p)
    return tuple(order)


ALL_PARAMS = _in_forward_order()
PARAM = {p.name: p for p in ALL_PARAMS}
LAYER_PARAMS = tuple(p.name for p in PARAMS if p.per_layer)  # the contract's (L, ...) stacks


def present(p: Param, cfg: Config) -> bool:
    """Whether the model `cfg` has parameter `p`."""
    return not (p.untied_only and cfg.tie_embeddings) and (p.when is None or p.when(cfg))


def layer_names(cfg: Config) -> tuple[str, ...]:
    """The (L, ...) stacks of `cfg`, in forward order: the contract's and the open models'."""
    return tuple(p.name for p in ALL_PARAMS if p.per_layer and present(p, cfg))


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The parameter keys and shapes of `cfg`, in forward order: the contract's table, and the
    open models' parameters that `cfg` asks for."""
    return {p.name: p.shape(cfg) for p in ALL_PARAMS if present(p, cfg)}


def decays(name: str) -> bool:
    """Whether weight decay applies to parameter `name`: matrices and embeddings yes, gains no;
    LoRA's adapter matrices (`model.adapters`, named lora_A.<t>, lora_B.<t>) yes."""
    if name.startswith(("lora_A.", "lora_B.")):
        return True
    return PARAM[name].decay


def init_params(cfg: Config, seed: int = 0, dtype: type = np.float32) -> dict[str, np.ndarray]:
    """Weights drawn from N(0, 0.02**2), RMSNorm gains set to one (w = 0 in Gemma's 1 + w),
    biases to zero."""
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(cfg).items():
        if PARAM[name].kind == "gain":
            params[name] = (np.zeros if cfg.norm_plus_one else np.ones)(shape, dtype=dtype)
        elif PARAM[name].kind == "bias":
            params[name] = np.zeros(shape, dtype=dtype)
        else:
            params[name] = (0.02 * rng.standard_normal(shape)).astype(dtype)
    return params


def random_params(cfg: Config, rng: np.random.Generator, scale: float = 0.4,
                  gain_spread: float = 0.3, dtype: type = np.float64) -> dict[str, np.ndarray]:
    """Non-degenerate parameters for gradient checks: weights N(0, scale²), gains 1 + spread·N(0,1)
    (w = spread·N(0,1) when the gain is 1 + w, Config.norm_plus_one).

    Init-scale weights (0.02) make every layer nearly linear and every gain exactly one, so a
    wrong gradient can hide; these make every term of the backward pass matter.
    """
    params: dict[str, np.ndarray] = {}
    one = 0.0 if cfg.norm_plus_one else 1.0
    for name, shape in param_shapes(cfg).items():
        if PARAM[name].kind == "gain":
            params[name] = (one + gain_spread * rng.standard_normal(shape)).astype(dtype)
        else:
            params[name] = (scale * rng.standard_normal(shape)).astype(dtype)
    return params
