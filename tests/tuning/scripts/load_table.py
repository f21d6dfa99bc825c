"""Start the runtime with the table in MCR_TUNING_FILE and print the choice for all_reduce at
1 KiB and 8 MiB, or the error that refused the table. Usage: load_table.py refuse|predict

`refuse` starts MPI only and meets the peer in an MPI barrier before exiting: a rank that
refused first must not tear down connections a peer is still opening."""

import sys

import torch

import mcr
from mcr.tuning.table import TuningTableError

mode = sys.argv[1]
try:
    rt = mcr.init(tuning_predict=mode == "predict", backends="mpi" if mode == "refuse" else "mpi,gloo")
except TuningTableError as exc:
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    print(f"rank {MPI.COMM_WORLD.Get_rank()} refused: {exc}", flush=True)
    raise SystemExit(0) from None
for nbytes in (1024, 8 << 20):
    backend, chunk = rt.router.choose("all_reduce", nbytes, rt.world, torch.float32, "cpu")
    print(f"rank {mcr.get_rank()}: all_reduce {nbytes} -> {backend.name} chunk {chunk}", flush=True)
entries = [e for e in rt.router.table.entries if e.group_size == mcr.get_world_size()]
print(f"rank {mcr.get_rank()}: {len(entries)} entries, predicted {all(e.predicted for e in entries)}", flush=True)
mcr.finalize()
