"""Inside the sandbox: run one learner's notebooks, call their functions, send back plain data.
Nothing here judges: the grader, in its own process, decides every verdict from what comes back.

The parent process runs only this module's code: it reads the grader's one request, drops to the
sandbox's uid, fills the learner's home with its copy of the submission, sets the limits, fences
off the exercise catalogue (its checks become no-ops, its reference functions are not there to
import), resolves the package functions that compute each exercise's answer (their code is
watched while the learner's function runs: sys.setprofile), then forks one child per notebook.
The child executes the notebook's code cells (as IPython transforms them: cells.py) and calls
each exercise's function on the grader's inputs through the one runner of the exercise floor
(`outcomes.run`); the parent relays the child's frames and stops a child that overruns. A child
that dies or overruns while a function runs is replaced by a new one, which executes the
notebook again and goes on with the next exercise.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import linecache
import os
import re
import resource
import shutil
import signal
import stat
import sys
import time
import types

from ..exercises import outcomes
from . import cells, wire

# A line that calls an exercise's check: the grader calls the function itself, on hidden cases.
CHECK_LINE = re.compile(r"^(\s*)(?:_\s*=\s*|assert\s+)?check_\w+\(\s*[A-Za-z_]\w*\s*\)"
                        r"(?:\.passed)?\s*;?\s*$")
EXEC_GRACE = 5.0  # seconds past the notebook's own time limit before the parent stops it
CATALOGUE = "xenith_edu.exercises"  # the boot installs it as a fence: see `fence_catalogue`
OPEN_MODULES = ("outcomes",)  # the exercise floor's modules the sandbox may import
_MATERIAL: dict[str, str] = {}  # catalogue module -> the teacher's helpers' source
_MODULES: set[str] = set()  # the catalogue's module names: each a placeholder in the sandbox
# the exercise being called, the package functions it may not call, and the calls seen
_STATE: dict = {"active": None, "codes": {}, "hits": set(), "own": False, "self": None}
COPY_MIN = 200  # bytes of bytecode from which a copied code object is matched by its bytecode
_HERE = os.path.dirname(os.path.abspath(__file__))


class _TimeUp(BaseException):
    """Raised in a cell when the notebook's time is up (BaseException: `except Exception` in
    the learner's code does not swallow it, and it is raised again every half second)."""


def main() -> None:
    """The sandbox's entry point: one request on stdin, frames on stdout, then exit."""
    req, rep = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the learner's prints go nowhere; the channel is `rep`
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file too large raises, it does not kill
    try:
        msg, _ = wire.message(wire.read_frame(req, None))
        _drop_privileges(msg.get("uid"))
        _not_dumpable()
        fill_home(msg.get("copy"), msg.get("home"))
        _set_limits(msg["limits"])
        os.environ["MPLBACKEND"] = "Agg"
        fence_catalogue(msg.get("material") or {}, msg.get("catalogue") or [])
        for exercises in (nb["exercises"] for nb in msg["notebooks"]):
            for ex in exercises:
                ex["codes"] = observe(ex["targets"])
        sys.addaudithook(_audit)  # for good: no learner code can remove it
        guard_threads()
    except Exception as exc:  # the request or the setup failed: say so, the grader records it
        wire.write_frame(rep, wire.pack({"op": "error", "text": _text(exc)}))
        os._exit(3)
    wire.write_frame(rep, wire.pack({"op": "ready"}))  # set up; no learner code has run yet
    for i, nb in enumerate(msg["notebooks"]):
        _serve_notebook(i, nb, msg, req, rep)
        wire.write_frame(rep, wire.pack({"op": "notebook", "nb": i}))
    wire.write_frame(rep, wire.pack({"op": "bye"}))
    os._exit(0)


def _not_dumpable() -> None:
    """No process of the learner's may open this one's descriptors (the grader's channel)
    through /proc, nor trace it: PR_SET_DUMPABLE 0, where Linux offers it."""
    try:
        import ctypes  # only here: the one call into libc, on Linux only

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


# ----------------------------------------------------------------------------------------------
# The learner's home: a size-capped tmpfs, filled from the grader's read-only copy.


def fill_home(copy: object, home: object, depth: int = 0) -> None:
    """Copy the folder `copy` into `home`: folders and regular files only, no link followed."""
    if copy is None or home is None:
        return
    if depth > 64:
        raise ValueError("the learner's copy is nested too deeply")
    for entry in os.scandir(str(copy)):
        st = entry.stat(follow_symlinks=False)
        target = os.path.join(str(home), entry.name)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(target, 0o755)
            fill_home(entry.path, target, depth + 1)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as src, open(target, "xb") as dst:
                shutil.copyfileobj(src, dst)


# ----------------------------------------------------------------------------------------------
# The fence: the exercise catalogue is not in the sandbox, and its checks do nothing there.


class _Skipped(types.SimpleNamespace):
    """What a notebook's check returns inside the sandbox: nothing was checked there."""


def _no_check(name: str):
    def check(*args, **kwargs) -> _Skipped:
        return _Skipped(exercise=name[6:], status="not checked in the sandbox", passed=True,
                        message="", mistakes=())

    check.__name__ = name
    return check


def _unavailable(module: str, name: str):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{module}.{name} is not available inside the grader's sandbox: "
                           "the exercise catalogue is kept out of it")

    unavailable.__name__ = name
    return unavailable


def _catalogue_attr(name: str) -> object:
    if name.startswith("check_"):
        return _no_check(name)
    raise AttributeError(f"{CATALOGUE}.{name} is not available inside the grader's sandbox: "
                         "the exercise catalogue is kept out of it")


def _placeholders(module: str):
    def attr(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        if name.startswith("check_"):  # a check, from whichever module: a no-op here
            return _no_check(name)
        return _unavailable(module, name)

    return attr


class _Fence(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the catalogue's modules give placeholders, whose functions raise."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, tail = fullname.rpartition(".")
        if head == CATALOGUE and tail not in OPEN_MODULES and \
                (fullname in _MATERIAL or tail in _MODULES):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = _placeholders(spec.name)
        return module

    def exec_module(self, module) -> None:
        source = _MATERIAL.get(module.__name__)
        if source:  # the teacher's helpers of this module: cut out by the grader, no reference
            name = f"<{module.__name__}>"
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            exec(compile(source, name, "exec"), module.__dict__)  # inspect.getsource works


def fence_catalogue(material: dict, modules: list) -> None:
    """Finish the fence the boot put up (an empty `xenith_edu.exercises` whose path holds, in
    the sandbox, only the runner): `check_*` become no-ops, the teacher's `material` (module
    -> source) is what its `modules` hold, anything else is refused."""
    _MATERIAL.update({k: v for k, v in material.items() if isinstance(v, str)})
    _MODULES.update(m for m in modules if isinstance(m, str))
    fence = sys.modules.get(CATALOGUE)
    if fence is None or not getattr(fence, "_xenith_fence", False):
        return  # started without the boot's fence (a test): nothing to finish
    fence.__getattr__ = _catalogue_attr
    if not any(isinstance(f, _Fence) for f in sys.meta_path):
        sys.meta_path.insert(0, _Fence())


def _text(exc: BaseException) -> str:
    try:
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    except Exception:  # a learner's exception whose __str__ raises
        return type(exc).__name__[:100]


def _drop_privileges(uid: object) -> None:
    """Become the sandbox's own unprivileged uid (when the grader runs as root)."""
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))
    if os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError("could not leave uid 0")


def _set_limits(limits: dict) -> None:
    """Soft and hard limits at once: the learner's code cannot raise them again."""
    for name, key in (("memory", resource.RLIMIT_AS), ("cpu", resource.RLIMIT_CPU),
                      ("nproc", resource.RLIMIT_NPROC), ("fsize", resource.RLIMIT_FSIZE),
                      ("nofile", resource.RLIMIT_NOFILE), ("core", resource.RLIMIT_CORE)):
        if limits.get(name) is not None:
            value = int(limits[name])
            resource.setrlimit(key, (value, value))


# ----------------------------------------------------------------------------------------------
# What computes an exercise's answer, observed however a learner's function reaches it.


def _resolve(dotted: str) -> object:
    """The function `module.qualname` names (a method: `module.Class.name`)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            found: object = sys.modules.get(module) or importlib.import_module(module)
        except ImportError:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise ImportError(dotted)


def observe(targets: list[str]) -> dict:
    """{code object or its bytecode: dotted name} of the package functions `targets` names,
    resolved before any learner code runs: a call of one is seen by its code, whatever path
    reached it (a name, an attribute, a closure, getattr, functools.partial, another
    exercise's function), and by its bytecode if the learner copied its code object."""
    seen: dict = {}
    for dotted in targets:
        if dotted.startswith("spec:") or dotted.startswith(CATALOGUE + "."):
            continue  # the check's reference: the catalogue is not in the sandbox
        try:
            fn = inspect.unwrap(_resolve(dotted))
        except (ImportError, AttributeError, ValueError, KeyError, RuntimeError, TypeError):
            continue
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType):
            seen[code] = dotted
            if len(code.co_code) >= COPY_MIN:  # too short, and an honest one could match it
                seen[code.co_code] = dotted
    return seen


def _profile(frame, event: str, arg) -> None:
    if event == "call":
        code = frame.f_code
        if code is _STATE["self"]:
            return  # the learner's function itself: judged, never "delegated" to
        watched = _STATE["codes"]
        name = watched.get(code) or watched.get(code.co_code)
        if name is not None:
            _STATE["hits"].add(name)


def _start_thread(function, args=(), kwargs=None):
    """`_thread.start_new_thread` in the sandbox: the new thread is observed too."""
    def observed(*a, **k):
        _watch(True)
        return function(*a, **k)

    return _START["original"](observed, args, kwargs or {})


_START: dict = {}


def guard_threads() -> None:
    """Every thread the learner's code starts runs under the observer (sys.setprofile is one
    thread's; where the sandbox's process limit does not already forbid threads)."""
    import _thread  # the one way Python starts a thread
    import threading  # holds its own reference to it

    if not _START:
        _START["original"] = _thread.start_new_thread
        _thread.start_new_thread = _start_thread
        threading._start_new_thread = _start_thread


def _audit(event: str, args: tuple) -> None:
    """Removing the observer while a learner's function runs hides nothing: it is a hit."""
    if event in ("sys.setprofile", "sys.settrace") and _STATE["active"] is not None and \
            not _STATE["own"]:
        _STATE["hits"].add(f"{event} (the grader's observer, replaced by the learner's code)")


# ----------------------------------------------------------------------------------------------
# The parent: one child per notebook, relayed frame by frame, stopped when it overruns.


def _serve_notebook(i: int, nb: dict, msg: dict, req: int, rep: int) -> None:
    start, first = 0, True
    while start < len(nb["exercises"]) or first:
        r, w = os.pipe()  # child -> parent: its frames
        ir, iw = os.pipe()  # parent -> child: the inputs, once its cells have run
        pid = os.fork()
        if pid == 0:
            for fd in (r, iw, rep, req):
                os.close(fd)  # the child writes only to its own pipe
            _child(i, nb, msg, w, ir, start)
            os._exit(0)
        os.close(w)
        os.close(ir)
        stop = _relay(i, nb, msg, (r, iw, req, rep), start)
        os.close(r)
        os.close(iw)
        _end(pid)
        if stop is None or stop["ex"] is None:
            return  # the notebook is done, or it never got past its cells
        wire.write_frame(rep, wire.pack(stop))
        start, first = stop["ex"] + 1, False


def _end(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child and anything it started in its group
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _relay(i: int, nb: dict, msg: dict, fds: tuple[int, int, int, int], start: int
           ) -> dict | None:
    """Relay the child's frames; None when it finished, else the `stopped` record.

    Every frame the child writes goes on to the grader, which holds it to the protocol: a
    frame the learner's code forges there is the learner's protocol error. After the first
    "ran", the grader's inputs go to the child: they never existed in the sandbox while the
    learner's cells ran.
    """
    r, iw, req, rep = fds
    ex, calls, ran = start, 0, False
    deadline = time.monotonic() + float(msg["exec_time"]) + EXEC_GRACE
    while True:
        try:
            frame = wire.read_frame(r, deadline)
            got, _ = wire.message(frame)
        except wire.Deadline:
            why = "time"
        except wire.ChannelError:
            why = "exited"
        else:
            op = got.get("op")
            if op == "done" and ran:
                return None
            wire.write_frame(rep, frame)  # the grader holds every frame to the protocol
            if op == "ran" and not ran:
                ran = True
                try:
                    wire.write_frame(iw, wire.read_frame(req, time.monotonic() + 60))
                except (wire.ChannelError, OSError):
                    return {"ex": None}  # the grader has gone, or the child has
            elif op == "result":
                calls += 1
                continue
            elif op == "exercise":
                ex, calls = ex + 1, 0
            else:
                continue  # a frame out of place: the grader ends the sandbox
            deadline = time.monotonic() + float(msg["call_time"])
            continue
        if not ran:
            wire.write_frame(rep, wire.pack({"op": "stopped", "nb": i, "ex": None,
                                             "call": None, "why": why, "phase": "run"}))
            return {"ex": None}
        if ex >= len(nb["exercises"]):
            return None
        return {"op": "stopped", "nb": i, "ex": ex, "call": calls, "why": why, "phase": "call"}


# ----------------------------------------------------------------------------------------------
# The child: the learner's notebook, then the learner's functions.


def _child(i: int, nb: dict, msg: dict, w: int, ir: int, start: int) -> None:
    os.setpgid(0, 0)
    t0 = time.monotonic()
    ns, errors, stopped = _execute(nb["path"], float(msg["exec_time"]))
    seconds = round(time.monotonic() - t0, 2)
    functions = {}
    for ex in nb["exercises"]:
        fn = ns.get(ex["fn"])
        functions[ex["fn"]] = ("missing" if ex["fn"] not in ns else "ok" if callable(fn)
                               else f"not callable: {type(fn).__name__} {_short(fn)}"[:200])
    wire.write_frame(w, wire.pack({"op": "ran", "nb": i, "errors": errors[:100],
                                   "stopped": stopped and stopped[:1000],
                                   "functions": functions, "seconds": seconds}))
    got, blobs = wire.message(wire.read_frame(ir, None))
    os.close(ir)
    _alone(bool(msg.get("sweep")))
    for k, ex in enumerate(nb["exercises"]):
        if k < start:
            continue
        fn = ns.get(ex["fn"])
        if callable(fn):
            for j, tree in enumerate(got["exercises"][k]):
                args = wire.decode_value(tree, blobs, tuple)
                wire.write_frame(w, _call(i, k, j, ex, fn, args))
        wire.write_frame(w, wire.pack({"op": "exercise", "nb": i, "ex": k}))
    wire.write_frame(w, wire.pack({"op": "done", "nb": i}))


def _alone(sweep: bool) -> None:
    """Before the calls: end every other process the learner started, and forbid new ones, so
    that no other process can compute an answer unseen."""
    if sweep and os.getuid() != 0:  # never as root, never outside the sandbox's own uid
        me, parent = os.getpid(), os.getppid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, me, parent):
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid == os.getuid():
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))


def _short(value: object) -> str:
    try:
        return repr(value)[:60]
    except Exception:
        return "?"


def _call(i: int, k: int, j: int, ex: dict, fn, args: tuple) -> bytes:
    """One call of the learner's function through the exercise floor's runner, as a frame:
    its outcome (the value, or what it raised, or the argument it changed in place), and the
    package functions it handed the work to."""
    _STATE["hits"], _STATE["codes"] = set(), ex.get("codes") or {}
    _STATE["self"] = getattr(fn, "__code__", None)
    _watch(True)
    _STATE["active"] = ex["id"]
    t0 = time.perf_counter()
    try:
        outcome = outcomes.run(fn, args)
    except BaseException as exc:  # what the notebook lets through (KeyboardInterrupt, ...)
        outcome = outcomes.raised(exc)
    if sys.getprofile() is not _profile:  # removed, or replaced, by the learner's code
        _STATE["hits"].add("sys.setprofile (the grader's observer, removed by the learner's "
                           "code)")
    _STATE["active"] = None
    _watch(False)
    seconds = time.perf_counter() - t0
    blobs: list[bytes] = []
    try:
        tree = wire.encode_outcome(outcome, blobs)
    except RecursionError:
        blobs, tree = [], wire.encode_outcome(outcomes.Raised(
            "RecursionError", "the returned value is nested too deeply to be read"), [])
    cap = wire.answer_cap(sum(a.nbytes for a in args if hasattr(a, "nbytes")))
    if sum(len(b) for b in blobs) > cap:  # not sent: the grader would call it a flood
        blobs, tree = [], wire.encode_outcome(outcomes.Raised("ValueError", (
            f"{fn.__name__ if hasattr(fn, '__name__') else 'the function'} returned "
            f"{sum(len(b) for b in blobs)} bytes of arrays, more than the grader reads for "
            f"this case ({cap})")), [])
    return wire.pack({"op": "result", "nb": i, "ex": k, "call": j, "outcome": tree,
                      "delegated": sorted(_STATE["hits"]), "seconds": seconds}, blobs)


def _watch(on: bool) -> None:
    _STATE["own"] = True
    try:
        sys.setprofile(_profile if on else None)
    finally:
        _STATE["own"] = False


def _cells(path: str) -> list[tuple[int, str]]:
    """(cell number from 1, Python) of each code cell, as IPython transforms it (cells.py):
    magics and shell escapes become calls of `get_ipython()`, no Python line changes."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    out = []
    for n, cell in enumerate(nb.get("cells", []), start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        lines = [CHECK_LINE.sub(r"\1pass", ln) for ln in source.split("\n")]
        try:
            out.append((n, cells.transform("\n".join(lines))))
        except Exception:  # IPython could not read it: Python will say why
            out.append((n, "\n".join(lines)))
    return out


def _on_alarm(signum, frame) -> None:
    raise _TimeUp()


def _execute(path: str, limit: float) -> tuple[dict, list, str | None]:
    """Run the notebook's code cells in a fresh __main__, as a kernel would, until `limit` s."""
    folder = os.path.dirname(os.path.abspath(path))
    os.chdir(folder)
    sys.path.insert(0, folder)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    ns = main.__dict__
    ns["__builtins__"] = builtins
    ns["display"] = lambda *objects, **kwargs: None  # IPython's display, a no-op here
    try:
        code = _cells(path)
    except (OSError, ValueError, AttributeError, RecursionError, MemoryError) as exc:
        return ns, [], f"unreadable: {_text(exc)}"
    errors: list = []
    at = [0]
    shell = cells.Shell(ns, lambda what: errors.append(
        [at[0], f"{cells.UNAVAILABLE}: {what[:200]}"]))
    ns["get_ipython"] = lambda: shell
    deadline = time.monotonic() + limit
    signal.signal(signal.SIGALRM, _on_alarm)
    for n, source in code:
        at[0] = n
        left = deadline - time.monotonic()
        if left <= 0:
            return ns, errors, f"the time limit of {limit:g} s was reached before cell {n}"
        name = f"<cell {n}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        try:
            signal.setitimer(signal.ITIMER_REAL, left, 0.5)
            try:
                exec(compile(source, name, "exec"), ns)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _TimeUp:
            return ns, errors, (f"timed out after {limit:g} s in cell {n} (an infinite loop, "
                                "or too slow?); the cells after it did not run")
        except BaseException as exc:  # the learner's error: noted, the notebook goes on
            errors.append([n, f"{_text(exc)}{outcomes.where(exc)}"[:3000]])
        _close_figures()
    return ns, errors, None


def _close_figures() -> None:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close("all")
        except Exception:
            pass


if __name__ == "__main__":
    main()
