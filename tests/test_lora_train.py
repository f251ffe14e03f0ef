"""LoRA fine-tuning end to end, through the command line: `train --init DIR --lora-rank R`
trains the adapters alone (AdamW moments for them only, the base weights untouched bit for
bit), a run stopped and resumed ends where one straight run does, bit for bit, and to-hf writes
the merged model or the base with a peft adapter folder. Bad combinations are one line each.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("tokenizers")
from families import NEW, TEXT, bpe_json, tiny_folder  # noqa: E402

from xenith_edu.cli import main  # noqa: E402
from xenith_edu.model import forward, param_shapes  # noqa: E402
from xenith_edu.model.adapters import LoraSpec, adapter_shapes  # noqa: E402
from xenith_edu.training.checkpoint import load_checkpoint  # noqa: E402

NARROWED = {"num_hidden_layers": 2, "hidden_size": 24, "intermediate_size": 40,
            "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 4}
COMMON = ["--eval-every", "1", "--eval-batches", "1", "--seq-len", "8", "--batch-size", "2",
          "--decay-steps", "4", "--warmup-steps", "1", "--threads", "1", "--no-progress",
          "--sample-chars", "0", "--lr", "1e-2"]
LORA = ["--lora-rank", "3", "--lora-alpha", "6", "--lora-targets", "o,q,v"]


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    folder = tiny_folder(tmp / "hf", NEW["Llama-3.2-1B"], bpe_json(), NARROWED, scale=0.2)
    (tmp / "text.txt").write_text(TEXT, encoding="utf-8")
    assert main(["from-hf", str(folder), "--out", str(tmp / "run")]) == 0
    return tmp


@pytest.mark.parametrize("parts", [False, True])
def test_lora_trains_the_adapters_alone_and_resumes_bit_for_bit(converted, tmp_path, capsys,
                                                                monkeypatch, request, parts):
    """`parts`: the frozen blocks as sums of parts and the head on vocabulary shards, a thread
    each (model/parts.py; here at any size), as at a real model's: the same exactness."""
    ran: list[int] = []
    if parts:
        from threadpoolctl import threadpool_limits

        from xenith_edu.model import cores, ends
        from xenith_edu.model import parts as parts_mod

        monkeypatch.setattr(parts_mod, "MIN_WORK", 0)
        monkeypatch.setattr(ends, "SPLIT", 0)
        request.addfinalizer(threadpool_limits(2).restore_original_limits)
        real = cores.on_threads
        monkeypatch.setattr(parts_mod, "on_threads", lambda calls: ran.append(1) or real(calls))
    common = ["--text", converted / "text.txt", *COMMON]
    init = converted / "run"
    rc, _, err = run(["train", "--init", init, "--out", tmp_path / "a", "--steps", "4", *LORA,
                      *common], capsys)
    assert rc == 0, err
    rc, _, err = run(["train", "--init", init, "--out", tmp_path / "b", "--steps", "2", *LORA,
                      *common], capsys)
    assert rc == 0, err
    rc, _, err = run(["train", "--resume", tmp_path / "b", "--steps", "4", "--no-progress",
                      "--sample-chars", "0"], capsys)
    assert rc == 0, err
    start, a, b = (load_checkpoint(p) for p in (init, tmp_path / "a", tmp_path / "b"))
    spec = LoraSpec(3, 6.0, ("q", "v", "o"))
    assert a.adapters.spec == b.adapters.spec == spec
    names = set(adapter_shapes(a.config, spec))
    assert set(a.m) == set(a.v) == names  # AdamW moments for the adapters alone
    for k in param_shapes(a.config):  # the frozen base: the init's weights, bit for bit
        assert np.array_equal(a.base[k], start.params[k]), k
    for k in names:
        assert np.array_equal(a.adapters.weights[k], b.adapters.weights[k]), k
        assert np.array_equal(a.m[k], b.m[k]) and np.array_equal(a.v[k], b.v[k]), k
        assert a.adapters.weights[k].any(), k  # B moved from zero, A from its draw
    assert a.step == b.step == 4
    for k in param_shapes(a.config):  # the model its readers get: the adapters merged
        assert np.array_equal(a.params[k], b.params[k]), k
    changed = {k for k in param_shapes(a.config) if not np.array_equal(a.params[k], a.base[k])}
    assert changed == {"wq", "wv", "wo"}
    assert bool(ran) == parts  # the parts ran, or not


def test_to_hf_merges_or_writes_a_peft_adapter_folder(converted, tmp_path, capsys):
    common = ["--text", converted / "text.txt", *COMMON]
    rc, _, err = run(["train", "--init", converted / "run", "--out", tmp_path / "a", "--steps",
                      "2", *LORA, *common], capsys)
    assert rc == 0, err
    a = load_checkpoint(tmp_path / "a")
    x = a.tokenizer().encode(TEXT[:40])[None, :]
    ours = forward(a.params, a.config, x)[0]
    assert run(["to-hf", tmp_path / "a", "--out", tmp_path / "merged", "--merge"],
               capsys)[0] == 0
    assert not (tmp_path / "merged" / "adapter").exists()
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged",
                                                          dtype=torch.float32)
    with torch.no_grad():
        assert np.abs(m(torch.tensor(x)).logits.numpy() - ours).max() < 1e-4
    capsys.readouterr()
    rc, out, err = run(["to-hf", tmp_path / "a", "--out", tmp_path / "sep"], capsys)
    assert rc == 0, err
    conf = json.loads((tmp_path / "sep" / "adapter" / "adapter_config.json").read_text())
    assert conf["r"] == 3 and conf["lora_alpha"] == 6.0
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sep",
                                                             dtype=torch.float32)
    with torch.no_grad():  # the folder itself is the frozen base
        assert np.abs(base(torch.tensor(x)).logits.numpy() - ours).max() > 1e-3
        pm = peft.PeftModel.from_pretrained(base, tmp_path / "sep" / "adapter")
        assert np.abs(pm(torch.tensor(x)).logits.numpy() - ours).max() < 1e-4


@pytest.mark.parametrize(("argv", "words"), [
    (["train", "--out", "{tmp}/n", "--lora-rank", "2", "--steps", "1"], "needs a model"),
    (["train", "--init", "{run}", "--out", "{tmp}/t", "--lora-rank", "2", "--lora-targets",
      "q,up"], "SwiGLU"),
    (["train", "--init", "{run}", "--out", "{tmp}/t", "--lora-rank", "-1"], "lora_rank"),
    (["train", "--init", "{run}", "--out", "{tmp}/t", "--lora-rank", "2", "--lora-alpha",
      "0"], "alpha"),
    (["train", "--init", "{run}", "--out", "{tmp}/t", "--lora-rank", "2", "--lora-targets",
      ","], "targets"),
])
def test_bad_lora_settings_are_one_line_and_write_nothing(converted, tmp_path, capsys, argv,
                                                          words):
    argv = [a.format(tmp=tmp_path, run=converted / "run") for a in argv]
    rc, _, err = run([*argv, "--text", converted / "text.txt", *COMMON], capsys)
    assert rc != 0 and words in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t").exists() and not (tmp_path / "n").exists()


def test_a_resume_keeps_its_adapters(converted, tmp_path, capsys):
    common = ["--text", converted / "text.txt", *COMMON]
    assert run(["train", "--init", converted / "run", "--out", tmp_path / "a", "--steps", "1",
                *LORA, *common], capsys)[0] == 0
    for change in (["--lora-rank", "0"], ["--lora-rank", "5"], ["--lora-targets", "q"]):
        rc, _, err = run(["train", "--resume", tmp_path / "a", "--steps", "2", *change,
                          "--no-progress"], capsys)
        assert rc != 0 and "keeps its adapters" in err, err
