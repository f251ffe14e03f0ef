"""The door: `import xenith_edu` is light, and the package works on a system that is not POSIX.

The invariants: the face loads no floor above the model, and every public name of it resolves;
a module of the training floor loads only what it imports (the floor's face is lazy too);
no module reachable from the face, the trainer or the command line imports a Unix-only module;
a Python without fcntl, resource, pwd, grp, termios and fork, whose multiprocessing starts
processes by spawn (as on Windows and macOS), imports every module but the grader's sandbox,
trains the small preset with worker processes and threads, keeps one trainer per run folder
(whatever way its holder ends), and writes the student notebooks. The simulated system is a
`sitecustomize` on PYTHONPATH, which the trainer's worker processes inherit too.
"""

from __future__ import annotations

import ast
import errno
import importlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xenith_edu
from xenith_edu import chapters
from xenith_edu.booktools.student import (
    EXTRA_MODULES,
    EXTRA_OF,
    PROGRAMS,
    chapter_extras,
    setup_cell,
    used_modules,
)

ROOT = Path(__file__).resolve().parents[1]
UNIX_ONLY = ("fcntl", "resource", "pwd", "grp", "termios")
# the grader's sandbox: bubblewrap, rlimits and flock are Linux's (gradebook.grade says so)
GRADER_ONLY = {"xenith_edu.gradebook.grading", "xenith_edu.grader.judging",
               "xenith_edu.grader.sandbox", "xenith_edu.grader.worker"}
UPPER_FLOORS = ("training", "exercises", "booktools", "grader", "gradebook", "cli")

SITECUSTOMIZE = f"""
import multiprocessing, os, sys
for name in {UNIX_ONLY!r}:
    sys.modules[name] = None  # `import fcntl` fails, as on Windows


def _no_fork(*args, **kwargs):
    raise OSError("fork is not available on this system (the door's simulation)")


for name in ("fork", "forkpty"):
    setattr(os, name, _no_fork)
multiprocessing.set_start_method("spawn", force=True)
"""


@pytest.fixture(scope="module")
def no_posix(tmp_path_factory) -> dict[str, str]:
    """The environment of a Python without the Unix-only modules and fork (see above)."""
    site = tmp_path_factory.mktemp("no_posix_site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COV_"))}
    env["PYTHONPATH"] = str(site)
    return env


def python(code: str, env: dict[str, str] | None, cwd: Path, *args: str,
           timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)


def fake_jupyterlab(tmp_path: Path, main: str) -> dict[str, str]:
    """The environment of a Python whose `jupyterlab` is a stand-in running `main`."""
    fake = tmp_path / "fake" / "jupyterlab"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(main)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(fake.parent)
    return env


def xenith(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xenith_edu", *args], env=env, cwd=cwd,
                          text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the simulation is what it says


def test_the_simulated_system_has_no_fcntl_and_no_fork(no_posix, tmp_path) -> None:
    ran = python("import multiprocessing, os\n"
                 "for m in ('fcntl', 'resource', 'pwd', 'grp', 'termios'):\n"
                 "    try:\n        __import__(m)\n    except ImportError:\n        pass\n"
                 "    else:\n        raise SystemExit(m + ' imports')\n"
                 "try:\n    os.fork()\nexcept OSError:\n    pass\nelse:\n    os._exit(0)\n"
                 "print(multiprocessing.get_start_method())", no_posix, tmp_path)
    assert ran.returncode == 0 and ran.stdout == "spawn\n", ran.stderr


# ---------------------------------------------------------------- the face


FACE = """
import json, sys
import xenith_edu as xe
loaded = sorted(m for m in sys.modules if m.startswith("xenith_edu."))
heavy = sorted(m for m in ("nbformat", "nbclient", "matplotlib", "tqdm", "torch", "filelock")
               if m in sys.modules)
names = {}
for name in xe.__all__:
    value = getattr(xe, name)
    names[name] = getattr(value, "__module__", None) or value.__name__
print(json.dumps({"loaded": loaded, "heavy": heavy, "names": names}))
"""


@pytest.mark.parametrize("system", ["posix", "no_posix"])
def test_the_face_loads_no_upper_floor_and_every_name_resolves(system, no_posix,
                                                                tmp_path) -> None:
    ran = python(FACE, no_posix if system == "no_posix" else None, tmp_path)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    upper = [m for m in seen["loaded"] if m.split(".")[1] in UPPER_FLOORS]
    assert upper == [] and seen["heavy"] == [], (upper, seen["heavy"])
    assert set(seen["names"]) == set(xenith_edu.__all__)


@pytest.mark.parametrize("name", xenith_edu.__all__)
def test_a_lazy_name_is_its_home_modules_object(name: str) -> None:
    value = getattr(xenith_edu, name)
    where = xenith_edu._LAZY.get(name)
    if where == f"xenith_edu.{name}":
        assert value is importlib.import_module(where)
    elif where is not None:
        assert value is getattr(importlib.import_module(where), name)
    exec(f"from xenith_edu import {name} as again", namespace := {})
    assert namespace["again"] is value
    assert name in dir(xenith_edu)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'TrainConfg'"):
        xenith_edu.TrainConfg  # noqa: B018
    assert not hasattr(xenith_edu, "grade")


FLOOR = """
import importlib, json, sys
loaded = {}
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m.startswith("xenith_edu.training")]:
        del sys.modules[m]  # each module of the floor imported as in a fresh interpreter
    importlib.import_module(name)
    loaded[name] = sorted(m for m in sys.modules if m.startswith("xenith_edu.training"))
print(json.dumps(loaded))
"""


def _eager_imports(path: Path) -> set[str]:
    """The modules of its own floor that a module imports when it is imported: its top-level
    `from .x import ...` and `from . import x`, not those inside a function or TYPE_CHECKING."""
    found: set[str] = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.Try):
            body += node.body + node.orelse + node.finalbody
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_a_module_of_the_training_floor_loads_only_what_it_imports(tmp_path) -> None:
    """The floor's face is lazy (PEP 562): importing one module of it (the settings, to read a
    preset) loads that module and what it imports, read from its source, and nothing else;
    `import xenith_edu.training` alone loads no module of the floor."""
    here = ROOT / "xenith_edu" / "training"
    floor = {p.stem: _eager_imports(p) for p in here.glob("*.py") if p.stem != "__init__"}
    names = ["xenith_edu.training", *(f"xenith_edu.training.{m}" for m in sorted(floor))]
    ran = python(FLOOR, None, tmp_path, *names)
    assert ran.returncode == 0, ran.stderr
    for name, loaded in json.loads(ran.stdout).items():
        want, todo = set(), [name.rsplit(".", 1)[1]] if name != "xenith_edu.training" else []
        while todo:
            m = todo.pop()
            if m not in want:
                want.add(m)
                todo += floor[m]
        assert set(loaded) == {"xenith_edu.training", *(f"xenith_edu.training.{m}"
                                                          for m in want)}, name


def test_the_training_floors_names_and_modules_resolve_lazily() -> None:
    import xenith_edu.training as floor

    for name in floor.__all__:
        value = getattr(floor, name)
        assert value is getattr(importlib.import_module(f"xenith_edu.training.{floor._LAZY[name]}"),
                                name)
        assert name in dir(floor)
    for module in floor._MODULES:
        assert getattr(floor, module) is importlib.import_module(f"xenith_edu.training.{module}")
    with pytest.raises(AttributeError, match="no attribute 'TrainConfg'"):
        floor.TrainConfg  # noqa: B018


# ---------------------------------------------------------------- every module, without POSIX


WALK = """
import importlib, json, pkgutil, xenith_edu
failed = {}
for m in pkgutil.walk_packages(xenith_edu.__path__, "xenith_edu."):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except ImportError as e:
        failed[m.name] = e.name
print(json.dumps(failed))
"""


def test_every_module_but_the_graders_sandbox_imports_without_posix(no_posix, tmp_path) -> None:
    ran = python(WALK, no_posix, tmp_path)
    assert ran.returncode == 0, ran.stderr
    failed = json.loads(ran.stdout)
    assert set(failed) <= GRADER_ONLY, failed
    assert set(failed.values()) <= set(UNIX_ONLY), failed
    here = python(WALK, None, tmp_path)  # and on this system, every one of them imports
    assert json.loads(here.stdout) == {}, here.stderr


def test_grading_says_in_one_line_that_it_needs_linux(no_posix, tmp_path) -> None:
    (tmp_path / "subs").mkdir()
    ran = xenith(no_posix, tmp_path, "grade", "subs", "--out", "grades.csv")
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.count("\n") == 1 and "Linux sandbox" in ran.stderr, ran.stderr


# ---------------------------------------------------------------- training, without POSIX


QUICK = ("train", "--preset", "small", "--steps", "4", "--eval-every", "2", "--eval-batches", "2",
         "--no-progress", "--sample-chars", "0")


def test_the_small_preset_trains_and_resumes_without_posix(no_posix, tmp_path) -> None:
    """Worker processes (started as spawn would: fresh interpreters, which inherit the
    simulation) and threads give the same losses, bit for bit; a run resumes."""
    for parallel in ("processes", "threads"):
        ran = xenith(no_posix, tmp_path, *QUICK, "--threads", "2", "--parallel", parallel,
                     "--out", parallel)
        assert ran.returncode == 0, ran.stderr
        assert sorted(p.name for p in (tmp_path / parallel).iterdir()) == [
            "ckpt.npz", "log.jsonl", "loss.png"]
    assert losses(tmp_path / "processes", 4) == losses(tmp_path / "threads", 4)
    again = xenith(no_posix, tmp_path, "train", "--resume", "processes", "--steps", "6",
                   "--no-progress", "--sample-chars", "0")
    assert again.returncode == 0 and "after 6 steps" in again.stdout, again.stderr


def losses(run: Path, steps: int) -> list[tuple[str, int, float]]:
    """The losses of a run's log up to `steps`: (event, step, loss), every step's."""
    events = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    found = [(e["event"], e["step"], e.get("loss", e.get("val_loss"))) for e in events
             if e["event"] in ("train", "eval") and e["step"] < steps]
    assert len([f for f in found if f[0] == "train"]) == steps, found
    return found


# ---------------------------------------------------------------- one trainer per folder


HOLD = """
import os, sys, time
from pathlib import Path
from xenith_edu.training.rundir import FolderLock
FolderLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
end = sys.argv[2]
if end == "exit":  # ends without releasing
    os._exit(0)
if end == "raise":
    raise SystemExit(3)
time.sleep(120)
"""
ENDS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "exit": None, "raise": None}


# this system's kernel lock is tested further in test_cli.py: here its SIGKILL and a plain exit
@pytest.mark.parametrize(("system", "end"), [("posix", "SIGKILL"), ("posix", "exit"),
                                             *(("no_posix", end) for end in ENDS)])
def test_one_trainer_per_folder_and_none_after_its_holder_ends(system, end, no_posix,
                                                               tmp_path) -> None:
    """While a holder runs, a second trainer stops at once naming it; however the holder
    ends, the folder is free again."""
    env = no_posix if system == "no_posix" else None
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run"), end], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        if ENDS[end] is not None:
            refused = xenith(env or dict(os.environ), tmp_path, *QUICK, "--out", "run")
            assert refused.returncode == 1 and refused.stderr == (
                f"xenith-edu train: error: run folder 'run' is in use by another trainer (pid "
                f"{holder.pid} on {socket.gethostname()}): wait for it to end or stop it, or "
                "choose another --out\n")
            holder.send_signal(ENDS[end])
    finally:
        holder.wait(timeout=60)
        holder.stdout.close()
    ran = xenith(env or dict(os.environ), tmp_path, *QUICK, "--out", "run", "--overwrite")
    assert ran.returncode == 0, ran.stderr
    assert not (tmp_path / "run" / ".lock").exists()


def test_two_locks_in_one_process_without_posix(no_posix, tmp_path) -> None:
    code = ("import sys\nfrom pathlib import Path\nfrom xenith_edu.training.rundir import "
            "FolderLock\na = FolderLock(Path('run'))\na.acquire()\ntry:\n"
            "    FolderLock(Path('run')).acquire()\nexcept ValueError as e:\n    print(e)\n"
            "a.release()\nb = FolderLock(Path('run'))\nb.acquire()\nb.release()\n"
            "print(sorted(p.name for p in Path('.').iterdir()))")
    ran = python(code, no_posix, tmp_path)
    assert ran.returncode == 0, ran.stderr
    first, listing = ran.stdout.splitlines()
    assert "in use by another trainer (pid " in first and socket.gethostname() in first
    assert listing == "[]"  # released: the lock file and the folder it made are gone


# ---------------------------------------------------------------- the chapters, without POSIX


def test_the_chapters_are_written_without_posix_and_a_learners_kept(no_posix, tmp_path) -> None:
    ran = xenith(no_posix, tmp_path, "chapters", "--out", "mine")
    assert ran.returncode == 0, ran.stderr
    names = sorted(p.name for p in (tmp_path / "mine").iterdir())
    assert names == sorted(f"{c.slug}.ipynb" for c in chapters.CHAPTERS)
    mine = tmp_path / "mine" / names[0]
    mine.write_text("my work")
    (tmp_path / "mine" / names[1]).unlink()
    again = xenith(no_posix, tmp_path, "chapters", "--out", "mine")
    assert again.returncode == 0 and "wrote 1 " in again.stdout, again.stderr
    assert mine.read_text() == "my work"
    assert len(list((tmp_path / "mine").iterdir())) == len(names)


# ---------------------------------------------------------------- the setup cell's extras


@pytest.mark.parametrize("extras", [e for n in range(1, len(EXTRA_MODULES) + 1)
                                    for e in itertools.combinations(sorted(EXTRA_MODULES), n)])
@pytest.mark.parametrize("url", ["", "https://github.com/someone/xenith-edu"])
def test_the_setup_cell_names_the_missing_extras(extras, url, monkeypatch) -> None:
    """With the package importable and the extras' modules absent, the cell installs exactly
    the missing extras from `url`, or names them in one line; present, it does nothing."""
    import importlib.util

    source = setup_cell(url, "main", extras).source
    assert f"[{','.join(extras)}]" in source.split("import importlib.util")[0]
    absent = set(EXTRA_MODULES[extras[-1]])  # the last extra missing, the others there
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda m, *a: None if m in absent else real("json"))
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    if url:
        exec(compile(source, "setup cell", "exec"), {})
        assert ran == [[sys.executable, "-m", "pip", "install", "-q",
                        f"xenith-edu[{extras[-1]}] @ git+{url}@main"]]
    else:
        with pytest.raises(ImportError) as e:
            exec(compile(source, "setup cell", "exec"), {})
        assert str(e.value).count("\n") == 0 and f"[{extras[-1]}]" in str(e.value)
        assert ran == []
    absent.clear()
    ran.clear()
    exec(compile(source, "setup cell", "exec"), {})
    assert ran == []


# ---------------------------------------------------------------- chapters and lab, at the door


def test_chapters_into_a_file_an_empty_or_impossible_name_is_one_line(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    (tmp_path / "file").write_text("x")
    for out in ("file", "file/below", "", " ", "x" * 300):
        ran = xenith(env, tmp_path, "chapters", "--out", out)
        assert ran.returncode == 1 and ran.stderr.count("\n") == 1, ran.stderr
        assert ran.stderr.startswith("xenith-edu chapters: error: "), ran.stderr
    assert (tmp_path / "file").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


FAKE_LAB = """import json, sys
print(json.dumps(sys.argv[1:]))
"""


def test_lab_writes_the_chapters_then_opens_jupyterlab_on_them(tmp_path) -> None:
    env = fake_jupyterlab(tmp_path, FAKE_LAB)
    ran = xenith(env, tmp_path, "lab", "--out", "mine", "--allow-root")
    assert ran.returncode == 0, ran.stderr
    wrote, opened = ran.stdout.splitlines()
    assert wrote.startswith(f"wrote {len(chapters.CHAPTERS)} student notebook(s) into mine")
    assert json.loads(opened) == ["--allow-root", "mine"]
    assert len(list((tmp_path / "mine").iterdir())) == len(chapters.CHAPTERS)


def test_worker_processes_where_the_system_is_not_posix_are_one_line(monkeypatch) -> None:
    from xenith_edu.training import processes

    monkeypatch.setattr(processes, "POSIX", False)
    with pytest.raises(OSError, match=r"need POSIX .* \(parallel='threads'\)"):
        processes.ProcessShards(2)


# ---------------------------------------------------------------- a file system without locks


NO_LOCK = [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL]


def ended_pid() -> int:
    """The pid of a process of this host that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("code", NO_LOCK)
def test_where_the_kernel_refuses_a_lock_the_named_holder_decides(code, monkeypatch,
                                                                  tmp_path) -> None:
    """Without a kernel lock, a holder named in the file that runs on this host (or on
    another host, which cannot be asked) keeps the folder; one that has ended does not."""
    from xenith_edu.training import rundir

    def refuse(fd, blocking=True):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(rundir, "lock_descriptor", refuse)
    here = socket.gethostname()
    for holder, free in [(f"pid {os.getpid()} on {here}", False),
                         (f"pid {ended_pid()} on {here}", True),
                         (f"pid {ended_pid()} on another-{here}", False), ("", True),
                         ("garbage \x00\xff", True)]:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        (out / rundir.LOCK).write_bytes(b"\n" + holder.encode("utf-8", "surrogateescape"))
        lock = rundir.FolderLock(out)
        if free:
            lock.acquire()
            assert f"pid {os.getpid()} on {here}" in (out / rundir.LOCK).read_text()
            with pytest.raises(ValueError, match="in use by another trainer"):
                rundir.FolderLock(out).acquire()  # and now this process holds it
            lock.release()
            assert not (out / rundir.LOCK).exists()
        else:
            with pytest.raises(ValueError, match=f"in use by another trainer \\({holder}\\)"):
                lock.acquire()


def test_a_lock_error_that_is_not_a_missing_lock_is_raised(monkeypatch, tmp_path) -> None:
    from xenith_edu.training import rundir

    def broken(fd, blocking=True):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(rundir, "lock_descriptor", broken)
    before = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    for _ in range(3):
        with pytest.raises(OSError, match="I/O error"):
            rundir.FolderLock(tmp_path / "run").acquire()
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before  # no descriptor left open


# ---------------------------------------------------------------- what a chapter's code needs

FORMS = ["import {m}", "import {m}.sub as alias", "from {m} import thing",
         "from {m}.sub import (a,\n    b)", "x = 1; import {m}", "importlib.import_module('{m}')",
         "mod = __import__('{m}.sub')", "import os, {m}"]
WRAPS = ["{s}", "def f():\n    {s}", "if True:\n    {s}", "%matplotlib inline\n{s}",
         "!pip list\n{s}", "try:\n    {s}\nexcept ImportError:\n    pass"]


@given(module=st.sampled_from(sorted(EXTRA_OF)), form=st.sampled_from(FORMS),
       wrap=st.sampled_from(WRAPS), decoy=st.sampled_from(sorted(EXTRA_OF)))
@settings(max_examples=200, deadline=None)
def test_every_way_of_importing_an_extras_module_is_seen(module, form, wrap, decoy) -> None:
    """However a cell imports a module (or names a program) of an extra, the setup cell's
    extras include it; a module only named in a comment is not an import."""
    code = form.format(m=module) if module not in PROGRAMS else f"p = '/x/bin/{module}'"
    source = wrap.format(s=code.replace("\n", "\n    " if wrap.startswith(("def", "if", "try"))
                                        else "\n")) + f"\n# import {decoy}\n"
    found = used_modules(source)
    assert module in found
    assert decoy not in found or decoy == module
    cell = type("Cell", (), {"cell_type": "code", "source": source})
    assert EXTRA_OF[module] in chapter_extras(type("NB", (), {"cells": [cell]}))


FAKE_LAB_CTRL_C = """import signal, sys, time
signal.signal(signal.SIGINT, lambda *a: sys.exit(7))  # as JupyterLab: it decides how to stop
print("ready", flush=True)
time.sleep(60)
"""


def test_ctrl_c_in_lab_is_jupyterlabs_to_handle(tmp_path) -> None:
    env = fake_jupyterlab(tmp_path, FAKE_LAB_CTRL_C)
    lab = subprocess.Popen([sys.executable, "-m", "xenith_edu", "lab", "--out", "mine"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        assert lab.stdout.readline().startswith("wrote ")
        assert lab.stdout.readline() == "ready\n"
        os.killpg(lab.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        assert lab.wait(timeout=60) == 7  # JupyterLab's own status: no "interrupted" line
        assert lab.stderr.read() == ""
    finally:
        lab.kill()
        lab.wait()
        lab.stdout.close()
        lab.stderr.close()
