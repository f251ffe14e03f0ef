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
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from filelock import FileLock

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


# The processes of one run (`make test` runs the tests in two, with pytest-xdist) share a
# folder: the controller, the process that starts the others, makes it and names it here
RUN_FOLDER_ENV = "XENITH_EDU_TEST_RUN"


class Run(NamedTuple):
    """The controller's own record of the run."""

    folder: Path  # shared by the run's processes; removed when the run ends
    previous: str | None  # RUN_FOLDER_ENV before the run (a run inside a test's run)


RUN = pytest.StashKey[Run]()


def is_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker, a process the controller hands tests to."""
    return hasattr(config, "workerinput")


def run_folder() -> Path:
    """This run's shared folder."""
    return Path(os.environ[RUN_FOLDER_ENV])


def clone_lock() -> FileLock:
    """Held while a test writes into the clone (the book's build into _build) or checks what
    a build leaves there (the wheel's): in two processes, such tests take turns."""
    return FileLock(run_folder() / "clone.lock")


def book_extension() -> Any:
    """The book's Sphinx extension (book/_ext/xenith_book.py), imported as the build does:
    its directives, its list of exercises and its recipe for the site's wheel."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
    try:
        import xenith_book
    finally:
        sys.path.pop(0)
    return xenith_book


def pytest_configure(config: pytest.Config) -> None:
    """The controller makes the run's folder. Under pytest-xdist, the tests tied by a fixture
    made once for several tests run in one process, one after the other (TiedTests)."""
    if is_worker(config):
        config.pluginmanager.register(TiedTests(), "xenith-edu-tied-tests")
        return
    config.stash[RUN] = Run(Path(tempfile.mkdtemp(prefix="xenith-edu-tests-")),
                            os.environ.get(RUN_FOLDER_ENV))
    os.environ[RUN_FOLDER_ENV] = str(config.stash[RUN].folder)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(Controller(config), "xenith-edu-controller")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The chapters' runs end with the run (stopped, if it was cut short); no file stays."""
    if RUN not in config.stash:  # a worker
        return
    runs = config.stash.get(RUNS, None)
    if runs is not None:
        if runs.proc.poll() is None:
            os.killpg(runs.proc.pid, signal.SIGTERM)  # its own session: it and its kernels
        runs.waiter.join()
    run = config.stash[RUN]
    shutil.rmtree(run.folder, ignore_errors=True)
    if run.previous is None:
        os.environ.pop(RUN_FOLDER_ENV, None)
    else:
        os.environ[RUN_FOLDER_ENV] = run.previous


GROUPS = "groups.json"  # test id -> its group, written by the workers for the controller


class TiedTests:
    """A worker's groups: tests that share a fixture made once for several tests (of module or
    class scope: their file; of session scope: that fixture), or that are marked with one
    xdist_group, form one group, which the controller hands to one process (Controller): the
    fixture is made once per run. The chapters' runs tie nothing: any process reads them
    from the run's folder. (pytest-xdist's own --dist loadgroup does not see the marks under
    pytest 9, whose test ids it can no longer suffix.)"""

    @staticmethod
    def shared(item: pytest.Item) -> list[str]:
        info = getattr(item, "_fixtureinfo", None)
        keys = []
        for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
            fixture = defs[-1]
            if fixture.scope == "function" or name in NEEDS_CHAPTERS or not fixture.baseid:
                continue  # not shared, shared through the run's folder, or pytest's own
            keys.append(name if fixture.scope in ("session", "package") else
                        Path(str(item.path)).resolve().relative_to(HERE).as_posix())
        for mark in item.iter_markers("xdist_group"):  # pytest-xdist's own mark, by hand
            keys.append(f"group {mark.args[0] if mark.args else mark.kwargs['name']}")
        return keys

    @pytest.hookimpl(tryfirst=True)  # written before pytest-xdist reports the collection
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        parent: dict[str, str] = {}

        def root(key: str) -> str:
            while parent.setdefault(key, key) != key:
                key = parent[key]
            return key

        tied = {item.nodeid: self.shared(item) for item in session.items}
        for keys in tied.values():
            for key in keys[1:]:
                parent[root(key)] = root(keys[0])
        groups = {nodeid: root(keys[0]) for nodeid, keys in tied.items() if keys}
        part = run_folder() / f"{GROUPS}.{os.getpid()}"  # every worker writes the same
        part.write_text(json.dumps(groups), encoding="utf-8")
        os.replace(part, run_folder() / GROUPS)


class ChapterRuns(NamedTuple):
    """tests/chapter_runs.py at work in a process of its own, the controller's child."""

    proc: subprocess.Popen
    waiter: threading.Thread  # writes its exit status into its folder when it ends


RUNS = pytest.StashKey[ChapterRuns]()
NEEDS_CHAPTERS = {"chapter_runs", "full_runs", "student_runs"}
CHAPTERS_WANTED = "chapters-wanted"  # a worker collected a test that reads the chapters' runs


def chapters_folder() -> Path:
    """The chapters' runs' folder: log.txt; runs.json and then exit when they are done."""
    return run_folder() / "chapters"


def _start_chapter_runs(config: pytest.Config) -> None:
    """Start the chapters' runs, once per run; only the controller does."""
    if RUNS in config.stash:
        return
    out = chapters_folder()
    out.mkdir()
    with open(out / "log.txt", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "chapter_runs.py"), str(out)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def note_the_end() -> None:
        code = proc.wait()
        (out / "exit.part").write_text(str(code), encoding="utf-8")
        os.replace(out / "exit.part", out / "exit")

    waiter = threading.Thread(target=note_the_end, daemon=True)
    waiter.start()
    config.stash[RUNS] = ChapterRuns(proc, waiter)


class Controller:
    """pytest-xdist's controller. It collects nothing: it starts the chapters' runs when a
    worker has collected a test that reads them, before it hands out any test; and it hands
    out the tests of a group (TiedTests) to one worker, the others one by one."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        if (run_folder() / CHAPTERS_WANTED).exists():
            _start_chapter_runs(self.config)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object:
        if config.getoption("dist") not in ("load", "loadgroup"):
            return None  # loadfile, loadscope, each...: pytest-xdist's own
        from xdist.scheduler import LoadScopeScheduling

        class TiedScheduling(LoadScopeScheduling):
            """The groups of the workers' groups.json, largest first, then every other test
            on its own, in the order of the collection (the chapters' readers last)."""

            groups: dict[str, str] | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self.groups is None:  # written before the collections came
                    path = run_folder() / GROUPS
                    self.groups = json.loads(path.read_text(encoding="utf-8"))
                return self.groups.get(nodeid, nodeid)

        return TiedScheduling(config, log)


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
        if is_worker(config):  # the controller starts them (Controller)
            (run_folder() / CHAPTERS_WANTED).touch()
        else:
            _start_chapter_runs(config)


@pytest.fixture(scope="session")
def chapter_runs(request: pytest.FixtureRequest) -> dict:
    """{"full": slug -> FullRun, "student": slug -> StudentRun}: the chapters' one run each,
    made by tests/chapter_runs.py in a process of its own, started when the session began."""
    import chapter_runs  # here, not at the top: --fast needs no notebook machinery

    out = chapters_folder()
    if not out.exists():
        if is_worker(request.config):
            pytest.fail("the chapters' runs were not started (the controller starts them)")
        _start_chapter_runs(request.config)
    while not (out / "exit").exists():  # polled: the runs may be another process's child
        time.sleep(0.2)
    code = int((out / "exit").read_text(encoding="utf-8"))
    done = out / "runs.json"
    if code != 0 or not done.exists():
        said = (out / "log.txt").read_text(encoding="utf-8", errors="replace")
        pytest.fail(f"the chapters' runs failed (exit {code}):\n{said[-4000:]}")
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
def one_thread_each():
    """One BLAS thread, and one torch thread where torch is loaded, for a test whose assertions
    do not depend on threads: `make test` runs two processes on two cores, where a product on
    two threads spins waiting for the core the other process holds. A file opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread_each")`; the threads' own behaviour is
    tested where the default stays (test_threads.py, test_processes.py, test_lora.py)."""
    from threadpoolctl import threadpool_limits  # a core dependency of the package

    torch = sys.modules.get("torch")  # only if the test file loaded it: --fast needs none
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(before)


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
