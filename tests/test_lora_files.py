"""LoRA's files are foreign input like any other: a peft adapter folder and a LoRA run's
checkpoint, damaged at random points (truncation, flipped bytes, edited fields), are either read
whole and right or refused with one ValueError; never another exception, never a wrong model.
And a LoRA checkpoint round-trips: the base, the adapters, their moments, the merged model.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xenith_edu.model import Config, param_shapes, random_params
from xenith_edu.model.adapters import Adapters, LoraSpec, init_adapters, merged
from xenith_edu.model.hf.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    read_adapter_folder,
    write_adapter_folder,
)
from xenith_edu.training import TrainConfig
from xenith_edu.training.checkpoint import load_checkpoint, save_checkpoint

CFG = Config(vocab_size=11, n_embd=12, n_head=3, n_kv_head=1, n_layer=2, seq_len=6)
SPEC = LoraSpec(2, 4.0, ("q", "k", "o"))
FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def adapters(seed: int = 0, dtype=np.float32) -> Adapters:
    rng = np.random.default_rng(seed)
    ad = init_adapters(CFG, SPEC, rng, dtype)
    for a in ad.weights.values():
        a[...] = rng.standard_normal(a.shape)
    return ad


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("adapter") / "a"
    write_adapter_folder(path, adapters(), CFG)
    return path


def same(a: Adapters, b: Adapters) -> bool:
    return a.spec == b.spec and all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


@FUZZ
@given(which=st.sampled_from([ADAPTER_CONFIG, ADAPTER_WEIGHTS]), data=st.data())
def test_a_damaged_adapter_folder_is_read_right_or_refused_in_one_line(tmp_path_factory, folder,
                                                                       which, data):
    work = tmp_path_factory.mktemp("d")
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        (work / name).write_bytes((folder / name).read_bytes())
    raw = bytearray((folder / which).read_bytes())
    kind = data.draw(st.sampled_from(["truncate", "flip", "delete"]))
    if kind == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    if kind == "delete":
        (work / which).unlink()
    else:
        (work / which).write_bytes(bytes(raw))
    try:
        got = read_adapter_folder(work, CFG)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    # read: then it is what was written (a flip in a float's low bits is a different but
    # valid adapter, so only the structure is certain), finite, of the spec's shapes
    assert set(got.weights) == set(adapters().weights)
    assert all(np.isfinite(a).all() for a in got.weights.values())


def test_an_adapter_folder_round_trips(folder):
    assert same(read_adapter_folder(folder, CFG), adapters())


def test_an_adapter_folder_for_another_base_is_refused(folder):
    with pytest.raises(ValueError, match="shape|lacks"):
        read_adapter_folder(folder, replace(CFG, n_embd=18, n_head=3))
    with pytest.raises(ValueError, match="lacks"):
        read_adapter_folder(folder, replace(CFG, n_layer=3))


def lora_checkpoint(path, ad: Adapters, step: int = 3):
    rng = np.random.default_rng(1)
    base = random_params(CFG, rng, dtype=np.float32)
    m = {k: rng.random(a.shape).astype(np.float32) for k, a in ad.weights.items()}
    v = {k: rng.random(a.shape).astype(np.float32) for k, a in ad.weights.items()}
    tc = TrainConfig().with_settings(lora_rank=SPEC.rank, lora_alpha=SPEC.alpha,
                                     lora_targets="q,k,o")
    save_checkpoint(path, {**base, **ad.weights}, m, v, step, np.random.default_rng(2), CFG,
                    "abcdefghijk", tc.to_dict())
    return base, m, v


def test_a_lora_checkpoint_round_trips(tmp_path):
    ad = adapters()
    base, m, v = lora_checkpoint(tmp_path / "c.npz", ad)
    ck = load_checkpoint(tmp_path / "c.npz")
    assert same(ck.adapters, ad)
    assert set(ck.base) == set(param_shapes(CFG)) and set(ck.m) == set(ad.weights)
    for k in base:
        assert np.array_equal(ck.base[k], base[k])
        assert np.array_equal(ck.params[k], merged(base, ad)[k])
    weights_only = load_checkpoint(tmp_path / "c.npz", groups=("params",))
    assert weights_only.m is None and same(weights_only.adapters, ad)


@pytest.mark.parametrize(("edit", "words"), [
    ({"lora_rank": "two"}, "LoRA settings"), ({"lora_rank": 3}, "shape"),
    ({"lora_targets": "q,k"}, "unexpected"), ({"lora_targets": "q,k,o,v"}, "lacks"),
    ({"lora_alpha": -1.0}, "LoRA settings"), ({"lora_rank": 0}, "lacks"),
    ({"lora_targets": "gate"}, "LoRA settings"), ({"lora_rank": 10**12}, "LoRA settings"),
])
def test_a_lora_checkpoint_whose_settings_were_edited_is_refused(tmp_path, edit, words):
    lora_checkpoint(tmp_path / "c.npz", adapters())
    with zipfile.ZipFile(tmp_path / "c.npz") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))[()]))
    meta["train"].update(edit)
    buf = io.BytesIO()
    np.save(buf, np.array(json.dumps(meta)))
    members["meta.npy"] = buf.getvalue()
    with zipfile.ZipFile(tmp_path / "c.npz", "w") as z:
        for name, raw in members.items():
            z.writestr(name, raw)
    with pytest.raises(ValueError, match=words) as e:
        load_checkpoint(tmp_path / "c.npz")
    assert "\n" not in str(e.value)


def test_save_refuses_moments_that_are_not_the_adapters(tmp_path):
    ad = adapters()
    rng = np.random.default_rng(0)
    base = random_params(CFG, rng, dtype=np.float32)
    tc = TrainConfig().with_settings(lora_rank=2, lora_alpha=4.0, lora_targets="q,k,o")
    full = {**base, **ad.weights}
    with pytest.raises(ValueError, match="adapters' keys"):  # full moments in a LoRA run
        save_checkpoint(tmp_path / "c.npz", full, full, full, 1, rng, CFG, "abcdefghijk",
                        tc.to_dict())
    assert not (tmp_path / "c.npz").exists()
