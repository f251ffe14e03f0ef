"""The sandbox a submission runs in: bubblewrap, an unprivileged uid, no network, rlimits.
Where bubblewrap is missing, the same worker runs with only the limits, and one warning says so.

One sandbox per learner: a private copy of the learner's folder in a size-capped tmpfs home,
a size-capped /tmp and /dev/shm and nothing else writable, the rest of the filesystem read-only
(only what Python, NumPy and the package need, without the exercise catalogue) or absent, its
own PID, network, IPC and UTS namespaces, a uid of its own (leased for the run when the grader
is root, a fresh user namespace otherwise), a scrubbed environment, no controlling terminal,
limits on memory, CPU time, processes, file size and open files, and a wall-clock deadline.
Its whole process tree has ended when `run_sandbox` returns. Its replies are untrusted input:
`wire.Conversation` holds them to the protocol, and a breach is the learner's "protocol error".
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import wire
from .roster import MAX_FOLDER, walk

HOME = "/home/learner"  # where the sandbox sees the copy of the learner's folder
SUBMISSION = "/submission"  # the grader's copy, read-only: the worker fills HOME from it
UID_BASE, UID_COUNT = 65000, 1000  # as root, each sandbox leases a free uid of this range
LEASES = "/run/xenith-edu-uids"  # root's lock files, one per uid: a uid is leased while locked
EXERCISES_DIR = Path(__file__).resolve().parent.parent / "exercises"
OPEN_EXERCISES = ("outcomes.py",)  # the exercise floor's files the sandbox sees: the runner
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # xenith_edu
WARNING = ("warning: bubblewrap (bwrap) is not installed, so the learners' code is NOT "
           "isolated: it can read and write every file your user can, use the network, and "
           "leave processes behind; only the time, memory, CPU, process and file-size limits "
           "apply (install bubblewrap, e.g. apt-get install bubblewrap, or grade in a VM)")


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use. memory: bytes of address space per process."""

    memory: int = 2 * 2**30
    cpu: int = 600  # seconds of CPU time per process
    nproc: int = 64  # processes and threads of the sandbox's uid
    fsize: int = 256 * 2**20  # bytes: the largest file it may write
    nofile: int = 256
    home: int = MAX_FOLDER + 64 * 2**20  # bytes of the tmpfs home: the copy and what it writes
    tmp: int = 64 * 2**20  # bytes of /tmp, and again of /dev/shm

    def as_dict(self) -> dict:
        return {"memory": self.memory, "cpu": self.cpu, "nproc": self.nproc,
                "fsize": self.fsize, "nofile": self.nofile, "core": 0, "home": self.home,
                "tmp": self.tmp}


def bwrap() -> str | None:
    """The bubblewrap executable, or None where it is not installed."""
    return shutil.which("bwrap")


def isolation() -> str:
    """A one-line description of the isolation grading gets on this machine."""
    if bwrap():
        return ("bubblewrap: private copy of the learner's folder, read-only system, no "
                "network, own PID namespace, unprivileged uid, scrubbed environment, rlimits")
    return "none (bubblewrap missing): rlimits, scrubbed environment and time limits only"


class FolderTooLarge(ValueError):
    """A learner's folder is over one of `roster.walk`'s limits."""


def private_copy(source: Path, into: Path) -> Path:
    """Copy the learner's notebook or folder into `into`/learner: the regular files and
    folders `roster.walk` lists, opened without following a link, at most their listed size."""
    dest = into / "learner"
    dest.mkdir()
    found = walk(source)
    if found.over:
        raise FolderTooLarge(found.over)
    for rel in found.folders:
        (dest / rel).mkdir()
    folder = source.is_dir() and not source.is_symlink()
    for rel, size in found.files:
        _copy_file(os.path.join(source, rel) if folder else str(source), dest / rel, size)
    return dest


def _copy_file(src: str, dest: Path, size: int) -> None:
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # gone since the walk: not copied
    with os.fdopen(fd, "rb") as f, open(dest, "xb") as out:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return
        while size > 0 and (chunk := f.read(min(size, 1 << 20))):
            out.write(chunk)
            size -= len(chunk)


def _chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def remove_tree(path: Path) -> None:
    """Remove a sandbox's folder, even where the learner's code took permissions away."""
    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        try:
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


# ----------------------------------------------------------------------------------------------
# The bubblewrap command line.


def _read_only_paths() -> list[str]:
    """What Python, NumPy and the package need, and nothing above it."""
    import numpy  # only to find its files for the binds

    wanted = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
              str(PACKAGE_DIR), os.path.dirname(os.path.dirname(numpy.__file__))}
    paths: list[str] = []
    for p in sorted({os.path.realpath(w) for w in wanted} | wanted, key=len):
        if os.path.isdir(p) and p != "/" and not any(p == q or p.startswith(q.rstrip("/") + "/")
                                                      for q in paths + ["/usr"]):
            paths.append(p)
    return paths


def link_hops(path: str) -> list[str]:
    """The links an executable's path passes through before its file, each as its own path
    (a venv's bin/python3 -> /opt/py/python3 -> ...): the sandbox binds each one to the file
    it ends at, so the chain holds inside wherever its links live. A loop ends the walk."""
    hops: list[str] = []
    p = os.path.abspath(path)
    while os.path.islink(p) and p not in hops and len(hops) < 40:
        hops.append(p)
        p = os.path.join(os.path.dirname(p), os.readlink(p))
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
    return hops


def _others_can_read(paths: list[str]) -> bool:
    for p in paths:
        parts = Path(p).parts
        for n in range(1, len(parts) + 1):
            if not os.stat(Path(*parts[:n])).st_mode & 0o005 == 0o005:
                return False
    return True


def _ancestors(paths: list[str]) -> list[str]:
    made: list[str] = []
    for p in paths:
        parts = Path(p).parts
        for n in range(2, len(parts)):
            a = str(Path(*parts[:n]))
            if a not in made and a != "/usr" and not a.startswith("/usr/"):
                made.append(a)
    return made


def bwrap_command(workdir: Path, info_fd: int, extra_ro: list[tuple[str, str]],
                  limits: dict | None = None) -> list[str]:
    """The bwrap arguments for a sandbox whose learner's copy is `workdir`."""
    limits = limits or Limits().as_dict()
    cmd = [bwrap() or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
           "--die-with-parent", "--new-session", "--clearenv", "--info-fd", str(info_fd),
           "--ro-bind", "/usr", "/usr"]
    if os.getuid() == 0:  # the worker drops to its own uid itself: it keeps only that right
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # a private /tmp first: the read-only binds below go on top of it, so a checkout or an
    # environment that lives under /tmp stays visible
    cmd += ["--size", str(int(limits["tmp"])), "--perms", "1777", "--tmpfs", "/tmp",
            "--perms", "0777", "--dir", "/tmp/matplotlib"]
    ro = _read_only_paths()
    hops = [h for h in link_hops(sys.executable)
            if not any(h.startswith(q.rstrip("/") + "/") for q in ro + ["/usr"])]
    for a in _ancestors(ro + [HOME, SUBMISSION] + hops):
        cmd += ["--perms", "0755", "--dir", a]
    for p in ro:
        cmd += ["--ro-bind", p, p]
    for h in hops:  # each a link outside the folders above: bound as the file it ends at
        cmd += ["--ro-bind", os.path.realpath(h), h]
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--size", str(int(limits["tmp"])), "--perms", "1777", "--tmpfs", "/dev/shm"]
    for src, dest in extra_ro:
        cmd += ["--ro-bind", src, dest]
    cmd += _fence(ro)
    cmd += ["--ro-bind", str(workdir), SUBMISSION,
            "--size", str(int(limits["home"])), "--perms", "0777", "--tmpfs", HOME,
            "--chdir", HOME, "--remount-ro", "/", "--remount-ro", "/dev"]
    for key, value in environment(HOME, "/tmp/matplotlib").items():
        cmd += ["--setenv", key, value]
    return cmd + ["--"]


def _fence(ro: list[str]) -> list[str]:
    """Every copy of the exercise catalogue the sandbox could see, replaced by a read-only
    folder that holds only the runner: no reference function is there to import or read."""
    found = {str(EXERCISES_DIR)}
    for entry in sys.path:
        candidate = os.path.join(entry, "xenith_edu", "exercises")
        if entry and os.path.isdir(candidate):
            found.add(os.path.realpath(candidate))
    cmd: list[str] = []
    for folder in sorted(found):
        if not any(folder == q or folder.startswith(q.rstrip("/") + "/") for q in ro):
            continue  # not visible in the sandbox anyway
        cmd += ["--size", str(2**20), "--perms", "0755", "--tmpfs", folder]
        for name in OPEN_EXERCISES:
            if os.path.isfile(os.path.join(folder, name)):
                cmd += ["--ro-bind", os.path.join(folder, name), os.path.join(folder, name)]
        cmd += ["--remount-ro", folder]
    return cmd


def environment(home: str, mpl: str) -> dict[str, str]:
    """The whole environment the learner's code sees: nothing of the grader's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "MPLBACKEND": "Agg", "MPLCONFIGDIR": mpl, "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": "/tmp"}


def check_works() -> None:
    """Raise ValueError, in one line, if bubblewrap is installed but cannot sandbox here."""
    if not bwrap():
        return
    with tempfile.TemporaryDirectory(prefix="xenith-probe-") as tmp:
        cmd = bwrap_command(Path(tmp), 2, []) + [sys.executable, "-I", "-c", "pass"]
        run = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    if run.returncode != 0:
        text = run.stderr.decode("utf-8", "replace")
        text = re.sub(r"^\s*\{.*?\}", "", text, count=1, flags=re.S)  # bwrap's --info-fd record
        why = " ".join(text.split())[:200] or f"exit status {run.returncode}"
        raise ValueError(f"bubblewrap is installed but cannot make a sandbox here ({why}); "
                         "allow unprivileged user namespaces, or run the grader as root")


def worker_command() -> list[str]:
    """The worker's command line. Before the package is imported, `xenith_edu.exercises` is
    an empty fence whose path is the catalogue's folder (in the sandbox: the runner alone)."""
    boot = ("import sys, types; "
            f"sys.path.insert(0, {str(PACKAGE_DIR.parent)!r}); "
            "fence = types.ModuleType('xenith_edu.exercises'); "
            f"fence.__path__ = [{str(EXERCISES_DIR)!r}]; fence._xenith_fence = True; "
            "sys.modules[fence.__name__] = fence; "
            "from xenith_edu.grader.worker import main; main()")
    return [sys.executable, "-I", "-c", boot]


def font_cache() -> list[tuple[str, str]]:
    """Matplotlib's font list, read-only in the sandbox, so no sandbox rebuilds it."""
    try:
        import matplotlib  # only to find its files for the binds
        from matplotlib import font_manager  # noqa: F401  builds the cache if missing
    except ImportError:
        return []
    found = sorted(Path(matplotlib.get_cachedir()).glob("fontlist-*.json"))
    return [(str(p), f"/tmp/matplotlib/{p.name}") for p in found[-1:]]


# ----------------------------------------------------------------------------------------------
# One sandbox run.


_LIVE: set[subprocess.Popen] = set()  # the sandboxes running now, ended by `stop_all`
_LIVE_LOCK = threading.Lock()
ABORT = threading.Event()  # set when the grader is interrupted: nothing more is journaled


def stop_all() -> None:
    """End every running sandbox now (the grader was interrupted)."""
    ABORT.set()
    with _LIVE_LOCK:
        for proc in list(_LIVE):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@dataclass
class SandboxRun:
    """What came back from one sandbox: the frames, and why it ended if it did not say bye."""

    frames: list[tuple[dict, list[bytes]]]
    problem: str | None  # None when the worker said bye
    stderr: str
    tampered: str | None = None  # the protocol error that ended it: the learner's code wrote


# ----------------------------------------------------------------------------------------------
# A uid of its own: two sandboxes, of one grader or of two, never share a uid or a limit.


def _uid_busy(uid: int) -> bool:
    """Whether `uid` is an account of this machine, or any process runs under it."""
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                return True
        except OSError:
            pass
    return False


def _lease_folder() -> str:
    os.makedirs(LEASES, mode=0o700, exist_ok=True)
    st = os.lstat(LEASES)
    if not os.path.isdir(LEASES) or os.path.islink(LEASES) or st.st_uid != 0 or \
            st.st_mode & 0o022:
        raise ValueError(f"{LEASES} must be a folder of root's that only root may write")
    return LEASES


def lease_uid() -> tuple[int, int]:
    """(uid, fd): a uid of UID_BASE's range that no other sandbox holds and no process runs
    under, held until `fd` is closed (an flock, dropped by the kernel if the grader dies)."""
    folder = _lease_folder()
    for uid in range(UID_BASE, UID_BASE + UID_COUNT):
        fd = os.open(os.path.join(folder, f"{uid}.lock"),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if _uid_busy(uid):
            os.close(fd)
            continue
        return uid, fd
    raise RuntimeError(f"no free uid in {UID_BASE}..{UID_BASE + UID_COUNT - 1} for a sandbox")


def _processes_of_mine() -> int:
    """Processes and threads of this uid now (RLIMIT_NPROC counts them all)."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == os.getuid():
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            pass
    return count


def nproc_limit(nproc: int) -> int | None:
    """The sandbox's RLIMIT_NPROC. As root its uid is its own; under bubblewrap on Linux
    5.14 or later its fresh user namespace counts its processes apart; otherwise it shares
    the teacher's uid, whose processes count too."""
    if os.getuid() == 0:
        return nproc
    if bwrap() and _kernel_at_least(5, 14):
        return nproc
    return nproc + _processes_of_mine() if os.path.isdir("/proc") else None


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return bool(found) and (int(found.group(1)), int(found.group(2))) >= (major, minor)


# ----------------------------------------------------------------------------------------------
# One sandbox run.


def run_sandbox(workdir: Path, request: dict, inputs: list[bytes], seconds: float, slot: int,
                fonts: list[tuple[str, str]]) -> SandboxRun:
    """Run the worker on `request` in a sandbox over `workdir`, stopped after `seconds`;
    `inputs[i]` is the frame sent when notebook i's cells have run. (`slot`, the job's
    number, no longer picks the uid: each run leases its own.)"""
    uid, lease = lease_uid() if os.getuid() == 0 else (None, None)
    try:
        return _run_as(uid, workdir, request, inputs, seconds, fonts)
    finally:
        if lease is not None:
            os.close(lease)


def _run_as(uid: int | None, workdir: Path, request: dict, inputs: list[bytes],
            seconds: float, fonts: list[tuple[str, str]]) -> SandboxRun:
    use_bwrap = bwrap() is not None
    if uid is not None and not use_bwrap and not _others_can_read(_read_only_paths()):
        uid = None  # without a sandbox, another uid could not even read the interpreter
    if uid is not None:
        _chown_tree(workdir, uid)
    err = tempfile.TemporaryFile()
    info_r, info_w = os.pipe()
    if use_bwrap:
        cmd = bwrap_command(workdir, info_w, fonts, request.get("limits")) + worker_command()
        env, cwd = {}, None
    else:
        mpl = workdir.parent / "matplotlib"
        mpl.mkdir(exist_ok=True)
        if uid is not None:
            os.chown(mpl, uid, uid)
        cmd, env, cwd = worker_command(), environment(str(workdir), str(mpl)), str(workdir)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                            env=env, cwd=cwd, pass_fds=(info_w,), start_new_session=True)
    os.close(info_w)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    inner = _inner_pid(info_r) if use_bwrap else None
    os.close(info_r)
    frames: list = []
    # the worker may end the learner's other processes only where it cannot reach anyone
    # else's: in its own PID namespace, or under a uid of its own
    sweep = use_bwrap or uid is not None
    start = {**request, "op": "start", "uid": uid, "sweep": sweep,
             "copy": SUBMISSION if use_bwrap else None, "home": HOME if use_bwrap else None,
             "catalogue": sorted(p.stem for p in EXERCISES_DIR.glob("*.py"))}
    plan = _plan(request, inputs)
    talk = wire.Conversation(plan, _reply_budget(plan, inputs))
    problem, tampered = _converse(proc, start, inputs, seconds, frames, talk)
    _stop(proc, inner)
    with _LIVE_LOCK:
        _LIVE.discard(proc)
    err.seek(0)
    tail = err.read()[-4000:].decode("utf-8", "replace")
    err.close()
    return SandboxRun(frames, problem, tail, tampered)


def _plan(request: dict, inputs: list[bytes]) -> list[list[tuple[str, int, int]]]:
    """Per notebook, (function, number of cases, number of arguments) of each exercise."""
    plan = []
    for nb, frame in zip(request["notebooks"], inputs, strict=True):
        trees = wire.message(frame)[0]["exercises"]
        plan.append([(ex["fn"], len(cases), len(cases[0][1]) if cases else 0)
                     for ex, cases in zip(nb["exercises"], trees, strict=True)])
    return plan


def _reply_budget(plan: list, inputs: list[bytes]) -> int:
    """Bytes a sandbox may send back: every answer at its cap (`wire.answer_cap`), and a
    megabyte for each time a notebook's cells run (its "ran" frame)."""
    calls = sum(c for ex in plan for _, c, _ in ex)
    restarts = sum(len(ex) + 1 for ex in plan)
    return 2**20 * (16 * calls + restarts) + 4 * sum(len(f) for f in inputs)


def _inner_pid(fd: int) -> int | None:
    """The sandbox's PID 1, as bwrap reports it on its info fd."""
    data = b""
    deadline = time.monotonic() + 10
    while b"}" not in data:
        try:
            chunk = wire.read_exact(fd, 1, deadline)
        except wire.ChannelError:
            return None
        data += chunk
    try:
        return int(json.loads(data.decode())["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _converse(proc: subprocess.Popen, request: dict, inputs: list[bytes], seconds: float,
              frames: list, talk: wire.Conversation) -> tuple[str | None, str | None]:
    """Send the request, answer each "ran" with that notebook's inputs, read frames
    until bye; (the problem that ended the run otherwise, the protocol error if it was one).
    The deadline is fixed here: no frame of the learner's extends it."""
    try:
        wire.write_frame(proc.stdin.fileno(), wire.pack(request))
    except OSError:
        return "the sandbox did not start", None
    deadline = time.monotonic() + seconds
    fd = proc.stdout.fileno()
    while True:
        try:
            raw = wire.read_frame(fd, deadline, talk.budget())
            got = wire.message(raw)
            talk.take(len(raw), *got)
        except wire.Tampered as exc:
            return f"protocol error: {exc}", str(exc)
        except wire.Deadline:
            return f"the sandbox was stopped after {seconds:g} s", None
        except wire.ChannelError as exc:
            if frames:
                return ("the sandbox's processes were ended from inside it (by the learner's "
                        "code?)"), None
            return f"the sandbox ended early ({exc})", None
        frames.append(got)
        op, i = got[0].get("op"), got[0].get("nb")
        if op in ("bye", "error"):
            return None, None
        if op == "ran":  # in its place: `talk` took it
            try:
                wire.write_frame(proc.stdin.fileno(), inputs[i])
            except OSError:
                return "the sandbox ended early (it stopped reading)", None


def _stop(proc: subprocess.Popen, inner: int | None) -> None:
    """End the sandbox's whole process tree, and wait until it has ended."""
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass
    for pid in ([inner] if inner else []):
        try:
            os.kill(pid, signal.SIGKILL)  # PID 1 of the sandbox: the kernel ends all the rest
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.wait()
    proc.stdout.close()
    try:
        proc.stdin.close()
    except OSError:
        pass
    if inner:
        _wait_gone(inner)


def _wait_gone(pid: int, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return  # a zombie: ended, waiting for its parent to reap it
        except OSError:
            return
        time.sleep(0.01)
