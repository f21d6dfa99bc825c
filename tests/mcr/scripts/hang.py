"""Rank 1 skips one op (or dies): the job must fail naming the rank, op and backend.

hang.py MODE BACKEND    MODE: hang (rank 1 never issues the second all-reduce), die (rank 1
                        exits), async (rank 0 waits on an async handle rank 1 never
                        matches), finalize (rank 1 never finalizes)
"""

import os
import sys
import time

import torch

import mcr

mode, backend = sys.argv[1], sys.argv[2]
mcr.init()
rank = mcr.get_rank()
mcr.all_reduce(torch.ones(4), backend=backend)  # everyone is up
if rank == 1:
    if mode == "die":
        os._exit(3)
    time.sleep(120)  # never issues the op below, never finalizes
if mode == "finalize":
    mcr.finalize()
    print("unreachable: finalize completed without rank 1", flush=True)
elif mode == "async":
    mcr.all_reduce(torch.ones(4), backend=backend, async_op=True).wait()
    print("unreachable: async all_reduce completed without rank 1", flush=True)
else:
    mcr.all_reduce(torch.ones(4), backend=backend)
    print("unreachable: all_reduce completed without rank 1", flush=True)
