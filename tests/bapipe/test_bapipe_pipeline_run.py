"""A real 2-process DeepSpeed pipeline (gloo on loopback, DS_ACCELERATOR=cpu) with the planner's
partition. Slow: about a minute, longer the first time DeepSpeed JIT-builds its shm comm op."""
import pytest

from bapipe.cluster import Cluster
from bapipe.explore import CostModel, optimal_plan
from bapipe.pipeline_run import run_partitions
from bapipe.profile import Profile

SMALL_GPT = dict(vocab=2048, dim=128, heads=4, blocks=4, seq_len=64)
CPU_CLUSTER = "configs/bapipe/cpu-2proc.yaml"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_planned_partition_trains_in_a_real_deepspeed_pipeline(tmp_path):
    profile_path = tmp_path / "gpt.json"
    runs = run_partitions(["planned", "uniform"], microbatches=4, micro_batch=2, iters=3, warmup=1,
                          model_kwargs=SMALL_GPT, plan_cluster=CPU_CLUSTER, profile_out=str(profile_path))
    planned, uniform = runs
    model = CostModel(Profile.load(profile_path), Cluster.load(CPU_CLUSTER), 2, 4, "1f1b")
    plan = optimal_plan(model)
    assert planned["parts"] == plan.deepspeed_parts   # DeepSpeed ran the planner's boundaries
    assert uniform["parts"] == [0, 3, 6]
    # the same model and data train the same way whichever way it is cut
    assert planned["loss"] == pytest.approx(uniform["loss"], rel=1e-4)
    # the prediction is of the right size (timings on a shared machine are noisy: a loose bound)
    assert 0.5 < plan.iteration_s / planned["iteration_s"] < 2.0
