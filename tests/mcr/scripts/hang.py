"""Rank 1 fails while rank 0 waits for it: the job must end naming the rank, op and backend.

hang.py FAULT WAIT BACKEND
  FAULT  hang: rank 1 sleeps, never issuing the op; kill: rank 1 is SIGKILLed; raise: rank 1
         raises an exception
  WAIT   op: rank 0 blocks in an all-reduce; async: rank 0 waits on an async all-reduce's
         handle; finalize: rank 0 calls finalize(); slow-report: as async, but rank 0's report
         of the failed op is slowed, so the launcher's SIGTERM lands while it reports (a race
         seen in CI)
Rank 1 prints "fault at T" (time.time()) so a test can time the job's end from the fault, and
rank 0 "waits at T" just before it starts the wait that never ends, to time the watchdog from.
"""

import os
import signal
import sys
import time

import torch

import mcr

fault, wait, backend = sys.argv[1:4]
mcr.init()
rank = mcr.get_rank()
mcr.all_reduce(torch.ones(4), backend=backend)  # everyone is up
if rank == 1:
    time.sleep(5)  # rank 0 is waiting by now, even on a loaded machine
    print(f"fault at {time.time()}", flush=True)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    time.sleep(120)  # never issues the op below, never finalizes
if wait == "slow-report":
    report = sys.excepthook  # mcr's: prints the error, then aborts the job

    def slow_report(*exc_info):
        time.sleep(60)  # the launcher, seeing rank 1 dead, sends SIGTERM meanwhile
        report(*exc_info)

    sys.excepthook = slow_report
    wait = "async"
print(f"rank 0 waits at {time.time()}", flush=True)
if wait == "finalize":
    mcr.finalize()
elif wait == "async":
    mcr.all_reduce(torch.ones(4), backend=backend, async_op=True).wait()
else:
    mcr.all_reduce(torch.ones(4), backend=backend)
print(f"unreachable: rank {rank} finished its {wait} without rank 1", flush=True)
