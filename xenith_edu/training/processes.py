"""Data parallelism across worker processes on one machine: no interpreter lock between shards.
The same shards and the same average as `threads.py` ("Many processes" chapter), bit for bit.

Why processes. Two threads of one interpreter hand its lock back and forth at every NumPy call,
and at the book's sizes that costs a tenth to a fifth of the step, more when the two threads
fall into step with each other (benchmarks/README.md has the measured figures). A worker process
has an interpreter of its own. The parameters reach it through one block of memory that every
process maps (the trainer keeps its parameters there, `shared`, so that nothing is copied; other
callers' parameters are copied in at each call); its windows go down a pipe; its gradients come
back through a block of its own, where the caller reads them in place as it sums the shards.

A worker is `python -m xenith_edu.training.shard_worker`: a fresh interpreter that imports nothing
of the caller's script, so a script without `if __name__ == "__main__"` is safe. A block is a
file that is removed from its folder as soon as it is made; the workers inherit its open file
descriptor, so nothing is left behind however any process ends. Ctrl-C reaches only the caller
(a worker ignores SIGINT, and the caller stops it); a worker whose caller dies reads the end of
its pipe and exits; a worker that dies makes the call raise RuntimeError. After any failure or
interrupt in a call the workers are stopped (a pipe may be left mid-message), and the next call
starts new ones. POSIX systems only: elsewhere `batch_shards` gives threads, and
`ProcessShards` of more than one process raises OSError saying so.
"""

from __future__ import annotations

import mmap
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import IO, BinaryIO, NamedTuple

import numpy as np
from threadpoolctl import ThreadpoolController

from ..model import Config, loss_and_grads
from .config import PARALLEL
from .threads import Params, ThreadShards, average_shards, check_count, shard_bounds

# Shape legend: B batch (windows), S positions.

_ALIGN = 64  # each array starts on a cache line of its own
_STOP_WAIT = 5.0  # seconds a worker has to end once told to stop; then it is killed
POSIX = os.name == "posix"  # whether worker processes can be had (pass_fds, unnamed files):
# this module's own answer, which a test changes without changing os.name for the process


class Layout(NamedTuple):
    """Where each array of a dict sits in one mapped block: (name, shape, dtype, offset)."""

    items: tuple[tuple[str, tuple[int, ...], str, int], ...]
    nbytes: int


def layout_of(arrays: Params) -> Layout:
    """The layout of `arrays` packed one after the other, in their order."""
    items, offset = [], 0
    for name, a in arrays.items():
        items.append((name, tuple(a.shape), a.dtype.str, offset))
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    return Layout(tuple(items), max(offset, _ALIGN))


def views(buf: mmap.mmap, layout: Layout) -> Params:
    """The arrays of `layout` as views of the mapped block `buf`."""
    return {name: np.ndarray(shape, np.dtype(dtype), buf, offset)
            for name, shape, dtype, offset in layout.items}


class Block(NamedTuple):
    """A block of memory that the caller and its workers map: its open file and its arrays."""

    fd: int  # the file, already removed from its folder: the workers inherit this descriptor
    layout: Layout
    arrays: Params  # views of the caller's mapping


def new_block(layout: Layout) -> Block:
    """A block for `layout`, its space reserved: in memory (/dev/shm) where the system has room
    there, else in the temporary folder (a small /dev/shm, as in many containers, would
    otherwise kill the process that first touches a page beyond its size)."""
    folders = [tempfile.gettempdir()]
    if os.access("/dev/shm", os.W_OK):
        folders.insert(0, "/dev/shm")
    for i, folder in enumerate(folders):
        last = i == len(folders) - 1
        try:
            fd, path = tempfile.mkstemp(prefix="xenith-edu-shard-", dir=folder)
        except OSError:
            if last:
                raise
            continue
        os.unlink(path)  # no name to leave behind: the descriptor is the block
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, layout.nbytes)  # ENOSPC now, not a crash later
            else:
                os.ftruncate(fd, layout.nbytes)
            return Block(fd, layout, views(mmap.mmap(fd, layout.nbytes), layout))
        except OSError:
            os.close(fd)
            if last:
                raise
    raise AssertionError("unreachable")


# -- the worker's side ----------------------------------------------------------------------

def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """A worker's loop on the binary streams `inp` and `out`: one request, one reply, until
    the caller says stop or goes away. The first request is ("map", p, g): the descriptors and
    layouts of the parameters' and the gradients' blocks; then (seq, cfg, x, y, recompute) for
    each call, cfg None when it is the previous call's; replies: (seq, loss, error)."""
    from ..tools.perf import keep_freed_memory  # why here: the worker's own process setting

    keep_freed_memory()
    ThreadpoolController().limit(limits=1, user_api="blas")  # one core, for the worker's life
    try:
        tag, (p_fd, p_layout), (g_fd, g_layout) = pickle.load(inp)
    except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
        return
    if tag != "map":  # not a caller of this protocol: nothing to map, nothing to answer
        return
    params = views(mmap.mmap(p_fd, p_layout.nbytes), p_layout)
    grads = views(mmap.mmap(g_fd, g_layout.nbytes), g_layout)
    os.close(p_fd)
    os.close(g_fd)
    cfg: Config | None = None
    while True:
        try:
            msg = pickle.load(inp)
        except (EOFError, OSError, pickle.UnpicklingError):  # the caller is gone
            return
        if msg is None:
            return
        seq, new_cfg, x, y, recompute = msg
        cfg = new_cfg if new_cfg is not None else cfg
        reply: tuple[int, float | None, Exception | None]
        try:
            if cfg is None:
                raise ValueError("a shard's first call must carry the model's config")
            loss, g = loss_and_grads(params, cfg, x, y, recompute=recompute)
            for name, dst in grads.items():
                np.copyto(dst, g[name])
            reply = (seq, float(loss), None)
        except Exception as e:  # noqa: BLE001 -- any failure goes back to the caller
            reply = (seq, None, e)
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 -- an error that cannot travel: say what it was
            data = pickle.dumps((seq, None, RuntimeError(f"in a shard's worker: {reply[2]!r} "
                                                         f"({e})")))
        try:
            out.write(data)
            out.flush()
        except (BrokenPipeError, OSError):
            return


# -- the caller's side ----------------------------------------------------------------------

def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """One of a worker's pipes, which Popen made (stdin=PIPE, stdout=PIPE: never None)."""
    if stream is None:
        raise RuntimeError("a worker process was started without its pipes")
    return stream


class _Worker:
    """One worker process, its pipes, and its gradients' block."""

    def __init__(self, params: Block) -> None:
        self.grads = new_block(params.layout)
        env = dict(os.environ)  # where this package is, even if the caller found it by sys.path
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "xenith_edu.training.shard_worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                pass_fds=(params.fd, self.grads.fd))
        except OSError as e:
            os.close(self.grads.fd)
            raise RuntimeError(f"cannot start a worker process for the shards ({e}); share the "
                               "batch among threads instead (parallel='threads')") from e
        self.to_it, self.from_it = _pipe(self.proc.stdin), _pipe(self.proc.stdout)
        self.cfg: Config | None = None
        self.seq = 0
        try:
            self.send(("map", (params.fd, params.layout), (self.grads.fd, params.layout)))
        except BaseException:  # it died at once, or we were interrupted: leave nothing behind
            self.close()
            raise

    def send(self, msg: object) -> None:
        pickle.dump(msg, self.to_it, protocol=pickle.HIGHEST_PROTOCOL)
        self.to_it.flush()

    def receive(self) -> tuple:
        return pickle.load(self.from_it)

    def close(self) -> None:
        try:
            self.send(None)
            self.to_it.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=_STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.from_it.close()
        os.close(self.grads.fd)


def _close_all(workers: list[_Worker], blocks: list[Block] | None = None) -> None:
    """Stop the workers; with `blocks`, also close those blocks' files (their arrays stay
    valid in the caller as long as something holds them)."""
    while workers:
        workers.pop().close()
    while blocks:
        os.close(blocks.pop().fd)


class ProcessShards:
    """`loss_and_grads` over `processes` shards of each batch: the caller computes the first,
    a worker process each of the others, all with one BLAS thread. The result is the same as
    `ThreadShards`', bit for bit. `close()` (or a `with` block) ends the workers; so does
    dropping the object.
    """

    def __init__(self, processes: int) -> None:
        self.processes = check_count("processes", processes)
        if self.processes > 1 and not POSIX:  # pass_fds, unnamed files
            raise OSError("the shards' worker processes need POSIX (they inherit the memory "
                          "they share as file descriptors): share the batch among threads "
                          "instead (parallel='threads')")
        self._workers: list[_Worker] = []
        self._blocks: list[Block] = []  # the parameters' block, which every worker maps
        self._blas = ThreadpoolController()  # the caller's shard, too, runs on one core
        self._finalizer = weakref.finalize(self, _close_all, self._workers, self._blocks)

    def shared(self, params: Params) -> Params:
        """`params`' values in the block that the workers read: arrays to train in place (as
        AdamW does), which no call then needs to copy. Other arrays work too, copied in.
        With one process there are no workers, and `params` is returned as it is."""
        if self.processes == 1:
            return params
        block = self._block_for(params)
        for name, dst in block.arrays.items():
            if dst is not params[name]:
                np.copyto(dst, params[name])
        return dict(block.arrays)

    def _block_for(self, params: Params) -> Block:
        layout = layout_of(params)
        if not self._blocks or self._blocks[0].layout != layout:  # the first call, or a model
            self.close()  # of other shapes: new blocks, and workers that map them
            self._blocks.append(new_block(layout))
        return self._blocks[0]

    def loss_and_grads(self, params: Params, cfg: Config, x: np.ndarray, y: np.ndarray,
                       recompute: bool = False) -> tuple[float, Params]:
        """The mean loss and gradients of the batch x, y (B, S), as `model.loss_and_grads`."""
        if self.processes == 1 or len(x) < 2:
            return loss_and_grads(params, cfg, x, y, recompute=recompute)
        bounds = shard_bounds(len(x), self.processes)
        try:
            return self._sharded(params, cfg, x, y, recompute, bounds)
        except BaseException:  # an interrupt or an error mid-call: the pipes may be mid-message
            _close_all(self._workers)  # so the workers stop, and the next call starts new ones
            raise

    def _sharded(self, params: Params, cfg: Config, x: np.ndarray, y: np.ndarray,
                 recompute: bool, bounds: list[tuple[int, int]]) -> tuple[float, Params]:
        self.shared(params)  # copies only what is not the block's already
        try:
            while len(self._workers) < len(bounds) - 1:
                self._workers.append(_Worker(self._blocks[0]))
            sent = self._workers[: len(bounds) - 1]
            for w, (lo, hi) in zip(sent, bounds[1:], strict=True):
                w.seq += 1
                w.send((w.seq, None if cfg == w.cfg else cfg, np.asarray(x[lo:hi]),
                        np.asarray(y[lo:hi]), bool(recompute)))
                w.cfg = cfg
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            raise self._lost() from e
        lo, hi = bounds[0]
        with self._blas.limit(limits=1, user_api="blas"):  # the first shard, here
            results = [loss_and_grads(params, cfg, x[lo:hi], y[lo:hi], recompute=recompute)]
        results += [self._result(w) for w in sent]
        return average_shards(bounds, len(x), results)

    def _result(self, w: _Worker) -> tuple[float, Params]:
        try:
            seq, loss, error = w.receive()
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            raise self._lost() from e
        if error is not None:
            raise error
        if seq != w.seq:
            raise RuntimeError(f"a shard's worker answered call {seq} to call {w.seq}")
        return loss, w.grads.arrays

    def _lost(self) -> RuntimeError:
        codes = [w.proc.poll() for w in self._workers]
        return RuntimeError(f"a worker process of the shards ended (exit codes {codes}); the "
                            "next call starts new ones")

    def close(self) -> None:
        """End the worker processes and free the blocks; a later call starts new ones."""
        _close_all(self._workers, self._blocks)

    def __enter__(self) -> ProcessShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def batch_shards(count: int, parallel: str = "processes") -> ProcessShards | ThreadShards:
    """The trainer's way of sharing each batch among `count` workers: processes or threads
    (`TrainConfig.threads` and `TrainConfig.parallel`; threads where the system is not POSIX).
    Both give the same numbers, bit for bit."""
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    if parallel == "processes" and POSIX:
        return ProcessShards(count)
    return ThreadShards(count)


__all__ = ["Block", "Layout", "ProcessShards", "batch_shards", "layout_of", "new_block",
           "serve", "views"]
