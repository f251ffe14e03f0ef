"""Tests of xenith_edu.checkpoint: a round trip that loses nothing, atomic writes, checked loads."""

import json
import zipfile

import numpy as np
import pytest

from xenith_edu import Config, init_params
from xenith_edu.checkpoint import atomic_write, load_checkpoint, save_checkpoint

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
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.npz")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file_is_refused(tmp_path, keep):
    path = tmp_path / "ckpt.npz"
    _save(path)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match="truncated"):
        load_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "ckpt.npz"
    path.write_text("hello")
    with pytest.raises(ValueError, match="not a xenith-edu checkpoint"):
        load_checkpoint(path)
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="no metadata"):
        load_checkpoint(tmp_path / "other.npz")


def test_another_config_is_refused_naming_the_difference(tmp_path):
    _save(tmp_path / "ckpt.npz")
    other = Config(vocab_size=7, n_embd=32, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)
    with pytest.raises(ValueError, match="another model config.*n_embd: 16 in the checkpoint, 32"):
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
    with pytest.raises(ValueError, match=r"'params/w1' of shape \(2, 16, 10\)"):
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
    with pytest.raises(ValueError, match="lacks.*v/wq"):
        load_checkpoint(path)


def test_non_finite_parameters_are_refused(tmp_path):
    path = tmp_path / "ckpt.npz"
    _save(path)

    def poison(arrays):
        arrays["params/wq"][0, 0, 0] = np.nan

    _rewrite(path, poison)
    with pytest.raises(ValueError, match="non-finite"):
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
    with pytest.raises(ValueError, match="truncated or is not"):
        load_checkpoint(path)
