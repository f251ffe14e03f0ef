"""Hints that ask first, and progress the learner owns.

Hints: for every exercise and learners made by changing its reference (a sign, a factor, an
array read for another...), a failed verdict ends by saying how to ask for a hint, and the three
hints are a question, the rule, the line, keyed to the diagnosis, never naming the reference.
Progress: after any sequence of checks and hints (generated), the learner's file holds exactly
the counts of that sequence; a folder that cannot be written or a damaged file never fails a
check; `xenith-edu progress` prints the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xenith_edu.exercises as ex
from xenith_edu.exercises import engine, mutate, progress
from xenith_edu.exercises.hints import parse, steps

from .test_mutate import _learner

# Shape legend: none; these tests read text and counts.

ASK_LINE = "For a hint (a question, then the rule, then the line), run"


def _forbidden(spec: ex.Spec) -> list[str]:
    """Words no hint may contain: the reference's name and the functions it is made of."""
    names = [f.__name__ for f in mutate.reached(spec.reference) if "_" in f.__name__]
    return ["xenith_edu", "reference"] + [n for n in names if n != "<lambda>"]


@pytest.mark.parametrize("name", sorted(ex.SPECS))
def test_a_failed_verdict_asks_and_its_hints_ask_first(name, capsys):
    spec = ex.SPECS[name]
    found = mutate.mutants(spec)
    rng = np.random.default_rng(len(name))
    for m in [found[int(i)] for i in rng.choice(len(found), size=min(2, len(found)),
                                                 replace=False)]:
        ex.forget_hints()
        result = engine.check(spec, _learner(spec, m))
        if result.passed:
            continue  # a change that does nothing on these cases
        assert result.message.splitlines()[-1].strip().startswith(ASK_LINE), result.message
        assert f'hint("{name}")' in result.message
        ladder = result.hints
        assert len(ladder) == 3 and "?" in ladder[0], ladder
        for text in ladder:
            for word in _forbidden(spec):
                assert word not in text, (word, text)
        given_ = [result.hint() for _ in range(4)]
        assert [g.split(":")[0] for g in given_[:3]] == [
            f"Hint {i} of 3 ({s}) for {name}" for i, s in
            enumerate(("a question", "the rule", "the line"), start=1)]
        assert given_[3] == given_[2]
        if parse(result.mistakes[0] if result.mistakes else "") is not None:
            kind = parse(result.mistakes[0])[0]
            assert mutate.RULES[kind] in ladder[1]
    ex.forget_hints()


def test_a_new_diagnosis_starts_the_hints_again(capsys):
    ex.forget_hints()
    spec = ex.SPECS["softmax_rowsum"]
    ex.check_softmax_rowsum(lambda dout, out: -np.sum(dout * out, axis=-1))
    first = [ex.hint("softmax_rowsum") for _ in range(2)]
    assert first[1].startswith("Hint 2 of 3")
    ex.check_softmax_rowsum(lambda dout, out: 2 * np.sum(dout * out, axis=-1))
    again = ex.hint("softmax_rowsum")
    assert again.startswith("Hint 1 of 3 (a question)"), again
    assert steps(spec)[0] != again
    ex.forget_hints()


def test_no_spec_hint_gives_the_answer_away():
    for name, spec in ex.SPECS.items():
        for text in steps(spec):
            for word in _forbidden(spec):
                assert word not in text, (name, word, text)


# ---------------------------------------------------------------------------------- progress

LEARNERS = {  # (exercise, status) -> a learner that reaches it
    "passed": lambda spec: (lambda *a: spec.reference(*a)[0] if spec.single
                            else spec.reference(*a)),
    "failed": lambda spec: (lambda *a: 2 * spec.reference(*a)[0] if spec.single
                            else tuple(2 * o for o in spec.reference(*a))),
    "not attempted": lambda spec: (lambda *a: (_ for _ in ()).throw(NotImplementedError())),
}
CHEAP = ["softmax_rowsum", "silu_grad", "rope_permutation"]
actions = st.lists(st.tuples(st.sampled_from(CHEAP),
                             st.sampled_from(["passed", "failed", "not attempted", "hint"])),
                   max_size=8)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions)
def test_the_file_holds_the_counts_of_any_sequence(monkeypatch, capsys, seq):
    with tempfile.TemporaryDirectory() as folder:
        _run_sequence(Path(folder), monkeypatch, seq)


def _run_sequence(tmp_path: Path, monkeypatch, seq: list) -> None:
    file = tmp_path / "p.json"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(file))
    want: dict[str, dict] = {}
    for name, what in seq:
        rec = want.setdefault(name, {"passed": False, "attempts": 0, "hints": 0})
        if what == "hint":
            ex.hint(name)
            rec["hints"] += 1
            continue
        result = engine.check(ex.SPECS[name], LEARNERS[what](ex.SPECS[name]))
        assert str(result.status) == what, result.message
        rec["passed"] |= what == "passed"
        rec["attempts"] += what != "not attempted"
        rec["status"] = what
    got = json.loads(file.read_text()) if seq else {"exercises": {}}
    for name, rec in want.items():
        assert {k: got["exercises"][name][k] for k in ("passed", "attempts", "hints")} == \
            {k: rec[k] for k in ("passed", "attempts", "hints")}
    assert sorted(os.listdir(tmp_path)) == ([file.name] if seq else [])  # no temporary left
    ex.forget_hints()


@pytest.mark.parametrize("where", ["a directory", "under a file", "read-only folder"])
def test_an_unwritable_place_never_fails_a_check(tmp_path, monkeypatch, capsys, where):
    (tmp_path / "f").write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    target = {"a directory": tmp_path, "under a file": tmp_path / "f" / "p.json",
              "read-only folder": ro / "p.json"}[where]
    monkeypatch.setenv(progress.PROGRESS_ENV, str(target))
    spec = ex.SPECS["silu_grad"]
    assert engine.check(spec, LEARNERS["passed"](spec)).passed
    assert not engine.check(spec, LEARNERS["failed"](spec)).passed
    assert ex.hint("silu_grad").startswith("Hint")
    ro.chmod(0o700)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.sampled_from([b"[]", b'{"exercises": 3}', b"null",
                                                   b'{"exercises": {"silu_grad": 7}}']))
def test_a_damaged_file_is_replaced_and_the_command_says_so(monkeypatch, capsys, junk):
    with tempfile.TemporaryDirectory() as folder:
        _replace_damaged(Path(folder) / "d.json", monkeypatch, junk)


def _replace_damaged(file: Path, monkeypatch, junk: bytes) -> None:
    file.write_bytes(junk)
    try:
        progress.read(file)
        damaged = False
    except ValueError as e:
        damaged = True
        assert str(file) in str(e)
    monkeypatch.setenv(progress.PROGRESS_ENV, str(file))
    spec = ex.SPECS["silu_grad"]
    assert engine.check(spec, LEARNERS["passed"](spec)).passed
    entries = progress.read(file)  # now a good file
    assert entries["silu_grad"].passed and entries["silu_grad"].attempts >= 1
    assert damaged or isinstance(json.loads(junk), dict)  # the good ones were read


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xenith_edu", "progress", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=120)


def test_the_command_prints_the_table_in_the_book_order(tmp_path, monkeypatch, capsys):
    file = tmp_path / "p.json"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(file))
    for name in ["silu_grad", "softmax_rowsum"]:
        spec = ex.SPECS[name]
        engine.check(spec, LEARNERS["failed"](spec))
        engine.check(spec, LEARNERS["passed"](spec))
    ex.hint("silu_grad")
    out = _cli("--file", str(file))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["chapter", "exercise", "passed", "attempts", "hints"]
    assert lines[1].split() == ["swiglu", "silu_grad", "yes", "2", "1"]
    assert lines[2].split() == ["memory", "softmax_rowsum", "yes", "2", "0"]
    assert lines[-1] == "2 of 2 checked exercises passed."
    ex.forget_hints()


@pytest.mark.parametrize("content,code,words", [
    (None, 0, "No progress recorded yet"), (b"{", 1, "not a progress file"),
    (b"[1]", 1, "not a progress file"), ("dir", 1, "is not a file")])
def test_the_command_on_a_missing_or_bad_file(tmp_path, content, code, words):
    file = tmp_path / "p.json"
    if content == "dir":
        file.mkdir()
    elif content is not None:
        file.write_bytes(content)
    out = _cli("--file", str(file))
    assert out.returncode == code and words in out.stdout + out.stderr
    assert len((out.stdout + out.stderr).strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_the_command_when_progress_is_off():
    off = _cli(env={progress.PROGRESS_ENV: "off"})
    assert off.returncode == 1 and "off" in off.stderr and not off.stdout
