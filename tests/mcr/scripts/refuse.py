"""Every rank refuses at mcr.init, each in its own words, with MPI already up: rank 1 first, rank 0
only once rank 1 is on its way out (its exit handlers ran; MPI_Finalize, which mpi4py calls last,
then waits for every rank, under Hydra as under Open MPI). mcr's refusal must end a rank as an
exception does (exit 1 through MPI_Finalize), never through MPI_Abort or an exit without
MPI_Finalize: Hydra's mpiexec then kills every other rank before it can say why it refuses.

    refuse.py EVENTS     (a directory the ranks order their steps through: tests.events)

The refusal: an MPI launch with gloo alone in the backends, which has no rendezvous address."""

import atexit
import sys

import mcr
from mcr.backends.mpi import apply_mpi_defaults
from tests import events

apply_mpi_defaults()  # as mcr starts MPI (Open MPI's busy polling starved a loaded machine's ranks)
from mpi4py import MPI  # noqa: E402  MPI_Init: up before mcr.init, as under a script that imports mpi4py first

directory = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
if rank == 0:
    events.wait_mark(directory, "rank 1 exits")
else:
    atexit.register(events.mark, directory, "rank 1 exits")
mcr.init(backends="gloo")
print(f"refuse: rank {rank} went on", flush=True)
