"""Rank 1 skips one all-reduce (or dies): the job must fail naming the rank, op and backend."""

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
    time.sleep(120)  # never issues the op below
mcr.all_reduce(torch.ones(4), backend=backend)
print("unreachable: all_reduce completed without rank 1", flush=True)
