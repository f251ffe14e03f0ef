"""Run by tests/test_parallel.py under mpiexec: `xenith-edu train` in which one rank misbehaves.

python tests/mpi_worker.py MODE RANK ARGS...: MODE "raise" makes rank RANK fail at its third
gradient (as if out of memory), "hang" makes it stop answering there, "die" kills it there
(SIGKILL), "none" changes nothing.
"""

import os
import signal
import sys
import time

import xenith_edu.training.parallel as parallel
from xenith_edu.cli import main

mode, bad_rank, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
real = parallel.loss_and_grads
calls = [0]


def misbehaving(params, cfg, x, y, **kw):
    calls[0] += 1
    if parallel.launcher_rank() == bad_rank and calls[0] == 3:
        if mode == "raise":
            raise MemoryError("cannot allocate the gradients (a test)")
        if mode == "hang":
            time.sleep(600)
        if mode == "die":  # as the kernel's out-of-memory killer, or kill -9
            os.kill(os.getpid(), signal.SIGKILL)
    return real(params, cfg, x, y, **kw)


parallel.loss_and_grads = misbehaving
sys.exit(main(argv))
