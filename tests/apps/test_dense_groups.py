"""The dense trainer builds each process group once, on 2 and 4 real ranks.

DeepSpeed's grid (`PipelineParallelGrid`, the pipeline's or the plain engine's `mpu`) builds the
tensor, data and pipeline groups over the layout's ranks; the trainer's layers take theirs from
it (`ParallelDims.groups_from_grid`). tests/apps/scripts/dense_groups.py records every group a
rank makes, with the code that asked for it; a group made twice for the same purpose (the same
code asking for the same ranks twice, or the trainer making a TP, DP or PP group the grid holds)
fails here.
"""

import collections
import json
import os

import pytest

from apps.common.parallel_dims import ParallelDims
from tests.ranks import REPO, run_script

SCRIPT = os.path.join(REPO, "tests", "apps", "scripts", "dense_groups.py")
TINY = os.path.join(REPO, "configs", "dense", "tiny.yaml")
RUNTIME_START = "apps/common/comm.py:"  # the runtime's start makes its world: its one group of its own


@pytest.mark.parametrize("nprocs, tp, pp", [(2, 2, 1), (2, 1, 2), (4, 2, 1)], ids=["tp2", "pp2", "tp2-dp2"])
def test_each_group_is_built_once_by_deepspeeds_grid(tmp_path, nprocs, tp, pp):
    record = tmp_path / "groups"
    args = ["--config", TINY, f"out_dir={tmp_path}", "name=groups", "train.steps=2", "eval_iters=1"]
    args += [f"parallel.tensor={tp}", f"parallel.pipeline={pp}"]
    run_script(nprocs, SCRIPT, record, *args, timeout=400).check()
    dims = ParallelDims(nprocs, tp=tp, pp=pp)
    for rank in range(nprocs):
        made = json.loads((record / f"rank{rank}.json").read_text())
        by_deepspeed = {tuple(m["ranks"]) for m in made if m["by"].startswith("deepspeed/")}
        layout = {tuple(ranks) for dim in ("tp", "dp", "pp") for ranks in dims.group_ranks(dim)}
        mine = {tuple(ranks) for dim in ("tp", "dp", "pp") for ranks in dims.group_ranks(dim) if rank in ranks}
        assert mine <= by_deepspeed, f"rank {rank}: DeepSpeed's grid did not make all of its groups {mine}"
        again = [
            m
            for m in made
            if not m["by"].startswith("deepspeed/")
            and not (m["by"].startswith(RUNTIME_START) and m["ranks"] == list(range(nprocs)))
            and tuple(m["ranks"]) in layout
        ]
        assert again == [], f"rank {rank}: TP/DP/PP groups made again beside DeepSpeed's grid: {again}"
        asked = collections.Counter((tuple(m["ranks"]), m["by"]) for m in made)
        assert [key for key, n in asked.items() if n > 1] == [], f"rank {rank}: the same code made a group twice"
