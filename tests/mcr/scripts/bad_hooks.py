"""The hooks refuse what they cannot do, and out-of-order installs, with clear errors (torchrun, 2 ranks)."""

import re

import torch
import torch.distributed as dist

import mcr
from mcr.hooks import deepspeed as ds_hook
from mcr.hooks import torch_backend


def expect_error(pattern, call):
    try:
        call()
    except (ValueError, TypeError, RuntimeError) as exc:
        if not re.search(pattern, str(exc)):
            raise AssertionError(f"error {exc!r} does not match {pattern!r}") from exc
        print("raised:", exc, flush=True)
        return
    raise AssertionError(f"no error for {pattern!r}")


mcr.init()
# a config after mcr.init() would be ignored: refused
expect_error(
    r"init_process_group: mcr.init\(\) already ran; pass the config there",
    lambda: torch_backend.init_process_group({"comm_log": True}),
)
expect_error(
    r"mcr.hooks.deepspeed.install: mcr.init\(\) already ran; pass the config there",
    lambda: ds_hook.install({"comm_log": True}),
)
ds_hook.install()  # joins the running runtime and starts torch.distributed on it
assert dist.get_backend() == "mcr"
expect_error(
    r"mcr.hooks.deepspeed.install: already installed; call it once with the config",
    lambda: ds_hook.install({"comm_log": True}),
)
assert ds_hook.install() is not None  # a second plain install is harmless

# what backend "mcr" cannot run
t = torch.ones(2)
expect_error(
    r"reduce op .*PREMUL_SUM.* is not supported \(PREMUL_SUM: scale the tensor, then use SUM\)|"
    r"reduce op .* is not supported \(PREMUL_SUM",
    lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)),
)
world = dist.distributed_c10d._get_default_group()
expect_error(
    r"mcr backend: allgather takes one tensor per rank, got 2 \(multi-device lists are not supported\)",
    lambda: world.allgather([[t, t], [t, t]], [t, t.clone()], None),
)
dist.barrier()
print(f"rank {dist.get_rank()}: bad hooks OK", flush=True)
dist.destroy_process_group()
