"""Framework hooks: switch a framework's communication onto the runtime without touching models.

- `torch_backend`: the torch.distributed backend "mcr" (registered by `import mcr`), for
  `dist.init_process_group(backend="mcr")`, DDP, FSDP and TorchRec.
- `deepspeed`: `install(config)` makes `deepspeed.comm` run on that backend.
- `torchrec`: sharders that offer row-wise sharding on CPU.
- `versions`: the torch and DeepSpeed versions the hooks were tested with, and the warning outside them.

Their cost is measured by `mcr.tools.bench_hooks`, `bench_ddp` and `bench_fsdp2`.
"""

from . import torch_backend  # noqa: F401  (registers backend "mcr")
