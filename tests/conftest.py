"""Shared fixtures of the test suite, and its areas: `pytest --fast tests` (`make test-fast`)
collects only the areas a change to one component needs (FAST); every test file of an area
also carries its area's marker (`pytest -m model tests`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent

# make test-fast: area -> its test files (a folder: every file in it), under tests/
FAST: dict[str, tuple[str, ...]] = {
    "components": ("test_components.py", "test_caches.py", "test_flash_attention.py",
                   "test_gqa.py", "test_gradcheck.py", "test_workspace.py", "test_optim.py"),
    "model": ("test_model.py", "test_boundaries.py", "test_sample.py", "test_types.py"),
    "checks": ("exercises/",),
    "layers": ("test_layers.py", "test_chapters.py", "test_contributing.py", "test_notation.py"),
}


def area_of(path: Path) -> str | None:
    """The FAST area a test file belongs to, or None."""
    try:
        rel = path.resolve().relative_to(HERE).as_posix()
    except ValueError:
        return None
    for area, names in FAST.items():
        if any(rel == n or (n.endswith("/") and rel.startswith(n)) for n in names):
            return area
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="only the fast areas (components, model, checks, layers): "
                          "make test-fast")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under --fast, a test file of no fast area is not even imported."""
    if not config.getoption("--fast") or collection_path.is_dir():
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if area_of(collection_path) is None else None
    return None


class ChapterRuns(NamedTuple):
    """tests/chapter_runs.py at work in a process of its own."""

    proc: subprocess.Popen
    out: Path  # its folder: runs.json when it is done, log.txt


RUNS = pytest.StashKey[ChapterRuns]()
NEEDS_CHAPTERS = {"chapter_runs", "full_runs", "student_runs"}


def _start_chapter_runs(config: pytest.Config) -> ChapterRuns:
    out = Path(tempfile.mkdtemp(prefix="xenith-edu-chapters-"))
    with open(out / "log.txt", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "chapter_runs.py"), str(out)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    config.stash[RUNS] = ChapterRuns(proc, out)
    return config.stash[RUNS]


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The areas' markers; and when a test reads the chapters' runs, those runs start now, in
    a process of their own, and the tests that read them go last: the rest run meanwhile."""
    for item in items:
        area = area_of(Path(str(item.path)))
        if area is not None:
            item.add_marker(getattr(pytest.mark, area))
    needs = [i for i in items if NEEDS_CHAPTERS & set(getattr(i, "fixturenames", ()))]
    if needs and not config.getoption("collectonly"):
        late = set(needs)
        items[:] = [i for i in items if i not in late] + needs
        _start_chapter_runs(config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The chapters' runs end with the session (stopped, if it was cut short); no file stays."""
    runs = session.config.stash.get(RUNS, None)
    if runs is None:
        return
    if runs.proc.poll() is None:
        os.killpg(runs.proc.pid, signal.SIGTERM)  # its own session: it and its kernels
        runs.proc.wait()
    shutil.rmtree(runs.out, ignore_errors=True)


@pytest.fixture(scope="session")
def chapter_runs(request: pytest.FixtureRequest) -> dict:
    """{"full": slug -> FullRun, "student": slug -> StudentRun}: the chapters' one run each,
    made by tests/chapter_runs.py in a process of its own, started when the session began."""
    import chapter_runs  # here, not at the top: --fast needs no notebook machinery

    runs = request.config.stash.get(RUNS, None) or _start_chapter_runs(request.config)
    runs.proc.wait()
    done = runs.out / "runs.json"
    if runs.proc.returncode != 0 or not done.exists():
        said = (runs.out / "log.txt").read_text(encoding="utf-8", errors="replace")
        pytest.fail(f"the chapters' runs failed (exit {runs.proc.returncode}):\n{said[-4000:]}")
    got = json.loads(done.read_text(encoding="utf-8"))
    return {"full": {k: chapter_runs.FullRun(**v) for k, v in got["full"].items()},
            "student": {k: chapter_runs.StudentRun(**v) for k, v in got["student"].items()}}


@pytest.fixture(scope="session")
def full_runs(chapter_runs: dict) -> dict:
    """slug -> nbval's verdict on the full chapter, run once with the wheel (chapter_runs.py)."""
    return chapter_runs["full"]


@pytest.fixture(scope="session")
def student_runs(chapter_runs: dict) -> dict:
    """slug -> the student version's one run from an empty folder with the wheel."""
    return chapter_runs["student"]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _progress_elsewhere(tmp_path_factory, monkeypatch):
    """Every test's checks record the learner's progress in a temporary file, never in the
    folder the tests run from (the exercise tests of progress set their own)."""
    from xenith_edu.exercises.progress import PROGRESS_ENV  # the exercise floor, on use

    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path_factory.mktemp("progress") / "p.json"))


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Every test starts with Python's own Ctrl-C (KeyboardInterrupt), whatever the process
    that runs the tests set: the mutation runner, for one, ignores SIGINT, and the tests of
    interrupted writes and runs would then see nothing to wait for."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# Hypothesis: `make test` draws the same cases at every run (derandomize: each test's cases
# follow from its name), so that a run that passes passes again and a failure reproduces.
# `HYPOTHESIS_PROFILE=explore make test` draws afresh each time, to look for new cases.
def _hypothesis_profiles() -> None:
    from hypothesis import settings  # the test suite's own dependency

    settings.register_profile("repeatable", derandomize=True, database=None)
    settings.register_profile("explore", derandomize=False)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


_hypothesis_profiles()
