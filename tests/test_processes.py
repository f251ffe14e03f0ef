"""Tests of training.processes: a batch shared among worker processes gives, bit for bit, what
the same shards give in threads, and no process or file outlives its use however a call ends."""

from __future__ import annotations

import gc
import glob
import io
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import xenith_edu.training.processes as processes_mod
from xenith_edu import Config, init_params, loss_and_grads
from xenith_edu.training import TrainConfig
from xenith_edu.training.processes import (
    ProcessShards,
    batch_shards,
    layout_of,
    new_block,
    serve,
    views,
)
from xenith_edu.training.threads import ThreadShards

CFG = Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)
ROOT = Path(__file__).resolve().parents[1]


def _batch(B: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, CFG.vocab_size, (B, 8)), rng.integers(0, CFG.vocab_size, (B, 8))


def _same(a, b) -> None:
    assert a[0] == b[0]
    assert list(a[1]) == list(b[1])
    for name in a[1]:
        np.testing.assert_array_equal(a[1][name], b[1][name], err_msg=name)


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether process `pid` has ended (or is a zombie) within `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _shard_files() -> list[str]:
    folders = {tempfile.gettempdir(), "/dev/shm"}
    return [p for d in folders for p in glob.glob(os.path.join(d, "xenith-edu-shard-*"))]


@pytest.fixture(scope="module")
def shards():
    with ProcessShards(3) as s:
        yield s


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("B, count", [(6, 2), (5, 2), (7, 3), (3, 5), (4, 1), (2, 2), (1, 2)])
@pytest.mark.parametrize("recompute", [False, True])
def test_processes_give_the_threads_numbers_bit_for_bit(dtype, B, count, recompute):
    """Equal and unequal shards, one shard, more workers than windows: the same bits as the
    threads (the same shards, each with one BLAS thread, averaged by the same function)."""
    params = init_params(CFG, 3, dtype)
    x, y = _batch(B)
    with ThreadShards(count) as t, ProcessShards(count) as p:
        want = t.loss_and_grads(params, CFG, x, y, recompute=recompute)
        got = p.loss_and_grads(params, CFG, x, y, recompute=recompute)
    _same(got, want)
    assert got[1]["w1"].dtype == dtype


def test_processes_give_the_single_calls_figures(shards):
    params = init_params(CFG, 5, np.float64)
    x, y = _batch(7, seed=2)
    loss, grads = loss_and_grads(params, CFG, x, y)
    got_loss, got = shards.loss_and_grads(params, CFG, x, y)
    assert got_loss == pytest.approx(loss, rel=1e-13)
    for name in grads:
        np.testing.assert_allclose(got[name], grads[name], rtol=1e-11, atol=1e-15, err_msg=name)


def test_the_workers_see_each_calls_parameters_and_model(shards):
    """Parameters change at every update, a new model changes shapes and Config: each call
    computes with what it is given."""
    x, y = _batch(6, seed=3)
    for seed in (1, 2):
        params = init_params(CFG, seed, np.float32)
        _same(shards.loss_and_grads(params, CFG, x, y), ThreadShards(3).loss_and_grads(
            params, CFG, x, y))
    params = init_params(CFG, 1, np.float32)
    params["wq"] *= 2  # changed in place, as AdamW does
    _same(shards.loss_and_grads(params, CFG, x, y), ThreadShards(3).loss_and_grads(
        params, CFG, x, y))
    other = Config(vocab_size=13, n_embd=32, n_head=4, n_layer=1, ffn_hidden=40, seq_len=8,
                   tie_embeddings=False)
    params = init_params(other, 4, np.float64)
    xo = np.random.default_rng(0).integers(0, 13, (6, 8))
    _same(shards.loss_and_grads(params, other, xo, xo), ThreadShards(3).loss_and_grads(
        params, other, xo, xo))


def test_the_mapped_files_leave_no_name_behind(shards):
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(6)
    before = set(_shard_files())  # (a process killed inside mkstemp's instant may leave one)
    shards.close()
    shards.loss_and_grads(params, CFG, x, y)  # new blocks, new workers
    assert shards._workers and all(w.proc.poll() is None for w in shards._workers)
    assert set(_shard_files()) <= before  # each removed as soon as it was made


def test_a_full_dev_shm_falls_back_to_the_temporary_folder(monkeypatch):
    real = os.posix_fallocate if hasattr(os, "posix_fallocate") else None
    seen = []

    def full(fd, offset, length):
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen.append(path)
        if path.startswith("/dev/shm/"):
            raise OSError(28, "No space left on device")
        if real is not None:
            real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    with ProcessShards(2) as p:
        got = p.loss_and_grads(params, CFG, x, y)
    _same(got, ThreadShards(2).loss_and_grads(params, CFG, x, y))
    if os.access("/dev/shm", os.W_OK):  # memory is tried first, where the system has it
        assert seen[0].startswith("/dev/shm/")
    assert any(s.startswith(tempfile.gettempdir()) for s in seen)


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm here")
@pytest.mark.parametrize("fallocate", [True, False])  # False: a system without it (macOS)
def test_a_block_lives_in_memory_where_the_system_has_room(monkeypatch, fallocate):
    if not fallocate:
        monkeypatch.delattr(os, "posix_fallocate", raising=False)
    layout = layout_of({"w": np.zeros(1000, np.float32), "b": np.zeros(3, np.float64)})
    block = new_block(layout)
    try:
        where = os.readlink(f"/proc/self/fd/{block.fd}")  # a removed file's name, noted
        assert where.startswith("/dev/shm/xenith-edu-shard-") and where.endswith(" (deleted)")
        assert os.fstat(block.fd).st_size == layout.nbytes == 4096  # 4032 + 64
        block.arrays["b"][...] = 7.0
        assert os.pread(block.fd, 8, 4032) == np.float64(7.0).tobytes()  # the file is the block
    finally:
        os.close(block.fd)


def test_a_folder_that_takes_no_file_is_passed_over(monkeypatch):
    real = tempfile.mkstemp

    def mkstemp(prefix, dir):
        if dir == "/dev/shm":
            raise PermissionError(13, "Permission denied")
        return real(prefix=prefix, dir=dir)

    monkeypatch.setattr(processes_mod.tempfile, "mkstemp", mkstemp)
    block = new_block(layout_of({"w": np.zeros(10, np.float32)}))
    try:
        assert os.readlink(f"/proc/self/fd/{block.fd}").startswith(tempfile.gettempdir())
    finally:
        os.close(block.fd)


@pytest.mark.parametrize("where", ["fallocate", "mkstemp"])
def test_no_room_anywhere_is_the_systems_own_error(monkeypatch, where):
    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if where == "fallocate":
        monkeypatch.setattr(os, "posix_fallocate", no_room, raising=False)
        monkeypatch.setattr(os, "ftruncate", no_room)
    else:
        monkeypatch.setattr(processes_mod.tempfile, "mkstemp", no_room)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        new_block(layout_of({"w": np.zeros(10, np.float32)}))
    assert e.value.errno == 28
    assert set(os.listdir("/proc/self/fd")) <= before


def test_close_ends_the_workers_and_a_later_call_starts_new_ones():
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    p = ProcessShards(2)
    first = p.loss_and_grads(params, CFG, x, y)
    procs = [w.proc for w in p._workers]
    p.close()
    assert p._workers == [] and all(proc.poll() is not None for proc in procs)
    _same(p.loss_and_grads(params, CFG, x, y), first)
    p.close()


def test_dropping_the_shards_ends_the_workers():
    p = ProcessShards(2)
    params = init_params(CFG, 1, np.float32)
    p.loss_and_grads(params, CFG, *_batch(4))
    pid = p._workers[0].proc.pid
    del p
    gc.collect()
    assert _gone(pid)


def test_a_killed_worker_fails_the_call_clearly_and_the_next_call_recovers():
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    with ProcessShards(2) as p:
        want = p.loss_and_grads(params, CFG, x, y)
        proc = p._workers[0].proc
        proc.kill()
        proc.wait()
        with pytest.raises(RuntimeError, match=r"worker process of the shards ended \(exit "
                                               r"codes \[-9\]\); the next call starts new ones"):
            p.loss_and_grads(params, CFG, x, y)
        assert p._workers == []
        _same(p.loss_and_grads(params, CFG, x, y), want)


def test_a_reply_to_another_call_is_refused(monkeypatch):
    """A reply must answer the call just sent: one numbered otherwise fails the call, and the
    workers are stopped (their pipes can no longer be trusted)."""
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    with ProcessShards(2) as p:
        p.loss_and_grads(params, CFG, x, y)
        w = p._workers[0]
        real = w.receive
        monkeypatch.setattr(w, "receive", lambda: (w.seq + 1, *real()[1:]))
        with pytest.raises(RuntimeError, match=r"^a shard's worker answered call 3 to call 2$"):
            p.loss_and_grads(params, CFG, x, y)
        assert p._workers == [] and w.proc.poll() is not None


def test_an_error_in_a_workers_shard_is_raised_in_the_caller():
    """A target out of range in the worker's half only: the worker's ValueError, with its
    message, is the caller's, and the shards work again afterwards."""
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    bad = y.copy()
    bad[3, 0] = CFG.vocab_size
    with ProcessShards(2) as p:
        with pytest.raises(ValueError, match=r"y has token ids in \[\d+, 11\], outside \[0, 11\)"):
            p.loss_and_grads(params, CFG, x, bad)
        _same(p.loss_and_grads(params, CFG, x, y), ThreadShards(2).loss_and_grads(
            params, CFG, x, y))


def test_an_interrupt_in_the_callers_shard_stops_the_workers_and_leaves_them_usable(
        monkeypatch):
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    real = processes_mod.loss_and_grads

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with ProcessShards(2) as p:
        want = p.loss_and_grads(params, CFG, x, y)
        procs = [w.proc for w in p._workers]
        monkeypatch.setattr(processes_mod, "loss_and_grads", interrupted)
        with pytest.raises(KeyboardInterrupt):
            p.loss_and_grads(params, CFG, x, y)
        assert p._workers == [] and all(proc.poll() is not None for proc in procs)
        monkeypatch.setattr(processes_mod, "loss_and_grads", real)
        _same(p.loss_and_grads(params, CFG, x, y), want)


def test_ctrl_c_is_the_callers_to_handle(shards):
    """SIGINT (a terminal's Ctrl-C reaches the whole process group) does not stop a worker."""
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(6)
    want = shards.loss_and_grads(params, CFG, x, y)
    for w in shards._workers:
        os.kill(w.proc.pid, signal.SIGINT)
    time.sleep(0.2)
    assert all(w.proc.poll() is None for w in shards._workers)
    _same(shards.loss_and_grads(params, CFG, x, y), want)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(ROOT)!r})  # the package found by sys.path alone
        import numpy as np
        from xenith_edu import Config, init_params
        from xenith_edu.training.processes import ProcessShards
        from xenith_edu.training.threads import ThreadShards
        cfg = Config(vocab_size=11, n_embd=16, n_head=2, n_layer=2, ffn_hidden=24, seq_len=8)
        params = init_params(cfg, 1, np.float32)
        x = np.random.default_rng(0).integers(0, 11, (4, 8))
        p = ProcessShards(2)
        got = p.loss_and_grads(params, cfg, x, x)
        """) + textwrap.dedent(body))
    return path


def _env() -> dict:
    """This environment without PYTHONPATH (the script finds the package by sys.path alone).
    A mutation run's statistics pass is left out too: the script runs in another folder, where
    that pass finds none of its settings (a mutant under test is kept: the script runs it)."""
    return {k: v for k, v in os.environ.items()
            if k != "PYTHONPATH" and not (k == "MUTANT_UNDER_TEST" and v == "stats")}


def test_a_script_without_a_main_guard_and_a_package_found_by_sys_path(tmp_path):
    script = _script(tmp_path, """\
        want = ThreadShards(2).loss_and_grads(params, cfg, x, x)
        print(got[0] == want[0] and all((got[1][k] == want[1][k]).all() for k in want[1]))
        """)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, env=_env(), timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (0, "True\n", "")


def test_a_worker_ends_when_its_caller_is_killed(tmp_path):
    script = _script(tmp_path, """\
        print(p._workers[0].proc.pid, flush=True)
        import time
        time.sleep(60)
        """)
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=_env())
    try:
        pid = int(caller.stdout.readline())
        assert not _gone(pid, timeout=0.2)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
    assert _gone(pid)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (True, TypeError),
                                        (2.0, TypeError), ("2", TypeError), (None, TypeError)])
def test_bad_process_counts_are_refused(bad, error):
    with pytest.raises(error, match="processes must be"):
        ProcessShards(bad)


def test_batch_shards_gives_each_kind_and_refuses_others():
    assert isinstance(batch_shards(2), ProcessShards)
    assert isinstance(batch_shards(2, "threads"), ThreadShards)
    with pytest.raises(ValueError, match="parallel must be one of processes, threads, got 'gpu'"):
        batch_shards(2, "gpu")
    with pytest.raises(ValueError, match="parallel must be one of processes, threads, got 3"):
        TrainConfig(parallel=3)


def test_a_layout_puts_each_array_on_its_own_cache_line():
    arrays = {"a": np.ones(3, np.float32), "b": np.ones((2, 5)), "c": np.ones(0, np.int64)}
    layout = layout_of(arrays)
    assert [item[3] for item in layout.items] == [0, 64, 192]
    assert layout.nbytes == 192  # an empty array takes no room
    buf = bytearray(max(layout.nbytes, 64))
    got = views(memoryview(buf), layout)
    for name, a in arrays.items():
        got[name][...] = a
        assert got[name].shape == a.shape and got[name].dtype == a.dtype


def test_shared_parameters_are_read_where_they_are_trained():
    """The trainer's way: the block's own arrays, changed in place between calls (as AdamW
    changes them), are what the workers compute with."""
    params = init_params(CFG, 1, np.float32)
    x, y = _batch(4)
    with ProcessShards(2) as p:
        shared = p.shared(params)
        assert all(shared[k] is not params[k] for k in params)
        assert all(np.array_equal(shared[k], params[k]) for k in params)
        assert all(a is b for a, b in zip(p.shared(shared).values(), shared.values(),
                                          strict=True))
        for _ in range(3):
            _same(p.loss_and_grads(shared, CFG, x, y), ThreadShards(2).loss_and_grads(
                shared, CFG, x, y))
            for a in shared.values():
                a *= 0.9  # in place, as an update
    assert float(shared["wq"][0, 0, 0]) == pytest.approx(0.9**3 * float(params["wq"][0, 0, 0]))
    one = ProcessShards(1)
    assert one.shared(params) is params  # no workers, nothing to share


def test_no_descriptor_outlives_the_shards():
    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    params = init_params(CFG, 1, np.float32)
    x, y = _batch(6)
    before = open_fds()
    p = ProcessShards(3)
    p.loss_and_grads(params, CFG, x, y)
    p.close()
    p.loss_and_grads(params, CFG, x, y)  # restarted
    del p
    gc.collect()
    assert open_fds() <= before


def test_batch_shards_gives_threads_where_the_system_is_not_posix(monkeypatch):
    monkeypatch.setattr(processes_mod, "POSIX", False)
    assert isinstance(batch_shards(2), ThreadShards)
    assert isinstance(batch_shards(2, "threads"), ThreadShards)


def test_no_test_changes_what_the_whole_process_reads_of_its_system():
    """os.name, os.sep, sys.platform... are every module's, pytest's own paths included (a
    test that set os.name to "nt" made pathlib build WindowsPaths in pytest's report, and
    failed when run alone): a test changes the one module's own answer (processes.POSIX)."""
    what = r"(?:name|sep|altsep|linesep|pathsep|platform|system)"
    shared = re.compile(r"setattr\(\s*(?:(?:[\w.]+\.)?(?:os|sys|platform|pathlib)\s*,\s*[\"']"
                        + what + r"[\"']|[\"'](?:os|sys|platform|pathlib)\." + what + r"[\"'])")
    found = [f"{p.name}:{n}" for p in sorted(Path(__file__).parent.rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if shared.search(line)]
    assert found == []


def _replies(data: bytes) -> list:
    stream, out = io.BytesIO(data), []
    while stream.tell() < len(data):
        out.append(pickle.load(stream))
    return out


def test_the_worker_loop_answers_each_call_and_says_what_failed(monkeypatch):
    """`serve` in this process: the worker's loop, fed a map request and four calls. It
    answers each in turn, writes the gradients into its block, sends a picklable error back as
    it is, and says what an error that cannot travel was."""
    params = init_params(CFG, 1, np.float32)
    layout = layout_of(params)
    pb, gb = new_block(layout), new_block(layout)
    for k in params:
        pb.arrays[k][...] = params[k]
    x, y = _batch(2)
    real, calls = processes_mod.loss_and_grads, {"n": 0}

    class Unpicklable(Exception):
        def __init__(self):
            super().__init__("cannot travel")
            self.f = lambda: 0

    def flaky(*args, **kwargs):
        calls["n"] += 1
        calls.setdefault("recompute", []).append(kwargs.get("recompute"))
        if calls["n"] == 3:
            raise Unpicklable
        if calls["n"] == 4:
            raise ValueError("a bad shard")
        return real(*args, **kwargs)

    monkeypatch.setattr(processes_mod, "loss_and_grads", flaky)
    msgs = [("map", (os.dup(pb.fd), layout), (os.dup(gb.fd), layout)), (1, CFG, x, y, False),
            (2, None, x, y, True), (3, None, x, y, False), (4, None, x, y, False), None,
            (5, None, x, y, False)]
    out = io.BytesIO()
    with threadpool_limits(limits=None):  # the worker's one-thread limit is undone after
        serve(io.BytesIO(b"".join(pickle.dumps(m) for m in msgs)), out)
        blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and set(blas) == {1}  # a worker's products run on one core
    assert calls["recompute"] == [False, True, False, False]  # each call's own setting
    r1, r2, r3, r4 = _replies(out.getvalue())  # nothing after the stop
    want = loss_and_grads(params, CFG, x, y, recompute=True)
    assert r1 == (1, loss_and_grads(params, CFG, x, y)[0], None)
    assert r2 == (2, want[0], None)
    for k in want[1]:  # the block holds the last answered call's gradients
        np.testing.assert_array_equal(gb.arrays[k], want[1][k], err_msg=k)
    assert r3[:2] == (3, None) and isinstance(r3[2], RuntimeError)
    assert "in a shard's worker: Unpicklable('cannot travel')" in str(r3[2])
    assert r4[:2] == (4, None) and isinstance(r4[2], ValueError) and str(r4[2]) == "a bad shard"
    os.close(pb.fd)
    os.close(gb.fd)


_NO_BLOCK = (-1, layout_of({}))  # a request to map it would fail: -1 is no descriptor


@pytest.mark.parametrize("first", [b"", b"not a pickle", pickle.dumps(("map",)),
                                   pickle.dumps(("unmap", _NO_BLOCK, _NO_BLOCK)),
                                   pickle.dumps(None)])
def test_the_worker_loop_ends_quietly_on_a_bad_start(first):
    out = io.BytesIO()
    with threadpool_limits(limits=None):
        serve(io.BytesIO(first), out)
    assert out.getvalue() == b""


def test_a_worker_runs_its_callers_copy_of_the_package_and_keeps_its_path(tmp_path):
    """The worker imports the package from where its caller found it (here a copy found by
    sys.path alone, while the installed one stays importable), with the caller's PYTHONPATH
    after it: the copy's worker module notes the worker's sys.path."""
    pkg, extra = tmp_path / "pkg", tmp_path / "extra"
    shutil.copytree(ROOT / "xenith_edu", pkg / "xenith_edu",
                    ignore=shutil.ignore_patterns("__pycache__"))
    extra.mkdir()
    worker = pkg / "xenith_edu" / "training" / "shard_worker.py"
    worker.write_text(worker.read_text().replace("def main() -> None:", textwrap.dedent(f"""\
        import json as _json
        open({str(tmp_path / "ran.json")!r}, "w").write(_json.dumps(sys.path))


        def main() -> None:""")))
    script = _script(tmp_path, "print(got[0] > 0)\n").read_text()
    script = script.replace(repr(str(ROOT)), repr(str(pkg)))
    (tmp_path / "script.py").write_text(script)
    env = {**_env(), "PYTHONPATH": str(extra)}
    out = subprocess.run([sys.executable, str(tmp_path / "script.py")], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (0, "True\n", "")
    path = json.loads((tmp_path / "ran.json").read_text())  # the copy's worker ran
    assert str(pkg) in path and str(extra) in path
    assert path.index(str(pkg)) < path.index(str(extra))


def test_a_worker_that_cannot_start_says_what_to_do(monkeypatch):
    def no_fork(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    before = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(processes_mod.subprocess, "Popen", no_fork)
    p = ProcessShards(2)
    with pytest.raises(RuntimeError) as e:
        p.loss_and_grads(init_params(CFG, 1, np.float32), CFG, *_batch(4))
    assert str(e.value) == ("cannot start a worker process for the shards ([Errno 11] Resource "
                            "temporarily unavailable); share the batch among threads instead "
                            "(parallel='threads')")
    p.close()
    del p, e  # (a mapping holds a descriptor of its own until nothing holds its arrays)
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) <= before  # the worker's gradient block is closed


def test_a_worker_that_does_not_stop_is_killed(monkeypatch):
    p = ProcessShards(2)
    p.loss_and_grads(init_params(CFG, 1, np.float32), CFG, *_batch(4))
    proc = p._workers[0].proc
    os.kill(proc.pid, signal.SIGSTOP)  # it can read no stop request now
    monkeypatch.setattr(processes_mod, "_STOP_WAIT", 0.2)
    p.close()
    assert proc.returncode == -signal.SIGKILL and p._workers == []
