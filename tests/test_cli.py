"""Tests of the command line: train, sample, gradcheck, student, grade, and bad input.

Bad input (issue item 7): one line on stderr, a non-zero exit, no traceback, no file touched.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import types
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import xenith_edu
from xenith_edu.cli import build_parser, main
from xenith_edu.cli.settings import UsageError, train_config
from xenith_edu.model.params import PARAMS
from xenith_edu.training import SMALL, TrainConfig
from xenith_edu.training.checkpoint import load_checkpoint
from xenith_edu.training.config import model_fields

# every setting of a run, the model's and the trainer's: one option each
SETTINGS = [f.name for f in model_fields()] + [f.name for f in fields(TrainConfig)
                                               if f.name != "model"]
QUICK = ["--preset", "small", "--eval-batches", "1", "--no-progress", "--sample-chars", "0"]


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def snapshot(root: Path) -> dict:
    """Every file under root and its bytes: a failed command must leave this unchanged."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained small checkpoint (2 steps) and a collection of bad inputs."""
    w = tmp_path_factory.mktemp("world")
    assert main(["train", *QUICK, "--steps", "2", "--eval-every", "2", "--out",
                 str(w / "run")]) == 0
    (w / "empty.txt").write_bytes(b"")
    (w / "latin1.txt").write_bytes("Ô Roméo, Roméo!\n".encode("latin-1") * 100)
    (w / "short.txt").write_text("To be, or not to be.\n" * 10, encoding="utf-8")
    (w / "snowman.txt").write_text("I am a snowman: ☃\n" * 200, encoding="utf-8")
    (w / "trunc").mkdir()
    data = (w / "run" / "ckpt.npz").read_bytes()
    (w / "trunc" / "ckpt.npz").write_bytes(data[:len(data) // 2])
    return w


BAD = {
    "missing text": (["train", *QUICK, "--text", "{w}/missing.txt", "--out", "{w}/new"],
                     "does not exist"),
    "empty text": (["train", *QUICK, "--text", "{w}/empty.txt", "--out", "{w}/new"], "is empty"),
    "non-UTF-8 text": (["train", *QUICK, "--text", "{w}/latin1.txt", "--out", "{w}/new"],
                       "not UTF-8"),
    "too-short text": (["train", *QUICK, "--text", "{w}/short.txt", "--out", "{w}/new"],
                       "too short"),
    "steps 0": (["train", *QUICK, "--steps", "0", "--out", "{w}/new"],
                "steps must be a positive integer"),
    "checkpoint from another config": (["train", "--resume", "{w}/run/ckpt.npz", "--preset",
                                        "book", "--steps", "9"], "another model config"),
    "truncated checkpoint (train)": (["train", "--resume", "{w}/trunc/ckpt.npz", "--steps", "9"],
                                     "truncated"),
    "truncated checkpoint (sample)": (["sample", "{w}/trunc/ckpt.npz"], "truncated"),
    "missing checkpoint": (["sample", "{w}/nothing.npz"], "does not exist"),
    "prompt outside the vocabulary": (["sample", "{w}/run", "--prompt", "Ô ☃"],
                                      "outside the vocabulary: 'Ô', '☃'"),
    "temperature 0": (["sample", "{w}/run", "--temperature", "0"], "--temperature"),
    "existing run": (["train", *QUICK, "--steps", "2", "--out", "{w}/run"],
                     "already holds a run"),
    "resume without more steps": (["train", "--resume", "{w}/run", "--steps", "2"],
                                  "--steps greater than 2"),
    "resume on text outside the vocabulary": (["train", "--resume", "{w}/run", "--steps", "4",
                                               "--text", "{w}/snowman.txt"], "'☃'"),
    "resume with another seed": (["train", "--resume", "{w}/run", "--steps", "4", "--seed", "1"],
                                 "drop --seed"),
    "unknown preset": (["train", "--preset", "huge"], "invalid choice"),
    "unknown setting": (["train", *QUICK, "--set", "learning_rate=1", "--out", "{w}/new"],
                        "unknown setting 'learning_rate'"),
    "misspelt setting": (["train", *QUICK, "--set", "n_layers=3", "--out", "{w}/new"],
                         "did you mean n_layer?"),
    "vocab_size is not a setting": (["train", *QUICK, "--set", "vocab_size=9", "--out",
                                     "{w}/new"], "vocabulary size comes from the text"),
    "--set without =": (["train", *QUICK, "--set", "lr", "--out", "{w}/new"], "NAME=VALUE"),
    "bad value with --set": (["train", *QUICK, "--set", "lr=fast", "--out", "{w}/new"],
                             "lr expects a number, got 'fast'"),
    "bad value of a flag": (["train", *QUICK, "--n-layer", "2.5", "--out", "{w}/new"],
                            "n_layer expects an integer, got '2.5'"),
    "bad bool": (["train", *QUICK, "--set", "tie_embeddings=maybe", "--out", "{w}/new"],
                 "tie_embeddings expects true or false"),
    "value out of range": (["train", *QUICK, "--beta2", "1.5", "--out", "{w}/new"],
                           "beta2 must lie in [0, 1)"),
    "inconsistent values": (["train", *QUICK, "--n-head", "3", "--out", "{w}/new"],
                            "must be divisible by Config.n_head"),
    "a setting given twice": (["train", *QUICK, "--lr", "1e-3", "--set", "lr=2e-3", "--out",
                               "{w}/new"], "lr is given twice"),
    "model setting on resume": (["train", "--resume", "{w}/run", "--steps", "4", "--n-layer",
                                 "3"], "another model config"),
    "--overlap without mpiexec": (["train", *QUICK, "--overlap", "--out", "{w}/new"],
                                  "mpiexec -n K"),
    "student: missing source": (["student", "{w}/nope", "--out", "{w}/new"], "does not exist"),
    "grade: missing directory": (["grade", "{w}/nope", "--out", "{w}/grades.csv"],
                                 "is not a folder"),
}

# bad settings are usage errors, as argparse's own: exit status 2 and a pointer to --help
USAGE = {"steps 0", "unknown setting", "misspelt setting", "vocab_size is not a setting",
         "--set without =", "bad value with --set", "bad value of a flag", "bad bool",
         "value out of range", "inconsistent values", "a setting given twice",
         "--overlap without mpiexec"}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_one_line_nonzero_no_traceback_no_file_touched(case, world, capsys):
    argv, expect = BAD[case]
    argv = [a.format(w=world) for a in argv]
    before = snapshot(world)
    rc, out, err = run(argv, capsys)
    assert rc != 0
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("xenith-edu") and "error:" in lines[0]
    assert expect in lines[0]
    assert "Traceback" not in err + out
    for a in argv:  # no path said twice
        assert a.count(str(world)) == 0 or lines[0].count(a) <= 1, lines[0]
    assert snapshot(world) == before  # nothing destroyed, changed or created
    assert not (world / "new").exists()
    if case in USAGE:
        assert rc == 2 and "see xenith-edu train --help" in lines[0]  # a usage error


def test_train_then_sample(world, capsys):
    rc, out, err = run(["sample", world / "run", "--prompt", "ROMEO:", "--chars", "40",
                        "--seed", "3"], capsys)
    assert rc == 0 and err == ""
    text = out[:-1]  # print adds a newline
    assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 40
    rc, again, _ = run(["sample", world / "run" / "ckpt.npz", "--prompt", "ROMEO:", "--chars",
                        "40", "--seed", "3"], capsys)
    assert again == out  # same seed, same text
    rc, other, _ = run(["sample", world / "run", "--prompt", "ROMEO:", "--chars", "40",
                        "--seed", "4", "--top-k", "5", "--temperature", "1.5"], capsys)
    assert rc == 0 and other != out


def test_train_prints_summary_and_sample(tmp_path, capsys):
    rc, out, err = run(["train", "--preset", "small", "--no-progress", "--steps", "1",
                        "--sample-chars", "30", "--out", tmp_path], capsys)
    assert rc == 0
    assert "final validation loss" in out and "ms per step" in out and "sample:" in out
    assert (tmp_path / "ckpt.npz").is_file() and (tmp_path / "loss.png").is_file()


def test_cli_resume_is_exact(tmp_path, capsys):
    common = ["train", *QUICK, "--eval-every", "2"]
    assert run([*common, "--steps", "4", "--out", tmp_path / "split"], capsys)[0] == 0
    assert run(["train", "--resume", tmp_path / "split", "--steps", "8", "--no-progress",
                "--sample-chars", "0"], capsys)[0] == 0
    assert run([*common, "--steps", "8", "--out", tmp_path / "one"], capsys)[0] == 0
    a, b = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "split")
    assert a.step == b.step == 8
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])


def test_train_on_another_text(tmp_path, capsys):
    text = tmp_path / "tale.txt"
    text.write_text("Once upon a time there was a small model that learned to write.\n" * 40,
                    encoding="utf-8")
    rc, out, err = run(["train", *QUICK, "--steps", "2", "--text", text, "--out",
                        tmp_path / "run"], capsys)
    assert rc == 0, err
    ck = load_checkpoint(tmp_path / "run")
    assert ck.vocab == "".join(sorted(set(text.read_text(encoding="utf-8"))))
    assert ck.train["text"] == str(text.resolve())
    # one line, no newline in the vocabulary: the sample starts from its first character
    line = tmp_path / "line.txt"
    line.write_text("abcdefgh" * 60, encoding="utf-8")
    rc, out, err = run(["train", "--preset", "small", "--no-progress", "--steps", "1",
                        "--sample-chars", "5", "--text", line, "--out", tmp_path / "line"], capsys)
    assert rc == 0, err
    assert out.splitlines()[-1][0] == "a" and len(out.splitlines()[-1]) == 6


def test_gradcheck_table_passes(capsys):
    rc, out, err = run(["gradcheck"], capsys)
    assert rc == 0, out
    tied = [p.name for p in PARAMS if not p.untied_only]
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:2 + len(tied)]}
    assert list(rows) == tied
    assert all(r[-1] == "yes" and float(r[1]) < 1e-6 for r in rows.values())
    rc, out, _ = run(["gradcheck", "--untied", "--coords", "3"], capsys)
    assert rc == 0 and "lm_head" in out


def test_gradcheck_table_catches_a_wrong_gradient(capsys, monkeypatch):
    tied = [p.name for p in PARAMS if not p.untied_only]
    import xenith_edu.model.check as model  # the module whose loss_and_grads check_model calls
    real = model.loss_and_grads

    def off_by_one_percent(params, cfg, x, y):
        loss, grads = real(params, cfg, x, y)
        grads["w2"] = grads["w2"] * 1.01
        return loss, grads

    monkeypatch.setattr(model, "loss_and_grads", off_by_one_percent)
    rc, out, _ = run(["gradcheck", "--coords", "2"], capsys)
    assert rc == 1
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("w2 ")] == ["NO"]
    assert f"1 of {len(tied)} parameters fail" in out


@pytest.mark.parametrize("command,options", [
    (None, ["train", "sample", "gradcheck", "student", "grade"]),
    ("train", ["--preset", "--set", "--out", "--resume", "--overwrite", "--sample-chars",
               "--no-progress", "--overlap"]
     + [f"--{name.replace('_', '-')}" for name in SETTINGS]),
    ("sample", ["CKPT", "--prompt", "--chars", "--temperature", "--top-k", "--seed"]),
    ("gradcheck", ["--coords", "--seed", "--untied"]),
    ("student", ["SRC", "--out"]),
    ("grade", ["DIR", "--out", "--timeout"]),
])
def test_help_explains_every_option(command, options, capsys):
    rc, out, _ = run([command, "--help"] if command else ["--help"], capsys)
    assert rc == 0
    for option in options:
        assert option in out


def _fake_rooms(monkeypatch, calls, error=None):
    def make_student_versions(src, out):
        calls.append(("student", src, out))
        if error:
            raise ValueError(error)
        return [out / "01.ipynb"]

    def grade(submissions_dir, out_csv, timeout):
        calls.append(("grade", submissions_dir, out_csv, timeout))
        if error:
            raise ValueError(error)

        return [{"status": "passed"}, {"status": "failed"}]

    for room, names in (("booktools", {"make_student_versions": make_student_versions}),
                        ("gradebook", {"grade": grade})):
        fake = types.ModuleType(f"xenith_edu.{room}")
        for name, value in names.items():
            setattr(fake, name, value)
        monkeypatch.setitem(sys.modules, f"xenith_edu.{room}", fake)
        monkeypatch.setattr(xenith_edu, room, fake, raising=False)


def test_student_and_grade_call_their_rooms(monkeypatch, capsys):
    calls = []
    _fake_rooms(monkeypatch, calls)
    rc, out, _ = run(["student", "notebooks", "--out", "students"], capsys)
    assert rc == 0 and out == "wrote 1 student notebook(s) into students\n"
    rc, out, _ = run(["grade", "subs", "--out", "grades.csv", "--timeout", "30"], capsys)
    assert rc == 0 and out == "wrote 2 grade row(s), 1 passed, to grades.csv\n"
    assert run(["grade", "subs", "--out", "grades.csv"], capsys)[0] == 0
    assert calls == [("student", Path("notebooks"), Path("students")),
                     ("grade", Path("subs"), Path("grades.csv"), 30.0),
                     ("grade", Path("subs"), Path("grades.csv"), None)]


def test_the_rooms_errors_become_one_line(monkeypatch, capsys):
    _fake_rooms(monkeypatch, [], error="src 'x' is not a notebook:\npass an .ipynb file")
    for argv in (["student", "x", "--out", "y"], ["grade", "x", "--out", "g.csv"]):
        rc, out, err = run(argv, capsys)
        assert rc == 1
        assert err == f"xenith-edu {argv[0]}: error: src 'x' is not a notebook: pass an .ipynb " \
                      "file\n"


def test_python_dash_m_entry_point(tmp_path):
    def py(*args):
        return subprocess.run([sys.executable, "-m", "xenith_edu", *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)

    r = py("--help")
    assert r.returncode == 0 and "gradcheck" in r.stdout
    r = py("train", "--steps", "0")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    r = py("sample", "missing.npz")
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "xenith-edu sample: error: checkpoint 'missing.npz' does not exist: pass the ckpt.npz "
        "file that `xenith-edu train` wrote (or its directory)"]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- every setting


# A valid value, other than the small preset's, for every setting (the test below checks that
# the table covers every field, so a new setting needs a line here).
OTHER = {"n_layer": 3, "n_head": 2, "n_embd": 48, "ffn_hidden": 96, "seq_len": 16,
         "tie_embeddings": False, "rope_theta": 500.0, "norm_eps": 1e-6, "text": "tale.txt",
         "batch_size": 8, "lr": 2e-3, "min_lr": 1e-4, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6,
         "weight_decay": 0.0, "warmup_steps": 5, "decay_steps": 50, "grad_clip": 0.5, "steps": 7,
         "eval_every": 3, "eval_batches": 2, "seed": 4, "attention": "flash", "flash_block": 16,
         "recompute": True, "threads": 3, "n_kv_head": 2, "parallel": "threads",
         "head_width": 8, "qkv_bias": True, "qk_norm": True, "rope_scaling": "llama3",
         "sliding_window": 4, "lora_rank": 8, "lora_alpha": 4.0, "lora_targets": "q,k,v,o"}


def _config(argv):
    return train_config(build_parser().parse_args(["train", "--preset", "small", *argv]))[0]


def _text(value):
    return str(Path(value).resolve()) if value == "tale.txt" else value


@pytest.mark.parametrize("name", SETTINGS)
def test_every_setting_has_a_flag_and_a_set_form(name):
    assert set(SETTINGS) <= set(OTHER)
    value, flag = OTHER[name], "--" + name.replace("_", "-")
    want = SMALL.with_settings(**{name: _text(value)})
    assert want != SMALL
    as_flag = ([f"--no-{flag[2:]}"] if value is False else [flag] if value is True
               else [flag, str(value)])
    assert _config(as_flag) == want
    assert _config(["--set", f"{name}={value}"]) == want
    assert _config(["--set", f"{name.replace('_', '-')}={value}"]) == want


def test_flags_override_the_preset_and_combine():
    tc = _config(["--n-layer", "1", "--lr", "2e-3", "--set", "beta2=0.9", "--set",
                  "tie_embeddings=no", "--steps", "5", "--set", "lr=2e-3"])  # same value twice
    assert tc == SMALL.with_settings(n_layer=1, lr=2e-3, beta2=0.9, tie_embeddings=False, steps=5)
    with pytest.raises(UsageError, match="min_lr must lie in"):
        _config(["--lr", "1e-4"])  # below the preset's min_lr: the whole config is checked


def test_settings_reach_the_run_and_resume_keeps_or_changes_them(tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = run(["train", *QUICK, "--steps", "2", "--eval-every", "2", "--n-layer", "1",
                      "--no-tie-embeddings", "--set", "rope_theta=500", "--lr", "2e-3",
                      "--out", out], capsys)
    assert rc == 0, err
    ck = load_checkpoint(out)
    assert ck.config.n_layer == 1 and not ck.config.tie_embeddings
    assert ck.config.rope_theta == 500.0 and "lm_head" in ck.params
    assert TrainConfig.from_dict(ck.train) == SMALL.with_settings(steps=2, eval_every=2, n_layer=1,
                                                      tie_embeddings=False, rope_theta=500.0,
                                                      lr=2e-3, eval_batches=1)
    # resuming keeps the checkpoint's settings; an optimizer setting may change
    rc, _, err = run(["train", "--resume", out, "--steps", "4", "--set", "lr=1e-3",
                      "--no-progress", "--sample-chars", "0"], capsys)
    assert rc == 0, err
    ck = load_checkpoint(out)
    assert ck.step == 4 and ck.train["lr"] == 1e-3 and ck.train["rope_theta"] == 500.0


@pytest.mark.parametrize("train, expect", [
    ({"lr": "fast"}, "lr must be a number, got 'fast'"), ({"n_layer": 3}, "another model config"),
    ({"steps": 2, "learning_rate": 1}, "unknown training settings ['learning_rate']"),
    ({"text": 5}, "text must be a file name"), ({"recompute": "no"}, "recompute must be"),
])
def test_damaged_run_settings_in_a_checkpoint_are_one_line(world, tmp_path, capsys, train,
                                                           expect):
    from xenith_edu.training.checkpoint import save_checkpoint
    ck = load_checkpoint(world / "run")
    save_checkpoint(tmp_path / "ckpt.npz", ck.params, ck.m, ck.v, ck.step, ck.rng(), ck.config,
                    ck.vocab, {**ck.train, **train})
    rc, out, err = run(["train", "--resume", tmp_path, "--steps", "3", "--no-progress",
                        "--sample-chars", "0"], capsys)
    assert rc == 1 and len(err.splitlines()) == 1 and expect in err, err
    assert "Traceback" not in err


# ---------------------------------------------------------------- SIGTERM, stale files, the lock


def _no_leftovers(run_dir):
    names = sorted(p.name for p in run_dir.iterdir())
    assert not [n for n in names if n.endswith(".tmp")] and ".lock" not in names, names


def test_sigterm_stops_like_ctrl_c_with_status_143(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "xenith_edu", "train", *QUICK, "--steps",
                             "100000", "--eval-every", "5", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until the first checkpoint is written (at most 2 minutes)
            if (out / "ckpt.npz").exists() or proc.poll() is not None:
                break
            threading.Event().wait(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    step = load_checkpoint(out).step
    assert step > 0 and step % 5 == 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"xenith-edu train: stopped by SIGTERM; the last good checkpoint is {out / 'ckpt.npz'} "
        "(step "), err
    _no_leftovers(out)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("how, status, said", [("term", 143, "stopped by SIGTERM"),
                                              ("ctrl-c", 130, "interrupted")])
def test_a_stopped_run_stops_its_worker_process(tmp_path, how, status, said):
    """Two workers as processes (the book recipe's way): SIGTERM to the trainer, or Ctrl-C to
    the whole process group as a terminal sends it. The worker ignores Ctrl-C, the trainer
    stops it, and the run ends as with threads: its status, its one line, no leftovers."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "xenith_edu", "train", *QUICK, "--threads",
                             "2", "--steps", "100000", "--eval-every", "5", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for _ in range(1200):  # until the first checkpoint is written (at most 2 minutes)
            if (out / "ckpt.npz").exists() or proc.poll() is not None:
                break
            threading.Event().wait(0.1)
        workers = [k for k in _children(proc.pid)
                   if b"shard_worker" in Path(f"/proc/{k}/cmdline").read_bytes()]
        assert len(workers) == 1
        if how == "term":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == status, err
    assert all(_ended(w) for w in workers)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"xenith-edu train: {said}; the last good checkpoint is "), err
    _no_leftovers(out)


def test_sigterm_inside_a_checkpoint_write_waits_for_it(tmp_path, capsys, monkeypatch):
    """The kill lands in the middle of the second checkpoint's write: the write finishes, then
    the run stops, and the one line names that checkpoint, whole, with no temporary left."""
    import xenith_edu.training.checkpoint as checkpoint
    out, real, writes = tmp_path / "run", checkpoint.np.savez, []

    def killed_midway(f, **arrays):
        writes.append(1)
        if len(writes) == 2:  # the second checkpoint, as it starts to write
            os.kill(os.getpid(), signal.SIGTERM)
        real(f, **arrays)

    monkeypatch.setattr(checkpoint.np, "savez", killed_midway)
    rc, _, err = run(["train", *QUICK, "--steps", "6", "--eval-every", "2", "--out", out], capsys)
    assert rc == 143 and len(writes) == 2  # no third checkpoint
    assert err == (f"xenith-edu train: stopped by SIGTERM; the last good checkpoint is "
                   f"{out / 'ckpt.npz'} (step 4)\n")
    assert load_checkpoint(out).step == 4
    _no_leftovers(out)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after the command


def test_a_run_removes_the_temporary_files_a_killed_run_left(world, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["train", *QUICK, "--steps", "2", "--eval-every", "2", "--out", out],
               capsys)[0] == 0
    stale = [out / ".ckpt.npz.k1ll3d.tmp", out / ".log.jsonl.x.tmp", out / ".loss.png.y.tmp"]
    for p in stale:
        p.write_bytes(b"half a file")
    (out / "notes.tmp").write_text("mine")  # not the trainer's: kept
    assert run(["train", "--resume", out, "--steps", "3", "--no-progress", "--sample-chars",
                "0"], capsys)[0] == 0
    assert not any(p.exists() for p in stale) and (out / "notes.tmp").exists()


HOLD = """
import sys, time
from pathlib import Path
from xenith_edu.training.rundir import FolderLock
FolderLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_trainer_on_a_locked_folder_stops_at_once(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        rc, _, err = run(["train", *QUICK, "--steps", "2", "--out", out], capsys)
        assert rc == 1 and err == (
            f"xenith-edu train: error: run folder '{out}' is in use by another trainer (pid "
            f"{holder.pid} on {socket.gethostname()}): wait for it to end or stop it, or "
            "choose another --out\n")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()  # the kernel releases its lock: a killed holder blocks nothing
        holder.wait()
    rc, _, err = run(["train", *QUICK, "--steps", "2", "--eval-every", "2", "--out", out],
                     capsys)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.npz", "log.jsonl", "loss.png"]


def test_the_lock_is_released_and_made_folders_removed_on_bad_input(tmp_path):
    from xenith_edu.training.rundir import FolderLock
    out = tmp_path / "a" / "b"
    lock = FolderLock(out)
    lock.acquire()
    with pytest.raises(ValueError, match="is in use by another trainer"):
        FolderLock(out).acquire()
    lock.release()
    assert list(tmp_path.iterdir()) == []  # both folders it made, empty, are gone
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        FolderLock(tmp_path / "file").acquire()


def test_init_and_resume_together_is_one_usage_line_in_the_options_words(tmp_path, capsys):
    """The one rule (training.rundir.check_start), in the command line's words: exit 2, one line
    naming both options, nothing written."""
    out = tmp_path / "run"
    rc, _, err = run(["train", "--init", tmp_path / "a.npz", "--resume", tmp_path / "b.npz",
                      "--out", out], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--init starts a new run and --resume continues one: give only one" in err
    assert not out.exists()
