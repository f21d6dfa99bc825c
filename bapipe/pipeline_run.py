"""Run a real DeepSpeed pipeline (``PipelineModule``, 1F1B) on CPU processes and time it.

``run_partitions`` starts one process per stage with the repository's local launcher
(``python -m launch.local --launcher torchrun``: gloo on loopback, ``DS_ACCELERATOR=cpu``, one
thread each), and in those processes trains the GPT-like stack once per requested partition,
so the planner's partition and DeepSpeed's own methods meet the same conditions. The processes
run this module, from the checkout (launch/ is not installed):

    python -m launch.local -n 2 --launcher torchrun -m bapipe.pipeline_run --partitions 'planned;uniform' \
        --microbatches 8 --micro-batch 4 --out result.json --plan-cluster configs/bapipe/cpu-2proc.yaml \
        --profile-out gpt.json
"""

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time

from .local_job import run_local
from .models import build
from .planned_pipeline import planned_pipeline_module


def _profile_and_plan(args, dist):
    """Every rank profiles at once, so the profile sees the same shared cores as the pipeline;
    rank 0 plans and tells the others the planned boundaries."""
    import torch

    from .cluster import Cluster
    from .explore import CostModel, optimal_plan
    from .profile import profile_stack

    dist.barrier()
    profile = profile_stack(build("gpt-like", **json.loads(args.model_kwargs)), args.micro_batch, repeats=7)
    parts = torch.zeros(dist.get_world_size() + 1, dtype=torch.long)
    if dist.get_rank() == 0:
        profile.save(args.profile_out)
        model = CostModel(profile, Cluster.load(args.plan_cluster), dist.get_world_size(), args.microbatches, "1f1b")
        parts = torch.tensor(optimal_plan(model).deepspeed_parts)
    dist.broadcast(parts, 0)
    return parts.tolist()


def _worker(args):
    import deepspeed
    import deepspeed.comm as dist
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    specs = args.partitions.split(";")
    if "planned" in specs:
        planned = ",".join(map(str, _profile_and_plan(args, dist)))
        specs = [planned if spec == "planned" else spec for spec in specs]
    runs = []
    for spec in specs:
        parts = [int(v) for v in spec.split(",")] if spec[0].isdigit() else spec
        stack = build("gpt-like", **json.loads(args.model_kwargs))  # same seed: same weights everywhere
        module = planned_pipeline_module(stack.layers, parts, num_stages=dist.get_world_size(), loss_fn=stack.loss_fn)
        same = [r for r in runs if r["parts"] == [int(v) for v in module.parts]]
        if same:  # the same boundaries train the same way: measure them once
            runs.append({"spec": spec, "twin": same[0], "parts": same[0]["parts"]})
            continue
        config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": args.microbatches,
            "steps_per_print": 10**9,
            "pipeline": {"activation_checkpoint_interval": 0},
        }
        optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-4)
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
        batch = stack.make_batch(args.micro_batch)
        runs.append(
            {
                "spec": spec,
                "engine": engine,
                "data": itertools.repeat(batch),  # the same micro-batch every step
                "times": [],
                "cpu_times": [],
                "parts": [int(v) for v in module.parts],
            }
        )
    # rounds visit every partition in turn, so a burst of load from elsewhere hits them alike
    for step in range(args.warmup + args.iters):
        for run in (r for r in runs if "twin" not in r):
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            run["loss"] = float(run["engine"].train_batch(run["data"]))
            if step >= args.warmup:
                run["times"].append(time.perf_counter() - start)
                # CPU time this stage used: what the planner predicts, whatever else shares the cores
                run["cpu_times"].append(time.process_time() - cpu_start)
    measured = [r.get("twin", r) for r in runs]
    with open(f"{args.out}.rank{dist.get_rank()}", "w") as f:
        json.dump([statistics.median(m["cpu_times"]) for m in measured], f)
    dist.barrier()
    if dist.get_rank() == 0:
        cpu = [json.load(open(f"{args.out}.rank{r}")) for r in range(dist.get_world_size())]
        with open(args.out, "w") as f:
            json.dump(
                [
                    {
                        "partition": r["spec"],
                        "parts": m["parts"],
                        "loss": m["loss"],
                        "shared_with": m["spec"],
                        "iteration_s": statistics.median(m["times"]),
                        "iterations_s": m["times"],
                        "stage_cpu_s": [cpu[rank][i] for rank in range(len(cpu))],
                    }
                    for i, (r, m) in enumerate(zip(runs, measured))
                ],
                f,
                indent=1,
            )
    dist.barrier()
    torch.distributed.destroy_process_group()  # a clean exit: gloo's threads abort the process otherwise


def run_partitions(
    partitions,
    microbatches,
    micro_batch,
    iters=4,
    warmup=2,
    stages=2,
    model_kwargs=None,
    timeout_s=900,
    plan_cluster=None,
    profile_out=None,
):
    """Train the GPT-like stack on ``stages`` local processes with each partition in turn.

    ``partitions``: each a list of DeepSpeed ``parts``, a ``partition_method`` name, or "planned":
    then the processes profile the stack together, save the profile to ``profile_out`` and
    plan with the cluster file ``plan_cluster`` (1F1B). Returns one dict per partition with the
    measured median ``iteration_s``."""
    if "planned" in partitions and not (plan_cluster and profile_out):
        raise ValueError("a 'planned' partition needs plan_cluster and profile_out")
    specs = [",".join(map(str, p)) if isinstance(p, (list, tuple)) else p for p in partitions]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        job = ["-m", "bapipe.pipeline_run", "--partitions", ";".join(specs), "--out", out]
        job += ["--microbatches", str(microbatches), "--micro-batch", str(micro_batch)]
        job += ["--iters", str(iters), "--warmup", str(warmup), "--model-kwargs", json.dumps(model_kwargs or {})]
        job += ["--plan-cluster", str(plan_cluster), "--profile-out", str(profile_out)]
        log = run_local(stages, job, timeout_s, "the DeepSpeed pipeline", env={"DS_ACCELERATOR": "cpu"})
        if not os.path.exists(out):
            raise RuntimeError(f"the DeepSpeed pipeline wrote no result:\n{log[-6000:]}")
        with open(out) as f:
            return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one stage of the measured DeepSpeed pipeline (internal)")
    parser.add_argument("--partitions", required=True)
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--model-kwargs", default="{}")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan-cluster")
    parser.add_argument("--profile-out")
    _worker(parser.parse_args(argv))


if __name__ == "__main__":
    main()
