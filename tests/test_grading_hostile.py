"""Grading a class that attacks the grader itself: odd files, forged frames, limits, neighbours.
Each adversary once stopped the whole class (or passed); here every other grade stays intact.

One small class is graded once (the class fixture) and graded again with --resume; each test
reads one adversary's rows. The frame schema and the walk are also fed hostile input directly.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import socket
import threading
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from test_grading import IMPORTS, SILU, lesson, need_bwrap, write

from xenith_edu.exercises import InPlace, run
from xenith_edu.gradebook import grade
from xenith_edu.grader import roster, sandbox, wire

TIMEOUT, CALL_TIME = 6.0, 3.0

# Writes frames on every pipe the learner's process holds: the child's channel among them.
FORGE = '''\
import json, os, stat, struct
def frame(msg, blobs=()):
    header = json.dumps({"msg": msg, "blobs": [len(b) for b in blobs]}).encode()
    body = struct.pack("<I", len(header)) + header + b"".join(blobs)
    return struct.pack("<Q", len(body)) + body
def send(*frames):
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"".join(frames))
        except OSError:
            pass
RAN = {"op": "ran", "nb": 0, "errors": [], "stopped": None, "seconds": 0.1,
       "functions": {"my_linear_backward": "ok", "my_silu_grad": "ok"}}
def result(outcome, blobs=()):
    return frame({"op": "result", "nb": 0, "ex": 0, "call": 0, "outcome": outcome,
                  "delegated": [], "seconds": 0.0}, blobs)
'''
FORGED = {
    "wrong_type": 'send(frame({**RAN, "errors": "none", "functions": ["my_linear_backward"]}))',
    "huge_int": 'send(frame(RAN), result(["v", ["t", [["f", 10**400], ["i", 2**70]]]]))',
    "big_shape": 'send(frame(RAN), result(["v", ["a", "<f8", [2**32, 2**32], 0]], [b""]))',
    "bad_dtype": 'send(frame(RAN), result(["v", ["a", "M8[xx]", [1], 0]], [b"12345678"]))',
    "flood": 'send(frame(RAN), *[frame({"op": "exercise", "nb": 0, "ex": 0}, [bytes(4 << 20)])'
             ' for _ in range(40)])',
}
# wrote nothing: forges "cells ran", takes the hidden inputs, answers from the catalogue
FORGER = '''\
send(frame(RAN))
try:
    from xenith_edu.exercises import SPECS
    answer = SPECS["linear_backward"].reference
except ImportError:
    answer = None
send(result(["R", "ImportError", "no catalogue", ""]))
'''
FILL = '''\
import os
found = []
for where in ("big.bin", "/tmp/big.bin", "/dev/shm/big.bin", "/big.bin", "/home/big.bin"):
    try:
        with open(where, "wb") as f:
            for _ in range(40):
                f.write(bytes(2**20))
        found.append(f"{where}: written")
    except OSError as exc:
        found.append(f"{where}: {exc.strerror}")
    try:
        os.remove(where)
    except OSError:
        pass
raise RuntimeError("FILL " + "; ".join(found))
'''
PROC_CHANNEL = '''\
import os
opened = []
for fd in range(32):
    try:
        os.open(f"/proc/{os.getppid()}/fd/{fd}", os.O_WRONLY)
        opened.append(fd)
    except OSError:
        pass
assert not opened, f"opened the parent's descriptors {opened}"
'''
CATALOGUE = '''\
import os, sys, xenith_edu
base = os.path.join(os.path.dirname(xenith_edu.__file__), "exercises")
listed = sorted(os.listdir(base))
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Fence"]
for name in [n for n in sys.modules if n.startswith("xenith_edu.exercises")]:
    del sys.modules[name]
try:
    import xenith_edu.exercises.backward as b
    got = "imported " + str(len(b.SPECS))
except ImportError as exc:
    got = type(exc).__name__
raise RuntimeError(f"CATALOGUE {listed} {got}")
'''
SURROGATE = "def my_linear_backward(dY, X, W):\n    raise ValueError('half a pair: \\udcff')\n"
MATERIAL = "from xenith_edu.exercises.backward import buggy_stack_backward, stack_forward"
USE_MATERIAL = """\
import xenith_edu.exercises.backward as b
hs = stack_forward(np.ones((2, 3)), np.ones((1, 3)), np.ones((1, 3, 3)), 1e-5)
assert len(hs) == 2 and buggy_stack_backward(hs[1], hs[0], *[np.ones((1, 3, 3))[:, 0],
                                                             np.ones((1, 3, 3))], 1e-5)
held = sorted(n for n in vars(b) if not n.startswith("_"))
assert held == ["annotations", "buggy_stack_backward", "np", "rms_parts", "stack_forward"], held
"""
HUGE = "def my_linear_backward(dY, X, W):\n    return np.zeros(2**23), X.T @ dY\n"  # 64 MiB
CYCLIC = "def my_linear_backward(dY, X, W):\n    a = []\n    a.append(a)\n    return a, a\n"


def _folder(subs: Path, name: str) -> Path:
    folder = subs / name
    write(lesson(), folder / "lesson.ipynb")
    return folder


def _class(root: Path) -> dict:
    subs, inst = root / "subs", root / "inst"
    write(lesson(MATERIAL), inst / "lesson.ipynb")  # the teacher's helpers: in the sandbox
    write(lesson(), subs / "honest.ipynb")
    write(lesson(MATERIAL, USE_MATERIAL), subs / "material.ipynb")
    os.mkfifo(_folder(subs, "fifo") / "pipe")
    here = os.getcwd()
    os.chdir(_folder(subs, "socket"))
    try:
        server = socket.socket(socket.AF_UNIX)
        server.bind("sock")  # a relative name: the socket's path length limit
    finally:
        os.chdir(here)
    with open(os.fsencode(_folder(subs, "badname")) + b"/\xff\xfe.txt", "w") as f:
        f.write("x")
    with open(os.fsencode(subs) + b"/caf\xe9.ipynb", "w") as f:
        nbformat.write(lesson(), f)
    deep = _folder(subs, "deep")
    for _ in range(1000):
        deep = deep / "d"
        deep.mkdir()
    with open(_folder(subs, "sparse") / "big.bin", "wb") as f:
        f.truncate(8 << 30)  # 8 GiB that take no disk
    many = _folder(subs, "many")
    for k in range(roster.MAX_ENTRIES + 5):
        (many / f"{k}.txt").touch()
    write(lesson(), subs / "dup.ipynb")
    _folder(subs, "dup")
    os.symlink(subs / "honest.ipynb", _folder(subs, "link") / "other.ipynb")
    for name, code in FORGED.items():
        write(lesson(FORGE + code), subs / f"{name}.ipynb")
    write(new_notebook(cells=[new_code_cell(c) for c in [IMPORTS, FORGE + FORGER, SILU]]),
          subs / "forger.ipynb")
    for name, cell in (("fill", FILL), ("proc_channel", PROC_CHANNEL),
                       ("catalogue", CATALOGUE)):
        write(lesson(after=(cell,)), subs / f"{name}.ipynb")
    write(lesson(linear=CYCLIC), subs / "cyclic.ipynb")
    write(lesson(linear=HUGE), subs / "huge_answer.ipynb")
    write(lesson(linear=SURROGATE), subs / "surrogate.ipynb")
    return {"subs": subs, "inst": inst, "csv": root / "grades.csv", "server": server,
            "deep": deep}


def _remove_deep(deep: Path, stop: Path) -> None:
    """rmdir from the bottom: a recursive removal would overflow Python's stack."""
    while deep != stop:
        deep.rmdir()
        deep = deep.parent


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    need_bwrap()
    root = tmp_path_factory.mktemp("hostile")
    paths = _class(root)
    small = functools.partial(sandbox.Limits, home=24 * 2**20, tmp=16 * 2**20)
    original, sandbox.Limits = sandbox.Limits, small
    try:
        kwargs = dict(timeout=TIMEOUT, instructor=paths["inst"], jobs=2, call_time=CALL_TIME,
                      seed=7)
        rows = grade(paths["subs"], paths["csv"], **kwargs)
        again = grade(paths["subs"], paths["csv"], resume=True, **kwargs)
    finally:
        sandbox.Limits = original
        paths["server"].close()
        _remove_deep(paths["deep"], paths["subs"] / "deep")
    by: dict = {}
    for r in rows:
        by.setdefault(r["learner"], {}).setdefault(r["exercise"], []).append(
            (r["status"], r["message"]))
    return {**paths, "rows": rows, "again": again, "by": by}


def statuses(hostile, learner: str) -> dict[str, str]:
    return {ex: found[0][0] for ex, found in hostile["by"][learner].items()}


def passed(hostile, learner: str) -> bool:
    got = statuses(hostile, learner)
    return got["linear_backward"] == got["silu_grad"] == "passed"


def message(hostile, learner: str, exercise: str = "") -> str:
    return " ".join(m for _, m in hostile["by"][learner][exercise])


def test_the_honest_learners_pass_and_the_class_is_complete(hostile):
    for learner in ("honest", "material", "fifo", "socket", "badname", "caf\\xe9", "link",
                    "proc_channel", "catalogue", "dup.ipynb", "dup/"):
        assert passed(hostile, learner), learner
    with hostile["csv"].open(newline="", encoding="utf-8") as f:
        assert list(csv.DictReader(f)) == hostile["rows"]
    assert hostile["again"] == hostile["rows"]  # --resume: the same rows, nothing lost


def test_a_fifo_beside_the_notebook_is_listed_not_opened(hostile):
    assert statuses(hostile, "fifo")[""] == "unreadable file"
    assert "pipe (a named pipe)" in message(hostile, "fifo")


def test_a_unix_socket_is_listed_not_opened(hostile):
    assert statuses(hostile, "socket")[""] == "unreadable file"
    assert "sock (a socket)" in message(hostile, "socket")


def test_a_name_that_is_not_utf8_is_listed_and_a_learner_so_named_is_graded(hostile):
    assert statuses(hostile, "badname")[""] == "unreadable file"
    assert "\\xff\\xfe.txt (a name that is not UTF-8)" in message(hostile, "badname")
    assert passed(hostile, "caf\\xe9")  # the learner's name, escaped


def test_a_tree_a_thousand_folders_deep_is_over_the_limit(hostile):
    assert set(statuses(hostile, "deep").values()) == {"over the limit"}
    assert "nested more than 16 deep" in message(hostile, "deep", "linear_backward")


def test_a_sparse_file_of_8_gib_is_over_the_limit(hostile):
    assert set(statuses(hostile, "sparse").values()) == {"over the limit"}
    assert "more than 200 MiB" in message(hostile, "sparse", "linear_backward")


def test_too_many_files_are_over_the_limit(hostile):
    assert set(statuses(hostile, "many").values()) == {"over the limit"}


def test_a_link_inside_a_folder_is_listed_not_followed(hostile):
    assert "other.ipynb (a link, not followed)" in message(hostile, "link")


def test_a_notebook_and_a_folder_of_one_name_are_graded_apart_and_reported(hostile):
    assert statuses(hostile, "dup") == {"": "name collision"}
    assert "learner dup: dup/, dup.ipynb;" in message(hostile, "dup")
    assert [r["notebook"] for r in hostile["rows"] if r["learner"] == "dup/"][0] == \
        "dup/lesson.ipynb"


def test_the_report_shows_the_tampering_and_the_limits(hostile):
    report = hostile["csv"].with_name("grades.md").read_text(encoding="utf-8")
    # the report escapes Markdown, so the messages' brackets read as text: \[protocol error\]
    for text in ("\\[protocol error\\]", "wrote on the grader's channel", "\\[over the limit\\]"):
        assert text in report, text


@pytest.mark.parametrize("learner", sorted(FORGED))
def test_a_forged_frame_is_that_learner_s_protocol_error(hostile, learner):
    assert set(statuses(hostile, learner).values()) == {"protocol error"}
    assert "wrote on the grader's channel" in message(hostile, learner, "linear_backward")


def test_a_forged_cells_ran_finds_no_catalogue_and_is_a_protocol_error(hostile):
    assert set(statuses(hostile, "forger").values()) == {"protocol error"}


def test_the_catalogue_is_not_in_the_sandbox_even_without_the_import_fence(hostile):
    text = message(hostile, "catalogue")
    assert "CATALOGUE ['outcomes.py'] ModuleNotFoundError" in text and "imported" not in text


def test_the_teacher_s_helpers_are_in_the_sandbox_without_their_module(hostile):
    assert "" not in hostile["by"]["material"]  # its cells ran: the helpers, nothing else


def test_the_parent_s_channel_is_not_reachable_through_proc(hostile):
    assert "" not in hostile["by"]["proc_channel"]  # no cell raised: nothing opened


def test_every_writable_place_is_size_capped(hostile):
    text = message(hostile, "fill")
    for where in ("big.bin", "/tmp/big.bin", "/dev/shm/big.bin"):
        assert f"{where}: No space left on device" in text, where
    assert "/big.bin: Read-only file system" in text
    assert "written" not in text
    assert passed(hostile, "fill")


def test_a_message_no_file_can_hold_is_escaped(hostile):
    assert statuses(hostile, "surrogate")["linear_backward"] == "failed"
    assert "half a pair: \\udcff" in message(hostile, "surrogate", "linear_backward")


def test_a_huge_answer_is_a_wrong_answer_not_a_flood(hostile):
    assert statuses(hostile, "huge_answer")["linear_backward"] == "failed"
    assert "more than the grader reads" in message(hostile, "huge_answer", "linear_backward")
    assert statuses(hostile, "huge_answer")["silu_grad"] == "passed"


def test_a_cyclic_answer_is_judged_not_crashed(hostile):
    assert statuses(hostile, "cyclic")["linear_backward"] == "failed"
    assert statuses(hostile, "cyclic")["silu_grad"] == "passed"


# ---------------------------------------------------------------- two graders at once
BOMB = '''\
import os, time
for _ in range(500):
    try:
        if os.fork() == 0:
            time.sleep(4)
            os._exit(0)
    except OSError:
        break
time.sleep(4)
'''


def test_two_graders_at_once_never_share_a_uid_or_a_process_limit(tmp_path):
    need_bwrap()
    for side in ("a", "b"):
        write(lesson(), tmp_path / side / "inst" / "lesson.ipynb")
    write(lesson(BOMB), tmp_path / "a" / "subs" / "bomb.ipynb")
    write(lesson("import time\ntime.sleep(0.5)"), tmp_path / "b" / "subs" / "honest.ipynb")

    def grade_side(side: str) -> list[dict]:
        return grade(tmp_path / side / "subs", tmp_path / side / "grades.csv", timeout=6.0,
                     instructor=tmp_path / side / "inst", jobs=1, call_time=CALL_TIME, seed=3)

    bomb = threading.Thread(target=grade_side, args=("a",))
    bomb.start()
    time.sleep(1.5)  # the bomb's processes are all alive now, for 4 s
    rows = grade_side("b")
    bomb.join()
    assert {r["status"] for r in rows} == {"passed"}, rows


def test_each_lease_is_a_uid_of_its_own():
    if os.getuid() != 0:
        pytest.skip("uids are leased only when the grader is root")
    first, fd1 = sandbox.lease_uid()
    second, fd2 = sandbox.lease_uid()
    try:
        assert first != second and sandbox.UID_BASE <= min(first, second)
    finally:
        os.close(fd1)
    again, fd3 = sandbox.lease_uid()  # the first lease was given back
    os.close(fd2)
    os.close(fd3)
    assert again == first


# ---------------------------------------------------------------- the schema, frame by frame
PLAN = [[("f", 2, 3), ("g", 1, 1)]]  # one notebook: f on 2 cases of 3 arguments, g on 1
RAN = {"op": "ran", "nb": 0, "errors": [], "stopped": None, "seconds": 0.5,
       "functions": {"f": "ok", "g": "missing"}}


def result(call: int, outcome: object, ex: int = 0) -> dict:
    return {"op": "result", "nb": 0, "ex": ex, "call": call, "outcome": outcome,
            "delegated": [], "seconds": 0.0}


def honest_frames() -> list[tuple[dict, list[bytes]]]:
    blobs: list[bytes] = []
    tree = wire.encode_outcome((np.ones((2, 3), np.float32), 2.5), blobs)
    return [({"op": "ready"}, []), (RAN, []), (result(0, tree), blobs),
            (result(1, ["R", "ValueError", "no", ""]), []),
            ({"op": "exercise", "nb": 0, "ex": 0}, []), ({"op": "exercise", "nb": 0, "ex": 1}, []),
            ({"op": "notebook", "nb": 0}, []), ({"op": "bye"}, [])]


def converse(frames: list, budget: int = 2**20) -> None:
    talk = wire.Conversation(PLAN, budget)
    for msg, blobs in frames:
        talk.take(len(json.dumps(msg)) + sum(map(len, blobs)), msg, blobs)


def test_an_honest_reply_is_taken_whole():
    converse(honest_frames())


BAD = {
    "wrong type": (2, {**RAN, "errors": "none"}),
    "bool for an int": (2, {**RAN, "nb": False}),
    "functions of another notebook": (2, {**RAN, "functions": {"h": "ok"}}),
    "extra key": (2, {**RAN, "verdict": "passed"}),
    "huge int": (3, result(0, ["v", ["i", 2**70]])),
    "int too large for a float": (3, result(0, ["v", ["f", 10**400]])),
    "overflowing shape": (3, result(0, ["v", ["a", "<f8", [2**32, 2**32, 2**32], 0]])),
    "bad dtype": (3, result(0, ["v", ["a", "M8[xx]", [1], 0]])),
    "object dtype": (3, result(0, ["v", ["a", "|O", [1], 0]])),
    "in place out of range": (3, result(0, ["P", 7])),
    "a call out of order": (2, result(1, ["v", ["n"]])),
    "a repeated ran": (3, RAN),
    "an exercise too early": (3, {"op": "exercise", "nb": 0, "ex": 0}),
    "bye too early": (3, {"op": "bye"}),
    "an unknown op": (3, {"op": "passed", "nb": 0}),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_every_malformed_frame_is_tampering(kind):
    at, bad = BAD[kind]
    frames = honest_frames()
    frames[at] = (bad, [b"\0" * 8])
    with pytest.raises(wire.Tampered):
        converse(frames)


def test_a_flood_of_frames_or_bytes_is_over_the_budget():
    frames = honest_frames()
    with pytest.raises(wire.Tampered, match="more frames or bytes"):
        converse(frames, budget=100)
    talk = wire.Conversation(PLAN, 2**30)
    talk.take(10, {"op": "ready"}, [])
    with pytest.raises(wire.Tampered):
        for _ in range(100):  # each a well-formed, in-order frame, but far too many
            talk.take(10, {"op": "stopped", "nb": 0, "ex": None, "call": None,
                           "why": "time", "phase": "run"}, [])


def test_the_one_in_place_rule_counts_a_changed_dtype():
    def reinterpret(x):
        x.dtype = np.int64  # the same bytes, zero either way: only the dtype changed
        return x

    assert run(reinterpret, (np.zeros((2, 3)),)) == InPlace(0)


def test_the_walk_reads_nothing_odd(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "a.ipynb").write_text("{}")
    os.makedirs(tmp_path / ("d/" * 20))
    found = roster.walk(tmp_path)
    assert found.over == "folders are nested more than 16 deep"
    assert "pipe (a named pipe)" in found.unreadable
    assert ("a.ipynb", 2) in found.files


def test_a_learner_the_grader_cannot_grade_is_one_row_and_the_class_goes_on(tmp_path,
                                                                            monkeypatch):
    write(lesson(), tmp_path / "inst" / "lesson.ipynb")
    for name in ("a", "b"):
        write(lesson(), tmp_path / "subs" / f"{name}.ipynb")
    real = sandbox.private_copy

    def broken(source: Path, into: Path) -> Path:
        if source.name == "a.ipynb":
            raise OSError("the disk is on fire")
        return real(source, into)

    monkeypatch.setattr(sandbox, "private_copy", broken)
    rows = grade(tmp_path / "subs", tmp_path / "grades.csv", instructor=tmp_path / "inst",
                 jobs=1, timeout=TIMEOUT, call_time=CALL_TIME, seed=1)
    mine = [r for r in rows if r["learner"] == "a"]
    assert len(mine) == 1 and "the disk is on fire" in mine[0]["message"]
    assert {r["status"] for r in rows if r["learner"] == "b"} == {"passed"}
    journal = (tmp_path / "grades.journal.jsonl").read_text()
    assert '"a.ipynb"' not in journal  # --resume grades it again
