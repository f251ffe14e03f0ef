"""Faults in every command that writes a folder other than `train` (whose own are in test_cli
and test_train): `from-hf` and `to-hf` killed (SIGKILL) and stopped (SIGTERM) at random
moments, on a full disk, and with a second writer.

Invariants: whatever moment a kill lands, the folder holds the old state or the new one whole,
and the next command sweeps every temporary name; SIGTERM gives one line and exit 143 and
leaves no temporary name; a full disk gives one line naming the folder and what is kept, and
leaves no empty folder; a second writer, or `--overwrite` over a running trainer, is refused in
one line and changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from test_gates import bpe_spec, cli  # noqa: E402

from xenith_edu.model import BPETokenizer, Config  # noqa: E402
from xenith_edu.model.hf import write_hf  # noqa: E402
from xenith_edu.model.params import random_params  # noqa: E402
from xenith_edu.training.checkpoint import load_checkpoint  # noqa: E402
from xenith_edu.training.rundir import TEMP, FolderLock  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KILLS = int(os.environ.get("XENITH_FAULTS", "2"))  # random moments per command and signal

# what to-hf writes: the config, the weights, the tokenizer and the settings transformers reads
MODEL_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    """A Hugging Face folder of some 10 MB: its writes take long enough to be hit."""
    folder = tmp_path_factory.mktemp("faults") / "hf"
    tok = BPETokenizer(bpe_spec())
    cfg = Config(vocab_size=tok.vocab_size + 3, n_embd=256, n_head=4, n_kv_head=2, n_layer=4,
                 ffn_hidden=512, seq_len=64)
    write_hf(folder, random_params(cfg, np.random.default_rng(1), dtype=np.float32), cfg, tok)
    return folder


@pytest.fixture(scope="module")
def run(hf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "run"
    assert cli(["from-hf", hf, "--out", out])[0] == 0
    return out


def temps(*folders: Path) -> list[Path]:
    return [p for f in folders if f.exists() for p in f.iterdir() if TEMP.match(p.name)]


def start(argv: list) -> subprocess.Popen:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "xenith_edu", *map(str, argv)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def moments(seed: int) -> list[float]:
    """Random moments (seconds after the start) spread over a command's life."""
    return sorted(np.random.default_rng(seed).uniform(0.3, 4.0, KILLS).tolist())


def signal_at(p: subprocess.Popen, at: float, sig: int) -> None:
    """Send `sig` to `p` `at` seconds after now, unless it has ended before (then a signal
    would find nothing to stop, and waiting on would only idle)."""
    try:
        p.wait(timeout=at)
    except subprocess.TimeoutExpired:
        p.send_signal(sig)


def same_model(a: Path, b: Path) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes()
               for n in ("model.safetensors", "config.json", "tokenizer.json"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_from_hf_stopped_at_any_moment(hf, tmp_path, sig):
    for k, at in enumerate(moments(sig)):
        out = tmp_path / f"run{k}"
        p = start(["from-hf", hf, "--out", out])
        signal_at(p, at, sig)
        stdout, err = p.communicate(timeout=120)
        if sig == signal.SIGTERM and p.returncode == -sig:  # starting, or ending: no handler
            assert temps(out, tmp_path) == []
            assert not out.exists() or load_checkpoint(out).m is None  # nothing, or all
        elif sig == signal.SIGTERM:
            assert p.returncode in (0, 143), err
            assert p.returncode == 0 or (len(err.strip().splitlines()) == 1
                                         and "stopped by SIGTERM" in err), err
            assert temps(out, tmp_path) == []
        if (out / "ckpt.npz").exists():  # the old state (nothing) or the new one, whole
            load_checkpoint(out)
        rc, _, err, _ = cli(["from-hf", hf, "--out", out, "--overwrite"])  # the next run
        assert rc == 0, err
        assert temps(out, tmp_path) == [] and (out / ".lock").exists() is False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_to_hf_overwrite_stopped_at_any_moment_keeps_one_whole_model(hf, run, tmp_path, sig):
    out = tmp_path / "model"
    old = tmp_path / "old"
    assert cli(["to-hf", run, "--out", out])[0] == 0
    assert cli(["to-hf", run, "--out", old])[0] == 0
    for at in moments(sig + 1):
        p = start(["to-hf", run, "--out", out, "--overwrite"])
        signal_at(p, at, sig)
        _, err = p.communicate(timeout=120)
        if sig == signal.SIGTERM:  # done, stopped in one line, or stopped while starting
            assert p.returncode in (0, -sig) or (p.returncode == 143
                                                 and len(err.splitlines()) == 1), err
            assert temps(out, tmp_path) == []
        assert sorted(x.name for x in out.iterdir() if x.name != ".lock") == MODEL_FILES
        assert same_model(out, old)  # the same run: old and new are equal, and whole
        rc, _, err, _ = cli(["to-hf", run, "--out", out, "--overwrite"])
        assert rc == 0 and temps(out, tmp_path) == [], err


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB file system (tmpfs): a full disk for real."""
    where = tmp_path / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_is_one_line_naming_the_folder_and_what_is_kept(hf, run, tiny_disk):
    for argv, out in ((["from-hf", hf], tiny_disk / "run"), (["to-hf", run], tiny_disk / "m")):
        rc, stdout, err, _ = cli([*argv, "--out", out])
        assert rc == 1 and len(err.strip().splitlines()) == 1, err
        assert f"cannot write into '{out}'" in err and "nothing was written" in err, err
        assert not out.exists() and list(tiny_disk.iterdir()) == []  # no empty folder, no temp


def test_a_full_disk_keeps_the_model_already_there(run, tiny_disk, tmp_path):
    small = tiny_disk / "m"  # a model that fits, then one that does not, over it
    (small).mkdir()
    (small / "config.json").write_text(json.dumps({"model_type": "llama"}))
    before = (small / "config.json").read_bytes()
    rc, _, err, _ = cli(["to-hf", run, "--out", small, "--overwrite"])
    assert rc == 1 and "the model already there is kept, unchanged" in err, err
    assert (small / "config.json").read_bytes() == before and temps(small, tiny_disk) == []


@pytest.mark.parametrize("command", ["from-hf", "to-hf"])
def test_a_second_writer_is_refused_in_one_line(hf, run, tmp_path, command):
    out = tmp_path / "out"
    argv = [command, hf if command == "from-hf" else run, "--out", out]
    assert cli(argv)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    lock = FolderLock(out)  # a trainer (or another conversion) writing this folder
    lock.acquire()
    try:
        for extra in ([], ["--overwrite"]):
            rc, _, err, _ = cli([*argv, *extra])
            assert rc == 1 and len(err.strip().splitlines()) == 1 and "in use" in err, err
    finally:
        lock.release()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_two_from_hf_at_once_one_wins(hf, tmp_path):
    out = tmp_path / "run"
    a, b = start(["from-hf", hf, "--out", out]), start(["from-hf", hf, "--out", out])
    results = [(p.wait(timeout=120), p.stderr.read()) for p in (a, b)]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    err = next(e for rc, e in results if rc == 1)
    assert len(err.strip().splitlines()) == 1 and ("in use" in err or "already holds" in err)
    load_checkpoint(out)


def test_a_finished_run_resumed_sweeps_the_plot_left_by_a_kill(tmp_path):
    out = tmp_path / "run"
    quick = ["--preset", "small", "--steps", "2", "--eval-every", "2", "--eval-batches", "1",
             "--no-progress", "--sample-chars", "0", "--threads", "1"]
    assert cli(["train", *quick, "--out", out])[0] == 0
    stale = out / ".loss.png.0123456789ab.tmp"  # a kill at the last rename of the curve
    stale.write_bytes(b"half a png")
    rc, _, err, _ = cli(["train", "--resume", out, "--steps", "2", "--no-progress"])
    assert rc != 0 and "already at step" in err
    assert not stale.exists()


def test_from_hf_checkpoint_holds_the_weights_alone(run):
    ckpt = load_checkpoint(run)
    n = sum(p.size for p in ckpt.params.values())
    assert ckpt.m is None and ckpt.v is None
    assert (run / "ckpt.npz").stat().st_size < 4 * n * 1.05 + 2**20  # float32, plus metadata


def piped(argv: list) -> tuple[int, str]:
    p = start(argv)
    out, _ = p.communicate(timeout=120)
    return p.returncode, out


def test_conversions_say_each_stage_through_a_pipe(hf, run, tmp_path):
    rc, out = piped(["from-hf", hf, "--out", tmp_path / "run"])
    stages = [line for line in out.splitlines() if line.startswith("from-hf: ")]
    raw = (hf / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    n = len(set(header) - {"__metadata__"})  # the tensors
    assert rc == 0 and stages == [f"from-hf: reading {n} tensors from {hf}",
                                  f"from-hf: reading the weights: {n} of {n} tensors",
                                  f"from-hf: writing {tmp_path / 'run' / 'ckpt.npz'}"]
    rc, out = piped(["to-hf", run, "--out", tmp_path / "back"])
    assert rc == 0 and out.splitlines()[0] == (
        f"to-hf: writing model.safetensors: {n} of {n} tensors")
    assert [line for line in cli(["to-hf", run, "--out", tmp_path / "quiet"])[1].splitlines()
            if line.startswith("to-hf: ")] == []  # captured in-process (a notebook): no progress


@pytest.mark.parametrize("exchange", [True, False], ids=["swap", "two-renames"])
def test_to_hf_overwrite_replaces_the_whole_folder(run, tmp_path, monkeypatch, exchange):
    from xenith_edu.training import rundir

    if not exchange:  # a file system without renameat2's exchange
        monkeypatch.setattr(rundir, "_exchange", lambda a, b: False)
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"old")
    (out / "generation_config.json").write_text("{}")  # the old model's: replaced with it
    rc, _, err, _ = cli(["to-hf", run, "--out", out, "--overwrite"])
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == MODEL_FILES
    assert temps(out, tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_to_hf_refuses_a_folder_of_other_files(run, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    rc, _, err, _ = cli(["to-hf", run, "--out", out, "--overwrite"])
    assert rc == 1 and "holds files that are not a model" in err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
