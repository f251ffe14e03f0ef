"""Inside the sandbox: run one learner's notebooks, call their functions, send back plain data.
Nothing here judges: the grader, in its own process, decides every verdict from what comes back.

The parent process runs only this module's code: it reads the grader's one request, drops to
the sandbox's uid, sets the limits, imports the package, wraps the package's own function of
each exercise so that a call to it is reported, then forks one child per notebook. The child
executes the notebook's code cells (IPython magics dropped) and calls each exercise's function
on the grader's inputs; the parent relays the child's frames and stops a child that overruns.
A child that dies or overruns while a function runs is replaced by a new one, which executes
the notebook again and goes on with the next exercise.
"""

from __future__ import annotations

import builtins
import linecache
import os
import re
import resource
import signal
import sys
import time
import traceback
import types

from . import wire

# A line that calls an exercise's check: the grader calls the function itself, on hidden cases.
CHECK_LINE = re.compile(r"^(\s*)(?:_\s*=\s*|assert\s+)?check_\w+\(\s*[A-Za-z_]\w*\s*\)"
                        r"(?:\.passed)?\s*;?\s*$")
EXEC_GRACE = 5.0  # seconds past the notebook's own time limit before the parent stops it
_STATE: dict = {"active": None, "hits": set()}  # the exercise being called, and the calls seen
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
        _set_limits(msg["limits"])
        os.environ["MPLBACKEND"] = "Agg"
        import numpy  # noqa: F401  the package and its dependencies, before any learner code

        import xenith_edu  # noqa: F401

        for exercises in (nb["exercises"] for nb in msg["notebooks"]):
            for ex in exercises:
                ex["wrapped"] = _wrap(ex["id"], ex["targets"])
    except Exception as exc:  # the request or the setup failed: say so, the grader records it
        wire.write_frame(rep, wire.pack({"op": "error", "text": _text(exc)}))
        os._exit(3)
    wire.write_frame(rep, wire.pack({"op": "ready"}))  # set up; no learner code has run yet
    for i, nb in enumerate(msg["notebooks"]):
        _serve_notebook(i, nb, msg, req, rep)
        wire.write_frame(rep, wire.pack({"op": "notebook", "nb": i}))
    wire.write_frame(rep, wire.pack({"op": "bye"}))
    os._exit(0)


def _text(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


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
# The package's own function of an exercise, wrapped to report a call.


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    return getattr(sys.modules.get(module) or __import__(module, fromlist=[attr]), attr)


def _wrap(exercise: str, targets: list[str]) -> list[str]:
    """Replace each target function, wherever the package holds it, by one that reports."""
    done = []
    specs = getattr(sys.modules.get("xenith_edu.exercises"), "SPECS", {})
    for dotted in targets:
        try:
            if dotted.startswith("spec:"):  # the check's own reference function
                original = specs[dotted[5:]].reference
                dotted = f"the reference of check_{dotted[5:]}"
            else:
                original = _resolve(dotted)
                home = f"{getattr(original, '__module__', '')}.{getattr(original, '__name__', '')}"
                dotted = home if home.startswith("xenith_edu.") else dotted
        except (ImportError, AttributeError, ValueError, KeyError):
            continue
        if not callable(original) or getattr(original, "_xenith_reports", None):
            continue
        wrapper = _reporter(original, exercise, dotted)
        for module in [m for n, m in list(sys.modules.items())
                       if (n == "xenith_edu" or n.startswith("xenith_edu."))
                       and not n.startswith("xenith_edu.classroom")]:
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, wrapper)
        _wrap_spec(original, wrapper)
        done.append(dotted)
    return done


def _wrap_spec(original: object, wrapper: object) -> None:
    for spec in getattr(sys.modules.get("xenith_edu.exercises"), "SPECS", {}).values():
        if getattr(spec, "reference", None) is original:
            spec.reference = wrapper


def _reporter(original, exercise: str, dotted: str):
    def reporting(*args, **kwargs):
        if _STATE["active"] == exercise:
            _STATE["hits"].add(dotted)
        return original(*args, **kwargs)

    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(reporting, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    reporting._xenith_reports = True
    return reporting


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

    Only the frames a child sends ("ran", "result", "exercise") pass; anything else it writes
    is dropped. After "ran", the grader's inputs go to the child: they never existed in the
    sandbox while the learner's cells ran.
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
            if got.get("nb") != i or op not in ("ran", "result", "exercise", "done") or \
                    (op == "ran") == ran:
                continue  # forged by the learner's code, or out of order
            if op == "done":
                return None
            wire.write_frame(rep, frame)
            if op == "ran":
                ran = True
                try:
                    wire.write_frame(iw, wire.read_frame(req, time.monotonic() + 60))
                except (wire.ChannelError, OSError):
                    return {"ex": None}  # the grader has gone, or the child has
            elif op == "result":
                calls += 1
                continue
            else:
                ex, calls = ex + 1, 0
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
                               else f"not callable: {type(fn).__name__} {_short(fn)}")
    wire.write_frame(w, wire.pack({"op": "ran", "nb": i, "errors": errors, "stopped": stopped,
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
                wire.write_frame(w, _call(i, k, j, ex["id"], fn, args))
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


def _call(i: int, k: int, j: int, exercise: str, fn, args: tuple) -> bytes:
    """One call of the learner's function, as a frame: the value (or what it raised), the
    arguments as the function left them, and the package functions it handed the work to."""
    import warnings

    import numpy as np

    raised, got = None, None
    _STATE["hits"] = set()
    _STATE["active"] = exercise
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = fn(*args)
    except NotImplementedError:
        raised = ["NotImplementedError", "", ""]
    except BaseException as exc:  # the learner's error is a verdict, not a crash
        raised = [type(exc).__name__, str(exc)[:2000], _where(exc)]
    _STATE["active"] = None
    seconds = time.perf_counter() - t0
    blobs: list[bytes] = []
    try:
        out = None if raised else wire.encode_value(got, blobs)
        after = [wire.encode_value(a, blobs) for a in args]
    except RecursionError:
        blobs, out, after = [], None, []
        raised = ["RecursionError", "the returned value is nested too deeply to be read", ""]
    return wire.pack({"op": "result", "nb": i, "ex": k, "call": j, "out": out, "raised": raised,
                      "after": after, "delegated": sorted(_STATE["hits"]),
                      "seconds": seconds}, blobs)


def _where(exc: BaseException) -> str:
    """' (line 3: `x / rms`)' for the last frame of the learner's own code, or ''."""
    import numpy as np

    numpy_dir = os.path.dirname(np.__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(numpy_dir) and not f.filename.startswith(_HERE)]
    if not frames or frames[-1].lineno is None:
        return ""
    f = frames[-1]
    return f" (line {f.lineno}: `{f.line.strip()}`)" if f.line else f" (line {f.lineno})"


def _cells(path: str) -> list[tuple[int, str]]:
    """(cell number from 1, source) of each code cell, IPython magics and shell lines dropped."""
    import json

    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    out = []
    for n, cell in enumerate(nb.get("cells", []), start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if source.lstrip().startswith("%%"):
            continue
        lines = [ln for ln in source.split("\n") if not ln.lstrip().startswith(("%", "!"))]
        lines = [CHECK_LINE.sub(r"\1pass", ln) for ln in lines]
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
        cells = _cells(path)
    except (OSError, ValueError, AttributeError) as exc:
        return ns, [], f"unreadable: {_text(exc)}"
    errors: list = []
    deadline = time.monotonic() + limit
    signal.signal(signal.SIGALRM, _on_alarm)
    for n, source in cells:
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
            errors.append([n, f"{_text(exc)}{_where(exc)}"])
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
