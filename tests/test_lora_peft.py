"""LoRA against peft: the adapter folder we write is what `peft.PeftModel.from_pretrained` loads
over the base folder to-hf writes, with the same logits in float64 (1e-10), and one training
step's dA and dB are torch autograd's through peft's LoRA layers (1e-10); a merged to-hf folder
gives the same logits in plain transformers. Generated: the targets, rank, alpha, grouped heads.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from families import NEW, reduced, tiny_model  # noqa: E402
from hf_exact import exact_models  # noqa: E402

from xenith_edu.model import forward, loss_and_grads  # noqa: E402
from xenith_edu.model.adapters import TARGETS, Adapters, LoraSpec, init_adapters, merged  # noqa: E402
from xenith_edu.model.hf import read_hf, write_hf  # noqa: E402
from xenith_edu.model.hf.adapters import (  # noqa: E402
    ADAPTER_CONFIG,
    adapters_to_peft,
    read_adapter_folder,
    write_adapter_folder,
)

V = 32


def base_folder(path, heads: tuple[int, int], seed: int):
    hf = {**reduced(NEW["Llama-3.2-1B"], layers=2, vocab=V), "hidden_size": 24,
          "intermediate_size": 40, "num_attention_heads": heads[0],
          "num_key_value_heads": heads[1], "head_dim": 24 // heads[0]}
    m = tiny_model(hf, seed=seed, scale=0.4, dtype=torch.float64)
    m.save_pretrained(path)
    return m


def random_adapters(cfg, spec, rng):
    ad = init_adapters(cfg, spec, rng, np.float64)
    for a in ad.weights.values():
        a[...] = 0.3 * rng.standard_normal(a.shape)  # B nonzero: the adapters matter
    return ad


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(targets=st.sets(st.sampled_from(list(TARGETS)), min_size=1), rank=st.integers(1, 4),
       alpha=st.sampled_from([1.0, 8.0, 16.0, 5.5]), heads=st.sampled_from([(6, 2), (4, 4)]),
       seed=st.integers(0, 2**16))
def test_peft_loads_our_adapters_with_the_same_logits_and_grads(tmp_path_factory, targets,
                                                                rank, alpha, heads, seed):
    tmp = tmp_path_factory.mktemp("peft")
    rng = np.random.default_rng(seed)
    base_folder(tmp / "base", heads, seed)
    model = read_hf(tmp / "base", np.float64)
    cfg, params = model.config, model.params
    ad = random_adapters(cfg, LoraSpec(rank, alpha, tuple(targets)), rng)
    write_adapter_folder(tmp / "adapter", ad, cfg, base=str(tmp / "base"))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp / "base", dtype=torch.float64,
                                                             attn_implementation="eager")
    pm = peft.PeftModel.from_pretrained(base, tmp / "adapter", is_trainable=True)
    x, y = rng.integers(0, V, (2, 7)), rng.integers(0, V, (2, 7))
    with exact_models():
        logits = pm(torch.tensor(x)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                                 torch.tensor(y).reshape(-1))
        loss.backward()
    ours, _ = forward(params, cfg, x, adapters=ad)
    our_loss, grads = loss_and_grads(params, cfg, x, y, adapters=ad)
    assert np.abs(ours - logits.detach().numpy()).max() <= 1e-10
    assert abs(our_loss - loss.item()) <= 1e-10
    theirs = {n.removesuffix(".default.weight") + ".weight": p
              for n, p in pm.named_parameters() if p.requires_grad}
    hf_grads = adapters_to_peft(Adapters(ad.spec, grads), cfg)
    assert set(hf_grads) == set(theirs)  # peft trains exactly the adapters we do
    for name, g in hf_grads.items():
        assert np.abs(g - theirs[name].grad.numpy()).max() <= 1e-10 * max(1.0, np.abs(g).max())
    assert all(p.grad is None for p in pm.parameters() if not p.requires_grad)
    # the merged folder: plain transformers, the same logits
    write_hf(tmp / "merged", merged(params, ad), cfg)
    mm = transformers.AutoModelForCausalLM.from_pretrained(tmp / "merged", dtype=torch.float64)
    with exact_models(), torch.no_grad():
        assert np.abs(mm(torch.tensor(x)).logits.numpy() - ours).max() <= 1e-10
    back = read_adapter_folder(tmp / "adapter", cfg, np.float64)
    assert back.spec == ad.spec
    for k, a in ad.weights.items():
        assert np.array_equal(back.weights[k], a), k


@pytest.mark.parametrize(("change", "match"), [
    ({"peft_type": "IA3"}, "peft_type"), ({"use_dora": True}, "use_dora"),
    ({"target_modules": ["gate_proj"]}, "targets"), ({"r": 0}, "rank"),
    ({"bias": "all"}, "bias"), ({"target_modules": "q_proj"}, "target_modules"),
    ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"), ({"lora_alpha": -1}, "alpha"),
])
def test_adapter_config_that_we_cannot_hold_is_refused_in_one_line(tmp_path, rng, change, match):
    base_folder(tmp_path / "base", (4, 4), 0)
    cfg = read_hf(tmp_path / "base", np.float64).config
    write_adapter_folder(tmp_path / "a", init_adapters(cfg, LoraSpec(2), rng), cfg)
    conf = json.loads((tmp_path / "a" / ADAPTER_CONFIG).read_text())
    (tmp_path / "a" / ADAPTER_CONFIG).write_text(json.dumps({**conf, **change}))
    with pytest.raises(ValueError, match=match):
        read_adapter_folder(tmp_path / "a", cfg)
