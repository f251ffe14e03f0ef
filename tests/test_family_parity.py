"""Parity with transformers for every family from-hf reads: the published config.json, narrowed
(tests/families.py), with random non-degenerate weights, in float64 with transformers' float32
casts removed (tests/hf_exact.py): the logits and every parameter's gradient within 1e-10; the
folder to-hf writes back loads in transformers with the same tensors, bit for bit; and at the
published widths (one layer, a small vocabulary) the float32 logits within 1e-4.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import families  # noqa: E402
from families import NARROW, NEW, SMOLLM_135M, WINDOWED, reduced, tiny_model  # noqa: E402
from hf_exact import assert_step_matches  # noqa: E402

from xenith_edu.model import forward  # noqa: E402
from xenith_edu.model.config import window_of  # noqa: E402
from xenith_edu.model.hf import read_hf, write_hf  # noqa: E402

# one thread each (conftest.py): the file took 44 s of CPU beside one busy core, 23 s so
pytestmark = pytest.mark.usefixtures("one_thread_each")
V = 40
ALL = {**NEW, **WINDOWED, "SmolLM-135M": SMOLLM_135M}


def narrow(family: str) -> dict:
    return {**reduced(ALL[family], layers=2, vocab=V), **NARROW.get(family, {
        "hidden_size": 24, "intermediate_size": 40, "num_attention_heads": 6,
        "num_key_value_heads": 2})}


@pytest.mark.parametrize("family", list(ALL))
def test_float64_logits_and_every_gradient_match_transformers(tmp_path, rng, family):
    m = tiny_model(narrow(family), scale=0.4, dtype=torch.float64)
    m.save_pretrained(tmp_path / "hf")
    model = read_hf(tmp_path / "hf", np.float64)
    assert model.config.family == ALL[family]["model_type"]
    windows = [window_of(model.config, l) for l in range(model.config.n_layer)]
    assert windows == families.their_windows(m.config)  # the same layers, by the same width
    assert (family in WINDOWED) <= any(w is not None and w < 12 for w in windows)  # it bites
    x, y = rng.integers(0, V, (2, 12)), rng.integers(0, V, (2, 12))
    assert_step_matches(m, model.params, model.config, x, y)  # Gemma's pad 0 out of both losses
    # to-hf: transformers loads the folder we write with the very same tensors
    write_hf(tmp_path / "back", model.params, model.config)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back",
                                                             dtype=torch.float64)
    assert type(back) is type(m)
    for name, t in m.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    assert read_hf(tmp_path / "back", np.float64).config == model.config


@pytest.mark.parametrize("family", list(NEW))
def test_float32_logits_at_the_published_widths(tmp_path, rng, family):
    hf = reduced(ALL[family], layers=1, vocab=256)
    m = tiny_model(hf, scale=0.02, dtype=torch.float32)
    m.save_pretrained(tmp_path / "hf")
    del m
    model = read_hf(tmp_path / "hf", np.float32)
    assert model.config.n_embd == ALL[family]["hidden_size"]
    x = rng.integers(0, 256, (1, 64))
    ours, _ = forward(model.params, model.config, x)
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    with torch.no_grad():
        theirs = m(torch.tensor(x)).logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-4


@pytest.mark.parametrize("family", list(NEW))
def test_config_json_reads_as_its_family(family):
    from xenith_edu.model.hf import config_from_hf, config_to_hf

    cfg = config_from_hf(json.loads(json.dumps(ALL[family])))
    hf = ALL[family]
    assert (cfg.n_head, cfg.n_kv_head, cfg.n_embd) == (hf["num_attention_heads"],
                                                       hf["num_key_value_heads"],
                                                       hf["hidden_size"])
    assert cfg.head_dim == hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
    assert cfg.qkv_bias == (hf["model_type"] == "qwen2")
    assert cfg.qk_norm == (hf["model_type"] in ("qwen3", "gemma3_text"))
    assert cfg.rope_scaling == ("llama3" if hf.get("rope_scaling") else "none")
    assert cfg.sliding_window == (hf["sliding_window"] if hf["model_type"] in (
        "mistral", "gemma3_text") else None)
    gemma = hf["model_type"] == "gemma3_text"
    assert (cfg.norm_plus_one, cfg.post_norms, cfg.scale_embeddings) == (gemma,) * 3
    assert cfg.activation == ("gelu_tanh" if gemma else "silu")
    assert cfg.global_layers == (tuple(range(5, hf["num_hidden_layers"], 6)) if gemma else ())
    assert cfg.local_rope_theta == (hf["rope_local_base_freq"] if gemma else None)
    assert cfg.nope_layers == tuple(l for l, f in enumerate(hf.get("no_rope_layers", [])) if not f)
    assert config_from_hf(json.loads(json.dumps(config_to_hf(cfg)))) == cfg
