"""A backward never changes its cache: called twice on one cache it gives the same gradients.

The check is generated, not written per component. The components are found in the package
(every `*_backward` of a module `xenith_edu/<name>.py`, paired with its `*_forward`); their
arguments are traced from the model's own calls (a profile hook records what each `*_forward`
receives while `loss_and_grads` runs, for plain and flash attention, grouped-query heads, a
padding token, float32 and float64). A new component is checked as soon as the model calls it,
and `test_every_component_backward_is_checked` fails until it is.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
import sys
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, NamedTuple

import numpy as np
import pytest

import xenith_edu
from xenith_edu.model.adapters import LoraSpec, init_adapters
from xenith_edu.model.config import Config
from xenith_edu.model.params import random_params
from xenith_edu.model.transformer import loss_and_grads

NOT_COMPONENTS = {"chapters", "__main__"}  # top-level modules that are no component


class Pair(NamedTuple):
    """A component's forward and backward, found by name in its module."""

    forward: Callable[..., Any]
    backward: Callable[..., Any]


class Call(NamedTuple):
    """One traced call of a forward: its positional and keyword arguments, deep-copied."""

    args: tuple
    kwargs: dict


def component_modules() -> list[ModuleType]:
    """Every top-level module of the package that is no sub-package and no registry."""
    names = [m.name for m in pkgutil.iter_modules(xenith_edu.__path__)
             if not m.ispkg and m.name not in NOT_COMPONENTS]
    return [importlib.import_module(f"xenith_edu.{n}") for n in sorted(names)]


def component_pairs() -> dict[str, Pair]:
    """`module.name_backward` -> its pair, for every backward defined in a component module."""
    pairs = {}
    for mod in component_modules():
        for name, fn in vars(mod).items():
            if not (name.endswith("_backward") and callable(fn)
                    and getattr(fn, "__module__", None) == mod.__name__):
                continue
            forward = getattr(mod, name[: -len("_backward")] + "_forward", None)
            assert forward is not None, f"{mod.__name__}.{name} has no *_forward beside it"
            pairs[f"{mod.__name__}.{name}"] = Pair(forward, fn)
    return pairs


PAIRS = component_pairs()

# (config, dtype): the model's call sites of every component, with their real arguments
TRACED_MODELS = [
    (dict(vocab_size=13, n_embd=16, n_head=4, n_layer=2, seq_len=8), np.float64),
    (dict(vocab_size=11, n_embd=24, n_head=4, n_kv_head=2, n_layer=1, seq_len=9,
          attention="flash", flash_block=4, pad_token_id=0), np.float64),
    (dict(vocab_size=9, n_embd=16, n_head=2, n_layer=1, seq_len=7, tie_embeddings=False,
          attention="flash", flash_block=3), np.float32),
    # the open models' pieces: q, k, v biases, QK-norm, a head width of its own, a window,
    # Llama 3's RoPE scaling and a layer without RoPE
    (dict(vocab_size=10, n_embd=16, n_head=4, n_kv_head=2, n_layer=2, seq_len=8,
          head_width=6, qkv_bias=True, qk_norm=True, sliding_window=3, rope_scaling="llama3",
          nope_layers=(1,)), np.float64),
    # Gemma 3's: GeGLU, gains 1 + w, norms after the blocks, the scaled embedding, the scores'
    # own scale, a windowed layer and a global one with their own RoPE (linear on the global)
    (dict(vocab_size=10, n_embd=12, n_head=2, n_kv_head=1, n_layer=2, seq_len=8, head_width=8,
          qk_norm=True, activation="gelu_tanh", norm_plus_one=True, post_norms=True,
          scale_embeddings=True, query_pre_attn_scalar=5, sliding_window=3, global_layers=(1,),
          local_rope_theta=10.0, rope_scaling="linear", rope_factor=2.0), np.float32),
]
# LoRA: adapters on every target, the base frozen (its caches keep no input of a weight's product)
TRACED_LORA = [
    (dict(vocab_size=10, n_embd=16, n_head=4, n_kv_head=2, n_layer=2, seq_len=6, qkv_bias=True,
          qk_norm=True), np.float64, LoraSpec(3, 6.0, ("q", "k", "v", "o"))),
    (dict(vocab_size=9, n_embd=16, n_head=2, n_layer=1, seq_len=5, tie_embeddings=False,
          attention="flash", flash_block=2), np.float32, LoraSpec(2, 16.0, ("v", "o"))),
    (dict(vocab_size=10, n_embd=12, n_head=2, n_kv_head=1, n_layer=1, seq_len=6, head_width=8,
          activation="gelu_tanh", norm_plus_one=True, post_norms=True, scale_embeddings=True),
     np.float32, LoraSpec(2, 4.0, ("q", "k", "o"))),  # Gemma's frozen GeGLU
]


def _arguments(frame: FrameType) -> Call:
    """The arguments a function was called with, read from its frame at the call."""
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[:n]
    values = {k: copy.deepcopy(frame.f_locals[k]) for k in names}
    positional = tuple(values[k] for k in names[: code.co_argcount])
    return Call(positional, {k: values[k] for k in names[code.co_argcount:]})


def traced_calls() -> dict[str, list[Call]]:
    """backward's key -> the calls its forward received while the model ran."""
    by_code = {pair.forward.__code__: key for key, pair in PAIRS.items()}
    calls: dict[str, list[Call]] = {key: [] for key in PAIRS}

    def hook(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code in by_code:
            calls[by_code[frame.f_code]].append(_arguments(frame))

    rng = np.random.default_rng(38)
    for kwargs, dtype, spec in [(*m, None) for m in TRACED_MODELS] + TRACED_LORA:
        cfg = Config(**kwargs)
        params = random_params(cfg, rng, dtype=dtype)
        adapters = None if spec is None else init_adapters(cfg, spec, rng, dtype)
        for a in (adapters.weights.values() if adapters else ()):
            a[...] = 0.3 * rng.standard_normal(a.shape)  # B nonzero: every term matters
        x = rng.integers(0, cfg.vocab_size, size=(2, cfg.seq_len))  # (B, S)
        y = rng.integers(0, cfg.vocab_size, size=(2, cfg.seq_len))  # (B, S)
        sys.setprofile(hook)
        try:
            loss_and_grads(params, cfg, x, y, adapters=adapters)
        finally:
            sys.setprofile(None)
    return calls


CALLS = traced_calls()
CASES = [(key, i) for key, found in CALLS.items() for i in range(len(found))]


def assert_same(a: object, b: object, where: str) -> None:
    """a and b equal bit for bit: arrays (dtype, shape, values), tuples and scalars, nested."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b, equal_nan=True), f"{where}: values changed"
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            field = a._fields[i] if hasattr(a, "_fields") else str(i)
            assert_same(u, v, f"{where}.{field}")
    else:
        assert type(a) is type(b) and (a == b or (a != a and b != b)), f"{where}: {a!r} != {b!r}"


def _gradient_seed(out: object, rng: np.random.Generator) -> object:
    """A random upstream gradient shaped like the forward's output."""
    if isinstance(out, np.ndarray):
        return rng.standard_normal(out.shape).astype(out.dtype)  # same shape as out
    return float(rng.uniform(0.5, 2.0))  # a scalar output (the loss)


def test_every_component_backward_is_checked() -> None:
    """Each backward of a component module is reached by the traced model, so checked below."""
    assert len(PAIRS) >= 8, sorted(PAIRS)
    missing = [key for key, found in CALLS.items() if not found]
    assert not missing, f"never called by the traced models: {missing}"


@pytest.mark.parametrize(("key", "i"), CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_backward_leaves_its_cache_alone(key: str, i: int) -> None:
    pair, call = PAIRS[key], CALLS[key][i]
    out, cache = pair.forward(*copy.deepcopy(call.args), **copy.deepcopy(call.kwargs))
    before = copy.deepcopy(cache)
    dout = _gradient_seed(out, np.random.default_rng(i))
    first = pair.backward(copy.deepcopy(dout), cache)
    assert_same(cache, before, f"{key}: cache after one call")
    second = pair.backward(copy.deepcopy(dout), cache)
    assert_same(cache, before, f"{key}: cache after two calls")
    assert_same(first, second, f"{key}: the two calls' gradients")
