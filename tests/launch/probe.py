"""What a job's ranks see: each rank's view of the launch, checked across the world through mcr.

Run by job scripts: `python -m tests.launch.probe [backends=B] [key=value ...]` (default gloo; the
other overrides a job script appends for trainers, out_dir= and name=, are ignored). Every rank
all-gathers (rank, local rank, local world size, world size from the launcher's view), its
hostname and the rendezvous address its runtime really used (the store behind gloo), rendezvousing
at the MASTER_ADDR/PORT the job script exported; rank 0 prints them, one line per rank. Every rank
also prints the GPU variables it was started with (its GPU, its MPI's GPU switch, NCCL's
network plugin and where the libraries are looked for).
"""

import os
import socket
import sys

import torch

import mcr
from mcr.env import discover, threads_per_rank

WIDTH = 64  # bytes for each rank's hostname and rendezvous address
GPU_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "OMPI_MCA_pml_pami_enable_cuda",
    "MPICH_GPU_SUPPORT_ENABLED",
    "MV2_USE_CUDA",
    "NCCL_NET",
    "FI_MR_CACHE_MONITOR",
    "LD_LIBRARY_PATH",
)


def encoded(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()[:WIDTH].ljust(WIDTH, b"\0")), dtype=torch.uint8)


def decoded(t: torch.Tensor) -> str:
    return bytes(t.tolist()).rstrip(b"\0").decode()


def say(*words: str) -> None:
    """One line in one write: the ranks share the job's output, and under PYTHONUNBUFFERED (the
    tests set it, as many job scripts do) print() writes each word apart, so a peer's line landed
    inside this one (rank 2's "probe-env" line cut after "gpu" by rank 3's, seen once under load)."""
    os.write(1, (" ".join(words) + "\n").encode())


overrides = dict(arg.split("=", 1) for arg in sys.argv[1:])
info = discover()
say(f"probe-env: rank {info.rank} gpu", *(f"{key}={os.environ.get(key, '')}" for key in GPU_VARIABLES))
rt = mcr.init(backends=overrides.get("backends", "gloo"))
n = mcr.get_world_size()
mine = torch.tensor([info.rank, info.local_rank, info.local_world_size, n], dtype=torch.int64)
everyone = [torch.zeros(4, dtype=torch.int64) for _ in range(n)]
mcr.all_gather(everyone, mine)
store = rt.store.underlying_store
where = torch.cat([encoded(socket.gethostname()), encoded(f"{store.host}:{store.port}")])
places = [torch.zeros(2 * WIDTH, dtype=torch.uint8) for _ in range(n)]
mcr.all_gather(places, where)
if info.rank == 0:
    say(f"probe: launcher {info.launcher}; master {info.master_addr}:{info.master_port}")
    say(f"probe: backends {', '.join(rt.backends)}")
    for row, place in zip(everyone, places):
        host, rendezvous = decoded(place[:WIDTH]), decoded(place[WIDTH:])
        say("probe: rank {} local {} of {} world {}".format(*row.tolist()), f"host {host} rendezvous {rendezvous}")
    say(f"probe: threads {threads_per_rank(info.local_world_size)} (the trainers' rule)")
    say(f"probe: mpi_yield_when_idle {os.environ.get('OMPI_MCA_mpi_yield_when_idle')}")
mcr.finalize()
