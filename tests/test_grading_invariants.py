"""The grader's invariants, each tested on generated cases: the same notebook gets the same
grade (hidden cases are a function of the assignment, never of the learner), nothing a learner
hands in is parsed outside a limit, names are data, lateness has a stated source, shards carry
their class, and files are readable by whom book/teaching.md says.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_notebook

from xenith_edu.classroom import grade, grading
from xenith_edu.classroom.journal import Journal
from xenith_edu.classroom.roster import Exercise
from xenith_edu.exercises import SPECS

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=12)
SEEDS = st.integers(0, 2**63 - 1)
QUICK = settings(max_examples=25, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


# ----------------------------------------------------------------------------------------------
# Same notebook, same grade.


@QUICK
@given(seed=SEEDS, learners=st.lists(NAMES, min_size=2, max_size=4, unique=True),
       exercise=st.sampled_from(sorted(SPECS)))
def test_hidden_cases_are_a_function_of_the_assignment_never_of_the_learner(
        seed, learners, exercise):
    plan = [("lesson.ipynb", "lesson.ipynb", [Exercise(exercise, "fn")])]
    options = grading.Options(seed=seed)
    drawn = []
    for learner in learners:
        _, frames, kept = grading.build_request(learner, plan, options, "/home")
        drawn.append((frames, kept[("lesson.ipynb", exercise)][0]))
    assert all(d == drawn[0] for d in drawn)


def test_the_journal_keeps_the_assignment_seed_for_resume(tmp_path):
    path = tmp_path / "g.journal.jsonl"
    first = Journal(path, "key", resume=False)
    assert isinstance(first.seed, int)
    assert Journal(path, "key", resume=True).seed == first.seed
    with pytest.raises(ValueError, match="seed"):
        Journal(path, "key", resume=True, seed=first.seed + 1)
    assert Journal(path, "key", resume=False, seed=7).seed == 7


def test_shards_must_share_a_stated_seed(tmp_path):
    (tmp_path / "subs").mkdir()
    with pytest.raises(ValueError, match="seed"):
        grade(tmp_path / "subs", tmp_path / "g.csv", shard="1/2")


WRONG_BEYOND = """\
def my_linear_backward(dY, X, W):
    dX, dW = dY @ W.T, X.T @ dY
    if X.shape[0] > {size}:  # wrong only for the larger batches
        dW = 2 * dW
    return dX, dW
"""


def _wrong_beyond_size_class(root: Path, learners: int, size: int) -> Path:
    subs = root / "subs"
    subs.mkdir()
    cells = ["from xenith_edu.exercises import check_linear_backward",
             WRONG_BEYOND.format(size=size), "_ = check_linear_backward(my_linear_backward)"]
    for i in range(learners):
        nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]),
                       str(subs / f"learner{i}.ipynb"))
    return subs


def test_identical_notebooks_wrong_beyond_a_size_get_identical_rows(tmp_path):
    sizes = {c.args[1].shape[0] for s in range(20)
             for c in SPECS["linear_backward"].inputs(np.random.default_rng(s))}
    size = sorted(sizes)[len(sizes) // 2]  # some draws pass it, some do not
    subs = _wrong_beyond_size_class(tmp_path, 4, size)
    inst = tmp_path / "inst.ipynb"
    nbformat.write(nbformat.read(str(subs / "learner0.ipynb"), 4), str(inst))
    rows = grade(subs, tmp_path / "g.csv", 20, instructor=inst, jobs=2, call_time=5.0)
    verdicts = {(r["status"], r["message"]) for r in rows if r["exercise"]}
    assert len(verdicts) == 1, verdicts
    head = json.loads((tmp_path / "g.journal.jsonl").read_text().splitlines()[0])
    assert isinstance(head["seed"], int)
    with (tmp_path / "g.csv").open() as f:
        assert len({r["status"] for r in csv.DictReader(f) if r["exercise"]}) == 1


# ----------------------------------------------------------------------------------------------
# Nothing from a submission is parsed outside limits.


BOMBS = st.sampled_from([b"{},", b"[],", b'{"a": []},', b"[{}],"])  # tiny, each a new object
HONEST = new_notebook(cells=[new_code_cell(c) for c in (
    "from xenith_edu.exercises import check_linear_backward",
    "def f(dY, X, W):\n    return dY @ W.T, X.T @ dY", "_ = check_linear_backward(f)")])


def _bomb(unit: bytes, n: int) -> bytes:
    """A notebook of `n` tiny JSON objects: a few bytes each on disk, ~60 in memory."""
    return b'{"cells": [{"cell_type": "markdown", "id": "q", "source": ' \
        b'"an answer"}], "x": [' + unit * n + b"0]}"


@settings(max_examples=4, deadline=None)
@given(unit=BOMBS, n=st.integers(1_500_000, 2_500_000))
def test_a_notebook_bomb_is_read_in_a_child_under_the_memory_limit(tmp_path_factory, unit, n):
    from xenith_edu.classroom import nbread

    folder = tmp_path_factory.mktemp("bomb")
    bomb, honest = folder / "bomb.ipynb", folder / "honest.ipynb"
    bomb.write_bytes(_bomb(unit, n))
    honest.write_bytes(_bomb(unit, 10))
    ask = [{"name": "lesson.ipynb", "path": str(bomb), "questions": ["q"]}]
    with pytest.raises(nbread.OverLimit, match="limit"):
        nbread.read_limited(ask, 64 * 2**20, 60)
    ask[0]["path"] = str(honest)  # the same kind of file, small: read within the same limit
    assert nbread.read_limited(ask, 64 * 2**20, 60) == {"lesson.ipynb": {"q": "an answer"}}


def test_a_notebook_bomb_is_its_learners_row_and_the_class_is_graded(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(HONEST, str(subs / "honest.ipynb"))
    nbformat.write(HONEST, str(tmp_path / "lesson.ipynb"))
    (subs / "bomb.ipynb").write_bytes(_bomb(b"{},", 21_000_000))  # 63 MB: ~1.5 GB of dicts
    rows = grade(subs, tmp_path / "g.csv", 20, instructor=tmp_path / "lesson.ipynb", jobs=1,
                 call_time=5.0, memory=2**30)
    status = {r["learner"]: r["status"] for r in rows if r["exercise"]}
    assert status == {"honest": "passed", "bomb": "over the limit"}, rows


# ----------------------------------------------------------------------------------------------
# Lateness only from a stated source.

IDS = st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), min_size=1, max_size=6,
               unique=True)


@QUICK
@given(ids=IDS, data=st.data())
def test_lateness_comes_from_the_stated_source_and_an_untimed_learner_is_reported(
        tmp_path_factory, ids, data):
    from datetime import UTC, datetime, timedelta

    from xenith_edu.classroom import course
    from xenith_edu.classroom.inputs import late_policy
    from xenith_edu.classroom.points import Part

    due = datetime(2026, 12, 1, tzinfo=UTC)
    folder = tmp_path_factory.mktemp("stamps")
    hours = st.one_of(st.none(), st.integers(-100, 100))
    stamped = {i: data.draw(hours, label=f"stamp {i}") for i in ids}
    listed = [i for i in ids if data.draw(st.booleans(), label=f"listed {i}")]
    stamps = folder / "t.csv"
    stamps.write_text("id,submitted\n" + "".join(
        f"{i},{'' if stamped[i] is None else (due + timedelta(hours=stamped[i])).isoformat()}\n"
        for i in listed))
    parts = [Part("lesson.ipynb", {"ex": 1.0})]
    marks = []
    for mtime in (data.draw(st.floats(0, 4e9)), data.draw(st.floats(0, 4e9))):
        entries = [course.Entry(i, f"{i}.ipynb", k, time=mtime) for k, i in enumerate(ids)]
        base = {e.key: [(e.learner, "lesson.ipynb", "ex", "passed", "", "")] for e in entries}
        pol = course.policy(None, late_policy(due.isoformat(), 0.1, None), stamps, [], entries,
                            parts)
        pol.source = course.time_source(pol.late, stamps, None)
        people = course.learners(entries, None)
        rows = course.class_rows(people, base, parts, pol)
        marks.append([r["late"] for r in rows])
        timed = {i for i in listed if stamped[i] is not None}
        assert set(course.untimed(people, pol)) == set(ids) - timed
        for r in rows:
            late = r["learner"] in timed and stamped[r["learner"]] > 0
            assert bool(r["late"]) == late and (not late or r["late"].endswith(
                course.FROM_TIMESTAMPS))
    assert marks[0] == marks[1]  # the files' times changed nothing
    with pytest.raises(ValueError, match="--timestamps"):
        course.time_source(late_policy(due.isoformat(), None, None), None, None)
    with pytest.raises(ValueError, match="not both"):
        course.time_source(late_policy(due.isoformat(), None, None), stamps, True)


# ----------------------------------------------------------------------------------------------
# Shards carry the class.


def _shards(root: Path, variant: str, seed: int) -> Path:
    subs, out = root / f"subs-{variant}", root / f"out-{variant}"
    subs.mkdir()
    out.mkdir()
    for name in ("ann", "ben"):
        nbformat.write(HONEST, str(subs / f"{name}.ipynb"))
    if variant == "other":  # another class of the same size: one learner's file differs
        cells = [*HONEST.cells, new_code_cell("x = 1")]
        nbformat.write(new_notebook(cells=cells), str(subs / "ben.ipynb"))
    if not (root / "lesson.ipynb").exists():
        nbformat.write(HONEST, str(root / "lesson.ipynb"))
    for k in (1, 2):
        grade(subs, out / f"part{k}.csv", 20, instructor=root / "lesson.ipynb", jobs=1,
              call_time=5.0, seed=seed, shard=f"{k}/2")
    return out


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    return {"root": root, "one": _shards(root, "one", 5), "other": _shards(root, "other", 5),
            "reseeded": _shards(root, "reseeded", 6)}


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


@QUICK
@given(data=st.data())
def test_a_merge_refuses_an_edited_journal_and_writes_nothing(sharded, data):
    from xenith_edu.classroom import grade_merge

    work = _copy(sharded["one"], sharded["root"] / "work")
    k = data.draw(st.sampled_from([1, 2]))
    journal = work / f"part{k}.journal.jsonl"
    raw = bytearray(journal.read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1))
    edit = data.draw(st.sampled_from(["flip", "cut", "insert", "swap lines"]))
    if edit == "flip":
        raw[at] ^= data.draw(st.integers(1, 255))
    elif edit == "cut":
        del raw[at:at + data.draw(st.integers(1, 40))]
    elif edit == "insert":
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=20))
    else:
        lines = bytes(raw).splitlines(keepends=True)
        if len(lines) < 3 or lines[1] == lines[2]:
            raw += b"\n"
        else:
            raw = bytearray(b"".join([lines[0], lines[2], lines[1], *lines[3:]]))
    journal.write_bytes(bytes(raw))
    out = work / "merged.csv"
    with pytest.raises(ValueError, match="journal"):
        grade_merge([work / "part1.csv", work / "part2.csv"], out)
    assert not out.exists() and not (work / "merged.totals.csv").exists()


@QUICK
@given(other=st.sampled_from(["other", "reseeded"]), k=st.sampled_from([1, 2]),
       layout=st.sampled_from(["swap", "repeat", "missing"]))
def test_a_merge_refuses_another_class_or_a_missing_or_repeated_shard(sharded, other, k,
                                                                      layout):
    from xenith_edu.classroom import grade_merge

    one, two = sharded["one"], sharded[other]
    given_ = {"swap": [one / f"part{3 - k}.csv", two / f"part{k}.csv"],
              "repeat": [one / f"part{k}.csv", one / f"part{k}.csv"],
              "missing": [one / f"part{k}.csv"]}[layout]
    out = sharded["root"] / "merged.csv"
    with pytest.raises(ValueError, match="another class|twice|missing"):
        grade_merge(given_, out)
    assert not out.exists()
    grade_merge([one / "part1.csv", one / "part2.csv"], out)  # the shards of one class join
    assert out.exists()
    out.unlink()


# ----------------------------------------------------------------------------------------------
# Files readable by whom the docs say: the teacher's group, no one else, whatever the umask.


@QUICK
@given(umask=st.integers(0, 0o777), ids=IDS)
def test_every_output_is_readable_by_the_group_and_no_wider_under_any_umask(
        tmp_path_factory, umask, ids):
    import os
    import stat

    from xenith_edu.classroom import course, shards
    from xenith_edu.classroom.inputs import LatePolicy
    from xenith_edu.classroom.points import Part, Question

    out = tmp_path_factory.mktemp("modes")
    parts = [Part("lesson.ipynb", {"ex": 1.0}, (Question("q", 2.0, "Why?"),))]
    entries = [course.Entry(i, f"{i}.ipynb", k) for k, i in enumerate(ids)]
    base = {e.key: [(e.learner, "lesson.ipynb", "ex", "passed", "", "")] for e in entries}
    pol = course.Policy(None, LatePolicy(), {}, {}, out / "feedback", ("canvas", "moodle"))
    old = os.umask(umask)
    try:
        Journal(out / "g.journal.jsonl", "key", resume=False).append({"learner": "x", "rows": []})
        shards.write_facts(out / "g.course.json", "key", (1, 1), len(ids), parts, entries, {})
        course.finish(out / "g.csv", entries, base, parts, pol, {})
    finally:
        os.umask(old)
    found = [p for p in out.rglob("*")]
    assert len(found) >= 8 + len(ids)  # csv, totals, written, md, canvas, moodle, ... pages
    for path in found:
        mode = stat.S_IMODE(path.stat().st_mode)
        want = 0o750 if path.is_dir() else 0o640
        assert mode == want, (path.name, oct(mode), oct(umask))
