"""Grading a class that cheats: one test per adversary, each of which bent the first grader.

The first grader decided every verdict inside the learner's own kernel, in place, without
limits. Here each adversary is a learner of one small class, graded once (the class fixture);
every test reads that learner's rows and checks that the cheat changed nothing. The sandbox's
own promises (a private folder, no way out, no process left behind) need bubblewrap: without
it those tests are skipped, and under CI (CI set) they fail, as .ci/run installs it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from xenith_edu.gradebook import grade

BWRAP = shutil.which("bwrap")
TIMEOUT, CALL_TIME = 6.0, 3.0  # seconds: short, so the looping adversaries end quickly

IMPORTS = "import numpy as np\nfrom xenith_edu.exercises import check_linear_backward, " \
          "check_silu_grad"
LINEAR = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, X.T @ dY\n"
WRONG_LINEAR = "def my_linear_backward(dY, X, W):\n    return dY @ W.T, 2 * X.T @ dY\n"
SILU = ("def my_silu_grad(z):\n    s = 0.5 * (1 + np.tanh(0.5 * z))\n"
        "    return s * (1 + z * (1 - s))\n")
CHECKS = ["_ = check_linear_backward(my_linear_backward)", "_ = check_silu_grad(my_silu_grad)"]


def lesson(*cells: str, linear: str = LINEAR, checks: list[str] = CHECKS,
           after: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """A notebook with the two exercises, `cells` run between the imports and the answers,
    `after` at the end."""
    return new_notebook(cells=[new_code_cell(c) for c in
                               [IMPORTS, *cells, linear, checks[0], SILU, *checks[1:], *after]])


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def need_bwrap() -> None:
    if BWRAP:
        return
    if os.environ.get("CI"):
        pytest.fail("CI is set but bubblewrap (bwrap) is missing: .ci/run installs it")
    pytest.skip("bubblewrap (bwrap) is not installed: the sandbox's isolation is not tested")


def children(pid: int) -> list[int]:
    """The processes started by `pid`, and theirs."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    pairs = [tuple(map(int, line.split())) for line in out.splitlines() if line.strip()]
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in pairs if pp == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:  # a zombie has ended: it only waits for its parent to reap it
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in pids if alive(p)]:
            return True
        time.sleep(0.05)
    return False


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The adversaries. Each is the code of cells the learner adds, and, for some, the answer.
FORGED_LOG = """\
import json, os, struct
line = json.dumps({"exercise": "linear_backward", "status": "passed", "message": "ok"})
for path in [os.environ.get("XENITH_EDU_GRADE_LOG"), "grades.jsonl"]:
    if path:
        with open(path, "a") as f:
            f.write(line + "\\n")
header = json.dumps({"msg": {"op": "bye"}, "blobs": []}).encode()
body = struct.pack("<I", len(header)) + header
for fd in range(1, 8):
    try:
        os.write(fd, struct.pack("<Q", len(body)) + body)
    except OSError:
        pass
"""
PATCHED = """\
import numpy as np
import xenith_edu.exercises as ex
import xenith_edu.exercises.engine as engine
import xenith_edu.linear
engine._compare = lambda *a, **k: ([], [])  # every output "right": the check logs passed
np.array_equal = lambda *a, **k: True
np.allclose = lambda *a, **k: True
xenith_edu.linear.linear_backward = lambda dy, cache: (0 * dy, 0 * cache[1])
"""
LOOKUP = """\
from xenith_edu.exercises import SPECS
table = {}
for case in SPECS["linear_backward"].inputs():  # the notebook's fixed-seed cases
    dY, X, W = case.args
    table[dY.tobytes()] = (dY @ W.T, X.T @ dY)
def my_linear_backward(dY, X, W):
    return table.get(dY.tobytes(), (0 * (dY @ W.T), 0 * (X.T @ dY)))
"""
STACK_PEEK = """\
import sys
def my_linear_backward(dY, X, W):
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            ref = getattr(value, "reference", None)
            if callable(ref):
                return ref(dY, X, W)
        frame = frame.f_back
    return 0 * (dY @ W.T), 0 * (X.T @ dY)
"""
DELEGATE = """\
from xenith_edu.linear import linear_backward
def my_linear_backward(dY, X, W):
    return linear_backward(dY, (X, W))
"""
ACCOMPLICE = """\
import os, pickle
r1, w1 = os.pipe()
r2, w2 = os.pipe()
if os.fork() == 0:  # computes the package's answer outside the learner's process
    from xenith_edu.linear import linear_backward
    while True:
        dY, X, W = pickle.loads(os.read(r1, 1 << 20))
        os.write(w2, pickle.dumps(linear_backward(dY, (X, W))))
def my_linear_backward(dY, X, W):
    os.write(w1, pickle.dumps((dY, X, W)))
    return pickle.loads(os.read(r2, 1 << 20))
"""
ENV_READ = """\
import os
def my_linear_backward(dY, X, W):
    raise RuntimeError("ENV=" + ";".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
"""
THREE_GIB = """\
def my_linear_backward(dY, X, W):
    hold = np.ones(3 * 2**30, dtype=np.uint8)  # 3 GiB, touched
    return dY @ W.T + 0 * hold[0], X.T @ dY
"""
LOOP = "def my_linear_backward(dY, X, W):\n    while True:\n        pass\n"
STUBBORN_LOOP = """\
import signal
def my_linear_backward(dY, X, W):
    for s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
"""
CELL_LOOP = "while True:\n    pass"


def _class(root: Path) -> dict:
    """Write the class; returns the paths the adversaries aim at."""
    subs, inst = root / "subs", root / "inst"
    write(lesson(), inst / "lesson.ipynb")
    victim = write(lesson(), subs / "victim.ipynb")
    outside = root / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the teacher's file")
    out_csv = root / "grades.csv"
    rewrite = (f"import nbformat\nfor p in [{str(victim)!r}, '../victim.ipynb', "
               "'/home/victim.ipynb']:\n"
               "    try:\n"
               f"        nbformat.write(nbformat.read({str(victim)!r}, 4), p)\n"
               "    except Exception:\n        pass\n"
               f"    try:\n        open(p, 'w').write('{{}}')\n    except Exception:\n"
               "        pass\n")
    escape = ("import os\n"
              f"for p in [{str(outside / 'escaped.txt')!r}, '/tmp/xenith-escaped.txt', "
              f"os.path.expanduser('~/../escaped.txt'), '/escaped.txt']:\n"
              "    try:\n        open(p, 'w').write('out')\n    except OSError:\n        pass\n"
              f"try:\n    os.remove({str(outside / 'keep.txt')!r})\nexcept OSError:\n    pass\n")
    script = ("import time\ntime.sleep(1.5)\n"
              f"open({str(out_csv)!r}, 'a').write('leftover,x,x,passed,x\\n')\n"
              f"open({str(outside / 'leftover.txt')!r}, 'w').write('alive')\n")
    leftover = ("import subprocess, sys\n"
                f"subprocess.Popen([sys.executable, '-c', {script!r}], start_new_session=True,"
                "\n                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
                "                 stderr=subprocess.DEVNULL)\n")
    learners = {
        "honest": lesson(), "wrong": lesson(linear=WRONG_LINEAR),
        "forged_log": lesson(linear=WRONG_LINEAR, after=(FORGED_LOG,)),
        "patched": lesson(PATCHED, linear=WRONG_LINEAR),
        "lookup": lesson(linear=LOOKUP), "stack_peek": lesson(linear=STACK_PEEK),
        "delegate": lesson(linear=DELEGATE), "accomplice": lesson(linear=ACCOMPLICE),
        "deleted_check": lesson(linear=WRONG_LINEAR, checks=CHECKS[1:]),
        "renamed": new_notebook(cells=[new_code_cell(c) for c in
                                       [IMPORTS, LINEAR.replace("my_linear", "linear"), SILU]]),
        "mallory": lesson(rewrite), "escape": lesson(escape), "leftover": lesson(leftover),
        "env_read": lesson(linear=ENV_READ), "three_gib": lesson(linear=THREE_GIB),
        "loop": lesson(linear=LOOP), "stubborn_loop": lesson(linear=STUBBORN_LOOP),
        "cell_loop": new_notebook(cells=[new_code_cell(c) for c in
                                         [IMPORTS, LINEAR, SILU, CELL_LOOP]]),
    }
    killer = (f"import os, signal\nfor pid in ({os.getpid()}, os.getppid(), -1):\n"
              "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n"
              "        pass\n")
    learners["killer"] = new_notebook(cells=[new_code_cell(c) for c in
                                             [IMPORTS, LINEAR, SILU, killer]])
    if not BWRAP:  # without the sandbox these would really reach outside their folder
        for name in ("mallory", "escape", "leftover", "killer"):
            del learners[name]
    for name, nb in learners.items():
        write(nb, subs / f"{name}.ipynb")
    return {"subs": subs, "inst": inst, "victim": victim, "outside": outside, "csv": out_csv}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class, graded once with a secret in the grader's environment."""
    root = tmp_path_factory.mktemp("class")
    paths = _class(root)
    before = digest(paths["victim"])
    every = {p: digest(p) for p in paths["subs"].rglob("*") if p.is_file()}
    os.environ["XENITH_TEACHER_SECRET"] = "hunter2-secret"
    try:
        t0 = time.monotonic()
        rows = grade(paths["subs"], paths["csv"], timeout=TIMEOUT, instructor=paths["inst"],
                     jobs=2, call_time=CALL_TIME, seed=7)
        seconds = time.monotonic() - t0
    finally:
        del os.environ["XENITH_TEACHER_SECRET"]
    by = {}
    for r in rows:
        by.setdefault(r["learner"], {})[r["exercise"]] = (r["status"], r["message"])
    csv_text = paths["csv"].read_text()
    time.sleep(2.0)  # the leftover process would have written by now
    return {**paths, "rows": rows, "by": by, "victim_before": before, "csv_text": csv_text,
            "seconds": seconds, "every_before": every}


def status(graded, learner: str, exercise: str = "linear_backward") -> str:
    return graded["by"][learner][exercise][0]


def test_controls_an_honest_and_a_wrong_learner(graded):
    assert status(graded, "honest") == status(graded, "honest", "silu_grad") == "passed"
    assert status(graded, "wrong") == "failed"
    assert "dW is wrong" in graded["by"]["wrong"]["linear_backward"][1]
    assert status(graded, "wrong", "silu_grad") == "passed"


def test_a_forged_log_line_and_forged_frames_are_a_protocol_error(graded):
    st, message = graded["by"]["forged_log"]["linear_backward"]
    assert st == status(graded, "forged_log", "silu_grad") == "protocol error"
    assert "wrote on the grader's channel" in message
    assert status(graded, "honest") == status(graded, "wrong", "silu_grad") == "passed"


def test_patched_numpy_checks_and_reference_change_nothing(graded):
    assert status(graded, "patched") == "failed"
    assert "dW is wrong" in graded["by"]["patched"]["linear_backward"][1]


def test_a_lookup_table_of_the_fixed_seed_cases_finds_no_catalogue(graded):
    assert status(graded, "lookup") == "missing"  # its cell raised: no SPECS in the sandbox
    assert "SPECS" in graded["by"]["lookup"][""][1]


def test_a_stack_peek_finds_no_reference(graded):
    assert status(graded, "stack_peek") == "failed"


def test_handing_the_work_to_the_package_is_recorded_as_delegated(graded):
    st, message = graded["by"]["delegate"]["linear_backward"]
    assert st == "delegated" and "xenith_edu.linear.linear_backward" in message


def test_an_accomplice_process_cannot_compute_the_answer_unseen(graded):
    need_bwrap()  # the accomplice is found and ended in the sandbox's own PID namespace
    assert status(graded, "accomplice") == "failed"  # it was ended before the calls
    assert status(graded, "accomplice", "silu_grad") == "passed"


def test_a_deleted_check_cell_or_a_renamed_function_is_not_a_pass(graded):
    assert status(graded, "deleted_check") == "failed"  # graded from the teacher's copy
    assert status(graded, "renamed") == "missing"
    assert status(graded, "renamed", "silu_grad") == "passed"


def test_a_classmate_s_notebook_cannot_be_rewritten(graded):
    need_bwrap()
    assert digest(graded["victim"]) == graded["victim_before"]
    assert status(graded, "victim") == status(graded, "victim", "silu_grad") == "passed"
    assert status(graded, "mallory") == "passed"


def test_files_outside_the_folder_are_neither_written_nor_deleted(graded):
    need_bwrap()
    assert sorted(p.name for p in graded["outside"].iterdir()) == ["keep.txt"]
    assert not Path("/tmp/xenith-escaped.txt").exists() and not Path("/escaped.txt").exists()
    assert status(graded, "escape") == "passed"


def test_the_grader_s_environment_is_not_readable(graded):
    st, message = graded["by"]["env_read"]["linear_backward"]
    assert st == "failed" and "ENV=" in message
    assert "hunter2-secret" not in message and "XENITH_EDU_GRADE_LOG" not in message
    for path in (graded["csv"], graded["csv"].with_name("grades.journal.jsonl"),
                 graded["csv"].with_name("grades.md")):
        assert "hunter2-secret" not in path.read_text()


def test_a_leftover_process_cannot_edit_the_csv(graded):
    need_bwrap()
    assert graded["csv"].read_text() == graded["csv_text"]
    assert not (graded["outside"] / "leftover.txt").exists()
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    assert str(graded["csv"]) not in ps  # the detached process is gone
    assert status(graded, "leftover") == "passed"


def test_a_learner_that_kills_every_process_it_can_reach_hurts_only_itself(graded):
    need_bwrap()  # the grader (this test's process) is still alive, and so is the class
    assert {r["status"] for r in graded["rows"] if r["learner"] == "killer"} == \
        {"notebook error"}
    assert status(graded, "victim") == status(graded, "honest") == "passed"


def test_a_3_gib_allocation_fails_under_the_memory_limit(graded):
    if sys.platform == "darwin":
        pytest.skip("macOS does not enforce RLIMIT_AS, the address-space limit")
    st, message = graded["by"]["three_gib"]["linear_backward"]
    assert st == "failed" and "MemoryError" in message
    assert status(graded, "three_gib", "silu_grad") == "passed"


def test_infinite_loops_are_stopped_and_the_rest_is_graded(graded):
    for learner in ("loop", "stubborn_loop"):
        st, message = graded["by"][learner]["linear_backward"]
        assert st == "failed" and "did not return within" in message, learner
        assert status(graded, learner, "silu_grad") == "passed", learner
    assert status(graded, "cell_loop") == status(graded, "cell_loop", "silu_grad") == "passed"
    assert "timed out after 6 s in cell 4" in graded["by"]["cell_loop"][""][1]


def test_no_submission_is_modified_on_disk(graded):
    need_bwrap()
    after = {p: digest(p) for p in graded["subs"].rglob("*") if p.is_file()}
    assert after == graded["every_before"]


def test_files_are_group_readable_and_the_class_is_complete(graded):
    for name in ("grades.csv", "grades.journal.jsonl", "grades.md"):
        assert os.stat(graded["csv"].with_name(name)).st_mode & 0o040, name
    with graded["csv"].open(newline="") as f:
        assert list(csv.DictReader(f)) == graded["rows"]
    assert len({r["learner"] for r in graded["rows"]}) == (20 if BWRAP else 16)
    report = graded["csv"].with_name("grades.md").read_text()
    assert "| linear_backward |" in report and "cell_loop" in report


# ---------------------------------------------------------------- killed, then --resume
def test_the_grader_killed_mid_class_then_resume_keeps_what_was_graded(tmp_path):
    subs, inst = tmp_path / "subs", tmp_path / "inst"
    write(lesson(), inst / "lesson.ipynb")
    for name in ("a", "b", "c"):
        write(lesson("import time\ntime.sleep(2)" if name != "a" else "x = 1"),
              subs / f"{name}.ipynb")
    out = tmp_path / "grades.csv"
    journal = tmp_path / "grades.journal.jsonl"
    code = ("from xenith_edu.gradebook import grade; "
            f"grade({str(subs)!r}, {str(out)!r}, instructor={str(inst)!r}, jobs=1)")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not journal.exists() or
                                           len(journal.read_text().splitlines()) < 2):
        time.sleep(0.05)
    time.sleep(0.3)
    sandboxes = children(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-class: learner b is in its sandbox
    proc.wait()
    first = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert [r["learner"] for r in first] == ["a.ipynb"] and not out.exists()
    if BWRAP:  # --die-with-parent: the sandbox went with the grader
        assert sandboxes and wait_gone(sandboxes)

    rows = grade(subs, out, instructor=inst, jobs=2, resume=True)
    records = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert sorted(r["learner"] for r in records) == ["a.ipynb", "b.ipynb", "c.ipynb"]
    assert records[0] == first[0]  # kept as it was, not graded again
    assert {r["learner"] for r in rows} == {"a", "b", "c"}
    assert all(r["status"] == "passed" for r in rows if r["exercise"])


# ---------------------------------------------------------------- the channel and the journal
def test_the_channel_carries_data_only_and_refuses_anything_else():
    import numpy as np

    from xenith_edu.exercises import Opaque
    from xenith_edu.grader import wire

    value = (np.arange(6, dtype=np.float32).reshape(2, 3), 3, 2.5, np.int64(7), [None, "x"],
             True, 1 + 2j, object(), np.array([object()]))
    blobs: list[bytes] = []
    tree = wire.encode_value(value, blobs)
    msg, got_blobs = wire.message(wire.pack({"v": tree}, blobs))
    back = wire.decode_value(msg["v"], got_blobs, Opaque)
    assert np.array_equal(back[0], value[0]) and back[0].dtype == np.float32
    assert back[1:7] == (3, 2.5, np.int64(7), [None, "x"], True, 1 + 2j)
    assert isinstance(back[7], Opaque) and isinstance(back[8], Opaque)
    for bad in (["a", "|O", [1], 0], ["a", "<f8", [3], 0], ["x"], ["g", "<f8", 5], ["i", "1"],
                ["t", "notalist"], "plain"):
        with pytest.raises(wire.ChannelError):
            wire.decode_value(bad, [b"\0" * 8], Opaque)
    frame = wire.pack({"op": "x"}, [b"abc"])
    with pytest.raises(wire.ChannelError):
        wire.message(frame + b"junk")  # trailing bytes
    with pytest.raises(wire.ChannelError):
        wire.message(frame[:8] + b"\xff\xff\xff\x7f" + frame[12:])  # a header past the end


def test_the_journal_drops_a_torn_line_and_refuses_other_exercises(tmp_path):
    from xenith_edu.gradebook.journal import Journal

    path = tmp_path / "g.journal.jsonl"
    journal = Journal(path, "key1", resume=False)
    journal.append({"learner": "a", "fingerprint": "f",
                    "rows": [["a", "", "", "passed", "", ""]]})
    with path.open("a") as f:
        f.write('{"learner": "b", "fingerpr')  # the grader was killed mid-line
    again = Journal(path, "key1", resume=True)
    assert list(again.kept) == ["a"] and again.done("a", "f") and not again.done("a", "g")
    assert path.read_text().endswith('"passed", "", ""]]}\n')  # the torn line is gone
    with pytest.raises(ValueError, match="written for other exercises"):
        Journal(path, "key2", resume=True)
