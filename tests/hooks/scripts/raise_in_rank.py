"""Start torch.distributed on backend "mcr", then fail: every rank's traceback must reach the output."""

import torch.distributed as dist

from mcr.hooks import torch_backend

torch_backend.init_process_group()
dist.barrier()  # both ranks past init: a rank that aborts first must not cut its peer's start-up short
raise AssertionError(f"rank {dist.get_rank()} uncaught after init_process_group")
