"""The open model families end to end: each published config.json becomes a run, fine-tunes
with the architecture of its checkpoint (never the defaults'), resumes exactly, and goes back
to a folder that transformers loads with its special tokens, generation and tokenizer settings.

Nothing is downloaded: each folder is its family's published config.json with fewer layers,
random weights and a BPE tokenizer trained here (tests/families.py).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
import families  # noqa: E402
from families import NARROW, NEW, SMOLLM_135M, TEXT, TODAY, bpe_json, tiny_folder  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from xenith_edu.cli import build_parser, main  # noqa: E402
from xenith_edu.cli.settings import UsageError, init_train_config  # noqa: E402
from xenith_edu.model import Config, forward  # noqa: E402
from xenith_edu.model.config import window_of  # noqa: E402
from xenith_edu.model.hf import config_from_hf, config_to_hf  # noqa: E402
from xenith_edu.model.hf.layout import INT_FIELDS  # noqa: E402
from xenith_edu.training.checkpoint import load_checkpoint  # noqa: E402
from xenith_edu.training.finetune import MODEL_FIELDS, RUN_OWN  # noqa: E402


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def some_layers(n_layer: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Some of the layers, not all: the global ones beside a window."""
    return st.lists(st.integers(0, n_layer - 1), unique=True, max_size=n_layer - 1).map(
        lambda ls: tuple(sorted(ls)))


def gemma(n_layer: int, window: int | None) -> st.SearchStrategy[dict]:
    """Gemma 3's fields: its four fixed pieces, its gate, the scores' scale, the global layers
    and the local RoPE when there is a window."""
    return st.fixed_dictionaries({
        "qk_norm": st.just(True), "norm_plus_one": st.just(True), "post_norms": st.just(True),
        "scale_embeddings": st.just(True), "family": st.just("gemma3_text"),
        "activation": st.sampled_from(["gelu_tanh", "silu"]),
        "query_pre_attn_scalar": st.none() | st.integers(1, 512),
        "global_layers": some_layers(n_layer) if window else st.just(()),
        "local_rope_theta": st.none() | st.floats(1.0, 1e6) if window else st.just(None)})


@st.composite
def models(draw) -> Config:
    """Any model the book can be: grouped heads of any group, any widths and constants, and
    special tokens anywhere in the table (the end one or several)."""
    hkv = draw(st.integers(1, 4))
    H = hkv * draw(st.integers(1, 4))
    V = draw(st.integers(8, 64))
    ids = st.none() | st.integers(0, V - 1)
    eos = draw(ids | st.lists(st.integers(0, V - 1), min_size=1, max_size=3).map(tuple))
    window = draw(st.none() | st.integers(1, 64))
    scaled = draw(st.sampled_from(["none", "llama3", "linear"]))
    scaling = dict(rope_scaling=scaled, rope_factor=draw(st.floats(1.0, 64.0))) \
        if scaled != "none" else {}
    if scaled == "llama3":
        scaling["rope_original_context"] = draw(st.integers(1, 8192))
    L = draw(st.integers(1, 6))
    return Config(vocab_size=V, n_embd=H * 2 * draw(st.integers(1, 4)), n_head=H,
                  head_width=draw(st.none() | st.integers(1, 8).map(lambda w: 2 * w)),
                  **scaling, sliding_window=window,
                  **draw(gemma(L, window) | st.fixed_dictionaries({
                      "qkv_bias": st.booleans(), "qk_norm": st.booleans(),  # any mix
                      "nope_layers": st.sampled_from([(), (0,)]),
                      "global_layers": some_layers(L) if window else st.just(()),
                      "family": st.sampled_from(["llama", "qwen2", "qwen3", "mistral",
                                                 "smollm3"])})),
                  n_kv_head=hkv, n_layer=L,
                  ffn_hidden=draw(st.integers(1, 96)), seq_len=draw(st.integers(1, 4096)),
                  tie_embeddings=draw(st.booleans()),
                  rope_theta=draw(st.floats(1.0, 1e7)), norm_eps=draw(st.floats(1e-8, 1e-3)),
                  pad_token_id=draw(ids), bos_token_id=draw(ids), eos_token_id=eos)


def test_model_fields_are_every_field_but_the_runs_and_the_tokenizers():
    """The class, not the case: a field added to Config is taken from the checkpoint."""
    from dataclasses import fields

    from xenith_edu.training.config import NOT_SETTINGS

    assert set(MODEL_FIELDS) | set(RUN_OWN) | set(NOT_SETTINGS) == {f.name for f in fields(Config)}
    assert {"n_kv_head", "n_head", "ffn_hidden"} <= set(MODEL_FIELDS)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), preset=st.sampled_from(["book", "small"]), data=st.data())
def test_init_takes_the_whole_architecture_from_the_checkpoint(model, preset, data):
    """For any checkpoint model and preset, `train --init` runs the checkpoint's architecture;
    an option repeating a field's value is accepted, one that differs is one line naming it."""
    given = [n for n in MODEL_FIELDS if getattr(model, n) is not None]
    same = data.draw(st.lists(st.sampled_from(given), unique=True, max_size=3))
    argv = ["train", "--init", "ckpt", "--out", "ft", "--preset", preset, "--seq-len", "1"]
    for name in same:
        argv += ["--set", f"{name}={str(getattr(model, name)).lower()}"]
    tc = init_train_config(build_parser().parse_args(argv), model, MODEL_FIELDS)
    assert {k: getattr(tc.model, k) for k in MODEL_FIELDS} == \
        {k: getattr(model, k) for k in MODEL_FIELDS}
    name = data.draw(st.sampled_from([n for n in MODEL_FIELDS if n not in same]))
    value = getattr(model, name)
    other = {bool: lambda v: str(not v).lower(), str: lambda v: v + "x",
             type(None): lambda v: 2}.get(type(value), lambda v: v * 2)(value)
    args = build_parser().parse_args([*argv, "--set", f"{name}={other}"])
    with pytest.raises(UsageError, match="--" + name.replace("_", "-")):
        init_train_config(args, model, MODEL_FIELDS)


@settings(max_examples=100, deadline=None)
@given(model=models())
def test_config_json_round_trip_is_the_identity(model):
    """config_to_hf then config_from_hf gives the model back, special tokens included, as a
    family that has what it has, and transformers' own config of that file windows the same
    layers by the same width; a mix that no family has is one ValueError naming it. The
    families, as transformers builds them: q, k, v biases only in Qwen2 (always there), QK-norm
    only in Qwen3 (always) and Gemma 3, layers without RoPE only in SmolLM3, a window on some
    layers in Qwen2, Qwen3, SmolLM3 and Gemma 3, on all of them in Mistral too."""
    from xenith_edu.model.hf.layout import gemma_marks

    pieces = [k for k in ("qkv_bias", "qk_norm", "nope_layers") if getattr(model, k)]
    try:
        hf = json.loads(json.dumps(config_to_hf(model)))
    except ValueError as e:
        assert "no Hugging Face family has" in str(e) and "\n" not in str(e)
        assert gemma_marks(model) or len(pieces) > 1, e
        return
    assert gemma_marks(model) or len(pieces) <= 1
    family = hf["model_type"]
    assert model.family == family or pieces or gemma_marks(model) or family in (
        "llama", "mistral") or model.global_layers
    assert config_from_hf(hf) == replace(model, attention="plain", flash_block=64,
                                         family=family)
    theirs = transformers.AutoConfig.for_model(**hf)
    assert families.their_windows(theirs) == [window_of(model, l) for l in range(model.n_layer)]


@pytest.fixture(scope="module")
def spec():
    return bpe_json()


FINE_TUNE = ["--text", "{text}", "--eval-every", "1", "--eval-batches", "1", "--seq-len", "8",
             "--batch-size", "2", "--decay-steps", "2", "--warmup-steps", "1", "--threads", "1",
             "--no-progress", "--sample-chars", "0", "--lr", "3e-3"]


@pytest.mark.parametrize("family", ["SmolLM-135M", *NEW])
def test_a_family_fine_tunes_with_its_own_heads_and_resumes_exactly(tmp_path, capsys, spec,
                                                                    family):
    """SmolLM at its published widths (9 and 3 heads, the README's example), each new family
    narrowed (tests/families.py): the run is the checkpoint's model, every field of it, and a
    run stopped and resumed ends where one straight run does, bit for bit."""
    published = {**NEW, "SmolLM-135M": SMOLLM_135M}[family]
    folder = tiny_folder(tmp_path / "hf", published, spec,
                         NARROW.get(family, {"num_hidden_layers": 1}))  # SmolLM: one layer
    published = json.loads((folder / "config.json").read_text())
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    common = [a.format(text=text) for a in FINE_TUNE]
    assert run(["from-hf", folder, "--out", tmp_path / "run"], capsys)[0] == 0
    heads = str(published["num_key_value_heads"])
    rc, _, err = run(["train", "--init", tmp_path / "run", "--out", tmp_path / "a", "--steps",
                      "2", "--n-kv-head", heads, *common], capsys)  # the checkpoint's own value
    assert rc == 0, err
    rc, _, err = run(["train", "--init", tmp_path / "run", "--out", tmp_path / "b", "--steps",
                      "1", *common], capsys)
    assert rc == 0, err
    rc, _, err = run(["train", "--resume", tmp_path / "b", "--steps", "2", "--no-progress",
                      "--sample-chars", "0"], capsys)
    assert rc == 0, err
    a, b, start = (load_checkpoint(tmp_path / n) for n in ("a", "b", "run"))
    assert a.config == b.config == replace(start.config, attention="plain")
    assert (a.config.n_head, a.config.n_kv_head) == (published["num_attention_heads"],
                                                      published["num_key_value_heads"])
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
        np.testing.assert_array_equal(a.m[k], b.m[k])
    # to-hf: transformers loads the tuned model as its family, with our logits
    assert run(["to-hf", tmp_path / "a", "--out", tmp_path / "a_hf"], capsys)[0] == 0
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a_hf", dtype=torch.float32)
    assert m.config.model_type == published["model_type"]
    x = a.tokenizer().encode(TEXT[:40])[None, :]
    with torch.no_grad():
        theirs = m(torch.tensor(x)).logits.numpy()
    assert np.abs(forward(a.params, a.config, x)[0] - theirs).max() < 1e-4
    capsys.readouterr()  # transformers' loading bar
    other = str(published["num_key_value_heads"] * 2 + 1)
    rc, _, err = run(["train", "--init", tmp_path / "run", "--out", tmp_path / "c",
                      "--n-kv-head", other, *common], capsys)
    assert rc == 2 and f"--n-kv-head ({other} asked, the checkpoint has" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "c").exists()


@pytest.mark.parametrize("family", sorted(TODAY)[:3])
def test_to_hf_writes_special_tokens_generation_and_tokenizer_settings(tmp_path, capsys, spec,
                                                                       family):
    published = TODAY[family]
    folder = tiny_folder(tmp_path / "hf", published, spec)
    assert run(["from-hf", folder, "--out", tmp_path / "run"], capsys)[0] == 0
    assert run(["to-hf", tmp_path / "run", "--out", tmp_path / "back"], capsys)[0] == 0
    back = tmp_path / "back"
    hf = json.loads((back / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id"):
        assert hf[key] == published[key], key
    gen = transformers.GenerationConfig.from_pretrained(back)
    assert (gen.bos_token_id, gen.eos_token_id) == (published["bos_token_id"],
                                                    published["eos_token_id"])
    tok = transformers.AutoTokenizer.from_pretrained(back)
    ckpt = load_checkpoint(tmp_path / "run")
    ours = ckpt.tokenizer()
    assert tok.eos_token_id == published["eos_token_id"]
    words = TEXT[:200]
    assert tok(words, add_special_tokens=False)["input_ids"] == ours.encode(words).tolist()
    m = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32)
    assert m.generation_config.eos_token_id == published["eos_token_id"]
    x = ours.encode("First Citizen")[None, :]
    with torch.no_grad():
        theirs = m(torch.tensor(x)).logits.numpy()
    assert np.abs(forward(ckpt.params, ckpt.config, x)[0] - theirs).max() < 1e-4


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
        ["rope_type", "factor", "low_freq_factor", "high_freq_factor",
         "original_max_position_embeddings", "rope_theta", "type", "full_attention",
         "sliding_attention"]), c, max_size=5),
    max_leaves=8)
NEW_KEYS = ["model_type", "rope_scaling", "rope_parameters", "head_dim", "sliding_window",
            "no_rope_layers", "no_rope_layer_interval", "use_sliding_window", "layer_types",
            "eos_token_id", "bos_token_id", "pad_token_id", "attention_bias",
            "num_key_value_heads", "rope_theta", "max_window_layers", "num_hidden_layers",
            "hidden_activation", "query_pre_attn_scalar", "rope_local_base_freq",
            "sliding_window_pattern", "attn_logit_softcapping", "final_logit_softcapping",
            "use_bidirectional_attention", "tie_word_embeddings"]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(family=st.sampled_from(sorted({**NEW, **TODAY})),
       changes=st.dictionaries(st.sampled_from(NEW_KEYS), JUNK, min_size=1, max_size=3))
def test_fuzzed_family_config_is_read_or_refused_in_one_line(family, changes):
    """Any published file with any of its new fields replaced by any JSON value: a Config that
    to-hf writes back as the same model, or one ValueError line, never another exception."""
    hf = json.loads(json.dumps({**{**NEW, **TODAY}[family], **changes}))
    try:
        cfg = config_from_hf(hf)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    try:
        back = config_from_hf(json.loads(json.dumps(config_to_hf(cfg))))
    except ValueError as e:  # a mix no family has: refused by name
        assert "no Hugging Face family has" in str(e)
        return
    assert replace(back, family=cfg.family) == cfg


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_window_switch_reads_as_transformers_reads_it(data):
    """Whatever a config.json of a windowing family says of its windows (use_sliding_window,
    sliding_window, max_window_layers, layer_types, no_rope_layers, each present or not), the
    book's model windows exactly the layers transformers' own config of that file does, by the
    same width, or one ValueError line names a field (transformers refusing it too, or a mix the
    book's model cannot hold)."""
    name = data.draw(st.sampled_from(["Qwen2.5-0.5B", "Qwen3-0.6B", "SmolLM3-3B",
                                      "Mistral-7B-v0.1", "Llama-3.2-1B"]))
    L = data.draw(st.integers(1, 5))
    hf = {**NEW[name], "num_hidden_layers": L}
    for key in ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                "no_rope_layers"):
        hf.pop(key, None)
    types = st.sampled_from(["sliding_attention", "full_attention"])
    drawn = data.draw(st.fixed_dictionaries({}, optional={
        "use_sliding_window": st.booleans(), "sliding_window": st.none() | st.integers(1, 9),
        "max_window_layers": st.integers(0, L + 1),
        "layer_types": st.lists(types, min_size=L, max_size=L),
        "no_rope_layers": st.lists(st.sampled_from([0, 1]), min_size=L, max_size=L)}))
    if data.draw(st.booleans()):  # switched on, so that the rule of each family is at work
        drawn.update(use_sliding_window=True, sliding_window=data.draw(st.integers(1, 9)))
    if hf["model_type"] == "mistral":
        drawn.pop("layer_types", None)  # transformers' Mistral warns and ignores them
    hf.update(drawn)
    try:
        ours = config_from_hf(json.loads(json.dumps(hf)))
    except ValueError as e:
        assert "\n" not in str(e) and "config.json" in str(e) or "'" in str(e), e
        return
    theirs = transformers.AutoConfig.for_model(**json.loads(json.dumps(hf)))
    assert [window_of(ours, l) for l in range(L)] == families.their_windows(theirs)


def their_sizes(t) -> dict:
    """What transformers' config object of a file makes of the sizes and constants the book's
    model has (its defaults filling what the file leaves out)."""
    rope = t.rope_parameters
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers'
    nope = getattr(t, "no_rope_layers", None) if t.model_type == "smollm3" else None
    return {"n_embd": t.hidden_size, "n_layer": t.num_hidden_layers,
            "n_head": t.num_attention_heads, "n_kv_head": t.num_key_value_heads,
            "head_dim": getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
            "ffn_hidden": t.intermediate_size, "vocab_size": t.vocab_size,
            "norm_eps": t.rms_norm_eps, "tie_embeddings": t.tie_word_embeddings,
            "rope_theta": float(rope["rope_theta"]),
            "nope_layers": tuple(l for l, f in enumerate(nope or []) if not f),
            "windows": families.their_windows(t),
            **{k: in_table(getattr(t, k), t.vocab_size) for k in ("pad_token_id", "bos_token_id",
                                                                   "eos_token_id")}}


def in_table(ids, V: int):
    """A special token's id (the end's may be several) as the book keeps it: None unless every
    id names a row of the table."""
    many = isinstance(ids, list)
    ok = all(isinstance(i, int) and 0 <= i < V for i in (ids if many else [ids]))
    return (tuple(ids) if many else ids) if ok and ids != [] else None


OUR_NAME = {"num_key_value_heads": "n_kv_head", "head_dim": "head_dim"}


def reads_as_transformers(hf: dict, dropped: set[str]) -> bool:
    """The book's model of config.json `hf` has every size, constant, window and special token
    that transformers' config object of it has (True), or the file is refused in one line
    naming a field left out, by its name or the model's (False)."""
    try:
        ours = config_from_hf(json.loads(json.dumps(hf)))
    except ValueError as e:
        assert "\n" not in str(e) and any(k in str(e) or OUR_NAME.get(k, "\0") in str(e)
                                          for k in dropped), e
        return False
    theirs = their_sizes(transformers.AutoConfig.for_model(**json.loads(json.dumps(hf))))
    mine = {k: getattr(ours, k) for k in theirs if k != "windows"}
    mine["windows"] = [window_of(ours, l) for l in range(ours.n_layer)]
    assert mine == theirs, dropped
    return True


def four_layers(published: dict) -> dict:
    """A published file cut to four layers, its lists of one entry a layer cut with it."""
    return {**published, "num_hidden_layers": 4,
            **{k: published[k][:4] for k in ("no_rope_layers", "layer_types") if k in published}}


@pytest.mark.parametrize("name", list(NEW))
def test_a_field_the_file_leaves_out_reads_as_transformers_default(name):
    """A config.json may leave out any field its family's config class has a default for: the
    book's model then takes transformers' default of that family (Qwen3's head width of 128,
    SmolLM3's tied embeddings and RoPE base, Mistral's 8 key/value heads and window of 4096,
    ...), or refuses the file in one line naming the field. Every field of every published
    file left out, one at a time."""
    published = four_layers(NEW[name])
    refused = {key for key in sorted(set(published) - {"model_type"})
               if not reads_as_transformers({k: v for k, v in published.items() if k != key},
                                            {key})}
    # refused: a size (transformers' default sizes are LLaMA-7B's, not this model's) or Qwen's
    # default of 32 key/value heads, more than the file's query heads
    assert refused <= set(INT_FIELDS) | {"num_key_value_heads"}, refused


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(list(NEW)), data=st.data())
def test_fields_left_out_together_read_as_transformers_defaults(name, data):
    """As above, several fields left out together (generated)."""
    published = four_layers(NEW[name])
    drop = data.draw(st.sets(st.sampled_from(sorted(set(published) - {"model_type"})),
                             min_size=2, max_size=4))
    reads_as_transformers({k: v for k, v in published.items() if k not in drop}, drop)
