"""Fuzz tests of every reader of foreign input: hostile bytes raise only the documented errors.

Property-based (hypothesis), on a fixed budget and derandomized, so that `make test` runs the
same examples every time and stays fast: the checkpoint loader (flipped, cut and inserted
bytes; hostile metadata; .npy headers that lie), the log reader, the text loader and the
command line's arguments. A failure prints the smallest input that breaks the rule.
"""

from __future__ import annotations

import io
import json
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xenith_edu.training as training
from xenith_edu import Config, init_params
from xenith_edu.cli import main
from xenith_edu.cli.settings import UsageError
from xenith_edu.training import TrainConfig
from xenith_edu.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from xenith_edu.training.data import load_text, prepare_data
from xenith_edu.training.runlog import read_log

BUDGET = 100  # examples per property (a few seconds each); the metadata, slower, gets fewer


def fuzz(examples: int = BUDGET) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


FUZZ = fuzz()

CFG = Config(vocab_size=5, n_embd=8, n_head=2, n_layer=1, ffn_hidden=8, seq_len=4)


def _checkpoint_bytes(tmp: Path) -> bytes:
    params = init_params(CFG, 0, np.float32)
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    save_checkpoint(tmp / "ok.npz", params, zeros, zeros, 3, np.random.default_rng(0), CFG,
                    "\nabcd", TrainConfig().to_dict())
    return (tmp / "ok.npz").read_bytes()


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[Path, bytes]:
    tmp = tmp_path_factory.mktemp("fuzz")
    return tmp, _checkpoint_bytes(tmp)


def _load(path: Path) -> None:
    """load_checkpoint(path): a Checkpoint or one ValueError naming the file, nothing else."""
    try:
        assert isinstance(load_checkpoint(path), Checkpoint)
    except ValueError as e:
        message = str(e)
        assert message.startswith(f"checkpoint '{path}' ") and "\n" not in message
        assert message.count(str(path)) == 1 and "pickle" not in message


edits = st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=8)


@FUZZ
@given(edits=edits, cut=st.none() | st.integers(0, 10**9), insert=st.binary(max_size=16))
def test_the_checkpoint_loader_refuses_damaged_bytes_with_one_value_error(good, edits, cut,
                                                                          insert):
    tmp, data = good
    data = bytearray(data)
    for at, value in edits:
        data[at % len(data)] = value
    if insert:
        at = edits[0][0] % len(data)
        data[at:at] = insert
    if cut is not None:
        data = data[:cut % len(data)]
    path = tmp / "damaged.npz"
    path.write_bytes(bytes(data))
    _load(path)


@FUZZ
@given(where=st.sampled_from([b"PK\x01\x02", b"PK\x03\x04", b"PK\x05\x06"]),
       offset=st.integers(4, 45), value=st.integers(0, 255), nth=st.integers(0, 40))
def test_flipped_bytes_in_the_zip_headers_are_one_value_error(good, where, offset, value, nth):
    """The zip directory and headers: compression method, flags, sizes, offsets, name lengths."""
    tmp, data = good
    data, starts, at = bytearray(data), [], data.find(where)
    while at >= 0:
        starts.append(at)
        at = data.find(where, at + 1)
    if starts:
        data[min(starts[nth % len(starts)] + offset, len(data) - 1)] = value
    path = tmp / "header.npz"
    path.write_bytes(bytes(data))
    _load(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=4)
META_KEYS = ["format", "step", "config", "vocab", "rng_state", "train", "checksums"]


@fuzz(40)
@given(changes=st.dictionaries(st.sampled_from(META_KEYS), json_values, max_size=3),
       drop=st.lists(st.sampled_from(META_KEYS), max_size=2),
       config=st.dictionaries(st.sampled_from(sorted(CFG.to_dict())), json_values, max_size=2))
def test_hostile_metadata_is_one_value_error(good, changes, drop, config):
    tmp, data = good
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"][()]))
    meta["config"].update(config)
    meta.update(changes)
    for k in drop:
        meta.pop(k, None)
    arrays["meta"] = np.array(json.dumps(meta))
    path = tmp / "meta.npz"
    np.savez(path, **arrays)
    _load(path)


@FUZZ
@given(shape=st.lists(st.integers(0, 10**15), max_size=4).map(tuple),
       descr=st.sampled_from(["<f4", "<f8", "<U10", "|b1", "<i8", "|O", "|V16", "<c16"]),
       body=st.binary(max_size=64), name=st.sampled_from(["meta.npy", "params/wte.npy", "x"]))
def test_npy_headers_that_lie_about_their_size_allocate_nothing(good, shape, descr, body, name):
    tmp, _ = good
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False,
                                                  "shape": shape})
    path = tmp / "lies.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(name, header.getvalue() + body)
    _load(path)


@FUZZ
@given(lines=st.lists(st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode())
                      | st.fixed_dictionaries({"event": json_values, "step": json_values},
                                              optional={"loss": json_values,
                                                        "val_loss": json_values})
                      .map(lambda d: json.dumps(d).encode()), max_size=8))
def test_the_log_reader_drops_damaged_lines_and_raises_nothing(good, lines):
    tmp, _ = good
    path = tmp / "log.jsonl"
    path.write_bytes(b"\n".join(lines))
    damaged = []
    for r in read_log(path, damaged):
        assert isinstance(r, dict) and isinstance(r["step"], int) and r["step"] >= 0
        assert isinstance(r["event"], str)
    assert all(note.startswith("line ") for note in damaged)


@FUZZ
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
       seq_len=st.integers(1, 40))
def test_the_text_loader_raises_only_value_error(good, raw, seq_len):
    tmp, _ = good
    path = tmp / "text.txt"
    path.write_bytes(raw)
    try:
        tokenizer, train_ids, val_ids = prepare_data(load_text(path), seq_len)
    except ValueError as e:
        assert "\n" not in str(e) and str(e).count(str(path)) <= 1
        return
    assert len(train_ids) > seq_len and len(val_ids) > seq_len


def _stderr():
    return redirect_stderr(io.StringIO())


class _Reached(Exception):
    """The arguments were accepted: the trainer was called (and stopped here)."""


def _stub_train(tc, out, **kw):
    assert isinstance(tc, TrainConfig)
    raise _Reached


OPTIONS = ["--preset", "--set", "--out", "--resume", "--steps", "--lr", "--n-layer",
           "--n-embd", "--n-head", "--ffn-hidden", "--seq-len", "--text", "--tie-embeddings",
           "--no-tie-embeddings", "--attention", "--beta2", "--threads", "--overlap",
           "--sample-chars", "--mpi-timeout", "--seed", "--recompute"]
WORDS = ["small", "book", "0", "-1", "3", "64", "1e-3", "nan", "inf", "true", "maybe", "lr=2",
         "n_layer=x", "vocab_size=3", "=", "", "flash", "plain", "☃", "run", "--", "-x"]


@FUZZ
@given(argv=st.lists(st.sampled_from(OPTIONS) | st.sampled_from(WORDS) | st.text(max_size=6),
                     max_size=8))
def test_the_command_line_arguments_raise_only_documented_errors(good, argv):
    """Whatever the arguments of `train`, the command line returns an exit status with one
    line on stderr, or calls the trainer with a TrainConfig: never a traceback."""
    tmp, _ = good
    args = [a.replace("run", str(tmp / "run")) for a in argv]
    with mock.patch.object(training, "train", _stub_train), _stderr() as err:
        try:
            rc = main(["train", *args])
        except _Reached:
            return
    err = err.getvalue()
    assert rc != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)


@FUZZ
@given(prompt=st.none() | st.text(max_size=5), chars=st.text(max_size=3),
       temperature=st.text(max_size=5), top_k=st.none() | st.text(max_size=3))
def test_the_sample_arguments_raise_only_documented_errors(good, prompt, chars, temperature,
                                                           top_k):
    tmp, _ = good
    argv = ["sample", str(tmp / "ok.npz"), "--chars", chars[:1] or "1", "--temperature",
            temperature]
    argv += [] if prompt is None else ["--prompt", prompt]
    argv += [] if top_k is None else ["--top-k", top_k]
    with _stderr() as err, redirect_stdout(io.StringIO()):
        rc = main(argv)
    err = err.getvalue()
    if rc == 0:
        assert err == ""
    else:
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)


def test_usage_errors_are_value_errors():
    """The documented errors of the settings: a UsageError is a ValueError."""
    assert issubclass(UsageError, ValueError)
