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

from xenith_edu.exercises import SPECS
from xenith_edu.gradebook import grade
from xenith_edu.gradebook.journal import Journal
from xenith_edu.grader import judging
from xenith_edu.grader.roster import Exercise

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
    options = judging.Options(seed=seed)
    drawn = []
    for learner in learners:
        _, frames, kept = judging.build_request(learner, plan, options, "/home")
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
    from xenith_edu.grader import nbread

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

    from xenith_edu.gradebook import course
    from xenith_edu.gradebook.inputs import late_policy
    from xenith_edu.gradebook.points import Part

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
    from xenith_edu.gradebook import grade_merge

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
    from xenith_edu.gradebook import grade_merge

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

    from xenith_edu.gradebook import course, shards
    from xenith_edu.gradebook.inputs import LatePolicy
    from xenith_edu.gradebook.points import Part, Question

    out = tmp_path_factory.mktemp("modes")
    parts = [Part("lesson.ipynb", {"ex": 1.0}, (Question("q", 2.0, "Why?"),))]
    entries = [course.Entry(i, f"{i}.ipynb", k) for k, i in enumerate(ids)]
    base = {e.key: [(e.learner, "lesson.ipynb", "ex", "passed", "", "")] for e in entries}
    pol = course.Policy(None, LatePolicy(), {}, {}, out / "feedback", ("canvas", "moodle:id"))
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


# ----------------------------------------------------------------------------------------------
# Names are data: canonical, unique on every disk, escaped everywhere.

ANY_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
TRIGGER_TEXT = st.lists(st.sampled_from(["=", "+", "-", "@", "\t", "\r", ";", " ", "'", "a",
                                         "1", ",", '"', "\n", "\u00a0", "\u3000"]),
                        max_size=20).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(ANY_TEXT, TRIGGER_TEXT))
def test_a_csv_cell_is_text_in_any_list_separator_and_reads_back_exactly(text):
    from xenith_edu.gradebook.inputs import TRIGGERS, safe_cell, unsafe_cell

    safe = safe_cell(text)
    assert unsafe_cell(safe) == text
    for piece in safe.split(";"):
        assert not piece.lstrip().startswith(TRIGGERS), (text, safe)
        assert not piece.startswith(TRIGGERS), (text, safe)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.one_of(ANY_TEXT.filter(bool), st.from_regex(r"[a-zA-Z0-9._+-]{1,9}",
                                                                     fullmatch=True)),
                    min_size=1, max_size=8))
def test_file_stems_are_unique_with_or_without_case_and_portable(ids):
    import re
    import unicodedata

    from xenith_edu.grader.names import canonical, file_stems, fold

    ids = [canonical(i) for i in ids]
    variants = ids + [i.upper() for i in ids] + [i.lower() for i in ids]
    stems = file_stems(variants)
    assert len({fold(s) for s in stems.values()}) == len(set(variants))
    for s in stems.values():
        assert re.fullmatch(r"[A-Za-z0-9._+-]{1,200}", s) and not s.startswith(".")
        assert s.split(".")[0].lower() not in ("con", "prn", "aux", "nul")
    for i in ids:
        assert canonical(unicodedata.normalize("NFD", i)) == i == canonical(i)
        assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in i)


def _variants(name: str) -> list[str]:
    import unicodedata

    return list(dict.fromkeys([name, unicodedata.normalize("NFD", name), name.upper(),
                               name.capitalize()]))


@settings(max_examples=30, deadline=None)
@given(names=st.lists(st.sampled_from(["josé", "ann", "zoë", "bob", "ça"]), min_size=1,
                      max_size=4, unique=True),
       data=st.data())
def test_submissions_that_differ_by_case_or_normalization_are_kept_apart(
        tmp_path_factory, names, data):
    import unicodedata

    from xenith_edu.gradebook import course
    from xenith_edu.grader.names import fold
    from xenith_edu.grader.roster import submissions

    root = tmp_path_factory.mktemp("names")
    made = set()
    for name in names:
        for v in data.draw(st.lists(st.sampled_from(_variants(name)), min_size=1, max_size=3,
                                    unique=True)):
            folder = data.draw(st.booleans())
            path = root / (v if folder else f"{v}.ipynb")
            if folder:
                path.mkdir(exist_ok=True)
                (path / "lesson.ipynb").write_text("{}")
            else:
                path.write_text("{}")
            made.add(path.name)
    found = submissions(root, set())
    graded = [(learner, src) for learner, src, problem in found if src is not None]
    assert len(graded) == len(made)  # every file graded, none merged into another
    assert len({fold(learner) for learner, _ in graded}) == len(graded)
    assert all(unicodedata.is_normalized("NFC", learner) for learner, _, _ in found)
    entries = [course.entry_of(i, e) for i, e in enumerate(found)]
    base = {e.key: [] for e in entries}
    out = root.parent / f"{root.name}-out"
    out.mkdir()
    pol = course.Policy(feedback=out / "feedback")
    course.finish(out / "g.csv", entries, base, [], pol, {})
    people = [e for e in entries if e.status != "name collision"]
    assert len(list((out / "feedback").iterdir())) == len(people)  # none overwritten


def test_a_roster_id_matches_its_decomposed_folder_and_no_name_steers_the_terminal(
        tmp_path, capsys):
    import unicodedata

    subs = tmp_path / "subs"
    nfd = unicodedata.normalize("NFD", "josé")
    for name in (nfd, "eve\x1b[2K\x1b[1Gann: 5 of 5 passed\r"):
        (subs / name).mkdir(parents=True)
        nbformat.write(HONEST, str(subs / name / "lesson.ipynb"))
    nbformat.write(HONEST, str(tmp_path / "lesson.ipynb"))
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name\njosé,José\n", encoding="utf-8")
    rows = grade(subs, tmp_path / "g.csv", 20, instructor=tmp_path / "lesson.ipynb", jobs=1,
                 call_time=5.0, progress=True, roster=roster, feedback=tmp_path / "fb")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    mine = {r["learner"]: r["status"] for r in rows if r["exercise"]}
    assert mine["josé"] == "passed"  # matched to the roster, not "not submitted"
    for path in tmp_path.glob("g.*"):
        assert "\x1b" not in path.read_text(encoding="utf-8"), path.name
    assert all("\x1b" not in p.read_text() for p in (tmp_path / "fb").iterdir())


# ----------------------------------------------------------------------------------------------
# Cells run as Jupyter runs them: no Python line changed, no magic dropped silently.

SMALL = st.integers(0, 99)
WORD = st.from_regex(r"[a-z]{1,6}", fullmatch=True)


@st.composite
def python_statement(draw) -> str:
    a, b, w = draw(SMALL), draw(SMALL), draw(WORD)
    pad = " " * draw(st.integers(0, 8))
    return draw(st.sampled_from([
        f"x = ({a}\n{pad}!= {b})",  # PEP 8: the line break before the operator
        f"x = ({a}\n{pad}% {b + 1})",
        f"x = {a} \\\n{pad}!= {b}",
        f"s = '%{w}'",
        f"t = \"!{w} %d\" % {a}",
        f"u = '''\n%{w} not a magic\n!{w} nor this\n'''",
        f"def f_{w}(a):\n    return (a\n{pad}    != {b})",
        f"if {a} != {b}:\n    y = {a} % {b + 1}",
        f"d = {{{a}:\n{pad}{b}}}",
        f"# %{w} and !{w} in a comment",
    ]))


MAGIC_LINES = ("%matplotlib inline", "!pip install numpy", "%load_ext autoreload", "%time x = 1",
               "files = !ls", "%who", "%config Completer.x = 1")
MAGICS = st.sampled_from(MAGIC_LINES)


def _cells_of(tmp: Path, sources: list[str]) -> list[tuple[int, str]]:
    from xenith_edu.grader.worker import _cells

    path = tmp / "lesson.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), str(path))
    return _cells(str(path))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(st.lists(python_statement(), min_size=1, max_size=5).map("\n".join),
                      min_size=1, max_size=4))
def test_a_python_cell_runs_unchanged(tmp_path, cells):
    got = _cells_of(tmp_path, cells)
    assert [code for _, code in got] == [c + "\n" for c in cells]
    for code in cells:
        compile(code, "<cell>", "exec")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(st.one_of(python_statement(), MAGICS), min_size=1, max_size=8))
def test_every_magic_becomes_a_call_and_the_python_around_it_is_kept(tmp_path, body):
    [(_, code)] = _cells_of(tmp_path, ["\n".join(body)])
    compile(code, "<cell>", "exec")
    magics = [b for b in body if b in MAGIC_LINES]
    assert code.count("get_ipython()") == len(magics)
    for statement in body:
        if statement not in magics:
            assert statement in code  # every Python line, as written


MAGIC_LESSON = [
    "%matplotlib inline\nimport numpy as np\n!pip install something",
    "%%time\ndef helper(a, b):\n    return (a\n            != b)",
    "def my_linear_backward(dY, X, W):\n    same = (X.shape[0]\n            != -1)\n"
    "    return dY @ W.T, X.T @ dY",
    "%timeit -n 1 -r 1 helper(1, 2)\n%%bash is not a cell magic here\nfrom xenith_edu.exercises "
    "import check_linear_backward",
    "_ = check_linear_backward(my_linear_backward)",
]


def test_a_notebook_with_magics_and_shell_escapes_is_graded_as_jupyter_runs_it(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    nb = new_notebook(cells=[new_code_cell(c) for c in MAGIC_LESSON])
    nbformat.write(nb, str(subs / "ann.ipynb"))
    nbformat.write(nb, str(tmp_path / "lesson.ipynb"))
    rows = grade(subs, tmp_path / "g.csv", 20, instructor=tmp_path / "lesson.ipynb", jobs=1,
                 call_time=5.0)
    judged = [r for r in rows if r["exercise"]]
    assert [r["status"] for r in judged] == ["passed"], rows
    notes = " ".join(r["message"] for r in rows if not r["exercise"])
    assert "magic not available while grading: !pip install something" in notes


# ----------------------------------------------------------------------------------------------
# Delegation seen however it is reached.

BASES = {  # ways to reach the package's own linear_backward, as g0
    "name": "from xenith_edu.linear import linear_backward as g0",
    "attribute": "import xenith_edu.linear as m\ng0 = m.linear_backward",
    "getattr": "import importlib\ng0 = getattr(importlib.import_module('xenith_edu.' + "
               "'linear'), 'linear_' + 'backward')",
    "sys.modules": "import sys, xenith_edu.linear\n"
                   "g0 = sys.modules['xenith_edu.linear'].__dict__['linear_backward']",
    "copied code": "import types, xenith_edu.linear as m\nf = m.linear_backward\n"
                   "g0 = types.FunctionType(f.__code__.replace(co_name='mine'), f.__globals__)",
    "via the model": "import xenith_edu.linear as m\ng0 = vars(m)['linear_backward']",
}
WRAPPERS = [  # each makes g{i} from g{i-1}
    "import functools\ng{i} = functools.partial(g{j})",
    "g{i} = lambda *a, _g=g{j}: _g(*a)",
    "def make{i}(h):\n    def inner(*a):\n        return h(*a)\n    return inner\n"
    "g{i} = make{i}(g{j})",
    "class C{i}:\n    def __call__(self, *a):\n        return g{j}(*a)\ng{i} = C{i}()",
    "g{i} = [g{j}][0]",
    "def g{i}(*a):\n    import sys\n    sys.setprofile(None)\n    return g{j}(*a)",
    "g{i} = {{'k': g{j}}}['k']",
    "import threading\ndef g{i}(*a):\n    out = []\n    t = threading.Thread(target=lambda: "
    "out.append(g{j}(*a)))\n    t.start()\n    t.join()\n    return out[0]",
]


@st.composite
def delegating_notebook(draw) -> str:
    code = [BASES[draw(st.sampled_from(sorted(BASES)))]]
    depth = draw(st.integers(0, 3))
    for i in range(1, depth + 1):
        code.append(draw(st.sampled_from(WRAPPERS)).format(i=i, j=i - 1))
    code.append(f"def f(dY, X, W):\n    return g{depth}(dY, (X, W))")
    return "\n".join(code)


@settings(max_examples=1, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ways=st.lists(delegating_notebook(), min_size=8, max_size=8, unique=True))
def test_a_call_into_the_package_s_answer_is_delegated_whatever_path_reaches_it(tmp_path,
                                                                                ways):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(HONEST, str(tmp_path / "lesson.ipynb"))
    nbformat.write(HONEST, str(subs / "honest.ipynb"))
    for n, way in enumerate(ways):
        cells = ["from xenith_edu.exercises import check_linear_backward", way,
                 "_ = check_linear_backward(f)"]
        nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]),
                       str(subs / f"way{n}.ipynb"))
    rows = grade(subs, tmp_path / "g.csv", 20, instructor=tmp_path / "lesson.ipynb", jobs=2,
                 call_time=5.0)
    status = {r["learner"]: r["status"] for r in rows if r["exercise"]}
    blocked = {r["learner"] for r in rows if "can't start new thread" in r["message"]}
    assert status.pop("honest") == "passed"
    # a thread the sandbox's process limit refuses is a failure, never a pass
    wrong = {ways[int(k[3:])]: v for k, v in status.items()
             if v != "delegated" and not (k in blocked and v == "failed")}
    assert not wrong, wrong


def test_the_sandbox_material_holds_no_reference_case_generator_mistake_list_or_check():
    import ast

    from xenith_edu.grader.material import SPEC_PARTS, material
    from xenith_edu.grader.roster import chapter_notebooks
    from xenith_edu.tools.notebook import read_notebook

    sources = [c.source for p in chapter_notebooks() for c in read_notebook(p).cells
               if c.cell_type == "code"]
    every = []  # the teacher importing every catalogue symbol of every module
    for spec in SPECS.values():
        module = f"xenith_edu.exercises.{spec.chapter}"
        names = [n for n in vars(__import__(module, fromlist=["x"])) if not n.startswith("__")]
        every.append(f"from {module} import {', '.join(names)}")
    for given_ in (sources, every):
        for module, source in material(given_).items():
            defined = {n.name for n in ast.parse(source).body
                       if isinstance(n, ast.FunctionDef | ast.ClassDef)} | \
                {t.id for n in ast.parse(source).body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
            for spec in SPECS.values():
                parts = [getattr(spec, p, None) for p in SPEC_PARTS]
                held = {f.__name__ for f in parts if callable(f) and f.__module__ == module}
                assert not held & defined, (module, spec.id, held & defined)
                assert spec.reference_name.rpartition(".")[2] not in defined or \
                    not spec.reference_name.startswith(module + "."), (module, spec.id)
            assert not any(n.startswith("check_") for n in defined), module


# ----------------------------------------------------------------------------------------------
# A class mixing honest learners with every kind: every honest grade intact, and the same.


def test_a_class_of_every_kind_leaves_the_honest_grades_intact_and_identical(tmp_path):
    import unicodedata

    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(HONEST, str(tmp_path / "lesson.ipynb"))
    honest = ["ann", unicodedata.normalize("NFD", "zoë"), "Bob", "bob", "x;=1+1",
              "eve\x1b[2J"]
    for name in honest:
        nbformat.write(HONEST, str(subs / f"{name}.ipynb"))
    magic = new_notebook(cells=[new_code_cell("%matplotlib inline\n!pip install x"),
                                *HONEST.cells])
    nbformat.write(magic, str(subs / "magic.ipynb"))
    (subs / "bomb.ipynb").write_bytes(_bomb(b"{},", 21_000_000))
    delegate = ["from xenith_edu.exercises import check_linear_backward",
                BASES["getattr"] + "\ndef f(dY, X, W):\n    return g0(dY, (X, W))",
                "_ = check_linear_backward(f)"]
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in delegate]),
                   str(subs / "del.ipynb"))
    rows = grade(subs, tmp_path / "g.csv", 20, instructor=tmp_path / "lesson.ipynb", jobs=2,
                 call_time=5.0, memory=2**30)
    judged = {r["learner"]: (r["status"], r["message"]) for r in rows if r["exercise"]}
    assert judged.pop("del")[0] == "delegated" and judged.pop("bomb")[0] == "over the limit"
    assert len(set(judged.values())) == 1 and next(iter(judged.values()))[0] == "passed"
    assert len(judged) == len(honest) + 1  # Bob and bob both graded, apart
