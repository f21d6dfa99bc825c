"""Train a small model with DDP under each of torch's DDP communication hooks; print the losses.

    python -m launch.local -n 2 -m tests.hooks.scripts.comm_hooks mcr one|many [hook ...]
    python -m launch.local -n 2 --launcher torchrun -m tests.hooks.scripts.comm_hooks gloo one [hook ...]

Prints `LOSSES <hook> <rank> <json>` per hook, and for mcr `COMMLOG <hook> <rank> <json>` (the
runtime's calls during that hook's run: op, backend, bytes, count). `one`: the whole model in one
bucket; `many`: a bucket per layer, so a step runs several hooks whose callbacks issue
collectives while backward issues the next bucket's (plain gloo fails there: its callbacks and
backward race for the same op order, "Received data size doesn't match expected size").
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power
from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks as quantization
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.hooks import fit, stock_exit
from tests.report import report

STEPS = 6
BUCKET_MB = {"one": 25, "many": 0.01}  # many: ~10 KB buckets, a bucket per layer


def power_state(**kwargs):
    # compress from the third step on; rank-1 factors of the 64x64 weights
    return power.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2, **kwargs)


# hook name -> a function making (state, hook); "optimizer_overlap" registers a fused optimizer instead.
# Left out, as torch 2.13 fails them on every backend: bf16_compress_hook (DDP refuses it without CUDA
# and NCCL) and batched_powerSGD_hook (its _orthogonalize asserts on the 2-D matrix it is given).
HOOKS = {
    "allreduce": lambda: (None, default.allreduce_hook),
    "fp16_compress": lambda: (None, default.fp16_compress_hook),
    "powerSGD": lambda: (power_state(), power.powerSGD_hook),
    "powerSGD_no_warm_start": lambda: (power_state(warm_start=False), power.powerSGD_hook),
    "quantization_pertensor": lambda: (dist.group.WORLD, quantization.quantization_pertensor_hook),
    "quantization_perchannel": lambda: (dist.group.WORLD, quantization.quantization_perchannel_hook),
    # local SGD from step 3 on, each rank its own subgroup: from then on the ranks' models diverge
    "post_localSGD": lambda: (
        post_local.PostLocalSGDState(
            process_group=None, subgroup=dist.new_subgroups(group_size=1)[0], start_localSGD_iter=3
        ),
        post_local.post_localSGD_hook,
    ),
    "optimizer_overlap": None,
}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def train(name, rank, buckets):
    ddp = DDP(model(), bucket_cap_mb=BUCKET_MB[buckets])
    if name == "optimizer_overlap":  # each bucket's SGD step runs in the all-reduce's callback
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1)
        opt = None
    else:
        state, hook = HOOKS[name]()
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    report("LOSSES", name, rank, value=fit.losses(ddp, opt, rank, STEPS))


def comm_counts():
    import mcr

    return {(r["op"], r["backend"], r["bytes"]): r["count"] for r in mcr.runtime().comm_log.rows()}


class _StackedFuture:
    """What NCCL's all_gather future carries, [the ranks' tensors stacked], for plain gloo's work."""

    def __init__(self, work, outputs):
        self._work, self._outputs = work, outputs

    def get_future(self):
        return self._work.get_future().then(lambda _: [torch.stack(self._outputs)])


def gloo_all_gather_futures_as_nccl():
    """torch's quantization hooks index the all_gather future's value as NCCL shapes it; plain
    gloo's carries a flat list (so they fail on gloo in torch 2.13). For the gloo reference run
    only, give it NCCL's shape; backend "mcr" gives it by itself."""
    plain = dist.all_gather

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        work = plain(tensor_list, tensor, group=group, async_op=async_op)
        return _StackedFuture(work, tensor_list) if async_op else work

    dist.all_gather = all_gather


def main(mode, buckets, names):
    if mode == "mcr":
        from mcr.hooks import torch_backend

        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group("gloo")
        gloo_all_gather_futures_as_nccl()
    rank = dist.get_rank()
    for name in names or HOOKS:
        before = comm_counts() if mode == "mcr" else {}
        train(name, rank, buckets)
        if mode == "mcr":
            rows = [[*key, n - before.get(key, 0)] for key, n in comm_counts().items() if n > before.get(key, 0)]
            report("COMMLOG", name, rank, value=rows)
    if mode != "mcr":
        stock_exit.leave()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
