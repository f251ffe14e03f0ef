"""What the type checker's work on the model and the trainer rests on, held at run time: the
sizes `Config` fills in have typed homes that agree with the fields; each config.json field is
read by one typed reader (a positive int, or a positive number a float holds) that refuses
anything else with a ValueError naming the field; a cache that backward gave up is refused by
name; a checkpoint is always read with its weights.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xenith_edu as xe
from xenith_edu.model.config import Config, default_ffn_hidden
from xenith_edu.model.hf.layout import FAMILIES, config_from_hf, config_to_hf
from xenith_edu.model.params import random_params
from xenith_edu.training.checkpoint import GROUPS, load_checkpoint, save_checkpoint


@st.composite
def configs(draw) -> Config:
    """Valid Configs of every kind the sizes take: each derived size given or left to its
    rule, grouped-query heads, wider heads."""
    n_head = draw(st.integers(1, 8))
    n_kv_head = draw(st.none() | st.sampled_from([k for k in range(1, n_head + 1)
                                                  if n_head % k == 0]))
    head_width = draw(st.none() | st.integers(1, 12).map(lambda h: 2 * h))
    n_embd = n_head * draw(st.integers(1, 12)) * (1 if head_width else 2)
    vocab_size, n_layer = draw(st.integers(1, 50)), draw(st.integers(1, 3))
    as_numpy = draw(st.sampled_from([lambda v: v, np.int64, np.int32, np.uint16]))
    wrap = lambda v: v if v is None else as_numpy(v)  # noqa: E731 -- sizes held by NumPy too
    return Config(vocab_size=wrap(vocab_size), n_embd=wrap(n_embd), n_head=wrap(n_head),
                  n_layer=wrap(n_layer), ffn_hidden=wrap(draw(st.none() | st.integers(1, 300))),
                  n_kv_head=wrap(n_kv_head), head_width=wrap(head_width),
                  pad_token_id=wrap(draw(st.none() | st.integers(0, vocab_size - 1))),
                  nope_layers=tuple(wrap(l) for l in range(n_layer) if draw(st.booleans())),
                  tie_embeddings=draw(st.sampled_from([True, False, np.True_, np.False_])),
                  norm_eps=draw(st.sampled_from([1e-5, np.float32(1e-6), np.float64(1e-6)])))


@settings(max_examples=150, deadline=None)
@given(cfg=configs())
def test_the_filled_sizes_have_typed_homes_that_agree_with_the_fields(cfg: Config) -> None:
    for prop, name in (("hidden", "ffn_hidden"), ("kv_heads", "n_kv_head")):
        got = getattr(cfg, prop)
        assert isinstance(got, int) and not isinstance(got, bool) and got > 0
        assert got == getattr(cfg, name)  # __post_init__ filled the field: they agree
    assert cfg.hidden == (default_ffn_hidden(cfg.n_embd) if replace(cfg, ffn_hidden=None)
                          == cfg else cfg.ffn_hidden)
    assert cfg.kv_heads * cfg.group == cfg.n_head
    assert cfg.kv_dim == cfg.kv_heads * cfg.head_dim and cfg.q_dim == cfg.n_head * cfg.head_dim
    shapes = xe.param_shapes(cfg)
    assert all(type(v) in (int, float, bool, str, tuple, type(None)) for v in
               cfg.to_dict().values()) and all(type(v) is int for v in cfg.nope_layers)
    assert Config(**json.loads(json.dumps(cfg.to_dict()))) == cfg  # what a checkpoint keeps
    assert shapes["w1"] == (cfg.n_layer, cfg.n_embd, cfg.hidden)
    assert shapes["wk"] == (cfg.n_layer, cfg.n_embd, cfg.kv_heads * cfg.head_dim)


TINY = Config(vocab_size=40, n_embd=16, n_head=4, n_layer=2, n_kv_head=2, seq_len=16)
JSON_VALUES = (st.none() | st.booleans() | st.integers() | st.floats()
               | st.sampled_from([10**400, -(10**400), 2**1024, sys.float_info.max,
                                  math.nextafter(sys.float_info.max, 0)])
               | st.text(max_size=4) | st.lists(st.integers(0, 3), max_size=3)
               | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _hf_docs() -> list[dict]:
    """config.json of TINY in every family, and with Llama 3's RoPE scaling."""
    docs = [config_to_hf(replace(TINY, family=f)) for f in ("llama", "mistral")]
    docs.append(config_to_hf(replace(TINY, qkv_bias=True)))
    docs.append(config_to_hf(replace(TINY, qk_norm=True)))
    docs.append(config_to_hf(replace(TINY, rope_scaling="llama3", rope_original_context=8)))
    return docs


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_config_json_field_is_a_config_or_one_value_error(data) -> None:
    """One field of a valid config.json (at the top or in rope_scaling) replaced by any JSON
    value: the result is a Config, or a ValueError; never another exception (a number too
    large for a float, a bool where an int goes, a list)."""
    doc = data.draw(st.sampled_from(_hf_docs()))
    where = doc
    if isinstance(doc.get("rope_scaling"), dict) and data.draw(st.booleans()):
        where = doc["rope_scaling"] = dict(doc["rope_scaling"])
    key = data.draw(st.sampled_from(sorted(where)))
    where[key] = data.draw(JSON_VALUES)
    try:
        cfg = config_from_hf(doc)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(cfg, Config) and cfg.family in FAMILIES
    for name in ("rope_theta", "norm_eps", "rope_factor"):
        assert math.isfinite(float(getattr(cfg, name)))


@pytest.mark.parametrize("recompute", [False, True])
def test_a_cache_that_backward_gave_up_is_refused_by_name(rng, recompute) -> None:
    params = random_params(TINY, rng)
    x = rng.integers(0, TINY.vocab_size, (2, 5))
    _, cache = xe.forward(params, TINY, x, recompute=recompute)
    xe.backward(params, TINY, cache, x, release=True)
    with pytest.raises(ValueError, match="^cache was spent"):
        xe.backward(params, TINY, cache, x)


@pytest.mark.parametrize("groups", [(), ("m",), ("m", "v"), ("params", "weights"), ("Params",)])
def test_a_checkpoint_is_read_with_its_weights(tmp_path, groups) -> None:
    params = xe.init_params(TINY)
    path = tmp_path / "ckpt.npz"
    vocab = "".join(chr(ord("A") + i) for i in range(TINY.vocab_size))
    save_checkpoint(path, params, None, None, 0, np.random.default_rng(0), TINY, vocab)
    with pytest.raises(ValueError, match="^groups must hold 'params'"):
        load_checkpoint(path, groups=groups)
    assert set(load_checkpoint(path, groups=GROUPS).params) == set(params)
