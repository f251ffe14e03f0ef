"""Tests of the checkpoint: a round trip that loses nothing, atomic writes, checked loads."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest

from xenith_edu import Config, init_params
from xenith_edu.tools import util
from xenith_edu.training.checkpoint import (
    atomic_write,
    checksum,
    config_mismatch,
    generator_from_state,
    load_checkpoint,
    save_checkpoint,
)

CFG = Config(vocab_size=7, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)
VOCAB = "\n abcde"


def _state(seed=0, cfg=CFG):
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed, np.float32)
    m = {k: rng.standard_normal(p.shape).astype(np.float32) for k, p in params.items()}
    v = {k: rng.random(p.shape).astype(np.float32) for k, p in params.items()}
    return params, m, v


def _save(path, cfg=CFG, vocab=VOCAB, step=42, seed=0):
    params, m, v = _state(seed, cfg)
    rng = np.random.default_rng(123)
    rng.integers(0, 10, size=5)  # move it away from its initial state
    save_checkpoint(path, params, m, v, step, rng, cfg, vocab, {"lr": 1e-3, "seed": 5})
    return params, m, v, rng


def refused(path, why):
    """pytest.raises for exactly the message "checkpoint '<path>' <why>"."""
    return pytest.raises(ValueError, match="^" + re.escape(f"checkpoint '{path}' {why}") + "$")


AGAIN = "use a checkpoint written by `xenith-edu train`"
DAMAGED = "the file is damaged or from another version"


def test_round_trip_loses_nothing(tmp_path):
    path = tmp_path / "ckpt.npz"
    params, m, v, rng = _save(path)
    ck = load_checkpoint(path)
    assert ck.step == 42 and ck.config == CFG and ck.vocab == VOCAB
    assert ck.train == {"lr": 1e-3, "seed": 5}
    for saved, loaded in ((params, ck.params), (m, ck.m), (v, ck.v)):
        assert saved.keys() == loaded.keys()
        for k in saved:
            assert loaded[k].dtype == np.float32
            np.testing.assert_array_equal(loaded[k], saved[k])
    # the restored generator continues exactly where the saved one was
    np.testing.assert_array_equal(ck.rng().integers(0, 1000, 20), rng.integers(0, 1000, 20))


def test_file_holds_no_pickled_objects(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    with np.load(path, allow_pickle=False) as npz:
        assert all(npz[k].dtype != object for k in npz.files)
        meta = json.loads(str(npz["meta"][()]))
    assert meta["step"] == 42 and meta["config"]["n_embd"] == 16


def test_untied_checkpoint_round_trip(tmp_path):
    cfg = Config(vocab_size=7, n_embd=16, n_head=2, n_layer=1, ffn_hidden=24, seq_len=8,
                 tie_embeddings=False)
    _save(tmp_path / "c.npz", cfg=cfg)
    ck = load_checkpoint(tmp_path / "c.npz")
    assert "lm_head" in ck.params and ck.config == cfg


def test_directory_means_its_ckpt_npz(tmp_path):
    _save(tmp_path / "ckpt.npz")
    assert load_checkpoint(tmp_path).step == 42


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    before = path.read_bytes()

    def broken(f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.npz"]  # no temporary left


def test_save_failure_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    _save(path)
    before = path.read_bytes()

    def failing_savez(f, **arrays):
        f.write(b"PK partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(KeyboardInterrupt):
        _save(path, step=43)
    assert path.read_bytes() == before
    assert load_checkpoint(path).step == 42


def test_written_files_get_the_usual_permissions(tmp_path):
    import os
    umask = os.umask(0o022)
    os.umask(umask)
    _save(tmp_path / "ckpt.npz")
    assert (tmp_path / "ckpt.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def test_missing_file(tmp_path):
    with refused(tmp_path / "nope.npz", "does not exist: pass the ckpt.npz file that "
                 "`xenith-edu train` wrote (or its directory)"):
        load_checkpoint(tmp_path / "nope.npz")
    with refused(tmp_path / "ckpt.npz", "does not exist: pass the ckpt.npz file that "
                 "`xenith-edu train` wrote (or its directory)"):
        load_checkpoint(tmp_path)  # a directory means its ckpt.npz


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file_is_refused(tmp_path, keep):
    path = tmp_path / "ckpt.npz"
    _save(path)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match=f"^checkpoint '{re.escape(str(path))}' is truncated or is "
                       r"not a xenith-edu checkpoint \(.+\): use an intact checkpoint or train "
                       r"again$"):
        load_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "ckpt.npz"
    path.write_text("hello")
    with pytest.raises(ValueError, match=f"^checkpoint '{re.escape(str(path))}' is truncated or is "
                       r"not a xenith-edu checkpoint \(.+\): use an intact checkpoint or train "
                       r"again$"):
        load_checkpoint(path)
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with refused(tmp_path / "other.npz", "is truncated or is not a xenith-edu checkpoint (no "
                 f"metadata): {AGAIN}"):
        load_checkpoint(tmp_path / "other.npz")


def test_another_config_is_refused_naming_the_difference(tmp_path):
    _save(tmp_path / "ckpt.npz")
    other = Config(vocab_size=7, n_embd=32, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)
    with refused(tmp_path / "ckpt.npz", "is from another model config (n_embd: 16 in the "
                 "checkpoint, 32 asked): resume with the settings it was trained with, or start "
                 "a new run"):
        load_checkpoint(tmp_path / "ckpt.npz", config=other)
    assert load_checkpoint(tmp_path / "ckpt.npz", config=CFG).step == 42


def _rewrite(path, edit):
    """Rewrite a checkpoint's arrays through edit(arrays) (a dict), bypassing the checks."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    edit(arrays)
    np.savez(path, **arrays)


def test_shapes_that_disagree_with_the_config_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def shrink(arrays):
        arrays["params/w1"] = arrays["params/w1"][:, :, :10]

    _rewrite(path, shrink)
    with refused(path, "has 'params/w1' of shape (2, 16, 10), but its config implies "
                 "(2, 16, 24): the file is damaged"):
        load_checkpoint(path)


def test_config_in_metadata_that_disagrees_with_arrays_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def lie(arrays):
        meta = json.loads(str(arrays["meta"][()]))
        meta["config"]["n_layer"] = 3
        arrays["meta"] = np.array(json.dumps(meta))

    _rewrite(path, lie)
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint(path)


def test_missing_moment_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _rewrite(path, lambda a: a.pop("v/wq"))
    with refused(path, f"lacks arrays ['v/wq'] for its config: {DAMAGED}"):
        load_checkpoint(path)


def test_non_finite_parameters_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def poison(arrays):
        arrays["params/wq"][0, 0, 0] = np.nan

    _rewrite(path, poison)
    with refused(path, "has non-finite parameters ['wq']: use an earlier checkpoint"):
        load_checkpoint(path)


def test_corrupted_member_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    # flip bytes inside the stored wte array: the zip CRC check must catch it
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("params/wte.npy")
    data = bytearray(path.read_bytes())
    at = info.header_offset + 30 + len(info.filename) + 200
    data[at:at + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"^checkpoint '.*' is truncated or is not a xenith-edu "
                       r"checkpoint \(.*CRC.*\): use an intact checkpoint or train again$"):
        load_checkpoint(path)


def test_config_mismatch_lists_every_difference():
    other = Config(vocab_size=7, n_embd=32, n_head=4, n_layer=2, ffn_hidden=24, seq_len=8)
    # n_kv_head follows n_head when not given: the resolved configs differ there too
    assert config_mismatch(CFG, other) == ("n_embd: 16 in the checkpoint, 32 asked; "
                                           "n_head: 2 in the checkpoint, 4 asked; "
                                           "n_kv_head: 2 in the checkpoint, 4 asked")
    assert config_mismatch(CFG, CFG) == ""


# ---- atomicity: the temporary file sits next to the checkpoint ----

def test_temporary_file_is_in_the_checkpoint_directory(tmp_path, monkeypatch):
    """os.replace is atomic only within one file system: the temporary must be a sibling."""
    made, renamed = [], []
    real_open, real_replace = os.open, os.replace

    def open_(name, flags, mode=0o777):
        made.append(name)
        return real_open(name, flags, mode)

    def replace(src, dst):
        renamed.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(util.os, "open", open_)
    monkeypatch.setattr(util.os, "replace", replace)
    path = tmp_path / "run" / "ckpt.npz"  # the directory does not exist yet
    _save(path)
    assert len(made) == 1 and renamed == [(made[0], path)]
    tmp = str(made[0])
    assert os.path.dirname(tmp) == str(path.parent)
    assert re.fullmatch(r"\.ckpt\.npz\.[0-9a-f]{12}\.tmp", os.path.basename(tmp))
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.npz"]
    assert load_checkpoint(path).step == 42


def test_atomic_write_is_the_shared_writer():
    assert atomic_write is util.atomic_write


# ---- every field of the metadata is checked ----

def _edit_meta(path, edit):
    def rewrite(arrays):
        meta = json.loads(str(arrays["meta"][()]))
        edit(meta)
        arrays["meta"] = np.array(json.dumps(meta))

    _rewrite(path, rewrite)


def test_step_zero_is_a_valid_checkpoint(tmp_path):
    _save(tmp_path / "ckpt.npz", step=0)
    assert load_checkpoint(tmp_path / "ckpt.npz").step == 0


@pytest.mark.parametrize("step", [-1, 1.5, True, "3", None])
def test_a_step_that_is_not_a_count_is_refused(tmp_path, step):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m.update(step=step))
    with refused(path, f"has step {step!r}, not an integer >= 0: the file is damaged"):
        load_checkpoint(path)


def test_a_vocabulary_of_the_wrong_length_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m.update(vocab=VOCAB[:-1]))
    with refused(path, "has a vocab of 6 characters but a config with vocab_size 7: the file "
                 "is damaged"):
        load_checkpoint(path)
    _edit_meta(path, lambda m: m.update(vocab=VOCAB + "z"))
    with refused(path, "has a vocab of 8 characters but a config with vocab_size 7: the file "
                 "is damaged"):
        load_checkpoint(path)


def test_a_vocabulary_that_is_not_a_tokenizer_vocabulary_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m.update(vocab=list(VOCAB)))
    with refused(path, f"has a vocab that is a list, not a str: {AGAIN}"):
        load_checkpoint(path)
    _edit_meta(path, lambda m: m.update(vocab="\n abcdd"))
    with refused(path, "has a damaged vocab (vocab has repeated characters: each character "
                 "must appear once)"):
        load_checkpoint(path)


@pytest.mark.parametrize("state, why", [
    ({"bit_generator": "PCG64", "state": "garbage", "has_uint32": 0, "uinteger": 0},
     "rng_state is not a valid PCG64 state (TypeError: "),
    ({"bit_generator": "PCG64", "state": {"state": 1.5, "inc": 3}, "has_uint32": 0,
      "uinteger": 0}, "rng_state is not a valid PCG64 state (it does not read back as saved)"),
    ({"bit_generator": "PCG64", "has_uint32": 0, "uinteger": 0},
     "rng_state is not a valid PCG64 state (KeyError: 'state')"),
    ({"bit_generator": "MT19937", "state": {}}, "rng_state names an unknown bit generator "
                                                "'MT19937'"),
    ("PCG64", "rng_state names an unknown bit generator None"),
])
def test_a_damaged_random_state_is_refused(tmp_path, state, why):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m.update(rng_state=state))
    with pytest.raises(ValueError, match="^" + re.escape(f"checkpoint '{path}' has a damaged "
                                                         f"rng_state ({why}")):
        load_checkpoint(path)


def test_generator_from_state_round_trip():
    rng = np.random.default_rng(9)
    rng.random(3)
    for g in (rng, np.random.Generator(np.random.PCG64DXSM(4))):
        copy = generator_from_state(g.bit_generator.state)
        assert type(copy.bit_generator) is type(g.bit_generator)
        np.testing.assert_array_equal(copy.random(5), g.random(5))


def test_save_refuses_a_generator_whose_state_is_not_json(tmp_path):
    params, m, v = _state()
    with pytest.raises(ValueError, match=r"^rng uses the bit generator MT19937, whose state is "
                       r"not plain JSON: use one of \('PCG64', 'PCG64DXSM'\), e\.g\. "
                       r"np\.random\.default_rng\(seed\)$"):
        save_checkpoint(tmp_path / "c.npz", params, m, v, 1,
                        np.random.Generator(np.random.MT19937(0)), CFG, VOCAB)
    assert not (tmp_path / "c.npz").exists()
    with pytest.raises(ValueError, match="^params, m and v must have the same keys$"):
        save_checkpoint(tmp_path / "c.npz", params, {**m, "x": m["wq"]}, v, 1,
                        np.random.default_rng(0), CFG, VOCAB)
    with pytest.raises(ValueError, match="^params, m and v must have the same keys$"):
        save_checkpoint(tmp_path / "c.npz", params, m, {**v, "x": v["wq"]}, 1,
                        np.random.default_rng(0), CFG, VOCAB)


def test_training_settings_are_optional_but_must_be_a_record(tmp_path):
    path = tmp_path / "ckpt.npz"
    params, m, v = _state()
    save_checkpoint(path, params, m, v, 3, np.random.default_rng(0), CFG, VOCAB)
    assert load_checkpoint(path).train == {}
    _edit_meta(path, lambda meta: meta.pop("train"))
    assert load_checkpoint(path).train == {}
    _edit_meta(path, lambda meta: meta.update(train=[1, 2]))
    with refused(path, f"has training settings 'train' that are a list, not a record: {AGAIN}"):
        load_checkpoint(path)


def test_unreadable_metadata_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _rewrite(path, lambda a: a.update(meta=np.array("{not json")))
    with pytest.raises(ValueError, match="^" + re.escape(f"checkpoint '{path}' has unreadable "
                       "metadata (it is not JSON (") + r".*\)\): " + re.escape(AGAIN) + "$"):
        load_checkpoint(path)
    _rewrite(path, lambda a: a.update(meta=np.array("[1, 2]")))
    with refused(path, f"has unreadable metadata (a list, not a record): {AGAIN}"):
        load_checkpoint(path)
    _rewrite(path, lambda a: a.update(meta=np.array([1.0, 2.0])))
    with pytest.raises(ValueError, match=re.escape(f"checkpoint '{path}' has unreadable metadata")):
        load_checkpoint(path)


@pytest.mark.parametrize("field", ["format", "step", "config", "vocab", "rng_state"])
def test_metadata_without_a_field_is_refused(tmp_path, field):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m.pop(field))
    with refused(path, f"has metadata without [{field!r}]: {AGAIN}"):
        load_checkpoint(path)


def test_another_format_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m.update(format="xenith-edu checkpoint 0"))
    with refused(path, "has format 'xenith-edu checkpoint 0', this version reads 'xenith-edu "
                 "checkpoint 1': train again with this version"):
        load_checkpoint(path)


def test_an_unreadable_config_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _edit_meta(path, lambda m: m["config"].update(n_head=3))
    with pytest.raises(ValueError, match="^" + re.escape(f"checkpoint '{path}' has an unreadable "
                       "config (ValueError: Config.n_embd (16) must be divisible by Config.n_head "
                       f"(3)): {AGAIN}") + "$"):
        load_checkpoint(path)
    _edit_meta(path, lambda m: m["config"].update(n_head=2, colour="red"))
    with pytest.raises(ValueError, match="^" + re.escape(f"checkpoint '{path}' has an unreadable "
                       "config (TypeError: ") + ".*colour"):
        load_checkpoint(path)


# ---- every array is checked ----

def test_extra_arrays_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    _rewrite(path, lambda a: a.update({"params/extra": np.zeros(3, np.float32)}))
    with refused(path, f"has unexpected arrays ['params/extra'] for its config: {DAMAGED}"):
        load_checkpoint(path)


def test_mixed_dtypes_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def widen(arrays):
        arrays["params/wq"] = arrays["params/wq"].astype(np.float64)

    _rewrite(path, widen)
    with refused(path, "has 'params/wq' of dtype float64 and 'params/wte' of dtype float32: all "
                 "arrays must share one float dtype"):
        load_checkpoint(path)


def test_integer_arrays_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def to_int(arrays):
        for k in arrays:
            if k != "meta":
                arrays[k] = arrays[k].astype(np.int32)

    _rewrite(path, to_int)
    with pytest.raises(ValueError, match=r"of dtype int32 and 'params/wte' of dtype int32: all "
                       r"arrays must share one float dtype$"):
        load_checkpoint(path)


def test_float64_checkpoints_load(tmp_path):
    params, m, v = _state()
    as64 = [{k: a.astype(np.float64) for k, a in d.items()} for d in (params, m, v)]
    save_checkpoint(tmp_path / "c.npz", *as64, 5, np.random.default_rng(0), CFG, VOCAB)
    ck = load_checkpoint(tmp_path / "c.npz", config=CFG)
    assert all(a.dtype == np.float64 for d in (ck.params, ck.m, ck.v) for a in d.values())
    assert ck.step == 5 and ck.config == CFG


# ---- the shared atomic writer that checkpoints use ----

def test_atomic_write_makes_missing_directories_and_replaces(tmp_path):
    path = tmp_path / "a" / "b" / "f.bin"
    util.atomic_write(path, lambda f: f.write(b"one"))
    util.atomic_write(path, lambda f: f.write(b"two"))  # the directories exist now: fine
    assert path.read_bytes() == b"two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.bin"]


def test_atomic_write_text_is_utf8_with_newlines_as_given(tmp_path):
    path = tmp_path / "t" / "notes.txt"
    util.atomic_write_text(str(path), "é\r\nx\n")
    assert path.read_bytes() == "é\r\nx\n".encode()


def test_atomic_write_flushes_to_disk_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(util.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    util.atomic_write(tmp_path / "f", lambda f: f.write(b"x"))
    assert len(synced) == 1


def test_atomic_write_cleans_up_even_if_the_temporary_is_gone(tmp_path):
    def vanish(f):
        (tmp,) = tmp_path.glob(".f.*.tmp")
        tmp.unlink()  # something removed the temporary: the original error still shows
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="^boom$"):
        util.atomic_write(tmp_path / "f", vanish)
    assert list(tmp_path.iterdir()) == []


def test_an_error_without_a_message_is_named_by_its_type(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def failing_zip(*args, **kwargs):
        raise EOFError

    monkeypatch.setattr(zipfile, "ZipFile", failing_zip)
    with refused(path, "is truncated or is not a xenith-edu checkpoint (EOFError): use an intact "
                 "checkpoint or train again"):
        load_checkpoint(path)


def test_messages_list_at_most_four_arrays(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    names = sorted(k for k in init_params(CFG, 0, np.float32))
    assert len(names) >= 5
    _rewrite(path, lambda a: [a.pop(f"v/{k}") for k in names])
    with refused(path, f"lacks arrays {[f'v/{k}' for k in names[:4]]} for its config: {DAMAGED}"):
        load_checkpoint(path)
    _save(path)
    _rewrite(path, lambda a: a.update({f"x/{i}": np.zeros(1) for i in range(5)}))
    with refused(path, f"has unexpected arrays {[f'x/{i}' for i in range(4)]} for its config: "
                 f"{DAMAGED}"):
        load_checkpoint(path)
    _save(path)

    def poison(arrays):
        for k in names:
            arrays[f"params/{k}"][...] = np.inf

    _rewrite(path, poison)
    order = list(init_params(CFG, 0, np.float32))  # the contract's order
    with refused(path, f"has non-finite parameters {order[:4]}: use an earlier checkpoint"):
        load_checkpoint(path)


def test_moments_are_checked_like_the_parameters(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def shrink(arrays):
        arrays["v/w2"] = arrays["v/w2"][:, :3]

    _rewrite(path, shrink)
    with refused(path, "has 'v/w2' of shape (2, 3, 16), but its config implies (2, 24, 16): the "
                 "file is damaged"):
        load_checkpoint(path)


# ---- damage is one line: sizes before allocation, zip errors, checksums ----

TRUNCATED = "is truncated or is not a xenith-edu checkpoint"


def _damaged(path):
    """The one-line refusal of a damaged checkpoint: a ValueError naming the file once."""
    with pytest.raises(ValueError) as e:
        load_checkpoint(path)
    message = str(e.value)
    assert message.startswith(f"checkpoint '{path}' ") and message.count(str(path)) == 1
    assert "\n" not in message and "pickle" not in message
    return message


def test_a_zeroed_checkpoint_gets_no_advice_to_unpickle(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    path.write_bytes(bytes(path.stat().st_size))
    assert _damaged(path) == (f"checkpoint '{path}' {TRUNCATED} (File is not a zip file): use "
                              "an intact checkpoint or train again")


def _zip(path, members):
    """A stored (uncompressed) zip of raw members {name: bytes}, as np.savez writes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)


def _npy_header(shape, descr="<f4"):
    import io
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False,
                                             "shape": shape})
    return f.getvalue()


def test_a_header_claiming_1e14_elements_is_refused_before_allocating(tmp_path):
    path = tmp_path / "ckpt.npz"
    _zip(path, {"meta.npy": _npy_header((10**14,)) + b"\0" * 64})
    message = _damaged(path)
    assert "claims shape (100000000000000,) of float32" in message and "holds 64" in message


def test_an_empty_member_and_a_pickled_member_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _zip(path, {"meta.npy": b""})
    assert TRUNCATED in _damaged(path)
    _zip(path, {"meta.npy": _npy_header((2,), "|O") + b"\0" * 16})
    assert "holds Python objects" in _damaged(path)
    _zip(path, {"meta.txt": b"hello"})
    assert "is not one array of the file" in _damaged(path)


@pytest.mark.parametrize("offset, value", [(10, 99), (8, 1), (8, 0x41), (10, 8)])
def test_flipped_bits_in_the_zip_directory_are_one_line(tmp_path, offset, value):
    """The central directory's general-purpose flags (8: bit 0 "encrypted") and compression
    method (10: 99 is AES, 8 deflate over stored bytes): NotImplementedError, RuntimeError or
    a BadZipFile inside the zip reader, a ValueError out of load_checkpoint."""
    path = tmp_path / "ckpt.npz"
    _save(path)
    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x01\x02")  # the last member's central directory record
    data[at + offset] = value
    path.write_bytes(bytes(data))
    assert TRUNCATED in _damaged(path)


def test_flipped_bits_that_the_zip_crc_misses_are_caught_by_the_checksums(tmp_path):
    """A file rewritten with a valid zip (new CRCs) but other bytes in an array: the checksum
    in the metadata, computed when the checkpoint was saved, refuses it."""
    path = tmp_path / "ckpt.npz"
    _save(path)

    def flip(arrays):
        bits = arrays["m/w1"].view(np.uint32)
        bits[0, 1, 2] ^= 1 << 3

    _rewrite(path, flip)
    with refused(path, "has arrays ['m/w1'] that do not match their checksums (flipped bits in "
                 "the file): use an intact checkpoint or train again"):
        load_checkpoint(path)
    _edit_meta(path, lambda m: m.update(checksums=[1, 2]))
    with refused(path, "has damaged checksums in its metadata: use an intact checkpoint or "
                 "train again"):
        load_checkpoint(path)


def test_a_checkpoint_without_checksums_still_loads(tmp_path):
    """A checkpoint saved before the checksums existed is read as before."""
    path = tmp_path / "ckpt.npz"
    params, _, _, _ = _save(path)
    _edit_meta(path, lambda m: m.pop("checksums"))
    np.testing.assert_array_equal(load_checkpoint(path).params["wq"], params["wq"])


def test_loaded_arrays_are_writable_and_checksums_recorded(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    ck = load_checkpoint(path)
    ck.params["wq"][0, 0, 0] += 1.0  # the trainer updates them in place
    with np.load(path, allow_pickle=False) as npz:
        meta = json.loads(str(npz["meta"][()]))
        assert set(meta["checksums"]) == set(npz.files) - {"meta"}
        assert all(meta["checksums"][k] == checksum(npz[k]) for k in meta["checksums"])


def test_an_unreadable_file_names_the_reason_once(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def unreadable(name, *args, **kwargs):  # as open() says it: with the path, once more
        raise PermissionError(13, "Permission denied", str(name))

    monkeypatch.setattr(zipfile, "ZipFile", unreadable)
    assert "(Permission denied)" in _damaged(path)


def _interrupt_after(monkeypatch, name):
    """os.<name> does its work, then a Ctrl-C lands before its result is kept (a signal that
    arrived during the system call is delivered just after it returns)."""
    real = getattr(util.os, name)

    def call(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(util.os, name, call)


@pytest.mark.parametrize("name", ["open", "fsync"])
def test_an_interrupt_just_after_a_system_call_leaves_no_temporary(tmp_path, monkeypatch, name):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    _interrupt_after(monkeypatch, name)
    with pytest.raises(KeyboardInterrupt):
        util.atomic_write(path, lambda f: f.write(b"new"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert path.read_bytes() == b"old"


def test_an_interrupt_just_after_the_rename_keeps_the_new_file(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    _interrupt_after(monkeypatch, "replace")
    with pytest.raises(KeyboardInterrupt):
        util.atomic_write(path, lambda f: f.write(b"new"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert path.read_bytes() == b"new"


def test_a_temporary_name_another_writer_holds_is_left_alone(tmp_path, monkeypatch):
    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(util.secrets, "token_hex", lambda n: next(names))
    theirs = tmp_path / ".f.bin.aaaaaaaaaaaa.tmp"
    theirs.write_bytes(b"another writer's")
    util.atomic_write(tmp_path / "f.bin", lambda f: f.write(b"mine"))
    assert (tmp_path / "f.bin").read_bytes() == b"mine"
    assert theirs.read_bytes() == b"another writer's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".f.bin.aaaaaaaaaaaa.tmp", "f.bin"]


def test_a_write_that_fails_while_another_writer_holds_a_name_leaves_theirs(tmp_path,
                                                                             monkeypatch):
    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(util.secrets, "token_hex", lambda n: next(names))
    theirs = tmp_path / ".f.bin.aaaaaaaaaaaa.tmp"
    theirs.write_bytes(b"another writer's")

    def broken(f):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        util.atomic_write(tmp_path / "f.bin", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".f.bin.aaaaaaaaaaaa.tmp"]


# ---- Ctrl-C and SIGTERM wait until the file is written ----

class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop(signum)


@pytest.fixture
def term_raises():
    """SIGTERM raises _Stop, as the command line's handler raises its own interrupt."""
    previous = signal.signal(signal.SIGTERM, _stop)
    yield
    signal.signal(signal.SIGTERM, previous)


def _signalled_mid_write(signum, chunks=3):
    """A write that gets `signum` after its first chunk, as a kill or a Ctrl-C would land."""
    def write(f):
        for i in range(chunks):
            f.write(b"chunk %d;" % i)
            if i == 0:
                signal.raise_signal(signum)
    return write


def test_ctrl_c_mid_write_comes_after_the_file_is_whole(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        util.atomic_write(path, _signalled_mid_write(signal.SIGINT))
    assert path.read_bytes() == b"chunk 0;chunk 1;chunk 2;"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_mid_checkpoint_comes_after_a_checkpoint_that_loads(tmp_path, term_raises,
                                                                    monkeypatch):
    real_savez = np.savez
    monkeypatch.setattr(np, "savez", lambda f, **arrays: (signal.raise_signal(signal.SIGTERM),
                                                           real_savez(f, **arrays)))
    path = tmp_path / "ckpt.npz"
    with pytest.raises(_Stop) as e:
        _save(path)
    assert e.value.args == (signal.SIGTERM,)
    assert load_checkpoint(path).step == 42
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.npz"]
    assert signal.getsignal(signal.SIGTERM) is _stop


def test_the_first_held_signal_is_delivered_once(term_raises):
    with pytest.raises(_Stop) as e:
        with util.interrupts_held():
            with util.interrupts_held():  # a nested hold delivers nothing itself
                signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
            reached = True
    assert reached and e.value.args == (signal.SIGTERM,)
    with util.interrupts_held():
        pass  # nothing held: nothing delivered, the handlers are back
    assert signal.getsignal(signal.SIGTERM) is _stop
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with util.interrupts_held():
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_error_in_the_block_still_delivers_the_held_signal(term_raises):
    with pytest.raises(_Stop) as e:
        with util.interrupts_held():
            signal.raise_signal(signal.SIGTERM)
            raise OSError("disk full")
    assert isinstance(e.value.__context__, OSError)


def test_off_the_main_thread_writes_are_not_held(tmp_path):
    errors = []

    def work():
        try:
            util.atomic_write(tmp_path / "f.bin", lambda f: f.write(b"from a thread"))
        except BaseException as e:  # signal.signal would raise ValueError here
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert errors == [] and (tmp_path / "f.bin").read_bytes() == b"from a thread"


def test_a_default_sigterm_ends_the_process_after_the_file_is_whole(tmp_path):
    """No handler installed: SIGTERM does what it always does, once the file is written."""
    path = tmp_path / "f.bin"
    code = ("import signal, sys; from xenith_edu.tools import util\n"
            "def write(f):\n"
            "    f.write(b'one;'); signal.raise_signal(signal.SIGTERM); f.write(b'two;')\n"
            "util.atomic_write(sys.argv[1], write)\n"
            "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == ""
    assert path.read_bytes() == b"one;two;"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_a_held_signal_with_its_default_action_is_raised_again(monkeypatch):
    """The default action is the kernel's (SIGTERM ends the process): the held signal is sent
    again once its handler is back; an ignored one is dropped. (The subprocess test above
    shows the end to end; this one runs where mutation testing sees it.)"""
    raised = []
    monkeypatch.setattr(util.signal, "raise_signal", raised.append)
    util._deliver(signal.SIGTERM, None, signal.SIG_DFL)
    util._deliver(signal.SIGINT, None, signal.SIG_IGN)
    assert raised == [signal.SIGTERM]


def test_the_handler_gets_the_frame_the_signal_came_in():
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append((signum, frame)))
    try:
        with util.interrupts_held():
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    (signum, frame), = got
    assert signum == signal.SIGTERM and frame.f_code.co_name == (
        "test_the_handler_gets_the_frame_the_signal_came_in")


# ---------------------------------------------- a checkpoint the size of what it holds, read once


def test_weights_alone_round_trip_and_groups_read_alone(tmp_path):
    path = tmp_path / "ckpt.npz"
    params, m, v = _state()
    save_checkpoint(path, params, None, None, 0, np.random.default_rng(0), CFG, VOCAB)
    ck = load_checkpoint(path)
    assert ck.m is None and ck.v is None
    for k in params:
        np.testing.assert_array_equal(ck.params[k], params[k])
    n = sum(p.nbytes for p in params.values())
    _save(path)
    assert load_checkpoint(path, groups=("params",)).m is None
    with zipfile.ZipFile(path) as z:
        full = sum(i.file_size for i in z.infolist() if i.filename.startswith("params/"))
    assert n <= full <= n + 256 * len(params)  # the weights' bytes and a .npy header each
    with pytest.raises(ValueError, match="both be given, or both be None"):
        save_checkpoint(path, params, m, None, 0, np.random.default_rng(0), CFG, VOCAB)


def test_moments_false_with_moments_in_the_file_is_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"][()]))
    meta["moments"] = False
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="unexpected arrays"):
        load_checkpoint(path)


@pytest.mark.parametrize("how", ["resume", "init"])
def test_the_command_line_reads_each_array_once(tmp_path, monkeypatch, how):
    from collections import Counter

    from xenith_edu.cli import main
    from xenith_edu.training import checkpoint

    run = tmp_path / "run"
    quick = ["--preset", "small", "--eval-every", "1", "--no-progress", "--sample-chars", "0",
             "--threads", "1", "--eval-batches", "1", "--batch-size", "2"]
    assert main(["train", *quick, "--steps", "1", "--out", str(run)]) == 0
    reads, original = Counter(), checkpoint._read_npy

    def counted(f, size, name):
        reads[name] += 1
        return original(f, size, name)

    monkeypatch.setattr(checkpoint, "_read_npy", counted)
    argv = (["--resume", str(run), "--steps", "2"] if how == "resume" else
            ["--init", str(run), "--out", str(tmp_path / "new"), "--steps", "1"])
    assert main(["train", *quick, *argv]) == 0
    assert reads["params/wte.npy"] == 1 and max(reads.values()) <= 2, reads  # meta: twice
