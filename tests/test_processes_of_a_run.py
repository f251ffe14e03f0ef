"""The test suite in two processes (pytest-xdist, tests/conftest.py): a fixture made once for
several tests is made once per run, and its tests run in the process that made it.

Invariants, on suites generated at random (modules, module- and session-scoped fixtures, a
session fixture imported into another module, xdist_group marks), each run with `-n 2` under
a copy of tests/conftest.py: every module-scoped fixture is made once; the tests of one
module fixture, of one session fixture's name and of one xdist_group mark each run in one
process; the tests tied by nothing spread over both processes; every test runs once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("xdist")

HERE = Path(__file__).resolve().parent

RECORD = '''
import json, os, time
import pytest

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log.jsonl")


def note(**what):
    with open(LOG, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **what}) + "\\n")
'''

SESSION = '''
@pytest.fixture(scope="session")
def shared_{k}():
    note(made="session", name="shared_{k}")
'''


def generated_suite(root: Path, rng: np.random.Generator) -> None:
    """Modules of tests that each note their process; some use their module's fixture, some
    a session fixture (defined in one module, imported into another), some an xdist_group."""
    (root / "record.py").write_text(RECORD, encoding="utf-8")
    sessions = int(rng.integers(1, 3))
    (root / "sessions.py").write_text(
        "from record import note, pytest\n" + "".join(SESSION.format(k=k)
                                                      for k in range(sessions)),
        encoding="utf-8")
    for m in range(int(rng.integers(4, 7))):
        lines = ["from record import note, pytest, time",
                 "from sessions import " + ", ".join(f"shared_{k}" for k in range(sessions))
                 + "  # noqa", "",
                 '@pytest.fixture(scope="module")', "def here():",
                 f'    note(made="module", name="m{m}")', ""]
        for t in range(int(rng.integers(3, 9))):
            uses = []
            if rng.random() < 0.4:
                uses.append("here")
            if rng.random() < 0.2:
                uses.append(f"shared_{int(rng.integers(sessions))}")
            if rng.random() < 0.15:
                lines.append(f'@pytest.mark.xdist_group("g{int(rng.integers(2))}")')
            lines += [f"def test_{t}({', '.join(uses)}):",
                      "    time.sleep(0.05)",
                      f'    note(test=__name__ + "::test_{t}", uses={uses!r})', ""]
        (root / f"test_m{m}.py").write_text("\n".join(lines), encoding="utf-8")


def run_in_two(root: Path) -> list[dict]:
    shutil.copy(HERE / "conftest.py", root / "conftest.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "--rootdir", str(root), str(root)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (root / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_shared_fixture_is_made_once_and_its_tests_run_where_it_was_made(tmp_path, seed):
    rng = np.random.default_rng(seed)
    generated_suite(tmp_path, rng)
    records = run_in_two(tmp_path)
    tests = [r for r in records if "test" in r]
    assert len({r["test"] for r in tests}) == len(tests)  # each test ran once
    made = [r for r in records if r.get("made") == "module"]
    assert len({r["name"] for r in made}) == len(made)  # each module fixture once
    where = defaultdict(set)  # what ties tests -> the processes its tests ran in
    for r in tests:
        module = r["test"].split("::")[0]
        for use in r["uses"]:
            where[use if use.startswith("shared_") else module].add(r["pid"])
    for r in made:
        assert where[f"test_{r['name']}"] <= {r["pid"]}, r
    assert all(len(pids) == 1 for pids in where.values()), dict(where)
    marks = defaultdict(set)
    for path in tmp_path.glob("test_m*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("@pytest.mark.xdist_group"):
                name = lines[i + 1].split("(")[0][len("def "):]
                pid = next(r["pid"] for r in tests if r["test"] == f"{path.stem}::{name}")
                marks[line].add(pid)
    assert all(len(pids) == 1 for pids in marks.values()), dict(marks)
    assert len({r["pid"] for r in tests}) == 2  # the rest spread over both processes
