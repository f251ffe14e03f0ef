"""The KV-cache sampler against recomputing the whole context: same logits, same tokens."""

from __future__ import annotations

import numpy as np
import pytest

from xenith_edu import Config, forward
from xenith_edu.model.generate import (
    KVCache,
    _feed,
    _prepare,
    generate,
    kv_cache_bytes,
    sample_text,
)
from xenith_edu.model.params import random_params


def _model(dtype=np.float64, tie: bool = True, seq_len: int = 12, seed: int = 0,
           n_head: int = 2, n_kv_head: int | None = None, attention: str = "plain"):
    cfg = Config(vocab_size=11, n_embd=8 * n_head, n_head=n_head, n_layer=2, ffn_hidden=24,
                 seq_len=seq_len, tie_embeddings=tie, n_kv_head=n_kv_head, attention=attention,
                 flash_block=4)
    params = random_params(cfg, np.random.default_rng(seed), dtype=dtype)
    return params, cfg


def _empty_cache(params: dict, cfg: Config) -> KVCache:
    shape = (cfg.n_layer, 1, cfg.n_kv_head, cfg.seq_len, cfg.head_dim)
    return KVCache(np.full(shape, np.nan, params["wte"].dtype),
                   np.full(shape, np.nan, params["wte"].dtype))


@pytest.mark.parametrize(("tie", "n_head", "n_kv_head", "attention"), [
    (True, 2, None, "plain"), (False, 2, None, "plain"),
    (True, 6, 2, "plain"),    # grouped-query attention: three query heads per key/value head
    (False, 4, 1, "flash"),   # one key/value head for all (multi-query), flash in the forward
])
def test_feeding_one_token_at_a_time_gives_the_forward_logits(tie, n_head, n_kv_head,
                                                              attention) -> None:
    params, cfg = _model(tie=tie, n_head=n_head, n_kv_head=n_kv_head, attention=attention)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, cfg.seq_len)
    logits, _ = forward(params, cfg, ids[None, :])  # (1, S, V)
    w, kv = _prepare(params, cfg), _empty_cache(params, cfg)
    first = _feed(params, cfg, w, kv, ids[:3], 0)  # a prompt of three tokens at once
    np.testing.assert_allclose(first, logits[0, 2], rtol=1e-12, atol=1e-12)
    for t in range(3, cfg.seq_len):
        step = _feed(params, cfg, w, kv, ids[t : t + 1], t)
        np.testing.assert_allclose(step, logits[0, t], rtol=1e-12, atol=1e-12)
    assert not np.isnan(kv.k).any() and not np.isnan(kv.v).any()  # every position stored


def test_the_cache_holds_the_key_value_heads_only() -> None:
    params, cfg = _model(n_head=6, n_kv_head=2)
    kv = _empty_cache(params, cfg)
    assert kv.k.shape == (2, 1, 2, 12, 8)  # (L, 1, Hkv, C, hd): a third of the query heads
    assert kv.k.nbytes + kv.v.nbytes == kv_cache_bytes(cfg, 8)
    full = Config(**{**cfg.to_dict(), "n_kv_head": 6})
    assert kv_cache_bytes(full, 8) == 3 * kv_cache_bytes(cfg, 8)


def test_the_cached_decoding_is_the_model_s_own_blocks() -> None:
    """No matrix product, attention or SwiGLU of its own: the module calls the model's."""
    import ast
    import inspect

    import xenith_edu.model.generate as gen

    tree = ast.parse(inspect.getsource(gen))
    products = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp | ast.AugAssign)
                and isinstance(n.op, ast.MatMult)]
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not products
    assert not names & {"matmul", "dot", "einsum", "tensordot", "inner", "silu", "softmax",
                        "rope_forward", "rmsnorm_forward", "causal_attention_forward"}
    assert {"layer_forward", "head_forward", "embed"} <= names  # embed: the model's embedding step


@pytest.mark.parametrize(("dtype", "tie", "prompt_len", "new", "n_kv_head"), [
    (np.float64, True, 1, 11, None),     # fills the context exactly
    (np.float64, False, 5, 30, None),    # slides past seq_len: the cache is rebuilt
    (np.float64, True, 20, 6, None),     # the prompt alone is longer than seq_len
    (np.float32, True, 3, 25, None),
    (np.float64, False, 4, 20, 3),  # grouped-query attention, sliding past seq_len
])
def test_same_tokens_as_recomputing_the_context(dtype, tie, prompt_len, new, n_kv_head):
    params, cfg = _model(dtype, tie, n_head=6 if n_kv_head else 2, n_kv_head=n_kv_head)
    prompt = np.random.default_rng(2).integers(0, cfg.vocab_size, prompt_len)
    for seed in range(3):
        cached = generate(params, cfg, prompt, new, np.random.default_rng(seed), 0.9)
        plain = generate(params, cfg, prompt, new, np.random.default_rng(seed), 0.9,
                         kv_cache=False)
        assert cached.shape == (prompt_len + new,)
        np.testing.assert_array_equal(cached, plain)


def test_top_k_and_greedy_agree_too() -> None:
    params, cfg = _model()
    prompt = np.array([3, 1, 4])
    for top_k in (1, 3):
        a = generate(params, cfg, prompt, 15, np.random.default_rng(5), 1.3, top_k)
        b = generate(params, cfg, prompt, 15, np.random.default_rng(5), 1.3, top_k, False)
        np.testing.assert_array_equal(a, b)


def test_sample_text_uses_the_cache_by_default_and_matches() -> None:
    from xenith_edu.training.data import CharTokenizer

    params, cfg = _model()
    tok = CharTokenizer("\nabcdefghij")
    a = sample_text(params, cfg, tok, "ab", 20, seed=4)
    b = sample_text(params, cfg, tok, "ab", 20, seed=4, kv_cache=False)
    assert a == b and a.startswith("ab") and len(a) == 22


def test_zero_new_tokens_and_inputs_unchanged() -> None:
    params, cfg = _model()
    before = {k: p.copy() for k, p in params.items()}
    prompt = np.array([1, 2, 3])
    np.testing.assert_array_equal(generate(params, cfg, prompt, 0, np.random.default_rng(0)),
                                  prompt)
    generate(params, cfg, prompt, 5, np.random.default_rng(0))
    for k, p in params.items():
        np.testing.assert_array_equal(p, before[k])


def test_bad_prompts_raise_on_the_cached_path() -> None:
    params, cfg = _model()
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(params, cfg, np.array([1, 99]), 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="empty"):
        generate(params, cfg, np.array([], dtype=np.int64), 3, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        generate(params, cfg, np.array([1]), 3, 0)
    with pytest.raises(ValueError, match="missing"):
        generate({"wte": params["wte"]}, cfg, np.array([1]), 3, np.random.default_rng(0))


def test_kv_cache_bytes_counts_keys_and_values_of_every_layer() -> None:
    cfg = Config(vocab_size=76, n_embd=128, n_head=4, n_layer=4, seq_len=64)
    assert kv_cache_bytes(cfg, 4) == 2 * 4 * 4 * 64 * 32 * 4  # 256 KiB in float32
    assert kv_cache_bytes(cfg, 8, batch=3) == 3 * 2 * kv_cache_bytes(cfg, 4)


def test_the_sample_command_uses_the_kv_cache(tmp_path, monkeypatch, capsys) -> None:
    import xenith_edu.model.generate as sample
    from xenith_edu.cli import main
    from xenith_edu.training.checkpoint import save_checkpoint

    params, cfg = _model(np.float32)
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    save_checkpoint(tmp_path / "ckpt.npz", params, zeros, zeros, 1, np.random.default_rng(0),
                    cfg, "\nabcdefghij")
    fed = []
    real_feed = sample._feed
    monkeypatch.setattr(sample, "_feed", lambda *a: fed.append(len(a[4])) or real_feed(*a))
    assert main(["sample", str(tmp_path / "ckpt.npz"), "--prompt", "abc", "--chars", "6",
                 "--seed", "1"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert fed == [3, 1, 1, 1, 1, 1]  # the prompt once, then one token at a time
    tok = sample.CharTokenizer("\nabcdefghij")
    # 0.8: the command's default temperature
    assert text == sample_text(params, cfg, tok, "abc", 6, 0.8, seed=1, kv_cache=False)


# -- what mutation testing asked for: exact messages, defaults, dtypes, the top-k cut ---------

def _raised(exc: type, call, *args, **kwargs) -> str:
    with pytest.raises(exc) as info:
        call(*args, **kwargs)
    return str(info.value)


def test_the_sampler_s_errors_say_what_is_wrong_exactly() -> None:
    params, cfg = _model()
    rng = np.random.default_rng(0)
    assert _raised(TypeError, generate, params, cfg, np.array([1]), 3, 0) == \
        "rng must be a np.random.Generator, e.g. np.random.default_rng(seed)"
    assert _raised(ValueError, generate, params, cfg, np.array([1]), 3, rng, 0.0) == \
        "temperature must be positive, got 0.0"
    assert _raised(ValueError, generate, params, cfg, np.array([1]), 3, rng, 1.0, 0) == \
        "top_k must be at least 1 (or None for no limit), got 0"
    assert _raised(ValueError, generate, params, cfg, np.array([1]), -1, rng) == \
        "max_new_tokens must be >= 0, got -1"
    assert _raised(ValueError, generate, params, cfg, np.array([], dtype=np.int64), 3, rng) == \
        "prompt_ids is empty: give the model at least one token to start from"
    assert _raised(ValueError, generate, params, cfg, np.array([1, 99]), 3, rng) == \
        "prompt_ids has token ids in [1, 99], outside [0, 11)"


def test_sample_text_s_errors_say_what_is_wrong_exactly() -> None:
    from xenith_edu.training.data import CharTokenizer

    params, cfg = _model()
    tok = CharTokenizer("\nabcdefghij")
    assert _raised(TypeError, sample_text, params, cfg, tok, 7) == \
        "prompt must be a str, got int"
    assert _raised(ValueError, sample_text, params, cfg, tok, "") == \
        "prompt is empty: give at least one character, e.g. a newline"
    assert _raised(ValueError, sample_text, params, cfg, tok, "aZ").startswith("prompt: ")


def test_the_defaults_are_temperature_1_seed_0_a_newline_and_500_characters() -> None:
    from xenith_edu.training.data import CharTokenizer

    params, cfg = _model()
    tok = CharTokenizer("\nabcdefghij")
    prompt = np.array([3, 1, 4])
    np.testing.assert_array_equal(
        generate(params, cfg, prompt, 12, np.random.default_rng(2)),
        generate(params, cfg, prompt, 12, np.random.default_rng(2), temperature=1.0))
    assert sample_text(params, cfg, tok, "ab", 12) == \
        sample_text(params, cfg, tok, "ab", 12, temperature=1.0, seed=0)
    assert sample_text(params, cfg, tok, max_new_tokens=4) == \
        sample_text(params, cfg, tok, "\n", 4)
    text = sample_text(params, cfg, tok)
    assert text.startswith("\n") and len(text) == 1 + 500


def test_sample_text_without_the_cache_recomputes(monkeypatch) -> None:
    import xenith_edu.model.generate as gen
    from xenith_edu.training.data import CharTokenizer

    params, cfg = _model()
    tok = CharTokenizer("\nabcdefghij")

    def no_feed(*a):
        raise AssertionError("kv_cache=False must not feed the cache")

    monkeypatch.setattr(gen, "_feed", no_feed)
    assert len(sample_text(params, cfg, tok, "ab", 5, kv_cache=False)) == 7


def test_the_cache_and_the_tables_have_the_parameters_dtype(monkeypatch) -> None:
    import xenith_edu.model.generate as gen
    from xenith_edu.model.generate import empty_kv_cache

    seen: list[tuple] = []
    real_feed = gen._feed
    monkeypatch.setattr(gen, "_feed", lambda *a: seen.append(a) or real_feed(*a))
    for dtype in (np.float32, np.float64):
        params, cfg = _model(dtype)
        kv = empty_kv_cache(cfg, dtype)
        assert all(a.dtype == dtype for a in kv.k + kv.v)
        assert all(a.shape == (1, 2, 12, 8) for a in kv.k + kv.v)  # per layer (1, Hkv, C, hd)
        w = _prepare(params, cfg)
        assert w.cos.dtype == dtype and w.sin.dtype == dtype
        seen.clear()
        generate(params, cfg, np.array([1, 2]), 3, np.random.default_rng(0))
        assert len(seen) == 3
        for a in seen:
            assert a[2].cos.dtype == dtype
            assert all(x.dtype == dtype for x in a[3].k + a[3].v)


class _Int32DefaultNumPy:
    """NumPy as Windows has it before NumPy 2: np.array of Python ints makes int32."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def array(obj, dtype=None, **kwargs):
        a = np.array(obj, dtype=dtype, **kwargs)
        return a.astype(np.int32) if dtype is None and a.dtype == np.int64 else a


def test_the_ids_are_int64_whatever_the_platform_s_default_integer(monkeypatch) -> None:
    import xenith_edu.model.generate as gen

    params, cfg = _model()
    monkeypatch.setattr(gen, "np", _Int32DefaultNumPy())
    assert gen.np.array([1, 2]).dtype == np.int32  # the stand-in works
    for kv_cache in (True, False):
        for new in (0, 4, 20):  # nothing drawn, within the context, sliding past it
            out = generate(params, cfg, np.array([1, 2]), new, np.random.default_rng(0),
                           kv_cache=kv_cache)
            assert out.dtype == np.int64 and out.shape == (2 + new,)


def test_top_k_keeps_exactly_the_k_largest_logits() -> None:
    from xenith_edu.model.generate import next_token_probs

    rng = np.random.default_rng(3)
    for V in (10, 1000):  # (NumPy sorts small arrays whole: a wrong partition index shows on
        # large ones only)
        logits = rng.permutation(np.arange(float(V)))  # distinct: the top k are unambiguous
        for k in (1, 2, 3, 5, 9):
            p = next_token_probs(logits, 0.7, k)
            top = np.argsort(logits)[-k:]
            assert set(np.flatnonzero(p)) == set(top)
            z = logits[top] / 0.7
            np.testing.assert_allclose(p[top], np.exp(z - z.max()) / np.exp(z - z.max()).sum(),
                                       rtol=1e-12)


def test_next_token_probs_does_not_overflow_on_large_logits() -> None:
    from xenith_edu.model.generate import next_token_probs

    p = next_token_probs(np.array([1000.0, 999.0, 0.0]))
    assert np.isfinite(p).all()
    e = np.exp([0.0, -1.0, -1000.0])
    np.testing.assert_allclose(p, e / e.sum(), rtol=1e-12)
    assert p.dtype == np.float64
    assert next_token_probs(np.array([3.0, 1.0], dtype=np.float32)).dtype == np.float64
