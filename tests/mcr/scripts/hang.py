"""Rank 1 fails while rank 0 waits for it: the job must end naming the rank, op and backend.

hang.py FAULT WAIT BACKEND EVENTS
  FAULT  hang: rank 1 never issues the op; kill: rank 1 is SIGKILLed; raise: rank 1 raises an
         exception; close: rank 1 closes its connections (its peer's gloo op fails as if it had
         died), waits until rank 0 has begun reporting that failure, then is SIGKILLed
  WAIT   op: rank 0 blocks in an all-reduce; async: rank 0 waits on an async all-reduce's
         handle; finalize: rank 0 calls finalize(); report: as async, and rank 0, reporting the
         failed op, waits for the launcher's SIGTERM (with FAULT close: the SIGTERM lands while
         it reports, a race seen in CI)
  EVENTS a directory the ranks order their steps through (`tests.events`): rank 1's fault
         comes once rank 0 is in its wait, never earlier, however busy the machine
Rank 1 prints "fault at T" (time.time()) so a test can time the job's end from the fault, and
rank 0 "waits at T" just before it starts the wait that never ends, to time the watchdog from.
"""

import os
import signal
import socket
import sys
import time

import torch

import mcr
from tests import events

fault, wait, backend, directory = sys.argv[1:5]
rt = mcr.init()
rank = mcr.get_rank()
mcr.all_reduce(torch.ones(4), backend=backend)  # everyone is up


def close_connections() -> None:
    """Shut down this process's TCP connections (gloo's pairs, the store's): each peer reads
    the end of its stream, as from a dead process, while this one lives on."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # not a socket
        with sock:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # a listening or unconnected socket


if rank == 1:
    events.wait_mark(directory, "rank 0 waits")
    print(f"fault at {time.time()}", flush=True)
    if fault == "close":
        close_connections()
        events.wait_mark(directory, "rank 0 reports")
        fault = "kill"
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    time.sleep(3600)  # never issues the op below, never finalizes: the watchdog or the test ends it
if wait == "report":
    report = sys.excepthook  # mcr's: prints the error, then aborts the job

    def report_after_the_sigterm(*exc_info):
        events.mark(directory, "rank 0 reports")  # the op's failure is recorded by now (mcr.watchdog)
        time.sleep(3600)  # the launcher, seeing rank 1 dead, sends SIGTERM meanwhile
        report(*exc_info)

    sys.excepthook = report_after_the_sigterm
    wait = "async"
events.when_in_a_wait(rt, lambda: events.mark(directory, "rank 0 waits"))
print(f"rank 0 waits at {time.time()}", flush=True)
if wait == "finalize":
    mcr.finalize()
elif wait == "async":
    mcr.all_reduce(torch.ones(4), backend=backend, async_op=True).wait()
else:
    mcr.all_reduce(torch.ones(4), backend=backend)
print(f"unreachable: rank {rank} finished its {wait} without rank 1", flush=True)
