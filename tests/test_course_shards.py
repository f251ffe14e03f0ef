"""Past one machine: a class graded as two shards and joined by grade-merge gives the files a
single run gives, byte for byte (the report's line of timings aside); a missing or doubled
shard is refused.
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_course import DUE, the_class

from xenith_edu import cli
from xenith_edu.gradebook import grade, grade_merge

OPTIONS = {"deadline": DUE.isoformat(), "late_penalty": 0.1, "export": ("canvas", "moodle"),
           "late_from_mtime": True}
FILES = ("grades.csv", "grades.totals.csv", "grades.canvas.csv", "grades.moodle.csv",
         "grades.written.csv")


def _report(path):
    lines = path.read_text().splitlines()
    return [ln for ln in lines if " learners, graded in " not in ln]  # wall time, jobs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    paths = the_class(root)
    common = {"instructor": paths["inst"], "jobs": 1, "seed": 5, "call_time": 5.0}
    single, split = root / "single", root / "split"
    for d in (single, split):
        d.mkdir()
    grade(paths["subs"], single / "grades.csv", 20, roster=paths["roster"],
          feedback=single / "feedback", **common, **OPTIONS)
    for k in (1, 2):
        grade(paths["subs"], split / f"part{k}.csv", 20, shard=f"{k}/2", **common)
    return {**paths, "root": root, "single": single, "split": split}


def test_two_shards_merged_equal_one_run(runs, capsys):
    split = runs["split"]
    facts = [json.loads((split / f"part{k}.course.json").read_text()) for k in (1, 2)]
    assert [len(f["entries"]) for f in facts] == [2, 2]  # four submissions, two each
    assert not (split / "part1.csv").exists()  # a shard writes its journal and facts only
    out = split / "grades.csv"
    assert cli.main(["grade-merge", str(split / "part1.csv"), str(split / "part2.csv"),
                     "--out", str(out), "--roster", str(runs["roster"]),
                     "--deadline", DUE.isoformat(), "--late-penalty", "0.1", "--late-from-mtime",
                     "--export", "canvas", "--export", "moodle",
                     "--feedback", str(split / "feedback")]) == 0
    assert "joined 2 shard(s)" in capsys.readouterr().out
    for name in FILES:
        assert (split / name).read_bytes() == (runs["single"] / name).read_bytes(), name
    assert _report(split / "grades.md") == _report(runs["single"] / "grades.md")
    pages = sorted(p.name for p in (runs["single"] / "feedback").iterdir())
    assert pages == sorted(p.name for p in (split / "feedback").iterdir()) and pages
    for name in pages:
        assert (split / "feedback" / name).read_bytes() == \
            (runs["single"] / "feedback" / name).read_bytes()


def test_a_missing_or_doubled_shard_and_course_options_on_a_shard_are_refused(runs):
    split = runs["split"]
    with pytest.raises(ValueError, match="shard 2 of 2 is missing"):
        grade_merge([split / "part1.csv"], split / "x.csv")
    with pytest.raises(ValueError, match="given twice"):
        grade_merge([split / "part1.csv", split / "part1.csv"], split / "x.csv")
    lost = runs["root"] / "lost"
    lost.mkdir()
    shutil.copy(split / "part1.course.json", lost / "part1.course.json")
    with pytest.raises(ValueError, match="part1.journal.jsonl: cannot be read"):
        grade_merge([lost / "part1.csv", split / "part2.csv"], split / "x.csv")
    assert not (split / "x.csv").exists()
    with pytest.raises(ValueError, match="a shard grades only"):
        grade(runs["subs"], split / "y.csv", shard="1/2", instructor=runs["inst"],
              roster=runs["roster"])
    for bad in ("0/2", "3/2", "1", "a/b"):
        with pytest.raises(ValueError, match="give K/N"):
            grade(runs["subs"], split / "y.csv", shard=bad, instructor=runs["inst"])


def test_the_help_explains_the_course_options(capsys):
    for argv, options in ((["grade", "--help"], ["--roster", "--deadline", "--timestamps",
                                                 "--late-penalty", "--late-cutoff", "--written",
                                                 "--feedback", "--export", "--shard"]),
                          (["grade-merge", "--help"], ["SHARD_CSV", "--out", "--roster",
                                                       "--written", "--export"]),
                          (["--help"], ["grade-merge"])):
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        for option in options:
            assert option in out, (argv, option)
    assert cli.main(["grade", "x", "--out", "y.csv", "--late-penalty", "1.5"]) == 2
    assert "fraction from 0 to 1" in capsys.readouterr().err
