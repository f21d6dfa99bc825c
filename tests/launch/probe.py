"""What a job's ranks see: each rank's view of the launch, checked across the world through mcr.

Run by job scripts: `python -m tests.launch.probe [backends=B] [key=value ...]` (default gloo; the
other overrides a job script appends for trainers, out_dir= and name=, are ignored). Every rank
all-gathers (rank, local rank, local world size, node id from the launcher's view) over gloo,
rendezvousing at the MASTER_ADDR/PORT the job script exported; rank 0 prints them.
"""

import os
import sys

import torch

import mcr
from mcr.env import discover, threads_per_rank

overrides = dict(arg.split("=", 1) for arg in sys.argv[1:])
info = discover()
mcr.init(backends=overrides.get("backends", "gloo"))
mine = torch.tensor([info.rank, info.local_rank, info.local_world_size, mcr.get_world_size()], dtype=torch.int64)
everyone = [torch.zeros(4, dtype=torch.int64) for _ in range(mcr.get_world_size())]
mcr.all_gather(everyone, mine)
if info.rank == 0:
    print(f"probe: launcher {info.launcher}; master {info.master_addr}:{info.master_port}", flush=True)
    print(f"probe: backends {', '.join(mcr.runtime().backends)}", flush=True)
    for row in everyone:
        print("probe: rank {} local {} of {} world {}".format(*row.tolist()), flush=True)
    print(f"probe: threads {threads_per_rank(info.local_world_size)} (the trainers' rule)", flush=True)
    print(f"probe: mpi_yield_when_idle {os.environ.get('OMPI_MCA_mpi_yield_when_idle')}", flush=True)
mcr.finalize()
