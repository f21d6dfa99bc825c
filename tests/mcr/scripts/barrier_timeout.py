"""A barrier with a timeout of its own, on 2 ranks under mpiexec (where barriers run on MPI).

    barrier_timeout.py api|dist

api: `mcr.barrier(timeout=)`; dist: `dist.barrier(timeout=)` on backend "mcr". Both ranks pass
a timed barrier they both join, and an untimed one; then rank 0 waits in a timed barrier on a
new group that rank 1 joins never, and both go on with an all-reduce on the world (rank 1 waits
there for rank 0), then leave the new group. Each rank reports where its barriers ran, the error its
late barrier raised and how long that took, and the all-reduce's result.
"""

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import mcr
from mcr.flight import ROUTE
from mcr.hooks import torch_backend
from tests.report import report

TIMEOUT_S = 0.5

mode = sys.argv[1]
if mode == "dist":
    torch_backend.init_process_group()
    new_group, barrier, all_reduce = dist.new_group, dist.barrier, dist.all_reduce
else:
    mcr.init()
    new_group, barrier, all_reduce = mcr.new_group, mcr.barrier, mcr.all_reduce
rank, rt = mcr.get_rank(), mcr.api.runtime()


def ran_on() -> str:
    """The backend that ran this rank's last op (its flight-recorder entry)."""
    return rt.recorder.entries()[-1][ROUTE].op.label


barrier(timeout=timedelta(seconds=60) if mode == "dist" else 60)  # mcr.barrier also takes seconds
timed_on = ran_on()
barrier()
untimed_on = ran_on()

late = new_group([0, 1])
error, waited = None, None
if rank == 0:
    started = time.monotonic()
    try:
        barrier(group=late, timeout=timedelta(seconds=TIMEOUT_S) if mode == "dist" else TIMEOUT_S)
    except RuntimeError as exc:
        error = str(exc)
    waited = round(time.monotonic() - started, 2)
# rank 1 meets rank 0 here, past its late barrier, and only then leaves the late group: the barrier
# can end by its timeout alone, however busy the machine
t = torch.tensor([10.0 * (rank + 1), rank + 0.5])
all_reduce(t)
if mode == "dist":
    dist.destroy_process_group(late)
else:
    rt.release_group(late)
report(
    "BARRIER",
    rank,
    value={"timed": timed_on, "untimed": untimed_on, "error": error, "waited": waited, "sum": t.tolist()},
)
if mode == "dist":
    dist.destroy_process_group()
else:
    mcr.finalize()
