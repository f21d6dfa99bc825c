"""Ops with a known history on every rank, then a fault, for the flight-recorder tests.
Usage: flight.py hang|mismatch|raise|kill|live
  hang:     rank 1 skips the 8th collective and waits in a receive that never comes
  mismatch: rank 1 all-reduces 8 elements where rank 0 all-reduces 4
  raise:    rank 1 raises in its own code once rank 0 waits in an all-reduce
  kill:     rank 1 SIGKILLs itself in a receive once rank 0 waits in an all-reduce, after it
            dumped its record into ../before_kill (what the live record must say too)
  live:     40 ops with a ring of 16 (MCR_FR_SIZE); rank 1 sends itself SIGUSR1 once it waits
            on an async receive, and rank 0 sends only once that dump is written; both ranks
            dump again at finalize (MCR_FR_DUMP_ON_FINALIZE)"""

import os
import signal
import sys
import time

import torch

import mcr
import mcr.env
from tests import events

mode = sys.argv[1]
if mode == "hang" and mcr.env.discover().rank == 1:
    # rank 0's watchdog names the hang; rank 1's, firing first, would end the job before rank 0
    # dumps its stack (Hydra SIGKILLs the other ranks of one that aborts)
    os.environ["MCR_WATCHDOG_TIMEOUT"] = str(3 * float(os.environ.get("MCR_WATCHDOG_TIMEOUT", "10")))
mcr.init()
rank = mcr.get_rank()
t = torch.arange(4, dtype=torch.float32) + 10 * rank
pair = mcr.new_group([0, 1])
for _ in range(3):  # collectives 1-6 on the world: the same on both ranks
    mcr.all_reduce(t)
    out = torch.empty(8)
    mcr.all_gather_into_tensor(out, t)
mcr.broadcast(t, 0, group=pair)
if rank == 0:
    mcr.send(t, 1)
else:
    mcr.recv(t, 0)
mcr.all_reduce(t, async_op=True).wait()  # the world's 7th collective

if mode == "hang":
    if rank == 1:
        mcr.recv(t, 0)  # skipped the all-reduce below: waits for a send rank 0 never makes
    mcr.all_reduce(t)  # rank 0 waits here
elif mode == "mismatch":
    mcr.all_reduce(torch.ones(4 + 4 * rank))
elif mode == "raise":
    here = os.path.dirname(os.path.abspath(os.environ["MCR_FR_DIR"]))  # where the ranks mark their steps (tests.events)
    if rank == 1:
        events.wait_mark(here, "rank 0 waits")
        raise ValueError("a bug in the training script")
    events.when_in_a_wait(mcr.runtime(), lambda: events.mark(here, "rank 0 waits"))
    mcr.all_reduce(t)
elif mode == "kill":
    here = os.path.dirname(os.path.abspath(os.environ["MCR_FR_DIR"]))  # where the ranks mark their steps (tests.events)
    if rank == 1:
        events.wait_mark(here, "rank 0 waits")

        def dump_and_die():
            mcr.dump_flight_record(os.path.join(here, "before_kill"))
            os.kill(os.getpid(), signal.SIGKILL)  # no handler runs: only the live record is left

        events.when_in_a_wait(mcr.runtime(), dump_and_die)
        mcr.recv(t, 0)  # never sent: rank 1 dies in it
    else:
        events.when_in_a_wait(mcr.runtime(), lambda: events.mark(here, "rank 0 waits"))
        mcr.all_reduce(t)
elif mode == "live":
    for _ in range(40):
        mcr.all_reduce(t)
    dumps = os.environ["MCR_FR_DIR"]
    here = os.path.dirname(os.path.abspath(dumps))  # where the ranks mark their steps (tests.events)
    if rank == 1:

        def look_while_waiting():
            os.kill(os.getpid(), signal.SIGUSR1)
            while not os.path.exists(os.path.join(dumps, "mcr_fr_rank_1")):  # written whole (renamed)
                time.sleep(events.POLL_S)
            events.mark(here, "rank 1 dumped")

        events.when_in_a_wait(mcr.runtime(), look_while_waiting)
        handle = mcr.irecv(t, 0)
        handle.wait()  # in it when the signal comes: the dump names this line, the op "started"
        os.replace(os.path.join(dumps, "mcr_fr_rank_1"), os.path.join(here, "sigusr1_rank_1"))  # not finalize's
    else:
        events.wait_mark(here, "rank 1 dumped")
        mcr.send(t, 1)
    print(f"rank {rank} live OK", flush=True)
mcr.finalize()
