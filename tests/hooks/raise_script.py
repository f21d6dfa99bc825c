"""Start torch.distributed on backend "mcr", then fail: the traceback must reach the output."""

from mcr.hooks import torch_backend

torch_backend.init_process_group()
raise AssertionError("uncaught after init_process_group")
