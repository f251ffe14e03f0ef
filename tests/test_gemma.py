"""Gemma 3's pieces, each a component or a switch of one with its backward derived: GeGLU (the
tanh GELU as the gate), RMSNorm's gain 1 + w, the norms after the blocks, the scaled embedding,
the scores' scale query_pre_attn_scalar ** -1/2, local and global layers with their own window
and RoPE (and the linear RoPE scaling of the global ones); and the whole model with any mix of
them, against central finite differences in float64 on non-degenerate inputs. The cases are
generated (hypothesis): shapes, scales, offsets, layers and every mix of the Gemma fields.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_open_components import decoding_is_the_forward, vjp_check

import xenith_edu as xe
from xenith_edu.attention import causal_attention_backward, causal_attention_forward
from xenith_edu.geglu import geglu_backward, geglu_forward, gelu_tanh
from xenith_edu.model import forward, loss_and_grads, random_params
from xenith_edu.model.check import check_model
from xenith_edu.model.hf import config_from_hf, config_to_hf
from xenith_edu.model.hf.layout import GEMMA_ALWAYS, gemma_marks, writing_family
from xenith_edu.qk_norm import qk_norm_backward, qk_norm_forward
from xenith_edu.rmsnorm import rmsnorm_backward, rmsnorm_forward
from xenith_edu.rope import rope_tables
from xenith_edu.rope_scaling import LinearScaling

# the same cases on every run: among random inputs, about one in 600 to 800 has a coordinate
# whose gradient is near 0 (a row of the softmax nearly one-hot, a gate at gelu's zero), where
# central differences' rounding shows; the project's component tests have the same rate
pytestmark = pytest.mark.usefixtures("one_thread_each")  # conftest.py: nothing here counts threads
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)


# -- the components ------------------------------------------------------------------------

@SLOW
@given(n=st.integers(2, 5), d=st.integers(1, 6), f=st.integers(2, 7), spread=st.floats(0.3, 2.0),
       seed=st.integers(0, 2**16))
def test_geglu_backward_against_finite_differences(n, d, f, spread, seed):
    """Gate pre-activations h1 ~ N(0, spread²), around GELU's bend where every term of gelu'
    counts, at 4 or more positions: gelu' is 0 at h1 = -0.75 and near 0 far left, so a column of
    w1 read at one position only could have a gradient near 0 (a degenerate input)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 2, d))  # two leading axes: flattened and restored
    w1 = spread / np.sqrt(d) * rng.standard_normal((d, f))  # h1 = x @ w1 ~ N(0, spread²)
    w3 = rng.standard_normal((d, f))
    w2 = rng.standard_normal((f, d))
    vjp_check(geglu_forward, [x, w1, w3, w2], geglu_backward, rng)


@given(z=st.lists(st.floats(-30, 30), min_size=1, max_size=20))
@settings(max_examples=50, deadline=None)
def test_gelu_tanh_is_transformers_gelu_pytorch_tanh(z):
    torch = pytest.importorskip("torch")
    from transformers.activations import ACT2FN

    z = np.asarray(z)
    theirs = ACT2FN["gelu_pytorch_tanh"](torch.tensor(z)).numpy()
    # z/2 (1 + t): the sum 1 + t is good to one rounding of 1, so the bound is |z| eps, not
    # relative (in the left tail 1 + t cancels)
    assert np.all(np.abs(gelu_tanh(z) - theirs) <= 4 * np.finfo(float).eps * np.abs(z))


@SLOW
@given(n=st.integers(1, 5), d=st.integers(4, 9), offset=st.sampled_from([0.0, 1.0, -0.5]),
       seed=st.integers(0, 2**16))
def test_rmsnorm_with_an_offset_gain_against_finite_differences(n, d, offset, seed):
    """y = xhat * (offset + w): the gain is w moved by a constant, so dw is the gain's."""
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((n, d)), 0.3 * rng.standard_normal(d)
    vjp_check(lambda x, w: rmsnorm_forward(x, w, 1e-6, offset), [x, w], rmsnorm_backward, rng)
    # the same function as the plain RMSNorm with the gain offset + w, values and gradients
    y, cache = rmsnorm_forward(x, w, 1e-6, offset)
    y0, cache0 = rmsnorm_forward(x, offset + w, 1e-6)
    np.testing.assert_array_equal(y, y0)
    g = rng.standard_normal(y.shape)
    for a, b in zip(rmsnorm_backward(g, cache), rmsnorm_backward(g, cache0), strict=True):
        np.testing.assert_array_equal(a, b)


@SLOW
@given(heads=st.integers(1, 4), hd=st.sampled_from([4, 6, 8]), n=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_qk_norm_with_gemmas_gain_against_finite_differences(heads, hd, n, seed):
    rng = np.random.default_rng(seed)
    u, w = rng.standard_normal((n, heads * hd)), 0.3 * rng.standard_normal(hd)
    vjp_check(lambda u, w: qk_norm_forward(u, w, 1e-6, 1.0), [u, w], qk_norm_backward, rng)


@st.composite
def attention_inputs(draw):
    hkv = draw(st.integers(1, 3))
    H, S, hd = hkv * draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.sampled_from([2, 4]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    q = rng.standard_normal((1, H, S, hd))
    k, v = (rng.standard_normal((1, hkv, S, hd)) for _ in range(2))
    window = draw(st.none() | st.integers(1, S + 1))
    return q, k, v, window, draw(st.floats(0.1, 0.7)), rng  # about 1/sqrt(hd), as Gemma's
    # 1/16 for hd 256: larger, softmax turns one-hot and the gradients near 0 (degenerate)


@SLOW
@given(inputs=attention_inputs())
def test_attention_with_its_own_scale_against_finite_differences(inputs):
    """scores = scale q k^T: dq and dk take the factor; the scale is q's, moved anywhere."""
    q, k, v, window, scale, rng = inputs
    vjp_check(lambda q, k, v: causal_attention_forward(q, k, v, window, scale), [q, k, v],
              causal_attention_backward, rng)
    hd = q.shape[-1]
    moved, _ = causal_attention_forward(q * (scale * np.sqrt(hd)), k, v, window)
    np.testing.assert_allclose(causal_attention_forward(q, k, v, window, scale)[0], moved,
                               rtol=1e-12, atol=1e-14)
    default, given_ = (causal_attention_forward(q, k, v, window, s)[0]
                       for s in (None, 1 / np.sqrt(hd)))
    np.testing.assert_array_equal(default, given_)


@given(S=st.integers(1, 40), hd=st.sampled_from([2, 8, 64]), factor=st.floats(1.0, 64.0),
       theta=st.floats(10.0, 1e6))
@settings(max_examples=40, deadline=None)
def test_linear_rope_scaling_is_the_positions_divided(S, hd, factor, theta):
    """The linear rule turns position t as the plain RoPE turns position t / factor."""
    cos, sin = rope_tables(S, hd, theta, LinearScaling(factor))
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    angle = (np.arange(S) / factor)[:, None] * inv[None, :]
    np.testing.assert_allclose(cos, np.cos(angle), rtol=0, atol=1e-12)
    np.testing.assert_allclose(sin, np.sin(angle), rtol=0, atol=1e-12)


# -- the model with any mix of Gemma's pieces ------------------------------------------------

@st.composite
def gemma_configs(draw, n_layer: int = 3) -> xe.Config:
    """A tiny model with any mix of Gemma 3's fields, alone or with the other open ones."""
    hd = draw(st.sampled_from([4, 6]))
    window = draw(st.none() | st.integers(1, 5))
    global_ = draw(st.sampled_from([(), (1,), (0, 2)])) if window else ()
    scaling = draw(st.sampled_from(["none", "linear", "llama3"]))
    extra = dict(rope_factor=draw(st.floats(1.0, 8.0))) if scaling != "none" else {}
    if scaling == "llama3":
        extra["rope_original_context"] = draw(st.integers(2, 64))
    return xe.Config(
        vocab_size=11, n_embd=draw(st.sampled_from([8, 12])), n_head=2, n_kv_head=1,
        head_width=hd, n_layer=n_layer, ffn_hidden=10, seq_len=6,
        tie_embeddings=draw(st.booleans()), qk_norm=draw(st.booleans()),
        activation=draw(st.sampled_from(["silu", "gelu_tanh"])),
        norm_plus_one=draw(st.booleans()), post_norms=draw(st.booleans()),
        scale_embeddings=draw(st.booleans()),
        query_pre_attn_scalar=draw(st.none() | st.integers(1, 40)),
        sliding_window=window, global_layers=global_,
        local_rope_theta=draw(st.none() | st.sampled_from([10.0, 30.0])) if window else None,
        rope_theta=draw(st.sampled_from([10.0, 100.0])), rope_scaling=scaling, **extra)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)  # the same 20 mixes on every run: no flaky near-zero gradient
@given(cfg=gemma_configs(), seed=st.integers(0, 2**16))
def test_every_gradient_of_any_gemma_mix_against_finite_differences(cfg, seed):
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
    for res in check_model(params, cfg, x, y, n_coords=4, seed=seed, h=1e-4):
        assert res.passed, (cfg, str(res))


@settings(max_examples=15, deadline=None)
@given(cfg=gemma_configs(), seed=st.integers(0, 2**16))
def test_gemma_decoding_with_the_kv_cache_is_the_forward_pass(cfg, seed):
    """Token by token (the scaled embedding, each layer's window and tables): the forward's
    logits at every position."""
    decoding_is_the_forward(cfg, seed)


@settings(max_examples=10, deadline=None)
@given(cfg=gemma_configs(), seed=st.integers(0, 2**16))
def test_gemma_recompute_gives_the_same_gradients(cfg, seed):
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x, y = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
    loss, grads = loss_and_grads(params, cfg, x, y)
    loss2, grads2 = loss_and_grads(params, cfg, x, y, recompute=True)
    assert loss == loss2
    for k in grads:
        np.testing.assert_array_equal(grads[k], grads2[k])


@settings(max_examples=20, deadline=None)
@given(cfg=gemma_configs(), seed=st.integers(0, 2**16))
def test_each_switch_is_the_function_it_names(cfg, seed):
    """Gains 1 + w are gains w' = 1 + w of the model without the switch; a window as long as
    the context, or every layer's RoPE base the same, is the model without the local layers;
    the scale query_pre_attn_scalar = head_dim is the default's."""
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    x = rng.integers(0, 11, (2, 6))
    want, _ = forward(params, cfg, x)
    if cfg.norm_plus_one:
        plain = replace(cfg, norm_plus_one=False)
        gains = {k: 1.0 + v if xe.model.params.PARAM[k].kind == "gain" else v
                 for k, v in params.items()}
        np.testing.assert_allclose(forward(gains, plain, x)[0], want, rtol=1e-12, atol=1e-12)
    if cfg.sliding_window is not None:  # windowed layers seeing the whole context
        wide = replace(cfg, sliding_window=6, local_rope_theta=None)
        same = replace(wide, global_layers=(), sliding_window=None)
        np.testing.assert_array_equal(forward(params, wide, x)[0], forward(params, same, x)[0])
    tail = replace(cfg, query_pre_attn_scalar=cfg.head_dim)
    assert tail.query_pre_attn_scalar is None  # one form for one model


def test_embedding_scale_is_rounded_to_the_dtype_and_spares_the_output_head(rng):
    """Gemma casts sqrt(d) to the weights' dtype; the tied head reads wte unscaled."""
    cfg = xe.Config(vocab_size=11, n_embd=12, n_head=2, n_layer=1, seq_len=4,
                    scale_embeddings=True)
    params = random_params(cfg, rng, dtype=np.float32)
    from xenith_edu.model.ends import embed, embed_scale

    assert embed_scale(cfg, np.float32) == float(np.float32(12 ** 0.5)) != 12 ** 0.5
    h, _ = embed(params, cfg, np.array([[3, 4]]))
    np.testing.assert_array_equal(h, params["wte"][[[3, 4]]] * np.float32(12 ** 0.5))
    plain = replace(cfg, scale_embeddings=False)  # the factor reaches the logits
    assert not np.array_equal(forward(params, cfg, np.array([[3]]))[0],
                              forward(params, plain, np.array([[3]]))[0])


def test_config_refuses_what_gemmas_fields_cannot_be():
    base = dict(vocab_size=11, n_embd=8, n_head=2, n_layer=2)
    for bad, word in (({"activation": "gelu"}, "activation"),
                      ({"global_layers": (1,)}, "global_layers"),
                      ({"sliding_window": 3, "global_layers": (0, 1)}, "global_layers"),
                      ({"sliding_window": 3, "global_layers": (2,)}, "global_layers"),
                      ({"local_rope_theta": 10.0}, "local_rope_theta"),
                      ({"sliding_window": 3, "local_rope_theta": -1.0}, "local_rope_theta"),
                      ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
                      ({"query_pre_attn_scalar": 2.5}, "query_pre_attn_scalar"),
                      ({"attention": "flash", "query_pre_attn_scalar": 3},
                       "query_pre_attn_scalar"),
                      ({"post_norms": 1}, "post_norms"),
                      ({"rope_low_freq_factor": 2.0, "rope_scaling": "linear"},
                       "rope_low_freq_factor")):
        with pytest.raises((ValueError, TypeError), match=word):
            xe.Config(**{**base, **bad})


# -- config.json: read, refused by name, written back ----------------------------------------

@settings(max_examples=60, deadline=None)
@given(cfg=gemma_configs(n_layer=4))
def test_a_gemma_config_json_round_trip_is_the_identity_or_one_line(cfg):
    """A model with Gemma's pieces is written as gemma3_text when Gemma 3 can hold it (all of
    its four fixed pieces, no other family's), read back as the same model; otherwise one
    ValueError naming a field, whatever the mix."""
    marks = gemma_marks(cfg)
    try:
        family = writing_family(cfg)
    except ValueError as e:
        assert "\n" not in str(e) and "no Hugging Face family has" in str(e)
        assert marks and (not all(getattr(cfg, k) for k in GEMMA_ALWAYS) or (
            cfg.local_rope_theta is None and cfg.rope_scaling != "none"))
        return
    hf = json.loads(json.dumps(config_to_hf(cfg)))
    assert (family == "gemma3_text") == bool(marks)
    assert config_from_hf(hf) == replace(cfg, family=family)


GEMMA_REFUSED = [("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0),
                 ("use_bidirectional_attention", True), ("hidden_activation", "gelu"),
                 ("layer_types", ["sliding_attention"]), ("attention_bias", True),
                 ("query_pre_attn_scalar", 0), ("sliding_window_pattern", 0),
                 ("rope_parameters", {"sliding_attention": {"rope_type": "linear",
                                                            "factor": 2.0}}),
                 ("rope_scaling", {"rope_type": "yarn", "factor": 2.0})]


@pytest.mark.parametrize(("key", "value"), GEMMA_REFUSED)
def test_from_hf_refuses_what_the_book_cannot_be_in_one_line_naming_the_field(key, value):
    from families import GEMMA_3_1B

    with pytest.raises(ValueError) as e:
        config_from_hf({**GEMMA_3_1B, key: value})
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("family", ["Gemma-3-1B", "SmolLM-135M"])
def test_float64_parity_with_the_linear_rope_scaling(tmp_path, rng, family):
    """Gemma 3 4B and larger scale the global layers' RoPE linearly (factor 8), the local layers
    not; a LLaMA file may ask for the same rule on every layer."""
    torch = pytest.importorskip("torch")
    from families import GEMMA_3_1B, NARROW, SMOLLM_135M, reduced, tiny_model
    from hf_exact import assert_step_matches

    from xenith_edu.model.hf import read_hf

    published = {"Gemma-3-1B": GEMMA_3_1B, "SmolLM-135M": SMOLLM_135M}[family]
    narrow = NARROW.get(family, {"hidden_size": 24, "intermediate_size": 40,
                                 "num_attention_heads": 6, "num_key_value_heads": 2})
    hf = {**reduced(published, layers=2, vocab=40), **narrow, "rope_theta": 50.0,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    m = tiny_model(hf, scale=0.4, dtype=torch.float64)
    m.save_pretrained(tmp_path / "hf")
    model = read_hf(tmp_path / "hf", np.float64)
    assert (model.config.rope_scaling, model.config.rope_factor) == ("linear", 8.0)
    x, y = rng.integers(1, 40, (2, 12)), rng.integers(1, 40, (2, 12))  # no padding token
    assert_step_matches(m, model.params, model.config, x, y)


@st.composite
def gemma_files(draw) -> dict:
    """Gemma 3 text files the book reads: the published one narrowed, with any layer kinds,
    tied or not, grouped heads or not, either gate, any scale, window and RoPE bases."""
    from families import GEMMA_3_1B, NARROW, reduced

    L = draw(st.integers(1, 3))
    hkv = draw(st.sampled_from([1, 2, 4]))
    return {**reduced(GEMMA_3_1B, layers=L, vocab=40), **NARROW["Gemma-3-1B"],
            "layer_types": draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]),
                                         min_size=L, max_size=L)),
            "tie_word_embeddings": draw(st.booleans()), "num_key_value_heads": hkv,
            "hidden_activation": draw(st.sampled_from(["gelu_pytorch_tanh", "silu"])),
            "query_pre_attn_scalar": draw(st.integers(2, 64)),
            "sliding_window": draw(st.integers(1, 13)),
            "rope_theta": draw(st.sampled_from([50.0, 1e6])),
            "rope_local_base_freq": draw(st.sampled_from([20.0, 1e4])),
            "rms_norm_eps": draw(st.sampled_from([1e-6, 1e-3]))}


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(hf=gemma_files(), seed=st.integers(0, 2**16))
def test_any_gemma_file_is_transformers_model_in_float64(tmp_path_factory, hf, seed):
    """The logits and every gradient within 1e-10 of transformers' (its float32 casts removed),
    and to-hf's folder loads as the same tensors and reads back as the same model."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from families import tiny_model
    from hf_exact import assert_step_matches

    from xenith_edu.model.hf import read_hf, write_hf

    folder = tmp_path_factory.mktemp("gemma")
    m = tiny_model(hf, seed=seed % 1000, scale=0.4, dtype=torch.float64)
    m.save_pretrained(folder / "hf")
    model = read_hf(folder / "hf", np.float64)
    rng = np.random.default_rng(seed)
    x, y = rng.integers(1, 40, (2, 12)), rng.integers(1, 40, (2, 12))  # no padding token
    assert_step_matches(m, model.params, model.config, x, y)
    write_hf(folder / "back", model.params, model.config)
    back = transformers.AutoModelForCausalLM.from_pretrained(folder / "back", dtype=torch.float64)
    for name, t in m.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    assert read_hf(folder / "back", np.float64).config == model.config
