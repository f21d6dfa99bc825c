"""Train a sharded DLRM with TorchRec DistributedModelParallel on 2 ranks (CPU).

    LOCAL_WORLD_SIZE=2 python -m launch.local -n 2 -m tests.hooks.scripts.torchrec_dlrm mcr
    python -m launch.local -n 2 --launcher torchrun -m tests.hooks.scripts.torchrec_dlrm gloo

Tables are row-wise, table-row-wise, table-wise and column-wise sharded (the first two need
mcr.hooks.torchrec's sharder on CPU). Inputs have a random number of ids per sample, so the
KJT exchange is an uneven all-to-all. Prints `LOSSES <rank> <json>`, `PLAN <rank> <json>`
and, for mcr, `COMMLOG <rank> <json>`.
"""

import sys

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.models.dlrm import DLRM
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from mcr.hooks.torchrec import cpu_sharders
from tests.hooks import stock_exit
from tests.report import report

SHARDING = {"t_rw": "row_wise", "t_twrw": "table_row_wise", "t_tw": "table_wise", "t_cw": "column_wise"}
ROWS, DIM, BATCH, STEPS = 40, 8, 6, 4


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    keys = [f"f_{t}" for t in SHARDING]
    lengths = torch.randint(0, 4, (len(keys) * BATCH,), generator=g)  # uneven: ids per sample vary
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    return torch.randn(BATCH, 4, generator=g), kjt, torch.randint(0, 2, (BATCH,), generator=g).float()


def main(mode):
    if mode == "mcr":
        from mcr.hooks import torch_backend

        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=t, embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f_{t}"]) for t in SHARDING
    ]
    dlrm = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=4,
        dense_arch_layer_sizes=[16, DIM],
        over_arch_layer_sizes=[16, 1],
    )
    apply_optimizer_in_backward(torch.optim.SGD, dlrm.sparse_arch.parameters(), {"lr": 0.1})
    sharders = cpu_sharders()
    constraints = {t: ParameterConstraints(sharding_types=[s]) for t, s in SHARDING.items()}
    topology = Topology(world_size=world, local_world_size=world, compute_device="cpu")
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(
        dlrm, sharders, dist.GroupMember.WORLD
    )
    model = DistributedModelParallel(dlrm, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())), lambda params: torch.optim.SGD(params, lr=0.1)
    )
    losses = []
    for step in range(STEPS):
        x, kjt, y = batch(rank, step)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x, kjt).squeeze(-1), y)
        dense.zero_grad()
        loss.backward()
        dense.step()
        losses.append(loss.item())
    used = sorted({ps.sharding_type for ps in plan.plan["sparse_arch.embedding_bag_collection"].values()})
    report("PLAN", rank, value=used)
    report("LOSSES", rank, value=losses)
    if mode == "mcr":
        import mcr

        rows = [[r["op"], r["backend"], r["bytes"], r["count"]] for r in mcr.runtime().comm_log.rows()]
        report("COMMLOG", rank, value=rows)
    if mode != "mcr":
        stock_exit.leave()
    dist.barrier()  # no rank tears gloo down while its peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
