"""Hugging Face checkpoints: the book's model against transformers' LlamaForCausalLM, the
safetensors reader, config.json's refusals, BPE runs from the command line, and padding.

Nothing is downloaded: the models are tiny random LlamaForCausalLM built from a LlamaConfig,
the tokenizer is trained here by the tokenizers library.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
from families import TEXT, bpe_json  # noqa: E402
from hf_exact import assert_grads_match, exact_llama  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from safetensors.torch import load_file as torch_load_file  # noqa: E402

from xenith_edu.cli import main  # noqa: E402
from xenith_edu.model import Config, forward, loss_and_grads  # noqa: E402
from xenith_edu.model.hf import (  # noqa: E402
    config_from_hf,
    read_hf,
    read_safetensors,
    write_safetensors,
)
from xenith_edu.softmax_ce import (  # noqa: E402
    softmax_ce_backward,
    softmax_ce_forward,
    softmax_cross_entropy,
)
from xenith_edu.training.checkpoint import load_checkpoint  # noqa: E402

PAD = 3


def tiny_llama(tie: bool, n_kv: int, pad: int | None = PAD, vocab: int = 40, seed: int = 0,
               scale: float = 0.4, **extra):
    """A random float64 LlamaForCausalLM with non-degenerate weights (gains away from one)."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=24, intermediate_size=40, num_attention_heads=4,
        num_key_value_heads=n_kv, num_hidden_layers=2, max_position_embeddings=16,
        tie_word_embeddings=tie, pad_token_id=pad, rms_norm_eps=1e-5,
        attn_implementation="eager", **extra)
    m = transformers.LlamaForCausalLM(cfg).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0, scale)
    return m


def tokens(rng, vocab=40, shape=(2, 12), pad_at=((1, 2), (0, 7))):
    x = rng.integers(0, vocab, size=shape)  # (B, S)
    y = rng.integers(0, vocab, size=shape)  # (B, S)
    for b, s in pad_at:  # padding in the inputs and in the targets
        x[b, s] = PAD
        y[1 - b, s] = PAD
    return x, y


def quiet_save(m, folder, **kw):
    m.save_pretrained(folder, **kw)
    return folder


# -- parity with transformers' autograd, float64 -------------------------------------------

@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("n_kv", [4, 2])
def test_logits_and_every_gradient_match_transformers(tmp_path, rng, tie, n_kv):
    m = tiny_llama(tie, n_kv)
    model = read_hf(quiet_save(m, tmp_path / "hf"), np.float64)
    assert model.config.n_kv_head == n_kv and model.config.pad_token_id == PAD
    x, y = tokens(rng)
    with exact_llama():
        logits = m(torch.tensor(x)).logits
        labels = torch.tensor(np.where(y == PAD, -100, y))  # transformers' ignored labels
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), labels.reshape(-1))
        loss.backward()
    ours, _ = forward(model.params, model.config, x)
    our_loss, grads = loss_and_grads(model.params, model.config, x, y)
    assert np.abs(ours - logits.detach().numpy()).max() <= 1e-10
    assert abs(our_loss - loss.item()) <= 1e-10
    assert_grads_match(grads, model.config, m)
    # the pad row: transformers' padding_idx gives it no gradient from the embedding
    if not tie:
        assert not grads["wte"][PAD].any()


def test_pad_row_is_the_only_one_left_out(rng):
    cfg = Config(vocab_size=12, n_embd=8, n_head=2, n_layer=1, ffn_hidden=16, seq_len=6,
                 tie_embeddings=False, pad_token_id=PAD)
    from xenith_edu.model import random_params

    params = random_params(cfg, rng)
    x = np.array([[PAD, 1, 2, PAD, 4, 5]])
    y = np.array([[1, 2, PAD, 4, 5, 6]])
    _, grads = loss_and_grads(params, cfg, x, y)
    assert not grads["wte"][PAD].any()
    assert np.abs(grads["wte"][[1, 2, 4, 5]]).min(axis=1).all()
    _, plain = loss_and_grads(params, Config(**{**cfg.to_dict(), "pad_token_id": None}), x, y)
    assert np.abs(plain["wte"][PAD]).max() > 0  # without a pad token the row learns


# -- softmax cross-entropy: ignore_index, and the forward/backward pair ---------------------

def test_ignore_index_matches_torch(rng):
    logits = rng.standard_normal((3, 5, 7))  # (B, S, V)
    y = rng.integers(0, 7, size=(3, 5))
    y[0, :2] = 2
    loss, dlogits = softmax_cross_entropy(logits, y, ignore_index=2)
    t = torch.tensor(logits, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(t.reshape(-1, 7), torch.tensor(y).reshape(-1),
                                            ignore_index=2)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-14
    assert np.abs(dlogits - t.grad.numpy()).max() < 1e-15
    assert not dlogits[y == 2].any()


def test_forward_backward_pair_is_the_convenience(rng):
    logits = rng.standard_normal((4, 6))
    y = rng.integers(0, 6, size=4)
    loss, cache = softmax_ce_forward(logits, y)
    want_loss, want = softmax_cross_entropy(logits, y)
    assert loss == want_loss
    np.testing.assert_array_equal(softmax_ce_backward(1.0, cache), want)
    _, cache = softmax_ce_forward(logits, y)
    np.testing.assert_allclose(softmax_ce_backward(2.5, cache), 2.5 * want, rtol=1e-15)
    # every target ignored: nothing to learn, and an ignored id may lie outside [0, V)
    loss, cache = softmax_ce_forward(logits, np.full(4, -100), ignore_index=-100)
    assert loss == 0.0 and not softmax_ce_backward(1.0, cache).any()


# -- the safetensors reader and writer --------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_becomes_float32_exactly(tmp_path, dtype):
    m = tiny_llama(True, 2).to(getattr(torch, dtype))
    quiet_save(m, tmp_path / "hf")
    ours = read_safetensors(tmp_path / "hf" / "model.safetensors")
    theirs = torch_load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(ours) == set(theirs)
    for k, t in theirs.items():
        assert ours[k].dtype == np.float32
        np.testing.assert_array_equal(ours[k], t.float().numpy())


def test_writer_and_library_agree(tmp_path, rng):
    arrays = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5).astype(np.float32),
              "c": rng.standard_normal((2, 2)).astype(np.float16),
              "d": np.arange(6, dtype=np.int64).reshape(2, 3), "e": np.zeros((0, 3))}
    write_safetensors(tmp_path / "ours.safetensors", arrays, {"format": "pt"})
    back = load_file(str(tmp_path / "ours.safetensors"))
    save_file(arrays, str(tmp_path / "lib.safetensors"))
    ours = read_safetensors(tmp_path / "lib.safetensors")
    for k, a in arrays.items():
        np.testing.assert_array_equal(back[k], a)
        np.testing.assert_array_equal(ours[k], a.astype(np.float32) if k == "c" else a)


def small_file(tmp_path) -> bytes:
    path = tmp_path / "small.safetensors"
    write_safetensors(path, {"w": np.arange(6.0).reshape(2, 3), "g": np.ones(4, np.float32)})
    return path.read_bytes()


def header_of(raw: bytes) -> dict:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n])


def with_header(raw: bytes, header: dict) -> bytes:
    n = int.from_bytes(raw[:8], "little")
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + raw[8 + n:]


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:-5], "truncated"),
    (lambda raw: raw[:4], "truncated"),
    (lambda raw: (10**9).to_bytes(8, "little") + raw[8:], "truncated"),
    (lambda raw: raw[:8] + b"{not json" + raw[17:], "not JSON"),
    (lambda raw: with_header(raw, {**header_of(raw), "w": {**header_of(raw)["w"],
                                                            "shape": [3, 3]}}), "needs"),
    (lambda raw: with_header(raw, {**header_of(raw), "w": {**header_of(raw)["w"],
                                                            "dtype": "F128"}}), "dtype"),
    (lambda raw: with_header(raw, {**header_of(raw), "w": {**header_of(raw)["w"],
                                                            "data_offsets": [8, 56]}}),
     "overlapping"),
    (lambda raw: raw + b"\0" * 8, "no tensor describes"),
])
def test_damaged_safetensors_is_one_line(tmp_path, damage, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(damage(small_file(tmp_path)))
    with pytest.raises(ValueError, match=message) as e:
        read_safetensors(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_safetensors_is_read_or_refused(tmp_path, data):
    raw = bytearray(small_file(tmp_path))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    raw = bytes(raw[:data.draw(st.integers(0, len(raw)))])
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(raw)
    try:
        out = read_safetensors(path)
    except ValueError as e:
        assert "\n" not in str(e)
    else:
        assert all(isinstance(a, np.ndarray) for a in out.values())


# -- config.json: what the book's model cannot represent is refused -------------------------

BASE = {"model_type": "llama", "vocab_size": 40, "hidden_size": 24, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 40,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"head_dim": 5}, "head_dim"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"hidden_size": "24"}, "hidden_size"),
    ({"model_type": "gpt2"}, "model_type"),
])
def test_unrepresentable_config_is_refused_by_name(change, field):
    with pytest.raises(ValueError, match=f"field {field} ") as e:
        config_from_hf({**BASE, **change})
    assert "\n" not in str(e.value)


def test_config_fields_are_read():
    cfg = config_from_hf({**BASE, "rope_parameters": {"rope_type": "default",
                                                      "rope_theta": 5e5}, "pad_token_id": -1})
    assert (cfg.n_kv_head, cfg.rope_theta, cfg.norm_eps, cfg.pad_token_id) == (2, 5e5, 1e-5,
                                                                               None)
    assert config_from_hf({**BASE, "rope_theta": 1e6}).rope_theta == 1e6
    for bad in (float("inf"), float("nan"), -1.0, True):
        with pytest.raises(ValueError, match="field rope_theta "):
            config_from_hf({**BASE, "rope_theta": bad})


def test_sharded_folder_reads_as_one(tmp_path):
    m = tiny_llama(False, 2)
    one = read_hf(quiet_save(m, tmp_path / "one"), np.float64)
    sharded = read_hf(quiet_save(m, tmp_path / "shards", max_shard_size="20KB"), np.float64)
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    for k, p in one.params.items():
        np.testing.assert_array_equal(sharded.params[k], p)


# -- the command line, end to end, with a BPE tokenizer trained here ------------------------

# TEXT and bpe_json (a byte-level BPE tokenizer trained on it) are tests/families.py's


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A bfloat16 tiny LLaMA with a BPE tokenizer, GQA, untied, with a pad token."""
    folder = tmp_path_factory.mktemp("hub") / "tiny"
    spec = bpe_json()
    V = tokenizers.Tokenizer.from_str(spec).get_vocab_size() + 4  # a few spare rows
    m = tiny_llama(False, 2, pad=2, vocab=V, scale=0.05).to(torch.bfloat16)
    quiet_save(m, folder)
    (folder / "tokenizer.json").write_text(spec, encoding="utf-8")
    return folder


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def hf_logits(folder: Path, x: np.ndarray) -> np.ndarray:
    m = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return m(torch.tensor(x)).logits.numpy()


def test_from_hf_to_hf_round_trip(tmp_path, hf_folder, capsys):
    rc, out, _ = run(["from-hf", hf_folder, "--out", tmp_path / "run"], capsys)
    assert rc == 0 and "BPE tokenizer" in out
    rc, _, _ = run(["to-hf", tmp_path / "run", "--out", tmp_path / "back"], capsys)
    assert rc == 0
    before = torch_load_file(str(hf_folder / "model.safetensors"))
    after = read_safetensors(tmp_path / "back" / "model.safetensors")
    assert set(before) == set(after)
    for k, t in before.items():  # bfloat16 -> float32 -> float32: not one bit changed
        np.testing.assert_array_equal(after[k], t.float().numpy())
    assert (tmp_path / "back" / "tokenizer.json").read_text() == \
        (hf_folder / "tokenizer.json").read_text()
    x = np.random.default_rng(0).integers(3, 100, size=(2, 10))
    ckpt = load_checkpoint(tmp_path / "run")
    ours, _ = forward(ckpt.params, ckpt.config, x)
    np.testing.assert_array_equal(hf_logits(tmp_path / "back", x), hf_logits(hf_folder, x))
    assert np.abs(ours - hf_logits(tmp_path / "back", x)).max() < 1e-5


def test_sample_gradcheck_and_fine_tune_a_converted_run(tmp_path, hf_folder, capsys):
    run_dir, ft, text = tmp_path / "run", tmp_path / "ft", tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert run(["from-hf", hf_folder, "--out", run_dir], capsys)[0] == 0
    rc, out, _ = run(["sample", run_dir, "--prompt", "First", "--chars", "5"], capsys)
    assert rc == 0 and out.startswith("First")
    rc, out, _ = run(["gradcheck", "--run", run_dir, "--coords", "2"], capsys)
    assert rc == 0 and "all 12 parameters pass" in out
    train = ["train", "--init", run_dir, "--out", ft, "--text", text, "--steps", "6",
             "--eval-every", "3", "--eval-batches", "1", "--seq-len", "8", "--batch-size", "2",
             "--lr", "3e-3", "--warmup-steps", "0", "--threads", "1", "--no-progress",
             "--sample-chars", "4"]
    rc, out, err = run(train, capsys)
    assert rc == 0, err
    start, tuned = load_checkpoint(run_dir), load_checkpoint(ft)
    assert tuned.step == 6 and tuned.config.n_kv_head == 2 and tuned.config.pad_token_id == 2
    assert tuned.config.seq_len == 16 and tuned.train["seq_len"] == 8  # the model's context kept
    assert tuned.tokenizer_spec == start.tokenizer_spec
    assert not np.array_equal(tuned.params["wq"], start.params["wq"])
    records = [json.loads(line) for line in (ft / "log.jsonl").read_text().splitlines()]
    evals = [r["val_loss"] for r in records if r["event"] == "eval"]
    assert evals[-1] < evals[0]  # fine-tuning on the text lowers its loss
    rc, out, err = run(["train", "--resume", ft, "--steps", "8", "--no-progress",
                        "--sample-chars", "0"], capsys)
    assert rc == 0, err
    assert run(["to-hf", ft, "--out", tmp_path / "ft_hf"], capsys)[0] == 0
    hf_config = json.loads((tmp_path / "ft_hf" / "config.json").read_text())
    assert hf_config["max_position_embeddings"] == 16 and hf_config["num_key_value_heads"] == 2
    x = np.random.default_rng(1).integers(3, 100, size=(1, 8))
    ours, _ = forward(load_checkpoint(ft).params, load_checkpoint(ft).config, x)
    assert np.abs(ours - hf_logits(tmp_path / "ft_hf", x)).max() < 1e-5


def test_init_refuses_model_settings(tmp_path, hf_folder, capsys):
    assert run(["from-hf", hf_folder, "--out", tmp_path / "run"], capsys)[0] == 0
    rc, _, err = run(["train", "--init", tmp_path / "run", "--out", tmp_path / "ft",
                      "--n-layer", "3"], capsys)
    assert rc == 2 and "--n-layer" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ft").exists()


def snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def damaged_copies(src: Path, root: Path) -> list[tuple[Path, str]]:
    """Copies of an HF folder, each damaged in one way, and the word its error must say."""
    out = []

    def copy(name: str) -> Path:
        d = root / name
        d.mkdir()
        for f in src.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        return d

    cfg = json.loads((src / "config.json").read_text())
    d = copy("notjson")
    (d / "config.json").write_text('{"vocab_size": 12,')
    out.append((d, "not JSON"))
    for key, value, word in (("rope_scaling", {"rope_type": "llama3"}, "rope_scaling"),
                             ("attention_bias", True, "attention_bias"),
                             ("hidden_act", "relu", "hidden_act"), ("head_dim", 5, "head_dim")):
        d = copy(key)
        (d / "config.json").write_text(json.dumps({**cfg, key: value}))
        out.append((d, word))
    d = copy("truncated")
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    out.append((d, "truncated"))
    d = copy("lying")
    raw = (d / "model.safetensors").read_bytes()
    h = header_of(raw)
    name = next(k for k in h if k != "__metadata__")
    h[name]["shape"] = [h[name]["shape"][0] + 1, *h[name]["shape"][1:]]
    (d / "model.safetensors").write_bytes(with_header(raw, h))
    out.append((d, "needs"))
    d = copy("notok")
    (d / "tokenizer.json").write_text("{}")
    out.append((d, "tokenizer"))
    return out


def test_hostile_folders_are_one_line_and_write_nothing(tmp_path, hf_folder, capsys):
    for folder, word in damaged_copies(hf_folder, tmp_path):
        before = snapshot(tmp_path)
        rc, out, err = run(["from-hf", folder, "--out", tmp_path / f"run_{folder.name}"],
                           capsys)
        assert rc == 1 and out == "", folder.name
        assert len(err.strip().splitlines()) == 1 and word in err, (folder.name, err)
        assert "Traceback" not in err and snapshot(tmp_path) == before, folder.name
        assert not (tmp_path / f"run_{folder.name}").exists()


def test_damaged_tokenizer_in_a_checkpoint_is_one_line(tmp_path, hf_folder, capsys):
    from xenith_edu.training.checkpoint import save_checkpoint

    assert run(["from-hf", hf_folder, "--out", tmp_path / "run"], capsys)[0] == 0
    ckpt = load_checkpoint(tmp_path / "run")
    save_checkpoint(tmp_path / "bad" / "ckpt.npz", ckpt.params, ckpt.m, ckpt.v, 0, ckpt.rng(),
                    ckpt.config, "", {}, '{"model": 7}')
    rc, _, err = run(["sample", tmp_path / "bad"], capsys)
    assert rc == 1 and "tokenizer" in err and len(err.strip().splitlines()) == 1


def test_package_never_imports_transformers_or_torch():
    code = ("import sys, xenith_edu, xenith_edu.model.hf, xenith_edu.cli.hf, "
            "xenith_edu.training.finetune, xenith_edu.cli.main; "
            "print(sorted(m for m in ('torch', 'transformers', 'safetensors', 'tokenizers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert out.strip() == "[]"


def test_fine_tuning_resumes_exactly_with_flash_attention_and_recompute(tmp_path, hf_folder,
                                                                      capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert run(["from-hf", hf_folder, "--out", tmp_path / "run"], capsys)[0] == 0
    common = ["--text", text, "--eval-every", "2", "--eval-batches", "1", "--seq-len", "8",
              "--batch-size", "2", "--decay-steps", "4", "--warmup-steps", "1", "--threads",
              "2", "--attention", "flash", "--flash-block", "4", "--recompute",
              "--no-progress", "--sample-chars", "0"]
    straight = ["train", "--init", tmp_path / "run", "--out", tmp_path / "a", "--steps", "4"]
    assert run([*straight, *common], capsys)[0] == 0
    half = ["train", "--init", tmp_path / "run", "--out", tmp_path / "b", "--steps", "2"]
    assert run([*half, *common], capsys)[0] == 0
    rc, _, err = run(["train", "--resume", tmp_path / "b", "--steps", "4", "--no-progress",
                      "--sample-chars", "0"], capsys)
    assert rc == 0, err
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert a.step == b.step == 4 and a.config.attention == "flash"
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
        np.testing.assert_array_equal(a.m[k], b.m[k])


def test_ignore_index_gradient_against_finite_differences(rng):
    from xenith_edu.tools.gradcheck import check_gradient

    logits = rng.standard_normal((7, 5))  # (N, V)
    y = rng.integers(0, 5, size=7)
    y[[1, 4]] = 2
    _, dlogits = softmax_cross_entropy(logits, y, ignore_index=2)
    r = check_gradient(lambda z: softmax_cross_entropy(z, y, ignore_index=2)[0], logits,
                       dlogits, name="dlogits", tol=1e-8)
    assert r.passed, r


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats()
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(changes=st.dictionaries(st.sampled_from(sorted(BASE) + [
    "rope_scaling", "rope_parameters", "rope_theta", "head_dim", "pad_token_id",
    "attention_bias", "mlp_bias", "hidden_act"]), JSON, max_size=4))
def test_fuzzed_config_is_read_or_refused_in_one_line(changes):
    try:
        cfg = config_from_hf({**BASE, **changes})
    except ValueError as e:
        assert "\n" not in str(e)
    else:
        assert isinstance(cfg, Config)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(spec=st.text(max_size=60) | JSON.map(json.dumps))
def test_fuzzed_tokenizer_json_is_read_or_refused(spec):
    from xenith_edu.model import BPETokenizer

    try:
        BPETokenizer(spec)
    except ValueError as e:
        assert "\n" not in str(e)


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 200), cols=st.integers(1, 70), block=st.integers(1, 80),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_the_blocked_transposed_copy_is_the_transpose(rows, cols, block, dtype):
    """The readers' and writers' transposed copy (checkpoint (out, in) <-> ours (in, out)) is
    src.T exactly, for any shape and block, a block that does not divide the rows included."""
    from xenith_edu.tools.util import copy_transposed

    src = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(dtype)
    dst = np.full((cols, rows), np.nan, dtype)
    copy_transposed(dst, src, block)
    np.testing.assert_array_equal(dst, src.T)
    with pytest.raises(ValueError, match="src.T has"):
        copy_transposed(np.empty((rows, cols + 1), dtype), src)
