"""A real 2-process DeepSpeed pipeline (gloo on loopback, DS_ACCELERATOR=cpu) with the planner's
partition. About 15 s; a minute more where DeepSpeed's shm comm op is not built yet (`make setup`
builds it; ninja other than the venv's first on PATH builds it again: see the Makefile's test)."""

import pytest

from bapipe.cluster import Cluster
from bapipe.explore import CostModel, optimal_plan
from bapipe.pipeline_run import run_partitions
from bapipe.profile import Profile
from bapipe.report import stage_cpu_s

SMALL_GPT = dict(vocab=4096, dim=256, heads=4, blocks=4, seq_len=128)
CPU_CLUSTER = "configs/bapipe/cpu-2proc.yaml"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_planned_partition_trains_in_a_real_deepspeed_pipeline(tmp_path):
    profile_path = tmp_path / "gpt.json"
    runs = run_partitions(
        ["planned", "uniform"],
        microbatches=4,
        micro_batch=2,
        iters=3,
        warmup=1,
        model_kwargs=SMALL_GPT,
        plan_cluster=CPU_CLUSTER,
        profile_out=str(profile_path),
    )
    planned, uniform = runs
    model = CostModel(Profile.load(profile_path), Cluster.load(CPU_CLUSTER), 2, 4, "1f1b")
    plan = optimal_plan(model)
    assert planned["parts"] == plan.deepspeed_parts  # DeepSpeed ran the planner's boundaries
    assert uniform["parts"] == [0, 3, 6]
    # the same model and data train the same way whichever way it is cut
    assert planned["loss"] == pytest.approx(uniform["loss"], rel=1e-4)
    # each stage's CPU time per iteration, which other work on the machine does not inflate, is
    # what the cost model predicts; DeepSpeed's bookkeeping and cache sharing add 10-20% here
    for predicted, measured in zip(stage_cpu_s(plan), planned["stage_cpu_s"]):
        assert 0.6 < predicted / measured < 1.4, f"stage CPU predicted {predicted:.3f} s, measured {measured:.3f} s"
