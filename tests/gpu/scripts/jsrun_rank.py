"""One rank as jsrun starts it (tests/gpu/test_jsrun_binding.py): no CUDA call before mcr.init,
then the GPU bound after MPI, and an all-reduce on it through MPI and through NCCL."""

import torch

import mcr

before = "no CUDA before init" if not torch.cuda.is_initialized() else "CUDA started before init"
rt = mcr.init(backends="mpi,gloo,nccl")
t = torch.arange(8, dtype=torch.float32, device=rt.device) + 1
mcr.all_reduce(t, backend="mpi")
mpi = "ok" if torch.equal(t.cpu(), torch.arange(8, dtype=torch.float32) + 1) else f"wrong {t.tolist()}"
mcr.all_reduce(t, backend="nccl")
nccl = "ok" if torch.equal(t.cpu(), torch.arange(8, dtype=torch.float32) + 1) else f"wrong {t.tolist()}"
print(f"jsrun rank: {before}; bound {rt.device}; mpi all-reduce {mpi}; nccl all-reduce {nccl}", flush=True)
mcr.finalize()
