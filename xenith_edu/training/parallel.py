"""Data-parallel training on MPI: K processes train one model, each on a shard of the batch.
The "Many processes" chapter derives it: the gradient of a mean is the mean of the shards'.

Every rank draws the same global batch (one generator, the one a single process would use),
keeps its shard of B/K windows, computes the loss and the gradients of that shard, and an
all-reduce averages them, so that every rank takes the same AdamW step. Only rank 0 writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, overload

import numpy as np

from ..model import Config, backward, forward, loss_and_grads
from ..model.params import PARAM
from ..tools.util import one_line
from .step import TrainingDiverged, evaluate

# Shape legend: B global batch, K ranks, S positions, E evaluation windows, L layers.

Params = dict[str, np.ndarray]
T = TypeVar("T")
TIMEOUT = 300.0  # seconds without progress after which a rank decides another one is stuck
# seconds between a failing rank's one line and MPI_Abort: without it, MPICH's launcher once
# lost the line under load (a test run of `make test`: exit status 1, nothing on stderr)
_ABORT_GRACE = 0.25
_LAUNCHERS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")  # MPICH, Open MPI


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpiexec, mpirun, srun) started this process."""
    return any(name in os.environ for name in _LAUNCHERS)


def srun_without_mpi() -> bool:
    """Whether Slurm's srun started several tasks without an MPI interface (no --mpi)."""
    return not launched_by_mpi() and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1


def launcher_rank() -> int | None:
    """This process's rank as the launcher's environment gives it, before MPI starts."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return None


def shard(a: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s share of the rows of `a` (B, ...): rows rank*B/K up to (rank+1)*B/K."""
    n = len(a) // size
    return a[rank * n:(rank + 1) * n]  # (B/K, ...)


def ring_allreduce_bytes(n_bytes: float, size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `n_bytes`: 2 (K-1)/K of them."""
    return 2 * (size - 1) / size * n_bytes


class Stopped(Exception):
    """This rank stops because a rank failed; the one line saying why is already printed."""

    def __init__(self, code: int) -> None:
        super().__init__(f"stopped with exit status {code}")
        self.code = code


class DataParallel:
    """The K ranks of one training run, seen from one of them (`rank`, 0 to K-1).

    `loss_and_grads` and `evaluate` have the signatures of the single-process functions, so
    the trainer uses them unchanged. `overlap`: start each layer's all-reduce (Iallreduce) as
    soon as the backward pass has its gradients, and wait for all of them before the step.
    """

    def __init__(self, comm: Any, overlap: bool = False, timeout: float = TIMEOUT) -> None:
        from mpi4py import MPI  # only under mpiexec

        self.MPI, self.comm, self.overlap, self.timeout = MPI, comm, overlap, timeout
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.is_root = self.rank == 0
        self.agreed = False  # whether the ranks have agreed that every check passed
        self.status: Callable[[BaseException], int] = lambda e: 1  # an error's exit status
        self.comm_seconds = 0.0  # spent in (or waiting for) the gradient all-reduce
        self.last_progress = time.monotonic()
        self.sentinel: Sentinel | None = None  # made by `run`, with every rank

    @classmethod
    def from_world(cls, overlap: bool = False, timeout: float = TIMEOUT) -> DataParallel:
        """Every process the launcher started."""
        try:
            from mpi4py import MPI  # only under mpiexec
        except ImportError:
            raise ValueError("this process was started by an MPI launcher, but mpi4py is not "
                             "installed: pip install 'xenith-edu[mpi]' (or see the README on "
                             "clusters)") from None
        return cls(MPI.COMM_WORLD, overlap, timeout)

    def __len__(self) -> int:
        return self.size

    def shard(self, a: np.ndarray) -> np.ndarray:
        return shard(a, self.rank, self.size)

    def ready(self, tc: Any) -> None:
        """Called by `train` after its checks: every rank learns whether all of them passed."""
        if tc.batch_size % self.size:
            raise ValueError(f"batch_size {tc.batch_size} is not divisible by the {self.size} "
                             f"processes: choose a multiple of {self.size} (--batch-size) or "
                             "another number of processes (mpiexec -n)")
        self._agree(None)

    @overload
    def _agree(self, error: BaseException) -> tuple[int, int]: ...  # this rank's failure counts
    @overload
    def _agree(self, error: None) -> None: ...

    def _agree(self, error: BaseException | None) -> tuple[int, int] | None:
        """All ranks say whether their checks failed: None if none did, else the lowest failing
        rank and the exit status every rank takes. A rank that passed raises Stopped."""
        codes = self.comm.allgather(None if error is None else self.status(error))
        self.agreed = True
        failed = [(r, c) for r, c in enumerate(codes) if c is not None]
        if not failed:
            return None
        first, code = failed[0] if len(failed) == self.size else (failed[0][0], 1)
        if error is None:
            raise Stopped(code)  # another rank failed a check, and says why
        return first, code

    def take_comm_seconds(self) -> float:
        """The communication time since the last call (the trainer logs it per step)."""
        seconds, self.comm_seconds = self.comm_seconds, 0.0
        return seconds

    # ---------------------------------------------------------------- gradients and loss

    def loss_and_grads(self, params: Params, cfg: Config, x: np.ndarray, y: np.ndarray,
                       recompute: bool = False) -> tuple[float, Params]:
        """The mean loss and gradients of the global batch x, y (B, S), from this rank's shard.

        Each rank's loss and gradients are means over its B/K windows; the mean over the K
        ranks of these means is the mean over all B windows, the single-process figure.
        `recompute` is the run's choice, which `train_step` passes (as to the model's own).
        """
        self.last_progress = time.monotonic()
        x, y = self.shard(x), self.shard(y)  # (B/K, S) each
        if self.overlap:
            return self._overlapped(params, cfg, x, y, recompute)
        loss, grads = loss_and_grads(params, cfg, x, y, recompute=recompute)  # of this shard
        t0 = time.perf_counter()
        flat = np.concatenate([g.ravel() for g in grads.values()])  # one message, not twelve
        self.comm.Allreduce(self.MPI.IN_PLACE, flat, op=self.MPI.SUM)  # the sum over ranks
        flat /= self.size  # ... and the mean
        grads = dict(zip(grads, _unflatten(flat, grads.values()), strict=True))
        loss = self._mean(loss)
        self.comm_seconds += time.perf_counter() - t0
        return loss, grads

    def _mean(self, value: float) -> float:
        """The mean over the ranks of one number, in float64."""
        buf = np.array([value], dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return float(buf[0] / self.size)

    def _overlapped(self, params: Params, cfg: Config, x: np.ndarray, y: np.ndarray,
                    recompute: bool) -> tuple[float, Params]:
        """The same figures, each layer's all-reduce started as soon as backward has its
        gradients: the communication of layer l overlaps the backward of layers l-1 ... 0."""
        MPI, pending = self.MPI, []  # (names, layer or None, buffer, request)

        def start(names: list[str], l: int | None, arrays: list[np.ndarray]) -> None:
            buf = np.concatenate([a.ravel() for a in arrays])
            pending.append((names, l, buf, self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)))

        def on_layer(l: int, grads_l: Params) -> None:  # called by backward, layer L-1 first
            t0 = time.perf_counter()
            start(list(grads_l), l, list(grads_l.values()))
            MPI.Request.Testall([p[3] for p in pending])  # lets MPI move the earlier ones on
            self.comm_seconds += time.perf_counter() - t0

        _, cache = forward(params, cfg, x, recompute=recompute)
        loss, grads = backward(params, cfg, cache, y, on_layer=on_layer)
        t0 = time.perf_counter()
        rest = [k for k in grads if not PARAM[k].per_layer]  # embedding, final gain, head
        start(rest, None, [grads[k] for k in rest])
        MPI.Request.Waitall([p[3] for p in pending])
        for names, l, buf, _ in pending:
            buf /= self.size
            dsts = [grads[k] if l is None else grads[k][l] for k in names]
            for dst, mean in zip(dsts, _unflatten(buf, dsts), strict=True):
                dst[...] = mean
        loss = self._mean(loss)
        self.comm_seconds += time.perf_counter() - t0
        return loss, grads

    def evaluate(self, params: Params, cfg: Config, x: np.ndarray, y: np.ndarray) -> float:
        """The mean loss over windows x, y (E, S), each rank evaluating E/K of them.

        Also checks that every rank holds the same parameters (a checksum of their bytes).
        """
        self.last_progress = time.monotonic()
        sums = self.comm.allgather(_checksum(params))
        if len(set(sums)) > 1:
            raise RuntimeError(f"the ranks' parameters differ (checksums {sums}): the "
                               "processes no longer train one model")
        buf = np.array([evaluate(params, cfg, self.shard(x), self.shard(y))], np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        self.last_progress = time.monotonic()
        return float(buf[0] / self.size)

    # ---------------------------------------------------------------- failures

    def run(self, fn: Callable[[], T], report: Callable[[BaseException], int],
            status: Callable[[BaseException], int]) -> T:
        """fn() on this rank, such that a failure anywhere stops every rank with one line.

        Before the ranks agree that the run's checks passed (`ready`), a failing check is
        reported once, by the lowest failing rank, and every rank raises Stopped. After it, a
        rank that fails reports and aborts all of them (the others wait in an all-reduce);
        a rank that sees no progress for `timeout` seconds does the same. `report(e)` prints
        the line and returns the exit status, `status(e)` only returns it.
        """
        self.status = status
        self.sentinel = Sentinel(self.comm)  # reports this rank's death, if it dies
        watchdog = threading.Thread(target=self._watch, daemon=True)
        self.last_progress, self.running = time.monotonic(), True
        watchdog.start()
        try:
            return fn()
        except Stopped:
            raise
        except BaseException as e:
            if not self.agreed:
                first, code = self._agree(e)
                if first == self.rank:
                    report(e if code == status(e) else  # every rank failed the same check
                           RuntimeError(f"rank {self.rank} of {self.size}: {one_line(e)}"))
                raise Stopped(code) from None
            if isinstance(e, TrainingDiverged):  # every rank sees the same losses
                raise Stopped(report(e) if self.is_root else status(e)) from None
            self._abort(e, report)
        finally:
            self.running = False
            self.sentinel.close()  # this rank stops on purpose: nothing to report

    def _watch(self) -> None:
        limit = self.timeout + 4 * _ABORT_GRACE * self.rank  # rank 0 first: one line, not K
        while self.running:
            time.sleep(min(0.5, self.timeout / 10))
            if self.running and time.monotonic() - self.last_progress > limit:
                self._abort(TimeoutError(f"no progress for {self.timeout:.0f} s: another "
                                         "process has stopped or hangs"), _print_line)

    def _abort(self, e: BaseException, report: Callable[[BaseException], int]) -> NoReturn:
        if not isinstance(e, (ValueError, OSError, MemoryError, KeyboardInterrupt,
                              TimeoutError, RuntimeError)):
            traceback.print_exception(e)  # a bug: its traceback, then the line
        if self.sentinel is not None:  # this rank reports: the others' sentinels stay quiet
            self.sentinel.claim()
        code = report(RuntimeError(f"rank {self.rank} of {self.size}: {one_line(e)}; "
                                   "stopping every process"))
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(_ABORT_GRACE)  # the launcher forwards the line before the abort ends it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # MPI_Abort's own message would be a second line
        self.comm.Abort(code)
        raise SystemExit(code)  # (Abort does not return; this rank ends all the same)


# The sentinel: a small process that waits for its rank to end. A rank that ends on purpose
# says so (one byte) first; if it ends without a word (killed, out of memory), the sentinel,
# in a session of its own that the launcher's clean-up does not reach, prints the one line.
# The first process of the job to end on a host claims a marker file there, so that the
# ranks the launcher kills next stay silent (on one host, one line; across hosts, the first
# death on each host is reported).
_SENTINEL = r"""
import os, sys, time
said = sys.stdin.buffer.read()
if said.endswith(b"!"):  # the rank reported an error itself, and claimed the marker
    os.close(2)  # nothing to say: the launcher waits for no stream of ours
    time.sleep(10)
    os.unlink(sys.argv[2])
if said:
    sys.exit(0)
try:
    os.close(os.open(sys.argv[2], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except OSError:
    sys.exit(0)
os.write(2, sys.argv[1].encode() + b"\n")
os.close(2)  # said: the launcher, which waits for every stream it hands out, need not wait
time.sleep(10)  # the launcher kills the other ranks meanwhile: their sentinels find the marker
os.unlink(sys.argv[2])
"""


class Sentinel:
    """The watcher of one rank's end: see _SENTINEL. `close()` says this rank stops on purpose;
    `claim()`, before this rank reports an error itself, keeps the other ranks' sentinels quiet.
    """

    def __init__(self, comm: Any) -> None:
        rank, size = comm.Get_rank(), comm.Get_size()
        self.marker = os.path.join(tempfile.gettempdir(),
                                   f"xenith-edu-{comm.bcast(os.getpid())}.ended")
        line = (f"xenith-edu train: error: rank {rank} of {size} died (killed, or out of "
                "memory: see the launcher's message); the last checkpoint in the run folder is "
                "intact: resume the run with --resume")
        self.proc: subprocess.Popen[bytes] | None
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _SENTINEL, line, self.marker],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError:
            self.proc = None  # no sentinel: the launcher's message alone tells of a death

    def claim(self) -> None:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_WRONLY))
        except OSError:
            pass
        self.close(b"!")  # its sentinel removes the marker, once the launcher is done

    def close(self, word: bytes = b".") -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(word)
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.stdin = None


def _unflatten(flat: np.ndarray, like: Any) -> list[np.ndarray]:
    """Views of `flat`, one per array of `like`, with their shapes, in order."""
    out, offset = [], 0
    for a in like:
        out.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return out


def _checksum(params: Params) -> int:
    crc = 0
    for p in params.values():
        crc = zlib.crc32(np.ascontiguousarray(p).view(np.uint8).ravel().data, crc)
    return crc


def _print_line(e: BaseException) -> int:
    print(f"xenith-edu train: error: {one_line(e)}", file=sys.stderr)
    return 1


__all__ = ["DataParallel", "Stopped", "launched_by_mpi", "launcher_rank", "srun_without_mpi",
           "ring_allreduce_bytes", "shard"]
