"""Tests of xenith_edu.training.parallel: data-parallel training under mpiexec against one process.

The runs go through `mpiexec` (the `mpi` extra's MPICH) in a subprocess with a time limit, so
a rank that hangs fails the test instead of blocking the suite.
"""

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from xenith_edu import Config, init_params, loss_and_grads
from xenith_edu.training import SMALL, read_log, train
from xenith_edu.training.checkpoint import load_checkpoint
from xenith_edu.training.parallel import ring_allreduce_bytes, shard

BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec") if (BIN / "mpiexec").exists() else shutil.which("mpiexec")
WORKER = Path(__file__).parent / "mpi_worker.py"
LIMIT = 300  # seconds for one mpiexec run: far more than it takes, far less than a hang
RUN = ["--preset", "small", "--steps", "20", "--eval-every", "10", "--eval-batches", "4",
       "--no-progress", "--sample-chars", "0"]
ONE = replace(SMALL, steps=20, eval_every=10, eval_batches=4)  # RUN, in this process
TARGET = 2e-4  # max |validation-loss difference| after 20 steps (float32 rounding is ~1e-6)
# one mpiexec at a time: each run removes the MPICH files it leaves (_remove_orphans), which
# could be another run's when two ran at once (the suite runs in two processes: conftest.py)
pytestmark = pytest.mark.xdist_group("mpiexec")


# one BLAS thread per rank, as one runs MPI with a rank per core: on two threads each, the two
# ranks' products wait for each other's spinning threads (a run of RUN took 2.6 times as long
# on a quiet machine, more beside the suite's other process). What is asserted does not depend
# on it, but for the race of test_a_rank_that_dies..., which keeps the default (see there).
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1"}
MPICH_SHM = "/dev/shm/mpich_shm_*"  # MPICH's shared memory: a job whose ranks are killed
# (the failure tests below) leaves its files behind, 2 MiB each


def mpiexec(k, *args, mode="none", bad_rank=0, cwd=None, blas=ONE_BLAS_THREAD):
    assert MPIEXEC, "mpiexec is missing: install the mpi extra (pip install -e '.[mpi]')"
    cmd = [MPIEXEC, "-n", str(k), sys.executable, str(WORKER), mode, str(bad_rank), "train",
           *map(str, args)]
    before = set(glob.glob(MPICH_SHM))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, cwd=cwd,
                              stdin=subprocess.DEVNULL, env={**os.environ, **blas})
    finally:
        _remove_orphans(set(glob.glob(MPICH_SHM)) - before)


def _mapped() -> set[str]:
    """The MPICH files that live processes map."""
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(line.split(None, 5)[-1].strip() for line in f if "mpich" in line)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return mapped


def _remove_orphans(paths: set[str], wait: float = 5.0) -> None:
    """Remove the files of `paths` (made during one run) once no live process maps them; a
    killed rank may still be ending when the launcher returns, so wait a little for it."""
    end = time.monotonic() + wait
    while paths:
        for path in paths - _mapped():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            paths.discard(path)
        if time.monotonic() > end:
            break
        time.sleep(0.1)


def evals(out):
    return np.array([r["val_loss"] for r in read_log(Path(out) / "log.jsonl")
                     if r["event"] == "eval"])


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The single-process run of the small preset, 20 steps (RUN)."""
    out = tmp_path_factory.mktemp("one") / "run"
    train(ONE, out, progress=False, verbose=False)
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The same run on two ranks (blocking all-reduce): the outcome of its mpiexec, and its
    folder. Read by the test of the one-process model and by the test of overlap."""
    out = tmp_path_factory.mktemp("two") / "run"
    return mpiexec(2, *RUN, "--out", out), out


# ---------------------------------------------------------------- without MPI


def test_the_mean_of_the_shard_means_is_the_batch_mean():
    """Why data parallelism is exact: the loss is a mean, so its gradient is a mean too."""
    cfg = Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=5)
    params = init_params(cfg, 0, np.float64)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (6, 5)), rng.integers(0, 11, (6, 5))
    loss, grads = loss_and_grads(params, cfg, x, y)
    for k in (1, 2, 3, 6):
        parts = [loss_and_grads(params, cfg, shard(x, r, k), shard(y, r, k)) for r in range(k)]
        assert np.mean([p[0] for p in parts]) == pytest.approx(loss, rel=1e-12)
        for name, g in grads.items():
            mean = np.mean([p[1][name] for p in parts], axis=0)
            np.testing.assert_allclose(mean, g, rtol=1e-10, atol=1e-14)
            if k > 1 and name == "w2":  # summing instead of averaging is off by K
                total = np.sum([p[1][name] for p in parts], axis=0)
                np.testing.assert_allclose(total, k * g, rtol=1e-10)


def test_shards_cover_the_batch_in_order():
    a = np.arange(12).reshape(6, 2)
    np.testing.assert_array_equal(np.concatenate([shard(a, r, 3) for r in range(3)]), a)
    assert shard(a, 1, 2).shape == (3, 2)


def test_ring_allreduce_bytes():
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 4) == 1500
    assert ring_allreduce_bytes(1000, 64) == pytest.approx(2000 * 63 / 64)


# ---------------------------------------------------------------- under mpiexec


def test_two_ranks_train_the_one_process_model(one, two):
    r, out = two
    assert r.returncode == 0, r.stderr
    assert "2 processes" in r.stdout and r.stderr.count("error") == 0
    # the same files as a single-process run, written once (by rank 0)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in one.iterdir()) == ["ckpt.npz", "log.jsonl", "loss.png"]
    gap = np.abs(evals(out) - evals(one)).max()
    assert gap <= TARGET, f"validation losses differ by {gap:.2e}"
    a, b = load_checkpoint(one), load_checkpoint(out)
    assert a.step == b.step == 20 and a.train == b.train and a.rng_state == b.rng_state
    for k in a.params:
        np.testing.assert_allclose(b.params[k], a.params[k], atol=1e-4)
    records = [x for x in read_log(out / "log.jsonl") if x["event"] == "train"]
    assert [x["step"] for x in records] == list(range(20))
    assert all(0 <= x["comm_ms"] <= x["ms"] for x in records)


def test_overlap_gives_the_blocking_results_bit_for_bit(two, tmp_path):
    """The run of `two` again, with each layer's all-reduce started as backward goes."""
    (done, blocking), overlap = two, tmp_path / "overlap"
    r = mpiexec(2, *RUN, "--overlap", "--out", overlap)
    assert done.returncode == 0 and r.returncode == 0, r.stderr
    a, b = load_checkpoint(blocking), load_checkpoint(overlap)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
        np.testing.assert_array_equal(a.v[k], b.v[k])
    np.testing.assert_array_equal(evals(blocking), evals(overlap))


def test_resume_with_another_number_of_processes(one, tmp_path):
    out = tmp_path / "run"
    train(replace(ONE, steps=10), out, progress=False, verbose=False)
    r = mpiexec(2, "--resume", out, "--steps", "20", "--no-progress", "--sample-chars", "0")
    assert r.returncode == 0, r.stderr
    gap = np.abs(evals(out) - evals(one)).max()
    assert gap <= TARGET and load_checkpoint(out).step == 20
    # and back to one process
    train(replace(ONE, steps=25), out, resume=out, progress=False, verbose=False)
    assert load_checkpoint(out).step == 25


def test_fine_tuning_under_mpi_is_the_one_process_fine_tuning(one, tmp_path):
    """`train --init RUN` on two ranks starts from the run's weights and trains as one process
    does; rank 0 alone writes the new run."""
    tune = ["--steps", "6", "--eval-every", "3", "--seq-len", "32", "--batch-size", "8",
            "--eval-batches", "4", "--no-progress", "--sample-chars", "0", "--init", one]
    from xenith_edu.cli import main  # the command line in this process: no interpreter to start

    assert main(["train", *map(str, tune), "--out", str(tmp_path / "single")]) == 0
    r = mpiexec(2, *tune, "--out", tmp_path / "two")
    assert r.returncode == 0, r.stderr
    assert "2 processes" in r.stdout
    a, b = load_checkpoint(tmp_path / "single"), load_checkpoint(tmp_path / "two")
    assert a.step == b.step == 6 and a.config == b.config == load_checkpoint(one).config
    gap = np.abs(evals(tmp_path / "two") - evals(tmp_path / "single")).max()
    assert gap <= TARGET, f"validation losses differ by {gap:.2e}"
    start = load_checkpoint(one).params
    for k in a.params:
        np.testing.assert_allclose(b.params[k], a.params[k], atol=1e-4)
        assert not np.array_equal(a.params[k], start[k]), f"{k} was not trained"


def _one_error_line(r):
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode != 0
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("xenith-edu train: error: ") and "Traceback" not in r.stderr
    return lines[0]


def test_a_batch_that_does_not_split_is_one_clear_line(tmp_path):
    r = mpiexec(3, *RUN, "--out", tmp_path / "run")  # batch 16, 3 processes
    assert "batch_size 16 is not divisible by the 3 processes" in _one_error_line(r)
    assert not (tmp_path / "run").exists()


def test_a_bad_setting_under_mpiexec_is_reported_once(tmp_path):
    r = mpiexec(2, *RUN, "--set", "lrr=1", "--out", tmp_path / "run")
    assert r.returncode == 2 and "did you mean lr?" in _one_error_line(r)
    r = mpiexec(2, *RUN, "--lr", "fast", "--out", tmp_path / "run")
    assert r.returncode == 2 and "lr expects a number" in _one_error_line(r)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_failing_rank_stops_every_rank_with_one_line(bad_rank, tmp_path):
    r = mpiexec(2, *RUN, "--out", tmp_path / "run", mode="raise", bad_rank=bad_rank)
    line = _one_error_line(r)
    assert f"rank {bad_rank} of 2: cannot allocate the gradients" in line
    assert "stopping every process" in line


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_rank_that_dies_is_reported_by_a_survivor_before_the_launcher(bad_rank, tmp_path):
    """SIGKILL (the out-of-memory killer, kill -9): the dead rank says nothing, the launcher
    kills the others within milliseconds; a survivor's line comes first, naming the rank."""
    # the BLAS threads' default: with one thread a rank, the killed rank's survivor was now
    # and then named instead of it (3 runs in 66; 0 in 45 with the default): the launcher
    # kills the survivor before the dead rank's sentinel speaks, a race of the package's
    r = mpiexec(2, *RUN, "--out", tmp_path / "run", mode="die", bad_rank=bad_rank, blas={})
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode != 0 and lines, r.stderr
    assert lines[0] == (f"xenith-edu train: error: rank {bad_rank} of 2 died (killed, or out "
                        "of memory: see the launcher's message); the last checkpoint in the run "
                        "folder is intact: resume the run with --resume"), r.stderr
    assert sum("xenith-edu" in x for x in lines) == 1 and "Traceback" not in r.stderr


def test_a_rank_that_hangs_is_noticed(tmp_path):
    r = mpiexec(2, *RUN, "--mpi-timeout", "3", "--out", tmp_path / "run", mode="hang",
                bad_rank=1)
    assert "no progress for 3 s" in _one_error_line(r)


def test_srun_without_mpi_is_refused(monkeypatch, tmp_path, capsys):
    from xenith_edu.cli import main

    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    assert main(["train", *RUN, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "srun --mpi=pmix" in err[0]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- the chapter's exercises


def test_exercise_references_pass_and_mistakes_are_named():
    from xenith_edu.exercises import check_global_gradient, check_ring_allreduce_bytes
    from xenith_edu.exercises.parallel import global_gradient_reference, ring_bytes_reference

    def weighted(g, n):
        return np.tensordot((n / n.sum()).astype(g.dtype), g, axes=1)

    assert check_global_gradient(lambda g, n: global_gradient_reference(g, n)[0]).passed
    assert check_global_gradient(weighted).passed  # another correct formula
    for wrong, named in ((lambda g, n: g.sum(0), "summed"),
                         (lambda g, n: g.mean(0), "without weights"),
                         (lambda g, n: np.tensordot(n.astype(g.dtype), g, axes=1),
                          "not divided by the number of positions"),
                         (lambda g, n: g.sum(0) / n.sum(), "already divided by its own")):
        r = check_global_gradient(wrong)
        assert not r.passed and named in r.message, r.message
    assert check_ring_allreduce_bytes(lambda n, i, k: ring_bytes_reference(n, i, k)[0]).passed
    assert check_ring_allreduce_bytes(lambda n, i, k: 2 * (k - 1) * ((n + k - 1) // k) * i).passed
    for wrong, named in ((lambda n, i, k: 2 * (k - 1) * (n // k), "numbers, not bytes"),
                         (lambda n, i, k: (k - 1) * (n // k) * i, "half the traffic"),
                         (lambda n, i, k: 2 * (k - 1) * n * i, "not the whole buffer"),
                         (lambda n, i, k: 2 * k * (n // k) * i, "K-1 steps per phase")):
        r = check_ring_allreduce_bytes(wrong)
        assert not r.passed and named in r.message, r.message
