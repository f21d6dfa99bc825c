"""Run by test_mpi_start under srun: when this rank's MPI_Init returned and when mcr's start of
MPI (which the MPI backend runs before its first message) returned, on the clock the nodes share."""

import socket
import time

import mpi4py

from mcr.backends.mpi import apply_mpi_defaults, start_mpi
from mcr.env import discover

apply_mpi_defaults()
mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402 (MPI_Init, which start_mpi then finds done)

initialized = time.time()
start_mpi(discover())
started = time.time()
print(f"mpi start: rank {MPI.COMM_WORLD.rank} host {socket.gethostname()} init {initialized:.3f} started {started:.3f}")
