"""Grading again what changed, on generated classes: `--regrade` of any subset of learners leaves
every other learner's rows byte for byte; `--resume` after any subset of the checks changed
re-grades exactly those rows of every learner, in the order a whole run writes them; a journal
without check digests (an older grader's) is graded again whole, and the run says so. The
digest changes with the check's code, its settings, the case seed and the package's version.

The sandbox is replaced by a recording stand-in (`grading.grade_learner`) whose rows carry a
generation number, so that each row says which run graded it; the scripted course
(test_course_run.py) does the same with the real sandbox.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_course import lesson, write

from xenith_edu import cli
from xenith_edu.exercises import SPECS
from xenith_edu.gradebook import grade, grading, regrade
from xenith_edu.grader.statuses import Found, Row

EXERCISES = ("linear_backward", "silu_grad")  # the lesson's, in its order
QUICK = settings(max_examples=12, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


class Stand:
    """The sandbox's stand-in: records who was graded on what; each row names its run."""

    def __init__(self) -> None:
        self.gen, self.calls, self.stop_at = 0, [], None

    def __call__(self, learner, source, teacher, options, slot, fonts):
        asked = [ex.id for _, exercises in teacher for ex in exercises]
        self.calls.append((learner, asked))
        if self.stop_at is not None and len(self.calls) > self.stop_at:
            raise KeyboardInterrupt  # the teacher's Ctrl-C, at a generated point
        return [Found(nb, ex.id, Row.PASSED if self.gen % 2 == 0 else Row.FAILED,
                      f"run {self.gen}", "") for nb, exercises in teacher for ex in exercises], \
            {f"{nb}/{ex.id}": self.gen for nb, exercises in teacher for ex in exercises}


@pytest.fixture
def stand(monkeypatch) -> Stand:
    s = Stand()
    monkeypatch.setattr(grading, "grade_learner", s)
    return s


def make_class(root: Path, names: list[str]) -> dict:
    write(lesson(), root / "inst" / "lesson.ipynb")
    for i, name in enumerate(names):
        nb = lesson()
        nb.cells[0].source += f"\n# {i}"  # each learner's own file
        write(nb, root / "subs" / f"{name}.ipynb")
    (root / "out").mkdir()
    return {"subs": root / "subs", "inst": root / "inst", "csv": root / "out" / "grades.csv"}


def run(paths: dict, **more) -> list[dict]:
    return grade(paths["subs"], paths["csv"], 20, instructor=paths["inst"], jobs=2, seed=11,
                 **more)


def lines_of(path: Path) -> dict[str, list[str]]:
    """The CSV's lines of each learner, as bytes on the disk."""
    out: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        out.setdefault(line.split(",", 1)[0], []).append(line)
    return out


LEARNERS = st.lists(st.sampled_from(["alice", "bob", "carol", "dan", "eve", "fay"]),
                    min_size=2, max_size=5, unique=True)


@QUICK
@given(data=st.data(), names=LEARNERS)
def test_regrade_of_a_subset_leaves_every_other_learners_rows_byte_for_byte(stand, data, names):
    named = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    stand.gen = 0  # the stand-in is shared by the examples
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_class(Path(tmp), names)
        run(paths)
        before = lines_of(paths["csv"])
        stand.gen, stand.calls = 1, []
        run(paths, regrade=",".join(named))
        after = lines_of(paths["csv"])
    assert sorted(c[0] for c in stand.calls) == sorted(named)
    assert all(asked == list(EXERCISES) for _, asked in stand.calls)
    for name in names:
        if name in named:
            graded = [line for line in after[name] if line.split(",")[2] in EXERCISES]
            assert len(graded) == 2 and all("run 1" in line for line in graded)
        else:
            assert after[name] == before[name]


@QUICK
@given(data=st.data(), names=LEARNERS)
def test_resume_after_checks_changed_regrades_exactly_their_rows(stand, data, names, monkeypatch,
                                                                 capsys):
    changed = set(data.draw(st.lists(st.sampled_from(EXERCISES), min_size=1, unique=True)))
    digest = regrade.check_digest
    stand.gen = 0  # the stand-in is shared by the examples
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_class(Path(tmp), names)
        run(paths)
        before = lines_of(paths["csv"])
        stand.gen, stand.calls = 1, []
        monkeypatch.setattr(regrade, "check_digest", lambda spec, seed: digest(spec, seed) +
                            ("fixed" if spec.id in changed else ""))
        capsys.readouterr()
        run(paths, resume=True)
        after = lines_of(paths["csv"])
        stand.calls = []
        run(paths, resume=True)  # the journal now holds the new digests: nothing to do
        assert stand.calls == []
        monkeypatch.setattr(regrade, "check_digest", digest)
    said = capsys.readouterr().err
    assert f"{len(names)} learner(s) re-graded for the check(s) that changed" in said
    assert "no check changed" in said
    assert sorted(c[0] for c in stand.calls) == []
    for name in names:
        assert len(after[name]) == len(before[name])
        for old, new in zip(before[name], after[name], strict=True):
            ex = old.split(",")[2]
            assert ex == new.split(",")[2]  # the order of a whole run
            assert (new == old) == (ex not in changed)
            assert ("run 1" in new) == (ex in changed)


def test_resume_asks_the_sandbox_only_for_the_changed_checks(stand, tmp_path, monkeypatch,
                                                            capsys):
    paths = make_class(tmp_path, ["alice", "bob"])
    run(paths)
    stand.calls = []
    digest = regrade.check_digest
    monkeypatch.setattr(regrade, "check_digest", lambda spec, seed: digest(spec, seed) +
                        ("x" if spec.id == "silu_grad" else ""))
    run(paths, resume=True)
    assert sorted(stand.calls) == [("alice", ["silu_grad"]), ("bob", ["silu_grad"])]
    assert "2 learner(s) re-graded for the check(s) that changed since the journal " \
        "(lesson.ipynb/silu_grad); 0 kept" in capsys.readouterr().err


def test_a_journal_without_digests_is_graded_again_whole_and_the_run_says_so(stand, tmp_path,
                                                                            capsys):
    paths = make_class(tmp_path, ["alice", "bob", "carol"])
    run(paths)
    journal = paths["csv"].with_name("grades.journal.jsonl")
    lines = journal.read_text().splitlines()
    old = [lines[0]] + [json.dumps({k: v for k, v in json.loads(x).items() if k != "checks"})
                        for x in lines[1:3]] + lines[3:]  # two of three records: no digests
    journal.write_text("\n".join(old) + "\n")
    stand.calls = []
    capsys.readouterr()
    run(paths, resume=True)
    assert sorted(c[0] for c in stand.calls) == sorted(
        json.loads(x)["learner"].removesuffix(".ipynb") for x in lines[1:3])
    assert all(asked == list(EXERCISES) for _, asked in stand.calls)
    assert "2 learner(s) graded again whole: their journal records have no check digests" \
        in capsys.readouterr().err


def test_regrade_refuses_unknown_names_and_a_class_never_graded(stand, tmp_path, capsys):
    paths = make_class(tmp_path, ["alice", "bob"])
    with pytest.raises(ValueError, match="no journal grades.journal.jsonl next to the CSV"):
        run(paths, regrade="alice")
    run(paths)
    for bad in ("zed", "alice,zed", " , ", "ALICE"):
        with pytest.raises(ValueError, match="^regrade: no ") as info:
            run(paths, regrade=bad)
        assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="regrade"):
        run(paths, regrade=3)
    stand.calls = []
    code = cli.main(["grade", str(paths["subs"]), "--out", str(paths["csv"]), "--instructor",
                     str(paths["inst"]), "--seed", "11", "--regrade", "bob.ipynb"])
    assert code == 0 and [c[0] for c in stand.calls] == ["bob"]
    assert cli.main(["grade", str(paths["subs"]), "--out", str(paths["csv"]), "--instructor",
                     str(paths["inst"]), "--seed", "11", "--regrade", "nobody"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("xenith-edu grade: error: regrade: no submission of 'nobody'")


FIELDS = [f.name for f in dataclasses.fields(next(iter(SPECS.values())))]


def _other(fn):
    def changed(*args, **kw):  # another function: a fix of the check
        return fn(*args, **kw)
    return changed


@pytest.mark.parametrize("exercise", sorted(SPECS))
def test_a_check_digest_changes_with_its_code_its_settings_its_seed(exercise):
    spec = SPECS[exercise]
    first = regrade.check_digest(spec, 5)
    assert regrade.check_digest(spec, 5) == first  # stable: the same check, the same digest
    assert regrade.check_digest(spec, 6) != first
    for name in ("reference", "cases"):
        fixed = dataclasses.replace(spec, **{name: _other(getattr(spec, name))})
        assert regrade.check_digest(fixed, 5) != first, name
    assert regrade.check_digest(dataclasses.replace(spec, tol=0.123), 5) != first


def test_no_two_checks_share_a_digest():
    digests = [regrade.check_digest(spec, 5) for spec in SPECS.values()]
    assert len(set(digests)) == len(digests)


@pytest.mark.parametrize("exercise", sorted(SPECS))
def test_a_fix_in_a_function_the_check_calls_changes_its_digest(exercise, monkeypatch):
    """Every function of the package the cases and the reference reach, replaced in turn (a
    fix in a shared function, or in the component itself), changes the check's digest; the
    same replacement in a module the check never reaches does not."""
    spec = SPECS[exercise]
    first = regrade.check_digest(spec, 5)
    reached: dict[str, str] = {}
    for name in ("cases", "reference"):
        regrade._traced(getattr(spec, name), reached)
    import importlib

    tried = 0
    for key in sorted(reached):
        if tried == 3:
            break  # three functions of each check: the suite stays fast
        module, _, name = key.rpartition(".")
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue  # a nested function: its source is its parent's
        fn = getattr(mod, name, None)
        if not callable(fn) or isinstance(fn, type) or getattr(fn, "__code__", None) is None \
                or any(fn is getattr(spec, c) for c in regrade.CODE):
            continue  # a class, or the spec's own function (the test above replaces those)
        fixed = _other(fn)
        with monkeypatch.context() as m:  # the fix, seen by every module that imported it
            for holder in [v for k, v in list(sys.modules.items()) if k.startswith("xenith_edu")]:
                if vars(holder).get(name) is fn:
                    m.setattr(holder, name, fixed)
            assert regrade.check_digest(spec, 5) != first, key
        tried += 1
    if not tried:
        pytest.skip("this check calls no other function of the package")
    assert regrade.check_digest(spec, 5) == first
    import xenith_edu.training.optim as unrelated

    with monkeypatch.context() as m:
        m.setattr(unrelated, "global_norm", _other(unrelated.global_norm))
        assert regrade.check_digest(spec, 5) == first


def test_a_check_digest_changes_with_the_package_version(monkeypatch):
    import xenith_edu

    spec = SPECS["silu_grad"]
    first = regrade.check_digest(spec, 5)
    monkeypatch.setattr(xenith_edu, "__version__", "9.9.9")
    assert regrade.check_digest(spec, 5) != first


@settings(max_examples=200, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_merged_rows_are_a_whole_runs_order_or_none(data, sizes):
    """Generated teachers and changed sets: the merge takes the changed exercises' rows from
    the partial run, the others from the journal, in the teacher's order, and the partial
    run's own trailing rows; any row out of place (a submission over a limit, one row for the
    whole notebook) gives None: grade it whole."""
    from xenith_edu.grader.roster import Exercise

    teacher = [(f"nb{i}.ipynb", [Exercise(f"e{i}_{j}", f"f{j}") for j in range(n)])
               for i, n in enumerate(sizes)]
    keys = [(f"{nb}/{ex.id}", ex.id) for nb, exs in teacher for ex in exs]
    changed = set(data.draw(st.lists(st.sampled_from([k for k, _ in keys]), min_size=1,
                                     unique=True)))
    old = [("l", "nb", ex, "passed", "old", "") for _, ex in keys]
    tail = data.draw(st.lists(st.just(("l", "", "", "unreadable file", "tail", "")), max_size=1))
    new = [("l", "nb", ex, "failed", "new", "") for k, ex in keys if k in changed] + tail
    merged = regrade.merge(old, new, teacher, changed)
    assert [r.exercise for r in merged[:len(keys)]] == [ex for _, ex in keys]
    assert [r.message for r in merged[:len(keys)]] == \
        ["new" if k in changed else "old" for k, _ in keys]
    assert [tuple(r) for r in merged[len(keys):]] == tail
    broken = data.draw(st.sampled_from(["old", "new"]))
    cut = [("l", "", "", "over the limit", "whole", "")]
    assert regrade.merge(cut if broken == "old" else old, new if broken == "old" else cut,
                         teacher, changed) is None
    assert regrade.only(teacher, changed) == [
        (nb, [ex for ex in exs if f"{nb}/{ex.id}" in changed]) for nb, exs in teacher
        if any(f"{nb}/{ex.id}" in changed for ex in exs)]


@QUICK
@given(data=st.data(), names=LEARNERS)
def test_a_regrade_interrupted_anywhere_then_resumed_ends_as_one_uninterrupted(
        stand, data, names, monkeypatch):
    """Ctrl-C at a generated point of a resume after a fixed check: the journal keeps what
    was merged; the next resume finishes the rest and the CSV is the uninterrupted run's."""
    changed = data.draw(st.sampled_from(EXERCISES))
    stop = data.draw(st.integers(0, len(names) - 1))
    digest = regrade.check_digest
    stand.gen, stand.stop_at = 0, None
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_class(Path(tmp), names)
        run(paths)
        before = lines_of(paths["csv"])
        monkeypatch.setattr(regrade, "check_digest", lambda spec, seed: digest(spec, seed) +
                            ("x" if spec.id == changed else ""))
        stand.gen, stand.calls, stand.stop_at = 1, [], stop
        with pytest.raises(KeyboardInterrupt):
            run(paths, resume=True)
        stand.calls, stand.stop_at = [], None
        run(paths, resume=True)
        after = lines_of(paths["csv"])
        monkeypatch.setattr(regrade, "check_digest", digest)
    assert all(asked == [changed] for _, asked in stand.calls)
    for name in names:
        for old, new in zip(before[name], after[name], strict=True):
            assert (old == new) == (old.split(",")[2] != changed)


def test_grade_merge_applies_the_overrides_extensions_and_late_rule_as_one_run(stand, tmp_path):
    """The course's new options are the merge's too: two shards joined with them give the
    files one run with them gives, byte for byte."""
    from test_course import DUE

    from xenith_edu.gradebook import grade_merge

    paths = make_class(tmp_path, ["alice", "bob", "carol"])
    (tmp_path / "o.csv").write_text("learner,exercise,points,comment\nbob,silu_grad,0.5,c\n")
    (tmp_path / "e.csv").write_text("id,extension\ncarol,3\n")
    options = {"deadline": (DUE - timedelta(days=400)).isoformat(),  # everyone is late
               "late_from_mtime": True, "late_penalty": 0.1, "late_rule": "possible",
               "overrides": tmp_path / "o.csv", "extensions": tmp_path / "e.csv",
               "export": ("canvas", "moodle:id")}
    run(paths, **options)
    split = tmp_path / "split"
    split.mkdir()
    for k in (1, 2):
        grade(paths["subs"], split / f"p{k}.csv", 20, instructor=paths["inst"], jobs=1, seed=11,
              shard=f"{k}/2")
    grade_merge([split / "p1.csv", split / "p2.csv"], split / "grades.csv", **options)
    for name in ("grades.csv", "grades.totals.csv", "grades.canvas.csv", "grades.moodle.csv"):
        assert (split / name).read_bytes() == (paths["csv"].parent / name).read_bytes(), name
    totals = (split / "grades.totals.csv").read_text()
    assert "silu_grad: 0.5" in totals and "deduction" in totals and "extended deadline" in totals
